"""The training config: typed dataclasses with per-field help, read from YAML.

`TrainingConfig` is the one description of every option: `load_config` checks a YAML file
against it (an unknown key is an error naming the closest valid one, a value of the wrong type is
an error naming the expected type), and `describe_options` renders the option list that
`python -m moe_embed.training.train --help` prints.
"""

from __future__ import annotations

import typing
from dataclasses import MISSING, dataclass, fields
from pathlib import Path

from moe_embed.convert.options import arch_options
from moe_embed.training.tasks import TASK_TYPES, task_type
from moe_embed.usage import UsageError, from_mapping, option, type_name

CURRICULA = ("task_aware", "static")
ARCHES = ("mote", "moe", "comoe", "lora")
TRAINABLE = ("all", "experts")
REGULARIZERS = ("none", "distill", "l2")


def _help(text: str, default=MISSING, **kwargs):
    """A config field carrying its help text (as peft's and transformers' configs do): the command line's
    `option`, with the text first, as the YAML's keys read best."""
    return option(default, help=text, required=default is MISSING and "default_factory" not in kwargs, **kwargs)


@dataclass
class DatasetSpec:
    """One training set: a local file (`path`) or a Hub dataset (`hub`), in one of
    `moe_embed.training.datasets.FORMATS`."""

    path: str | None = _help(
        "local file or folder: absolute, relative to the working directory, or starting with {data}/ for the data "
        "folder (give path or hub)",
        None,
    )
    hub: str | None = _help(
        "Hub dataset id, e.g. sentence-transformers/all-nli, read with datasets.load_dataset (from the data "
        "folder's copy when it has one)",
        None,
    )
    subset: str | None = _help("hub: the dataset's subset (config name), e.g. triplet", None)
    revision: str | None = _help("hub: a branch, tag or commit (default: the catalogue's pin, else main)", None)
    columns: list[str] | None = _help(
        "hub pairs: the columns that become anchor, positive[, negative], in that order (default: the "
        "dataset's columns in order, as sentence-transformers reads them)",
        None,
    )
    name: str | None = _help("name of the dataset's trainer entry (default: the file's stem or the Hub name)", None)
    format: str = _help(
        "pairs (anchor/positive[/negative] rows), labelled (text and label: texts paired by label) or beir "
        "(query -> relevant document)",
        "pairs",
    )
    text: str = _help("labelled: the text column", "text")
    label: str = _help("labelled: the label column", "label")
    split: str = _help("the split to read (beir: the qrels split)", "train")
    max_rows: int | None = _help("keep this many rows, with pairwise different positives", None)
    sample_seed: int = _help("seed of that sample (fixed, so runs with other seeds train on the same rows)", 0)

    def __post_init__(self):
        from moe_embed.training.datasets import FORMATS

        if (self.path is None) == (self.hub is None):
            raise UsageError(f"a dataset needs exactly one of path or hub, got path={self.path!r}, hub={self.hub!r}")
        if self.hub is not None and (self.hub.count("/") != 1 or not all(self.hub.split("/"))):
            raise UsageError(f"hub expects a Hub dataset id like sentence-transformers/all-nli, got {self.hub!r}")
        if self.format not in FORMATS:
            raise UsageError(f"unknown dataset format {self.format!r}; expected one of {', '.join(FORMATS)}")
        if self.max_rows is not None and self.max_rows < 1:
            raise UsageError(f"max_rows must be at least 1, got {self.max_rows}")
        if self.columns is not None and not 2 <= len(self.columns) <= 3:
            raise UsageError(f"columns names 2 or 3 columns (anchor, positive[, negative]), got {self.columns!r}")

    def entry_name(self) -> str:
        """The trainer entry's name: `name`, else the Hub dataset's name, else the file's stem (a labelled
        split: its folder's name)."""
        if self.name or self.hub:
            return self.name or self.hub.split("/")[1]
        path = Path(self.path)
        return {"labelled": path.parent.name, "beir": path.name}.get(self.format, path.stem)


@dataclass
class LossConfig:
    """Options of the contrastive loss (`loss:`)."""

    cached_mini_batch_size: int | None = _help(
        "GradCache: CachedMultipleNegativesRankingLoss with this mini-batch size (large batches in small memory)",
        None,
    )
    matryoshka_dims: list[int] | None = _help("MatryoshkaLoss over these embedding sizes, e.g. [384, 128]", None)
    gather_across_devices: bool = _help("in-batch negatives from all data-parallel ranks", False)

    def __post_init__(self):
        if self.cached_mini_batch_size is not None and self.cached_mini_batch_size < 1:
            raise UsageError(
                f"loss.cached_mini_batch_size must be a positive integer, got {self.cached_mini_batch_size!r}"
            )
        if self.matryoshka_dims is not None and (not self.matryoshka_dims or min(self.matryoshka_dims) < 1):
            raise UsageError(f"loss.matryoshka_dims must be a list of positive integers, got {self.matryoshka_dims!r}")


def _check_adapter(adapter) -> None:
    if adapter.lora_rank < 1:
        raise UsageError(f"adapter.lora_rank must be a positive integer, got {adapter.lora_rank}")


