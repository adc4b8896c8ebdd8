"""Upcycle a dense BERT-style checkpoint into an expert model folder.

    python convert/upcycle.py                                  # bundled all-MiniLM-L6-v2 -> models/mote-minilm
    python convert/upcycle.py --base sentence-transformers/all-mpnet-base-v2 --expert-layers all

Every expert starts as a copy of the dense layer it replaces, so the untrained model computes the
dense model's function; the converter checks that before writing. The output folder loads with
`AutoModel.from_pretrained(..., trust_remote_code=True)` and `SentenceTransformer(..., trust_remote_code=True)`.
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as `python convert/upcycle.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch
from tqdm.auto import tqdm

from convert.checkpoint import (
    HUB_CARDS_DIR,
    ConversionError,
    atomic_output_dir,
    copy_modeling_files,
    copy_tokenizer_files,
    encoder_config_kwargs,
    map_state_dict,
    parse_dtype,
    read_dense_checkpoint,
    resolve_source,
    run_cli,
    tokenizer_files,
    write_sentence_transformers_files,
)
from modeling.configuration_mote import DEFAULT_TASK_PREFIXES, MoteBertConfig
from modeling.modeling_mote import MoteBertModel

logger = logging.getLogger("upcycle")

MOTE_FILES = ["configuration_encoder.py", "modeling_encoder.py", "configuration_mote.py", "modeling_mote.py"]
# Dense keys of layer N that become expert keys in a MoTE layer (expert = these four modules).
_MOTE_EXPERT_KEY = re.compile(r"^encoder\.layer\.(\d+)\.(attention\.output\.LayerNorm|intermediate|output)\.(.+)$")


def parse_tasks(specs: list[str]) -> dict[str, str]:
    """`NAME=PREFIX` (or a bare known NAME) per task, in order, to `{name: prefix}`."""
    tasks = {}
    for spec in specs:
        name, sep, prefix = spec.partition("=")
        name = name.strip()
        if not sep:
            if name not in DEFAULT_TASK_PREFIXES:
                raise ConversionError(
                    f"task {name!r} needs a prefix: write {name}='{name}: ' (known defaults: "
                    f"{', '.join(DEFAULT_TASK_PREFIXES)})"
                )
            prefix = DEFAULT_TASK_PREFIXES[name]
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise ConversionError(f"task name {name!r} must be an identifier (letters, digits, underscores)")
        if not prefix.strip():
            raise ConversionError(f"task {name!r} has an empty prefix; routing by prefix needs text")
        if name in tasks:
            raise ConversionError(f"task {name!r} is given twice")
        tasks[name] = prefix
    if not tasks:
        raise ConversionError("--tasks needs at least one task")
    return tasks


def prefix_token_ids(tokenizer, prefix: str) -> list[int]:
    """Token ids every input starting with `prefix` starts with (leading special tokens included).

    Found as the common start of two tokenized texts that begin with the prefix and then differ in
    their first character, so it works for WordPiece, BPE and SentencePiece alike.
    """
    first = tokenizer(prefix + "hello world")["input_ids"]
    second = tokenizer(prefix + "42 apples")["input_ids"]
    common = []
    for a, b in zip(first, second):
        if a != b:
            break
        common.append(a)
    bare = tokenizer("hello world")["input_ids"]
    leading = 0
    while leading < len(bare) and leading < len(common) and bare[leading] == common[leading] and bare[leading] in tokenizer.all_special_ids:
        leading += 1
    if len(common) <= leading:
        raise ConversionError(f"prefix {prefix!r} produces no tokens of its own with this tokenizer")
    return common


def mote_rename(expert_layers: set[int], num_tasks: int):
    """Dense key -> MoTE keys: expert parts of expert layers go to every expert, the rest is shared."""

    def rename(key: str) -> list[str]:
        match = _MOTE_EXPERT_KEY.match(key)
        if match is None or int(match.group(1)) not in expert_layers:
            return [key]
        layer, part, rest = match.groups()
        part = "attention_LayerNorm" if part == "attention.output.LayerNorm" else part
        return [f"encoder.layer.{layer}.experts.{e}.{part}.{rest}" for e in range(num_tasks)]

    return rename


def build_mote(args, source: Path, dense_config: dict, dense_state: dict) -> tuple[MoteBertModel, dict]:
    """The upcycled MoteBertModel (fp32) and the template variables for its model card."""
    from transformers import AutoTokenizer

    tasks = parse_tasks(args.tasks)
    tokenizer = AutoTokenizer.from_pretrained(str(source))
    prefix_ids = {name: prefix_token_ids(tokenizer, prefix) for name, prefix in tasks.items()}
    seen = {}
    for name, ids in prefix_ids.items():
        if tuple(ids) in seen:
            raise ConversionError(f"tasks {seen[tuple(ids)]!r} and {name!r} have prefixes that tokenize identically")
        seen[tuple(ids)] = name
    try:
        config = MoteBertConfig(
            **encoder_config_kwargs(dense_config, dense_state),
            tasks=list(tasks),
            task_prefixes=tasks,
            task_prefix_ids=prefix_ids,
            default_task=args.default_task,
            expert_layers=args.expert_layers,
        )
    except ValueError as error:
        raise ConversionError(str(error)) from None
    with torch.device("meta"):
        model = MoteBertModel(config)
    shapes = {k: v.shape for k, v in model.state_dict().items()}
    mapped = map_state_dict(dense_state, shapes, mote_rename(set(config.expert_layers), config.num_tasks))
    # Each expert gets its own copy: tensors must not share memory in safetensors.
    mapped = {k: v.detach().clone().float().contiguous() for k, v in tqdm(mapped.items(), desc="upcycling", unit="tensor")}
    model.load_state_dict(mapped, strict=True, assign=True)
    model.eval()
    return model, tokenizer


def verify_against_dense(model: MoteBertModel, tokenizer, source: Path, dense_state: dict) -> float:
    """Largest |difference| between the upcycled and the dense model's hidden states, over all tasks."""
    from transformers import AutoConfig, AutoModel

    dense_config = AutoConfig.from_pretrained(str(source))
    dense = AutoModel.from_config(dense_config, add_pooling_layer=model.pooler is not None).eval()
    dense.load_state_dict(dense_state, strict=False)
    texts = ["Isaac Newton formulated the laws of motion.", "a short text"]
    worst = 0.0
    with torch.no_grad():
        for task in model.config.tasks:
            batch = tokenizer([model.config.task_prefixes[task] + t for t in texts], padding=True, return_tensors="pt")
            reference = dense(**batch).last_hidden_state
            routed = model(**batch).last_hidden_state  # routed by the prefix it starts with
            mask = batch["attention_mask"].bool()
            worst = max(worst, (reference - routed)[mask].abs().max().item())
    return worst


