"""Local MTEB-style evaluation over ../shared/data."""