AdapterConfig = arch_options(
    "comoe",
    name="AdapterConfig",
    module=__name__,
    doc="Adapters trained on a frozen dense `model` (`adapter:`, used with `arch: comoe` or `arch: lora`): the "
    "options of `moe-embed upcycle --arch comoe`, declared once in `convert/options.py`; `arch: lora` reads the "
    "LoRA ones (rank, alpha, dropout, target modules, layers).",
    exclude=("seed",),  # the run's `seed`
    post_init=_check_adapter,
)


@dataclass
class RegularizerConfig:
    """A term that keeps the model close to where it started (`regularizer:`)."""

    kind: str = _help(
        "none; distill: 1 - cosine to the frozen starting model's embeddings of the batch's own texts; "
        "l2: squared distance of the trained weights to their starting values",
        "none",
    )
    weight: float = _help("weight of the term in the loss", 1.0)

    def __post_init__(self):
        if self.kind not in REGULARIZERS:
            raise UsageError(f"unknown regularizer.kind {self.kind!r}; expected one of {', '.join(REGULARIZERS)}")
        if self.weight < 0:
            raise UsageError(f"regularizer.weight must be >= 0, got {self.weight}")


@dataclass
class DevConfig:
    """Checkpoint selection on development sets that are not test splits (`dev:`)."""

    tasks: list[str] = _help("dev sets, scored as the suite scores them (by mteb): stsb-dev, scifact-train")
    eval_steps: int = _help("score them before training and every N steps; the best step's weights are saved", 50)

    def __post_init__(self):
        from moe_embed.evaluation.tasks import DEV_SETS

        unknown = [name for name in self.tasks if name not in DEV_SETS]
        if unknown or not self.tasks:
            raise UsageError(f"unknown dev.tasks {unknown or self.tasks}; expected names from {', '.join(DEV_SETS)}")
        if self.eval_steps < 1:
            raise UsageError(f"dev.eval_steps must be at least 1, got {self.eval_steps}")


