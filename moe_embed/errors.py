"""Bad input and the runner of every command (`moe-embed SUBCOMMAND`, `python convert/<tool>.py`,
`python -m moe_embed.training.train`, ...).

Bad input ends the run with one line on stderr and exit code 2, never a traceback: code raises `UsageError` where
the user's input (arguments, files, data, configs) is wrong, and the entry point `run_cli(main)` also turns an
`OSError` (unwritable output, full disk, missing file) into that line. Anything else is a bug and keeps its
traceback. `run_cli` also sets up quiet logging (`moe_embed.logs`) and works offline at once where the Hub cannot
be reached (`offline_without_hub`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class UsageError(Exception):
    """Bad input to a command: reported as `error: <message>` on stderr with exit code 2."""


def offline_without_hub(argv: list[str] | None = None, timeout: float = 2.0) -> bool:
    """Set `HF_HUB_OFFLINE=1` for this process when the Hugging Face Hub (`HF_ENDPOINT`, default huggingface.co)
    cannot be reached, before any Hugging Face library is imported: they would otherwise retry it with backoff
    (about half a minute) before they fall back to local files. One TCP connection, `timeout` seconds at most;
    skipped when `HF_HUB_OFFLINE` is set either way or the command only asks for `--help`. Returns whether it
    switched to offline, which it says in one line."""
    import socket
    from urllib.parse import urlsplit

    argv = sys.argv[1:] if argv is None else argv
    if "HF_HUB_OFFLINE" in os.environ or {"-h", "--help"} & set(argv):
        return False
    endpoint = urlsplit(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    port = endpoint.port or (443 if endpoint.scheme == "https" else 80)
    try:
        socket.create_connection((endpoint.hostname, port), timeout=timeout).close()
        return False
    except OSError:
        os.environ["HF_HUB_OFFLINE"] = "1"
        print(f"{endpoint.hostname} cannot be reached: working offline (local folders and the cache)", file=sys.stderr)
        return True


def run_cli(main: Callable[[list[str] | None], T], argv: list[str] | None = None) -> T:
    """Call `main(argv)` with quiet logging set up, offline at once where the Hub cannot be reached
    (`offline_without_hub`); `UsageError` and `OSError` become one stderr line and exit 2."""
    from moe_embed.logs import set_verbosity

    set_verbosity(verbose=False)
    offline_without_hub(argv)
    try:
        return main(argv)
    except UsageError as error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    except OSError as error:  # the user's environment, not a bug
        print(f"error: {error.strerror or error}: {error.filename or ''}".rstrip(": "), file=sys.stderr)
        raise SystemExit(2) from None


__all__ = ["UsageError", "offline_without_hub", "run_cli"]
