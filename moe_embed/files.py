"""JSON files and atomic writes: every file or folder a tool writes appears whole, or not at all, and an
existing one is replaced only when the user said so (`check_output`)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from moe_embed.errors import UsageError
from moe_embed.folders import check_output

# the model code's own writer (it runs in folders where this package is absent): one form of JSON for every file
from moe_embed.modeling.st_folder import write_json


def read_json(path: str | os.PathLike):
    """Parse a JSON file, with a one-line error naming the file when it is missing or invalid."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"missing file {path}") from None
    except json.JSONDecodeError as error:
        raise UsageError(f"{path} is not valid JSON ({error})") from None


def atomic_write(path: str | os.PathLike, write: Callable[[str], object]) -> Path:
    """`write(temporary)` to a temporary sibling of `path`, renamed to `path` once written: readers see the whole
    file or none (the folder must exist; an existing `path` is replaced)."""
    path = Path(path)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    os.close(handle)
    try:
        write(temporary)
        _apply_umask(Path(temporary))
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)
    return path


def atomic_write_text(path: str | os.PathLike, text: str, overwrite: bool = False) -> Path:
    """Write `text` to `path` through a temporary sibling renamed at the end; refuse an existing `path`
    without `overwrite`."""
    path = check_output(path, overwrite=overwrite)
    path.parent.mkdir(parents=True, exist_ok=True)
    return atomic_write(path, lambda temporary: Path(temporary).write_text(text, encoding="utf-8"))


@contextlib.contextmanager
def atomic_output_dir(output: str | os.PathLike, overwrite: bool) -> Iterator[Path]:
    """Yield an empty temporary folder beside `output`, renamed to `output` only on success.

    Refuses (UsageError) when `output` exists and `overwrite` is false; on failure nothing is
    left behind and an existing `output` is untouched.
    """
    output = check_output(output, overwrite=overwrite).resolve()
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{output.name}.tmp-", dir=output.parent))
    try:
        yield tmp
        for path in [tmp, *tmp.rglob("*")]:
            _apply_umask(path)
        if output.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{output.name}.old-", dir=output.parent))
            os.replace(output, old / output.name)
            os.replace(tmp, output)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, output)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _apply_umask(path: Path) -> None:
    """Give a finished file or folder the usual permissions (mkdtemp / mkstemp make them private to the user)."""
    umask = os.umask(0)
    os.umask(umask)
    path.chmod((0o777 if path.is_dir() else 0o666) & ~umask)


__all__ = ["read_json", "write_json", "atomic_write", "atomic_write_text", "atomic_output_dir"]