@dataclass
class TrainingConfig:
    """A TA-CL training run (`moe-embed train --config FILE.yaml`)."""

    tasks: dict[str, list[DatasetSpec]] = _help(
        f"task type ({', '.join(TASK_TYPES)}) -> list of datasets, each {{name, path}}"
    )
    model: str | None = _help(
        "model folder or Hub id to train: MoTE, token-routed MoE, CoMoE or dense (default: the bundled "
        "all-MiniLM-L6-v2)",
        None,
    )
    trust_remote_code: bool = _help("allow the model folder's own code (MoTE, MoE)", False)
    data_dir: str | None = _help(
        "the folder {data} stands for in dataset paths, as `moe-embed data download DIR` writes it "
        "(default: $MOE_EMBED_DATA)",
        None,
    )
    model_kwargs: dict | None = _help(
        "keyword arguments for the transformers model (SentenceTransformer model_kwargs)", None
    )
    config_kwargs: dict | None = _help("config overrides, e.g. {hidden_dropout_prob: 0.1}", None)
    output_dir: str = _help("where the trained model (and checkpoints) are saved", "models/tacl")
    overwrite_output_dir: bool = _help(
        "replace an existing output_dir (else the run is refused before training; never the model folder itself)",
        False,
    )
    seed: int = _help("seed of the trainer, the sampler and the dataset shuffles", 0)
    batch_size: int = _help("rows per batch and device", 32)
    max_steps: int = _help("optimizer steps; -1 trains for `epochs` instead", -1)
    epochs: float = _help("passes over the data when max_steps is -1", 1.0)
    learning_rate: float = _help("peak learning rate", 2e-5)
    expert_learning_rate: float | None = _help(
        "peak learning rate of the expert parameters (default: learning_rate); see `trainable`", None
    )
    lr_scheduler_type: str = _help("learning-rate schedule after warm-up: linear, cosine, constant, ...", "linear")
    warmup_steps: int = _help("linear warm-up steps", 0)
    warmup_ratio: float = _help("linear warm-up as a share of the steps (instead of warmup_steps)", 0.0)
    save_steps: int = _help("save a checkpoint in output_dir/checkpoint-N every N steps; 0 saves none", 0)
    logging_steps: int = _help("log the loss every N steps", 10)
    ddp_backend: str | None = _help("data-parallel backend (default: gloo when launched on CPU)", None)
    max_seq_length: int | None = _help(
        "truncate training inputs to this many tokens (the saved model keeps its own)", None
    )
    curriculum: str = _help(
        "task_aware (TA-CL: per-task entries, prompts and temperatures) or static (one mixed entry, "
        "prompts written into the text, one temperature)",
        "task_aware",
    )
    temperature: float = _help("InfoNCE temperature of the static curriculum (task_aware uses each task type's)", 0.03)
    loss: LossConfig = _help(
        "loss options: cached_mini_batch_size, matryoshka_dims, gather_across_devices", default_factory=LossConfig
    )
    arch: str | None = _help(
        "upcycle the dense `model` first and train the result: mote or moe (`moe-embed upcycle` with the "
        "`upcycle` options), comoe (CoMoE-PEFT with the `adapter` options) or lora (peft LoRA, saved merged)",
        None,
    )
    upcycle: dict | None = _help(
        "arch mote / moe: options of `moe-embed upcycle` by their Python names, e.g. {expert_layers: all}", None
    )
    trainable: str = _help(
        "all, or experts: only the expert parameters train (MoTE's task experts, the MoE's experts and "
        "routers, adapters; on a dense model the blocks MoTE turns into experts); the rest stays bit-identical",
        "all",
    )
    regularizer: RegularizerConfig = _help(
        "keep the model close to where it started: kind (none, distill, l2) and weight",
        default_factory=RegularizerConfig,
    )
    dev: DevConfig | None = _help(
        "choose the checkpoint on dev sets: tasks and eval_steps (the data folder as for {data})", None
    )
    adapter: AdapterConfig = _help("adapter options for arch comoe / lora", default_factory=AdapterConfig)
    save_adapter_only: bool = _help(
        "CoMoE: write the adapter-only folder (adapter_config.json naming the base) instead of the full one", False
    )

    def __post_init__(self):
        if self.model == "":
            raise UsageError("`model` must name a model folder or Hub id (or be left out: the bundled MiniLM)")
        if not self.tasks:
            raise UsageError("`tasks` must map at least one task type to its datasets")
        for name, specs in self.tasks.items():
            try:
                task_type(name)
            except ValueError as error:
                raise UsageError(str(error)) from None
            if not specs:
                raise UsageError(f"task {name!r} lists no datasets")
        if self.curriculum not in CURRICULA:
            raise UsageError(f"unknown curriculum {self.curriculum!r}; expected one of {', '.join(CURRICULA)}")
        if self.arch is not None and self.arch not in ARCHES:
            raise UsageError(f"unknown arch {self.arch!r}; expected one of {', '.join(ARCHES)} (or leave it out)")
        if self.upcycle and self.arch not in ("mote", "moe"):
            raise UsageError("`upcycle` options apply to arch mote / moe (CoMoE and LoRA take `adapter`)")
        if self.trainable not in TRAINABLE:
            raise UsageError(f"unknown trainable {self.trainable!r}; expected one of {', '.join(TRAINABLE)}")
        from transformers.trainer_utils import SchedulerType

        schedules = [s.value for s in SchedulerType]
        if self.lr_scheduler_type not in schedules:
            raise UsageError(
                f"unknown lr_scheduler_type {self.lr_scheduler_type!r}; expected one of {', '.join(schedules)}"
            )
        if not 0 <= self.warmup_ratio < 1:
            raise UsageError(f"warmup_ratio must lie in [0, 1), got {self.warmup_ratio}")
        if self.warmup_ratio and self.warmup_steps:
            raise UsageError("give warmup_steps or warmup_ratio, not both")
        for name in ("learning_rate", "expert_learning_rate"):
            if getattr(self, name) is not None and getattr(self, name) <= 0:
                raise UsageError(f"{name} must be positive, got {getattr(self, name)}")
        if self.save_adapter_only and self.arch == "lora":
            raise UsageError("save_adapter_only applies to CoMoE; a LoRA run is saved merged into a plain model")
        if self.temperature <= 0:
            raise UsageError(f"temperature must be a positive number, got {self.temperature!r}")
        for name in ("batch_size", "logging_steps"):
            if getattr(self, name) < 1:
                raise UsageError(f"{name} must be at least 1, got {getattr(self, name)}")
        for name in ("warmup_steps", "save_steps"):
            if getattr(self, name) < 0:
                raise UsageError(f"{name} must be at least 0, got {getattr(self, name)}")


def load_config(path: Path) -> TrainingConfig:
    """The YAML config at `path` as a `TrainingConfig` (a `UsageError` for anything wrong in it)."""
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"config file {path} not found") from None
    except yaml.YAMLError as error:
        raise UsageError(f"{path} is not valid YAML: {str(error).splitlines()[0]}") from None
    return from_mapping(TrainingConfig, data if data is not None else {})


def describe_options(cls=TrainingConfig, indent: str = "  ") -> str:
    """The option list of `cls` (name, type, default, help), generated from its fields."""
    hints = typing.get_type_hints(cls)
    lines = []
    for f in fields(cls):
        if f.default is not MISSING:
            stated = f.default is None or "default" in f.metadata["help"]
            default = "" if stated else f" (default: {f.default})"
        elif f.default_factory is not MISSING:
            default = ""
        else:
            default = " (required)"
        lines.append(f"{indent}{f.name}: {type_name(hints[f.name])}{default}\n{indent}    {f.metadata['help']}")
        nested = hints[f.name]
        if isinstance(nested, type) and hasattr(nested, "__dataclass_fields__"):
            lines.append(describe_options(nested, indent + "    "))
    return "\n".join(lines)


__all__ = [
    "TrainingConfig",
    "LossConfig",
    "AdapterConfig",
    "RegularizerConfig",
    "DevConfig",
    "ARCHES",
    "TRAINABLE",
    "DatasetSpec",
    "CURRICULA",
    "load_config",
    "from_mapping",
    "describe_options",
]
