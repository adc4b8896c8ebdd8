"""Validate a model folder and publish it to the Hugging Face Hub (safetensors and code, never pickles).

    moe-embed push models/mote-minilm --repo-id you/mote-minilm
    moe-embed push models/minilm-ea --repo-id you/minilm-ea --private --revision v1
    moe-embed push models/comoe-adapter --repo-id you/comoe-adapter \\
        --base-model-id sentence-transformers/all-MiniLM-L6-v2      # adapter-only folder of a local base

(`python convert/push_to_hub.py ...` is the same command.) Before anything is uploaded, the folder is loaded
in a separate Python process with `AutoModel.from_pretrained(..., trust_remote_code=True)` and
`SentenceTransformer(...)`, and both run a forward pass. The model card is refreshed for the target repository
(metadata for the Hub, usage snippets naming `--repo-id`), or rendered from `hub_cards/` if the folder has
none; the folder itself is not modified. Everything is uploaded in one commit. An adapter-only CoMoE folder is
published naming its base model; one that names a local folder needs `--base-model-id`, the Hub id the
uploaded `adapter_config.json` and `config.json` then name instead. The token comes from the usual
huggingface_hub sources (`HF_TOKEN`, `hf auth login`) and is never printed.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from moe_embed.errors import UsageError, run_cli
from moe_embed.files import read_json
from moe_embed.folders import PICKLE_SUFFIXES, open_model_folder
from moe_embed.modeling.manifest import HUB_TAGS, MODEL_TYPE_TAGS
from moe_embed.options import option, parse_options

logger = logging.getLogger(__name__)

# Loads the folder the way users will, in a fresh interpreter, and runs one forward pass each way.
VALIDATE = """
import json, sys
import torch
from transformers import AutoModel, AutoTokenizer
from sentence_transformers import SentenceTransformer
folder = sys.argv[1]
config = json.load(open(folder + "/config.json"))
prefix = next(iter((config.get("task_prefixes") or {"": ""}).values()))
tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
model = AutoModel.from_pretrained(folder, trust_remote_code=True).eval()
with torch.no_grad():
    out = model(**tokenizer([prefix + "a test sentence"], return_tensors="pt"))
