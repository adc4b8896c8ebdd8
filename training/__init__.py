"""Task-aware contrastive learning (TA-CL) on sentence-transformers' trainer: the command and its run
(`train.py`: `moe-embed train`), the typed YAML config (`config.py`), the task registry (`tasks.py`), the
dataset formats (`datasets.py`), the task-aware batch sampler (`sampler.py`), data-parallel gradient averaging
(`trainer.py`), the auxiliary-loss wrapper (`losses.py`), regularisers towards the start (`regularizers.py`),
dev-set checkpoint selection (`dev.py`), which parameters are experts (`parameters.py`) and the data tools
(`data_tools.py`: `moe-embed mine` / `filter`)."""
