"""Training utilities for moe-embed models on top of sentence-transformers."""
