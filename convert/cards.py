"""Model cards: rendered from `hub_cards/<template>.md` with `huggingface_hub.ModelCard`, from what a
model folder holds (config, prompts, weight shapes), so every converter describes a folder the
same way."""

from __future__ import annotations

from pathlib import Path

from moe_embed.convert.layout import is_comoe_expert_key, parse_moe_key, parse_mote_key
from moe_embed.errors import UsageError
from moe_embed.files import read_json
from moe_embed.modeling.manifest import HUB_TAGS, MODEL_TYPE_TAGS

HUB_CARDS_DIR = Path(__file__).resolve().parent.parent / "hub_cards"

TEMPLATES = {
    "mote_bert": "mote.md",
    "moe_bert": "moe.md",
    "comoe_bert": "comoe.md",
}  # anything else: a dense export, dense.md
PLACEHOLDER_OWNER = "your-name"


def source_license(folder: Path) -> str | None:
    """The `license` in a model folder's card metadata, if it has one."""
    from huggingface_hub import ModelCard

    try:
        return ModelCard.load(Path(folder) / "README.md").data.license
    except Exception:  # no card, or a card without metadata: the license is unknown
        return None


def weight_shapes(folder: Path) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor in the folder's safetensors files (headers only, no data read)."""
    from safetensors import safe_open

    shapes = {}
    for path in sorted(Path(folder).glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as handle:
            for name in handle.keys():
                shapes[name] = tuple(handle.get_slice(name).get_shape())
    return shapes


def _numel(shape) -> int:
    count = 1
    for size in shape:
        count *= size
    return count


def parameter_counts(config: dict, shapes: dict) -> tuple[int, int]:
    """(total, active per token) parameter counts of a folder's weights."""
    total = sum(_numel(s) for s in shapes.values())
    if config.get("model_type") == "mote_bert":
        per_layer_experts: dict[int, dict[int, int]] = {}  # layer -> expert -> parameters
        for key, shape in shapes.items():
            parsed = parse_mote_key(key)
            if parsed is not None:
                layer, expert, _ = parsed
                experts = per_layer_experts.setdefault(layer, {})
                experts[expert] = experts.get(expert, 0) + _numel(shape)
        inactive = sum(sum(sizes.values()) - max(sizes.values()) for sizes in per_layer_experts.values())
        return total, total - inactive
    if config.get("model_type") == "moe_bert":
        stacked = sum(_numel(s) for k, s in shapes.items() if (parsed := parse_moe_key(k)) and parsed[1])  # not routers
        unused = config["num_local_experts"] - config["num_experts_per_tok"]
        return total, total - stacked * unused // config["num_local_experts"]
    if config.get("model_type") == "comoe_bert":  # LoRA experts: only top-k of E are used per token
        experts = sum(_numel(s) for k, s in shapes.items() if is_comoe_expert_key(k))
        unused = config["num_local_experts"] - config["num_experts_per_tok"]
        return total, total - experts * unused // config["num_local_experts"]
    return total, total


def looks_like_hub_id(name: str | None) -> bool:
    """Whether a model name is a Hub id (`owner/name`) rather than a local folder."""
    return bool(name) and not Path(name).exists() and "/" in name


def from_template(template: str, card_data=None, **context):
    """The one renderer of cards: `hub_cards/<template>` rendered with `context` (Jinja, as huggingface_hub renders
    a card). With `card_data` (`ModelCardData`, the Hub metadata), a `huggingface_hub.ModelCard`; without, the
    card's text (an ONNX folder's card, which has no metadata)."""
    import jinja2
    from huggingface_hub import ModelCard

    path = HUB_CARDS_DIR / template
    if card_data is not None:
        return ModelCard.from_template(card_data, template_path=str(path), **context)
    return jinja2.Template(path.read_text(encoding="utf-8")).render(**context)


def write_card(folder: Path, template: str, card_data=None, **context) -> None:
    """Write `folder/README.md` rendered from `hub_cards/<template>` (see `from_template`)."""
    card = from_template(template, card_data, **context)
    path = Path(folder) / "README.md"
    if card_data is not None:
        card.save(str(path))
    else:
        path.write_text(card, encoding="utf-8")


def card_metadata(model_type: str | None, tags=(), base_model: str | None = None, license_id: str | None = None):
    """The Hub metadata of a card: sentence-transformers' library and pipeline, the tags of the package, of the
    folder's model type and `tags`, the base model (a Hub id) and the license."""
    from huggingface_hub import ModelCardData

    return ModelCardData(
        library_name="sentence-transformers",
        pipeline_tag="sentence-similarity",
        tags=list(dict.fromkeys(HUB_TAGS + MODEL_TYPE_TAGS.get(model_type, ()) + tuple(tags))),
        base_model=base_model,
        license=license_id,
    )


def render_card(folder: Path, repo_id: str, **kwargs) -> None:
    """Write `folder/README.md` for the model the folder holds (arguments as `build_card`)."""
    build_card(folder, repo_id, **kwargs).save(str(Path(folder) / "README.md"))


def task_rows(config: dict) -> list[dict]:
    """A MoTE card's table of tasks: each task, its prefix and the names that reach it (its aliases)."""
    names = {}
    for alias, task in (config.get("task_aliases") or {}).items():
        names.setdefault(task, []).append(alias)
    return [
        {"task": t, "prefix": config["task_prefixes"][t], "names": ", ".join(f"`{n}`" for n in [t, *names.get(t, [])])}
        for t in config.get("tasks") or []
    ]


def build_card(
    folder: Path,
    repo_id: str,
    base_model: str | None = None,
    base_is_hub_id: bool | None = None,
    license_id: str | None = None,
    untrained: bool = False,
    provenance: str | None = None,
    tags: tuple[str, ...] = (),
):
    """The `huggingface_hub.ModelCard` of the model a folder holds.

    `base_model` names the dense model it derives from; it goes into the metadata and gets a link
    only when it is a Hub id (`base_is_hub_id`, guessed from its form when `None`). `provenance`
    is a sentence on how the folder was made and `tags` what it is (dense exports: `MERGE_TAGS`), beside the
    tags of its model type.
    """
    folder = Path(folder)
    config = read_json(folder / "config.json")
    st_config = read_json(folder / "config_sentence_transformers.json")
    prompts = st_config.get("prompts") or {}
    model_type = config.get("model_type")
    total, active = parameter_counts(config, weight_shapes(folder))
    if base_is_hub_id is None:
        base_is_hub_id = looks_like_hub_id(base_model)
    return from_template(
        TEMPLATES.get(model_type, "dense.md"),
        card_metadata(model_type, tags, base_model if base_is_hub_id else None, license_id),
        model_name=repo_id.split("/")[-1],
        repo_id=repo_id,
        base_model_name=base_model or "a dense encoder",
        base_model_link=f"https://huggingface.co/{base_model}" if base_is_hub_id else "#",
        config=config,
        num_layers=config["num_hidden_layers"],
        hidden_size=config["hidden_size"],
        source_model_type=config.get("source_model_type", model_type),
        untrained=untrained,
        provenance=provenance,
        prompts=prompts,
        default_prompt_name=st_config.get("default_prompt_name"),
        prompt_names=", ".join(f"`{name}`" for name in prompts),
        query_prefix=prompts.get("query", next(iter(prompts.values()), "")),
        task_rows=task_rows(config),
        adapter_only=(folder / "adapter_config.json").is_file(),  # an adapter-only CoMoE folder
        adapter_params=f"{total / 1e6:.2f}M",
        total_params=f"{total / 1e6:.1f}M",
        active_params=f"{active / 1e6:.1f}M",
    )


def render_aea_card(folder: Path, settings: dict, source_name: str, repo_id: str) -> None:
    """Write the card of an AEA folder: its allocation (`aea_config.json`'s `settings`) per layer."""
    layers = zip(settings["homogeneity"], settings["model_top_k"], settings["layer_top_k"], strict=True)
    write_card(
        folder,
        "aea.md",
        card_metadata("aea", base_model=source_name if looks_like_hub_id(source_name) else None),
        model_name=repo_id.split("/")[-1],
        repo_id=repo_id,
        source_name=source_name,
        settings=settings,
        rows=[(i, s, k0, k) for i, (s, k0, k) in enumerate(layers)],
    )


RESULT_FIELDS = ("main_score", "metric", "type", "hf_task_type", "dataset", "revision", "subset", "split")


def eval_results(results: dict, source: str = "results") -> list:
    """`moe-embed evaluate --output`'s scores as the model card's `model-index` entries (`EvalResult`s, one per
    task, as mteb's own `TaskResult.get_hf_eval_results` writes them: scores 0-1, source MTEB), which the Hub
    shows on the model page and its leaderboards read."""
    from huggingface_hub import EvalResult

    entries = []
    for name, result in results.items():
        missing = [key for key in RESULT_FIELDS if not isinstance(result, dict) or key not in result]
        if missing:
            raise UsageError(
                f"{source}: task {name!r} lacks {missing}; expected the JSON `moe-embed evaluate --output` writes"
            )
        entries.append(
            EvalResult(
                task_type=result["hf_task_type"],
                task_name=result["type"],
                dataset_type=result["dataset"],
                dataset_name=f"{name} ({result['subset']})",
                dataset_config=result["subset"],
                dataset_split=result["split"],
                dataset_revision=result["revision"],
                metric_type=result["metric"],
                metric_name=result["metric"],
                metric_value=round(result["main_score"] / 100, 6),
                source_name="MTEB",
                source_url="https://github.com/embeddings-benchmark/mteb/",
            )
        )
    return entries
