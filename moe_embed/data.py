"""Where evaluation and training data come from: datasets on the Hugging Face Hub, or local copies of them.

    moe-embed data download DIR             # every dataset the suite, the dev sets and the recipes name
    moe-embed data download DIR --datasets mteb/scifact,mteb/banking77
    moe-embed data list                     # what they are, what uses them, their licences

A dataset is named by its Hub id (`mteb/scifact`). It is read from `DIR/mteb/scifact` when the data folder
(`--data-dir`, else `$MOE_EMBED_DATA`) holds a copy there, in the repository's own layout (its files and the
card's `configs:` section, as `data download` writes it); else from the Hub through `datasets` and its cache.
Both go through the same `datasets.load_dataset` call, so a copy behaves exactly as the Hub repository does.
Offline with neither, a command stops in one line naming the dataset and the download command, before any
long step.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from moe_embed.errors import UsageError, run_cli
from moe_embed.options import command_parser, parse

logger = logging.getLogger(__name__)

DATA_ENV = "MOE_EMBED_DATA"
# the --data-dir help of every command that reads data
DATA_DIR_HELP = (
    f"folder of local copies of Hub datasets, as `moe-embed data download DIR` writes (default: ${DATA_ENV}; "
    "without one, data comes from the Hub or its cache)"
)


@dataclass(frozen=True)
class HubDataset:
    """A dataset on the Hub that this package names: where it is, what uses it, under which terms."""

    repo: str
    used_for: str
    licence: str
    revision: str | None = None  # None: the main branch
    patterns: tuple[str, ...] | None = None  # the files to download (None: all)


# Every Hub dataset the evaluation suite, the dev sets and the recipes name (docs/data.md is this table). The
# mteb datasets are pinned to the revision mteb's task names (tests/test_evaluation.py checks they agree).
CATALOGUE = {
    entry.repo: entry
    for entry in [
        HubDataset(
            "mteb/stsbenchmark-sts",
            "STSBenchmark (test); dev set stsb-dev and AEA calibration (validation)",
            "scores CC BY-SA 4.0; texts under their sources' terms (MSR Paraphrase / Video: Microsoft's)",
            "b0fddb56ed78048fa8b90373c8a3cfc37b684831",
        ),
        HubDataset("mteb/sickr-sts", "SICK-R", "CC BY-NC-SA 3.0", "20a6d6f312dd54037fe07a32d58e5e168867909d"),
        HubDataset(
            "mteb/scifact",
            "SciFact (test qrels); dev set scifact-train and training (train qrels)",
            "CC BY-NC 2.0 (mteb's card: CC BY-NC 4.0)",
            "d56462d0e63a25450459c4f213e49ffdb866f7f9",
        ),
        HubDataset(
            "mteb/twitterurlcorpus-pairclassification",
            "TwitterURLCorpus",
            "CC BY-NC-SA 3.0; Twitter's terms apply",
            "8b6510b0b1fa4e4c4f879467980e9be563ec1cdf",
        ),
        HubDataset(
            "mteb/banking77",
            "Banking77Classification, Banking77Clustering",
            "CC BY 4.0 (mteb's card: MIT)",
            "0fd18e25b25c072e09e0d92ab615fda904d66300",
        ),
        HubDataset(
            "mteb/emotion",
            "EmotionClassification",
            "educational and research use only",
            "4f58c6b202a23cf9a4da393831edf4f9183cad37",
        ),
        HubDataset(
            "mteb/amazon_counterfactual",
            "AmazonCounterfactualClassification (subset en); recipe training (en train)",
            "CC BY-SA 4.0 per its README, CC BY-NC 4.0 per its LICENSE file: treat as non-commercial",
            "1f7e6a9d6fa6e64c53d146e428565640410c0df1",
        ),
        HubDataset(
            "stanfordnlp/sst2",
            "SST2Classification (train phrases, validation sentences)",
            "the Stanford Sentiment Treebank's terms (research use)",
        ),
        HubDataset(
            "CogComp/trec",
            "TRECClustering (test, coarse labels); recipe training (train, fine labels)",
            "research use (Li & Roth's question classification data)",
            "refs/convert/parquet",  # the repository's main branch holds a loading script, which datasets 4+ refuses
        ),
        HubDataset(
            "sentence-transformers/all-nli",
            "recipe training (triplet: premise, entailment, contradiction)",
            "SNLI CC BY-SA 4.0; MultiNLI under its sources' terms",
            patterns=("README.md", "triplet/*"),
        ),
        HubDataset(
            "sentence-transformers/natural-questions",
            "recipe training (pair: question, answer passage)",
            "CC BY-SA 3.0",
        ),
        HubDataset(
            "sentence-transformers/quora-duplicates",
            "recipe training (pair: duplicate questions)",
            "Quora's terms (non-commercial research)",
            patterns=("README.md", "pair/*"),
        ),
    ]
}


def data_dir(override: str | os.PathLike | None = None) -> Path | None:
    """The data folder: `--data-dir`, else `$MOE_EMBED_DATA`, else None (the Hub and its cache). One that is
    named but missing is an error (a typo must not silently mean "download")."""
    value = override or os.environ.get(DATA_ENV)
    if not value:
        return None
    path = Path(value)
    if not path.is_dir():
        origin = "--data-dir" if override else f"${DATA_ENV}"
        raise UsageError(
            f"data folder {path} ({origin}) not found; expected a folder written by `moe-embed data download {path}`"
        )
    return path


def local_copy(repo: str, folder: Path | None) -> Path | None:
    """`folder/repo` when the data folder holds a copy of the Hub dataset `repo`, else None."""
    if folder is None:
        return None
    path = Path(folder) / repo
    return path if path.is_dir() else None


def missing_message(repo: str, folder: Path | None, purpose: str = "") -> str:
    """The one line a command stops with when `repo` is neither in the data folder nor reachable."""
    what = f"dataset {repo}" + (f" ({purpose})" if purpose else "")
    where = f"is not in the data folder {folder}" if folder else "is in no data folder (--data-dir / $MOE_EMBED_DATA)"
    return (
        f"{what} {where} and the Hub cannot be reached: run `moe-embed data download DIR` where there is "
        f"network, then pass --data-dir DIR (or set {DATA_ENV}=DIR)"
    )


_PRIVATE_CACHES: list[str] = []


def _private_cache() -> str:
    """A fresh `datasets` cache folder for one local copy, removed when the process ends.

    `datasets` caches a local folder under its base name and its card's file patterns only, not its path or
    contents: two copies named alike (a test fixture and the real data) would share one cache entry. Reading a
    copy is quick, so every read gets its own."""
    if not _PRIVATE_CACHES:
        _PRIVATE_CACHES.append(tempfile.mkdtemp(prefix="moe-embed-datasets-"))
        atexit.register(shutil.rmtree, _PRIVATE_CACHES[0], True)
    return tempfile.mkdtemp(dir=_PRIVATE_CACHES[0])


@contextlib.contextmanager
def reading(repo: str, folder: Path | None, purpose: str = "") -> Iterator[Path | None]:
    """Read the Hub dataset `repo` inside this block: yields its local copy (None: the Hub), points `datasets`
    at a private cache while a copy is read, and turns the Hub being out of reach into the one-line error.
    For readers that call `datasets.load_dataset` themselves (mteb's tasks)."""
    import datasets

    local = local_copy(repo, folder)
    saved = datasets.config.HF_DATASETS_CACHE
    if local is not None:
        datasets.config.HF_DATASETS_CACHE = Path(_private_cache())
    try:
        yield local
    except ConnectionError:
        if local is not None:
            raise
        raise UsageError(missing_message(repo, folder, purpose)) from None
    except (ValueError, KeyError, FileNotFoundError, RuntimeError, datasets.exceptions.DatasetNotFoundError) as error:
        place = str(local) if local is not None else f"the Hub ({repo})"
        what = f"dataset {repo}" + (f" ({purpose})" if purpose else "")
        raise UsageError(f"cannot read {what} from {place}: {one_line(error)}") from None
    finally:
        datasets.config.HF_DATASETS_CACHE = saved


def one_line(error: BaseException) -> str:
    """An exception's whole message on one line (libraries put the useful part after the first line)."""
    return " ".join(str(error).split()) or type(error).__name__


def load(
    repo: str,
    subset: str | None = None,
    split: str | None = None,
    *,
    revision: str | None = None,
    folder: Path | None = None,
    purpose: str = "",
):
    """`datasets.load_dataset` of the Hub dataset `repo` (its `subset` and `split`), from its copy in the data
    folder `folder` if there is one, else from the Hub (or the cache); a `UsageError` naming the dataset when it
    cannot be had or has no such subset or split."""
    import datasets

    if revision is None and repo in CATALOGUE:
        revision = CATALOGUE[repo].revision
    where = f"subset {subset or 'default'}, split {split}"
    with reading(repo, folder, f"{purpose}: {where}" if purpose else where) as local:
        if local is not None:
            return datasets.load_dataset(str(local), subset, split=split)
        return datasets.load_dataset(repo, subset, split=split, revision=revision)


def keep_downloaded_configs(folder: Path) -> None:
    """Of a partial copy's card, keep the `configs:` whose files were downloaded: `datasets` resolves a local
    folder's first config to choose a file format, and fails when its files are missing."""
    from huggingface_hub import DatasetCard

    card = DatasetCard.load(folder / "README.md")
    configs = card.data.to_dict().get("configs") or []

    def present(config) -> bool:
        files = config.get("data_files") or []
        files = [files] if isinstance(files, str | dict) else files
        patterns = [
            p
            for f in files
            for p in ([f] if isinstance(f, str) else [f["path"]] if isinstance(f["path"], str) else f["path"])
        ]
        return any(next(folder.glob(pattern), None) is not None for pattern in patterns)

    kept = [config for config in configs if present(config)]
    if len(kept) != len(configs):
        card.data.configs = kept
        card.save(folder / "README.md")


def download(repos: list[str], target: Path, overwrite: bool = False) -> list[Path]:
    """Copy the Hub datasets `repos` (ids from `CATALOGUE`, or any) into `target/<repo>`, each in its
    repository's layout at its catalogued revision; a copy already there is kept unless `overwrite`. Each copy
    appears whole or not at all."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError
    from tqdm.auto import tqdm

    from moe_embed.files import atomic_output_dir

    written = []
    for repo in repos:
        entry = CATALOGUE.get(repo) or HubDataset(repo, "named on the command line", "see the dataset's card")
        destination = Path(target) / repo
        if destination.exists() and not overwrite:
            logger.info("%s: kept the copy in %s (--overwrite fetches it again)", repo, destination)
            continue
        logger.info("downloading %s%s", repo, f" @ {entry.revision}" if entry.revision else "")
        with atomic_output_dir(destination, overwrite=True) as tmp:
            try:
                snapshot_download(
                    repo,
                    repo_type="dataset",
                    revision=entry.revision,
                    allow_patterns=list(entry.patterns) if entry.patterns else None,
                    local_dir=tmp,
                    tqdm_class=tqdm,
                )
            except LocalEntryNotFoundError:
                raise UsageError(f"cannot download {repo}: the Hub cannot be reached (offline)") from None
            except HfHubHTTPError as error:
                raise UsageError(f"cannot download {repo}: {one_line(error)}") from None
            shutil.rmtree(tmp / ".cache", ignore_errors=True)  # huggingface_hub's bookkeeping, not data
            if entry.patterns:
                keep_downloaded_configs(tmp)
        written.append(destination)
    return written


def catalogue_table() -> str:
    """The catalogue as a markdown table (what `data list` prints and docs/data.md shows)."""
    rows = ["| Hub dataset | revision | used for | licence |", "|---|---|---|---|"]
    rows += [
        f"| `{e.repo}` | {e.revision[:8] if e.revision and len(e.revision) == 40 else e.revision or 'main'} "
        f"| {e.used_for} | {e.licence} |"
        for e in CATALOGUE.values()
    ]
    return "\n".join(rows)


def select(spec: str | None) -> list[str]:
    """`--datasets`: comma-separated Hub ids (any, not only catalogued ones), or all of the catalogue."""
    if not spec:
        return list(CATALOGUE)
    repos = [name.strip() for name in spec.split(",") if name.strip()]
    bad = [name for name in repos if name.count("/") != 1 or name.startswith("/") or name.endswith("/")]
    if bad or not repos:
        raise UsageError(f"--datasets expects comma-separated Hub ids like mteb/scifact, got {bad or spec!r}")
    return repos


def build_parser(prog: str | None = None):
    parser = command_parser(__doc__, prog)
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    what = "copy Hub datasets into a data folder"
    fetch = actions.add_parser(
        "download", help=what, description=f"{what[0].upper()}{what[1:]}, in their repositories' layout."
    )
    fetch.add_argument("dir", help="the data folder (created if missing); pass it later as --data-dir")
    fetch.add_argument("--datasets", help="comma-separated Hub ids (default: every dataset of `data list`)")
    fetch.add_argument("--overwrite", action="store_true", help="fetch again copies that are already there")
    what = "the datasets this package names, what uses them and their licences"
    actions.add_parser("list", help=what, description=f"Print {what}.")
    return parser


def main(argv: list[str] | None = None, prog: str | None = None):
    args = parse(build_parser(prog), argv)
    if args.action == "list":
        print(catalogue_table())
        return list(CATALOGUE)
    repos = select(args.datasets)
    target = Path(args.dir)
    if target.exists() and not target.is_dir():
        raise UsageError(f"{target} exists and is not a folder")
    written = download(repos, target, overwrite=args.overwrite)
    print(f"{len(written)} dataset(s) downloaded, {len(repos) - len(written)} kept; use --data-dir {target}")
    return written


__all__ = [
    "CATALOGUE",
    "DATA_DIR_HELP",
    "HubDataset",
    "data_dir",
    "download",
    "load",
    "local_copy",
    "missing_message",
    "reading",
]


if __name__ == "__main__":
    run_cli(main)