def source_license(source: Path) -> str | None:
    """The `license` in the source model card's metadata, if it has one."""
    from huggingface_hub import ModelCard

    try:
        return ModelCard.load(source / "README.md").data.license
    except Exception:  # no card, or a card without metadata: the license is unknown
        return None


def render_card(target: Path, model: MoteBertModel, prompts: dict[str, str], base_name: str, repo_id: str,
                untrained: bool, license_id: str | None) -> None:
    """README.md model card from `hub_cards/mote.md`."""
    from huggingface_hub import ModelCard, ModelCardData

    config = model.config
    names = {task: [task] for task in config.tasks}
    for alias, task in config.task_aliases.items():
        names[task].append(alias)
    total = sum(p.numel() for p in model.parameters())
    per_expert = sum(p.numel() for p in model.encoder.layer[config.expert_layers[0]].experts[0].parameters())
    active = total - per_expert * len(config.expert_layers) * (config.num_tasks - 1)
    base_is_hub_id = not Path(base_name).is_absolute() and "/" in base_name
    card_data = ModelCardData(
        library_name="sentence-transformers",
        pipeline_tag="sentence-similarity",
        tags=["sentence-transformers", "feature-extraction", "mixture-of-experts", "mote", "moe-embed"],
        base_model=base_name if base_is_hub_id else None,
        license=license_id,
    )
    card = ModelCard.from_template(
        card_data,
        template_path=str(HUB_CARDS_DIR / "mote.md"),
        model_name=repo_id.split("/")[-1],
        repo_id=repo_id,
        base_model_name=base_name,
        base_model_link=f"https://huggingface.co/{base_name}" if base_is_hub_id else "#",
        expert_layers=config.expert_layers,
        num_layers=config.num_hidden_layers,
        num_tasks=config.num_tasks,
        hidden_size=config.hidden_size,
        source_model_type=config.source_model_type,
        untrained=untrained,
        task_rows=[
            {"task": t, "prefix": config.task_prefixes[t], "names": ", ".join(f"`{n}`" for n in names[t])}
            for t in config.tasks
        ],
        prompt_names=", ".join(f"`{name}`" for name in prompts),
        query_prefix=config.task_prefixes.get("query", next(iter(config.task_prefixes.values()))),
        total_params=f"{total / 1e6:.1f}M",
        active_params=f"{active / 1e6:.1f}M",
    )
    card.save(str(target / "README.md"))


