"""The shared core of moe-embed's tools: what `convert/`, `evaluation/` and `training/` all rely on, so
that none of them imports another for plumbing.

- `errors.py`: the command-line contract: `UsageError` (bad input: one line on stderr, exit code 2) and
  `run_cli`, which every command runs under (and which works offline at once where the Hub cannot be reached).
- `options.py`: options dataclasses read from the command line and from mappings (YAML) by their resolved
  annotations: `option()`, `options_parser`, `parse_options`, `from_mapping`, the help format.
- `logs.py`: quiet logging by default, `--verbose` for the libraries' informational logs.
- `folders.py`: the folder contract: opening a model folder or Hub id (refused in one line before any
  work), checking an output, the bundled dense checkpoint, `load_sentence_transformer`.
- `files.py`: JSON files and atomic writes (a folder or a file appears whole, or not at all).
- `data.py`: Hub datasets, the one reader of them (`datasets.load_dataset`, from a data folder's local copy
  or the Hub), `moe-embed data` (download for offline use, list) and the catalogue of what the package reads.
- `readers.py`: readers of local files (TSV, JSONL, BEIR folders) for training configs' `path:` datasets.

Every module here imports only the standard library at import time (heavy libraries inside the functions
that need them), so a command's `--help` and argument errors answer at once. It imports nothing of this
package but `modeling/` (the model code, the lowest layer).
"""
