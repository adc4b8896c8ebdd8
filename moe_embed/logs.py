"""Logging of every command: quiet by default (this package's own progress lines and every library's warnings),
the libraries' informational logs (and the progress bars sentence-transformers shows at that level) only with
`--verbose`, which every command's parser offers (`moe_embed.options.command_parser`).
"""

from __future__ import annotations

import logging
import os
import sys

# the loggers of this package's tools: informational by default, the libraries' only with --verbose
OWN_LOGGERS = ("moe_embed", "experiments", "benchmarks", "scripts")
# warnings the libraries give on every run, whatever the input, shown only with --verbose: sentence-transformers
# announces the default prompt of a folder that has one (a one-task export) each time it is loaded, and
# onnxruntime's quantiser advises pre-processing on every call
ROUTINE_WARNINGS = ("Default prompt name is set to", "Please consider to run pre-processing before quantization")

_BARS_HIDDEN = False  # whether the quiet mode set HF_HUB_DISABLE_PROGRESS_BARS (and may take it back)


class _Stderr(logging.StreamHandler):
    """A handler writing to the `sys.stderr` of each record's time (a caller, a test's capture, may replace the
    stream after logging was set up, and close the old one)."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value):  # logging.StreamHandler.__init__ sets it; the property always answers sys.stderr
        pass


class _Quiet(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(ROUTINE_WARNINGS)


class _NotPrintedYet(logging.Filter):
    """Drops a record that a handler of its own library already printed (huggingface_hub's logger has one and
    also passes its records up to the root): every line once."""

    def filter(self, record: logging.LogRecord) -> bool:
        logger = logging.getLogger(record.name)
        while logger is not None and logger is not logging.root:
            if logger.handlers:
                return False
            logger = logger.parent
        return True


class _Format(logging.Formatter):
    """This package's informational lines as they are; warnings and errors with their level and source."""

    def format(self, record: logging.LogRecord) -> str:
        if record.levelno <= logging.INFO and record.name.split(".")[0] in OWN_LOGGERS:
            return record.getMessage()
        return f"{record.levelname.lower()} ({record.name}): {record.getMessage()}"


def is_verbose() -> bool:
    """Whether `set_verbosity` made the command verbose (`--verbose`: the root logger at INFO)."""
    return logging.getLogger().getEffectiveLevel() <= logging.INFO


def set_verbosity(verbose: bool = False) -> None:
    """Quiet (this package's informational lines, every warning but the routine ones) or verbose (every
    library's informational lines too) logging on stderr. Quiet also hides the progress bars of transformers
    and the Hub (loading and writing a local folder take a second); call it before they are imported. Long steps
    keep theirs: training, calibration, a model fetched from the Hub (`moe_embed.folders.locate`)."""
    root = logging.getLogger()
    handler = next((h for h in root.handlers if getattr(h, "_moe_embed", False)), None)
    if handler is None:
        handler = _Stderr()
        handler._moe_embed = True
        handler.setFormatter(_Format())
        root.addHandler(handler)
    handler.filters = [_NotPrintedYet()] if verbose else [_NotPrintedYet(), _Quiet()]
    root.setLevel(logging.INFO if verbose else logging.WARNING)
    for name in OWN_LOGGERS:
        logging.getLogger(name).setLevel(logging.DEBUG if verbose else logging.INFO)
    global _BARS_HIDDEN
    if not verbose and "HF_HUB_DISABLE_PROGRESS_BARS" not in os.environ:
        os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
        _BARS_HIDDEN = True
    elif verbose and _BARS_HIDDEN:
        os.environ.pop("HF_HUB_DISABLE_PROGRESS_BARS", None)
        _BARS_HIDDEN = False


__all__ = ["OWN_LOGGERS", "is_verbose", "set_verbosity"]
