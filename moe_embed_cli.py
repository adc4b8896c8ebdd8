"""The command-line contract of every script of this package (`convert/`, `training/`, `evaluation/`,
`experiments/`): bad input ends the run with one line on stderr and exit code 2, never a traceback.

Code raises `UsageError` where the user's input (arguments, files, data, configs) is wrong; the
script's entry point is `run_cli(main)`, which also turns an `OSError` (unwritable output, full
disk, missing file) into the same one line. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """`--help` of every script: the description as written, and each option's default appended once,
    only where its help text does not already state one and there is a value to state."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if "default" in text or default in (None, False, argparse.SUPPRESS) or not action.option_strings:
            return text
        return f"{text} (default: {' '.join(map(str, default)) if isinstance(default, list) else default})"


class UsageError(Exception):
    """Bad input to a command-line tool: reported as `error: <message>` on stderr with exit code 2."""


def run_cli(main: Callable[[list[str] | None], T], argv: list[str] | None = None) -> T:
    """Call `main(argv)` with logging set up; `UsageError` and `OSError` become one stderr line and exit 2."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        return main(argv)
    except UsageError as error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    except OSError as error:  # the user's environment, not a bug
        print(f"error: {error.strerror or error}: {error.filename or ''}".rstrip(": "), file=sys.stderr)
        raise SystemExit(2) from None


__all__ = ["HelpFormatter", "UsageError", "run_cli"]