def upcycle_mote(args) -> Path:
    """Write a MoTE model folder for `args`; returns its path."""
    source = resolve_source(args.base)
    base_name = args.base or "sentence-transformers/all-MiniLM-L6-v2"
    logger.info("reading dense checkpoint %s", source)
    dense_config, dense_state = read_dense_checkpoint(source)
    tokenizer_files(source)
    dtype = parse_dtype(args.dtype)
    output = Path(args.output)
    if output.exists() and not args.overwrite:  # refuse before any work
        raise ConversionError(f"{output} already exists; pass --overwrite to replace it")
    model, tokenizer = build_mote(args, source, dense_config, dense_state)
    if not args.no_verify:
        worst = verify_against_dense(model, tokenizer, source, dense_state)
        logger.info("max |upcycled - dense| over all tasks: %.2e", worst)
        if worst > 1e-4:
            raise ConversionError(f"upcycled model differs from the dense model by {worst:.2e} (> 1e-4)")
    model = model.to(dtype)
    prompts = dict(model.config.task_prefixes)
    if "document" in prompts:
        prompts.setdefault("passage", prompts["document"])
    with atomic_output_dir(output, args.overwrite) as tmp:
        type(model.config).register_for_auto_class()
        type(model).register_for_auto_class("AutoModel")
        model.save_pretrained(tmp, max_shard_size=args.max_shard_size)
        copy_modeling_files(tmp, MOTE_FILES + ["st_mote.py"])
        copy_tokenizer_files(source, tmp)
        write_sentence_transformers_files(source, tmp, "st_mote.MoteTransformer", prompts)
        render_card(tmp, model, prompts, base_name, args.repo_id or f"your-name/{output.name}", untrained=True,
                    license_id=source_license(source))
    logger.info("wrote %s (%s, tasks %s, expert layers %s)", output, args.dtype, model.config.tasks,
                model.config.expert_layers)
    return output


ARCHITECTURES = {"mote": upcycle_mote}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Upcycle a dense bert/roberta/xlm-roberta checkpoint into an expert model folder.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--arch", choices=sorted(ARCHITECTURES), default="mote",
                        help="expert architecture: mote = one expert per task, routed per sequence by instruction")
    parser.add_argument("--base", default=None,
                        help="local folder or Hub id of the dense checkpoint (default: the bundled all-MiniLM-L6-v2)")
    parser.add_argument("--output", default="models/mote-minilm", help="folder to write")
    parser.add_argument("--overwrite", action="store_true", help="replace --output if it exists")
    parser.add_argument("--tasks", nargs="+", default=[f"{t}={p}" for t, p in DEFAULT_TASK_PREFIXES.items()],
                        metavar="NAME=PREFIX", help="tasks in expert order, each NAME=PREFIX (or a known NAME alone)")
    parser.add_argument("--expert-layers", default="every_other",
                        help="layers that get experts: all, every_other (1,3,5,...) or comma-separated indices")
    parser.add_argument("--default-task", default=None,
                        help="task for inputs that name none and carry no prefix (default: such inputs are an error)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"],
                        help="dtype of the saved weights")
    parser.add_argument("--max-shard-size", default="2GB", help="safetensors shard size above which weights are split")
    parser.add_argument("--repo-id", default=None, help="Hub id shown in the model card's usage snippets")
    parser.add_argument("--no-verify", action="store_true",
                        help="skip the check that the upcycled model reproduces the dense model")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    ARCHITECTURES[args.arch](args)


if __name__ == "__main__":
    run_cli(main)
