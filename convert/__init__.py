"""Command-line converters: upcycle dense checkpoints into expert models."""