assert torch.isfinite(out.last_hidden_state).all(), "non-finite outputs"
st = SentenceTransformer(folder, trust_remote_code=True)
names = list(st.prompts)
embedding = st.encode(["a test sentence"], prompt_name=names[0] if names else None)
assert embedding.shape[0] == 1
"""


def files_to_upload(folder: Path) -> list[Path]:
    """Files of the folder to publish: everything but pickles, hidden files and caches."""
    files = []
    for path in sorted(folder.rglob("*")):
        relative = path.relative_to(folder)
        if not path.is_file() or any(part.startswith(".") or part == "__pycache__" for part in relative.parts):
            continue
        if path.suffix in PICKLE_SUFFIXES:
            logger.warning("not uploading %s: pickle files are never published", relative)
            continue
        files.append(path)
    return files


def validate(folder: Path, offline: bool = True) -> None:
    """Load the folder in a fresh process and run a forward pass; UsageError if it fails.

    `offline=False` lets the process fetch what the folder names (the Hub base of an adapter folder)."""
    open_model_folder(folder, fetch=False)  # config, safetensors weights (headers read), nothing pickle-only
    env = {**os.environ, "HF_HUB_OFFLINE": "1"} if offline else dict(os.environ)
    result = subprocess.run(
        [sys.executable, "-c", VALIDATE, str(folder.resolve())], env=env, capture_output=True, text=True, cwd="/"
    )
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise UsageError(f"{folder} failed validation (load and forward pass in a fresh process): {last}")


def refreshed_card(folder: Path, repo_id: str, results: dict | None = None) -> str:
    """The folder's model card with Hub metadata ensured, usage snippets naming `repo_id` and, given `results`
    (`moe-embed evaluate --output`), their scores as its `model-index`."""
    from huggingface_hub import ModelCard

    from moe_embed.convert.cards import PLACEHOLDER_OWNER, build_card

    card = ModelCard.load(folder / "README.md") if (folder / "README.md").is_file() else build_card(folder, repo_id)
    if results:
        from moe_embed.convert.cards import eval_results

        card.data.model_name = repo_id.split("/")[-1]
        card.data.eval_results = eval_results(results)
    if not (folder / "README.md").is_file():
        return str(card)
    model_type = read_json(folder / "config.json").get("model_type")
    card.data.library_name = card.data.library_name or "sentence-transformers"
    card.data.pipeline_tag = card.data.pipeline_tag or "sentence-similarity"
    tags = list(card.data.tags or [])
    for tag in HUB_TAGS + MODEL_TYPE_TAGS.get(model_type, ()):
        if tag not in tags:
            tags.append(tag)
    card.data.tags = tags
    card.text = card.text.replace(f"{PLACEHOLDER_OWNER}/{folder.name}", repo_id)
    return str(card)


def adapter_files_naming(folder: Path, base_model_id: str | None) -> tuple[dict[str, bytes], bool]:
    """For an adapter-only folder: the files to upload in place of the folder's own (`adapter_config.json`
    and `config.json` naming `base_model_id`, when given) and whether the base it names now is a Hub
    id (which validation must be allowed to fetch); `({}, False)` for any other folder.

    An adapter naming a local folder as its base cannot be loaded by anyone else: refused without
    `base_model_id`."""
    if not (folder / "adapter_config.json").is_file():
        if base_model_id:
            raise UsageError("--base-model-id applies to adapter-only folders (with adapter_config.json)")
        return {}, False
    base = read_json(folder / "adapter_config.json").get("base_model_name_or_path")
    # a local folder: absolute, or relative to the adapter folder (as adapters name theirs) or to here
    local = bool(base) and (Path(base).is_absolute() or (folder / base).is_dir() or Path(base).exists())
    if not base_model_id:
        if local:
            raise UsageError(
                f"the adapter names the local folder {base} as its base, which others cannot fetch; "
                "pass --base-model-id with the Hub id of that model"
            )
        return {}, True
    if base_model_id.count("/") != 1:
        raise UsageError(f"--base-model-id must be a Hub id OWNER/NAME, got {base_model_id!r}")
    rewritten = {}
    for name in ("adapter_config.json", "config.json"):
        data = read_json(folder / name)
        data["base_model_name_or_path"] = base_model_id
        rewritten[name] = (json.dumps(data, indent=2) + "\n").encode()
    return rewritten, not local  # the local folder's own files still name the local base


def read_results(path) -> dict:
    """The JSON `moe-embed evaluate --output` wrote, checked entry by entry."""
    from moe_embed.convert.cards import eval_results

    try:
        results = read_json(path)
    except FileNotFoundError:
        raise UsageError(f"--results file {path} not found") from None
    except ValueError as error:
        raise UsageError(f"--results file {path} is not JSON: {error}") from None
    if not isinstance(results, dict) or not results:
        raise UsageError(f"--results file {path}: expected the scores `moe-embed evaluate --output` writes")
    eval_results(results, source=f"--results file {path}")  # every entry complete, before validating the model
    return results


@dataclass
class PushOptions:
    """What `push` publishes: the command line's options by their Python names (`moe-embed push --help`)."""

    model_dir: str | Path = option(
        required=True, positional=True, help="model folder written by this package's converters or training"
    )
    repo_id: str = option(required=True, help="target repository, OWNER/NAME")
    private: bool = option(False, help="create the repository as private")
    revision: str | None = option(help="branch to commit to (created if missing; default: main)")
    commit_message: str = option("Upload model with moe-embed", help="commit message")
    base_model_id: str | None = option(
        help="adapter-only folders: the Hub id of the base model, named in the uploaded adapter_config.json"
    )
    results: str | Path | None = option(
        help="scores of `moe-embed evaluate --output FILE` to publish in the card's model-index (as mteb writes them)"
    )

    def __post_init__(self):
        if self.repo_id.count("/") != 1 or not all(self.repo_id.split("/")):
            raise UsageError(f"--repo-id must look like OWNER/NAME, got {self.repo_id!r}")


def push(options: PushOptions) -> str:
    """Validate, then upload the folder to `options.repo_id` in one commit; returns the commit URL."""
    from huggingface_hub import CommitOperationAdd, HfApi

    folder = open_model_folder(options.model_dir, fetch=False).path
    results = read_results(options.results) if options.results else None
    rewritten, hub_base = adapter_files_naming(folder, options.base_model_id)
    logger.info("validating %s", folder)
    validate(folder, offline=not hub_base)
    operations = [
        CommitOperationAdd(
            path_in_repo=path.relative_to(folder).as_posix(),
            path_or_fileobj=rewritten.get(path.relative_to(folder).as_posix(), str(path)),
        )
        for path in files_to_upload(folder)
        if path.relative_to(folder).as_posix() != "README.md"
    ]
    card = refreshed_card(folder, options.repo_id, results).encode()
    operations.append(CommitOperationAdd(path_in_repo="README.md", path_or_fileobj=card))
    api = HfApi()
    try:
        api.create_repo(options.repo_id, private=options.private, exist_ok=True)
        if options.revision and options.revision != "main":
            api.create_branch(options.repo_id, branch=options.revision, exist_ok=True)
        commit = api.create_commit(
            options.repo_id, operations=operations, commit_message=options.commit_message, revision=options.revision
        )
    except Exception as error:  # HTTP and auth errors: report the message, never the token
        raise UsageError(
            f"upload to {options.repo_id} failed: {type(error).__name__}: {str(error).splitlines()[0]}"
        ) from None
    print(f"uploaded {len(operations)} files to {options.repo_id}: {commit.commit_url}")
    return commit.commit_url


def main(argv: list[str] | None = None, prog: str | None = None) -> str:
    return push(parse_options(PushOptions, argv, __doc__, prog))


if __name__ == "__main__":
    run_cli(main)
