"""Evaluation of embedding models: the MTEB-style suite over the data folder (`run.py`: `moe-embed evaluate`,
with the protocols of `metrics.py`), the inter-task similarity of task embeddings (`intertask.py`) and the
routing shares and expert similarity of token-routed models (`expert_usage.py`)."""
