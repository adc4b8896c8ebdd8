"""Model code of moe-embed. Every file here is self-contained enough to be copied into a saved
model folder (remote code), importing only the standard library, torch, transformers and siblings."""
