"""The training config: typed dataclasses with per-field help, read from YAML.

`TrainingConfig` is the one description of every option: `load_config` checks a YAML file
against it (an unknown key is an error naming the closest valid one, a value of the wrong type is
an error naming the expected type), and `describe_options` renders the option list that
`python -m moe_embed.training.train --help` prints.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, fields, replace
from pathlib import Path
from typing import Literal

from moe_embed.convert.options import ARCH_OPTIONS, CoMoeOptions, UpcycleOptions
from moe_embed.errors import UsageError
from moe_embed.options import from_mapping, hints, option, type_name
from moe_embed.training.tasks import TASK_TYPES, task_type

CURRICULA = ("task_aware", "static")
# transformers' `SchedulerType` values, written here so that a config is checked without importing transformers
# (and torch: seconds); `tests/test_cli_contract.py` checks that they are the installed transformers' names
Schedule = Literal[
    "linear",
    "cosine",
    "cosine_with_restarts",
    "polynomial",
    "constant",
    "constant_with_warmup",
    "inverse_sqrt",
    "reduce_lr_on_plateau",
    "cosine_with_min_lr",
    "cosine_warmup_with_min_lr",
    "warmup_stable_decay",
    "greedy",
]
ARCHES = ("mote", "moe", "comoe", "lora")
TRAINABLE = ("all", "experts")
REGULARIZERS = ("none", "distill", "l2")


@dataclass
class DatasetSpec:
    """One training set: a local file (`path`) or a Hub dataset (`hub`), in one of
    `moe_embed.training.datasets.FORMATS`."""

    path: str | None = option(
        None,
        help="local file or folder: absolute, relative to the working directory, or starting with {data}/ for the data "
        "folder (give path or hub)",
    )
    hub: str | None = option(
        None,
        help="Hub dataset id, e.g. sentence-transformers/all-nli, read with datasets.load_dataset (from the data "
        "folder's copy when it has one)",
    )
    subset: str | None = option(None, help="hub: the dataset's subset (config name), e.g. triplet")
    revision: str | None = option(None, help="hub: a branch, tag or commit (default: the catalogue's pin, else main)")
    columns: list[str] | None = option(
        None,
        help="hub pairs: the columns that become anchor, positive[, negative], in that order (default: the "
        "dataset's columns in order, as sentence-transformers reads them)",
    )
    name: str | None = option(
        None, help="name of the dataset's trainer entry (default: the file's stem or the Hub name)"
    )
    format: str = option(
        "pairs",
        help="pairs (anchor/positive[/negative] rows), labelled (text and label: texts paired by label) or beir "
        "(query -> relevant document)",
    )
    text: str = option("text", help="labelled: the text column")
    label: str = option("label", help="labelled: the label column")
    split: str = option("train", help="the split to read (beir: the qrels split)")
    max_rows: int | None = option(None, help="keep this many rows, with pairwise different positives")
    sample_seed: int = option(0, help="seed of that sample (fixed, so runs with other seeds train on the same rows)")

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

    cached_mini_batch_size: int | None = option(
        None,
        help="GradCache: CachedMultipleNegativesRankingLoss with this mini-batch size (large batches in small memory)",
    )
    matryoshka_dims: list[int] | None = option(None, help="MatryoshkaLoss over these embedding sizes, e.g. [384, 128]")
    gather_across_devices: bool = option(False, help="in-batch negatives from all data-parallel ranks")

    def __post_init__(self):
        if self.cached_mini_batch_size is not None and self.cached_mini_batch_size < 1:
            raise UsageError(
                f"loss.cached_mini_batch_size must be a positive integer, got {self.cached_mini_batch_size!r}"
            )
        if self.matryoshka_dims is not None and (not self.matryoshka_dims or min(self.matryoshka_dims) < 1):
            raise UsageError(f"loss.matryoshka_dims must be a list of positive integers, got {self.matryoshka_dims!r}")


# the fields of `adapter:` (the CoMoE options) that the run sets itself: the base is `model`, the folder a scratch
# one, the seed the run's, the prompts the default ones; what is left are the CoMoE hyper-parameters
SET_BY_THE_RUN = tuple(f.name for f in fields(UpcycleOptions)) + ("seed",)


@dataclass
class RegularizerConfig:
    """A term that keeps the model close to where it started (`regularizer:`)."""

    kind: str = option(
        "none",
        help="none; distill: 1 - cosine to the frozen starting model's embeddings of the batch's own texts; "
        "l2: squared distance of the trained weights to their starting values",
    )
    weight: float = option(1.0, help="weight of the term in the loss")

    def __post_init__(self):
        if self.kind not in REGULARIZERS:
            raise UsageError(f"unknown regularizer.kind {self.kind!r}; expected one of {', '.join(REGULARIZERS)}")
        if self.weight < 0:
            raise UsageError(f"regularizer.weight must be >= 0, got {self.weight}")


@dataclass
class DevConfig:
    """Checkpoint selection on development sets that are not test splits (`dev:`)."""

    tasks: list[str] = option(
        required=True, help="dev sets, scored as the suite scores them (by mteb): stsb-dev, scifact-train"
    )
    eval_steps: int = option(50, help="score them before training and every N steps; the best step's weights are saved")

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

    tasks: dict[str, list[DatasetSpec]] = option(
        required=True, help=f"task type ({', '.join(TASK_TYPES)}) -> list of datasets, each {{name, path}}"
    )
    model: str | None = option(
        None,
        help="model folder or Hub id to train: MoTE, token-routed MoE, CoMoE or dense (default: the bundled "
        "all-MiniLM-L6-v2)",
    )
    trust_remote_code: bool = option(False, help="allow the model folder's own code (MoTE, MoE)")
    data_dir: str | None = option(
        None,
        help="the folder {data} stands for in dataset paths, as `moe-embed data download DIR` writes it "
        "(default: $MOE_EMBED_DATA)",
    )
    model_kwargs: dict | None = option(
        None, help="keyword arguments for the transformers model (SentenceTransformer model_kwargs)"
    )
    config_kwargs: dict | None = option(None, help="config overrides, e.g. {hidden_dropout_prob: 0.1}")
    output_dir: str = option("models/tacl", help="where the trained model (and checkpoints) are saved")
    overwrite_output_dir: bool = option(
        False,
        renamed_from="overwrite",
        renamed_why="the config's name",
        help="replace an existing output_dir (else the run is refused before training; never the model folder itself)",
    )
    seed: int = option(0, help="seed of the trainer, the sampler and the dataset shuffles")
    batch_size: int = option(32, help="rows per batch and device")
    max_steps: int = option(-1, help="optimizer steps; -1 trains for `epochs` instead")
    epochs: float = option(1.0, help="passes over the data when max_steps is -1")
    learning_rate: float = option(2e-5, help="peak learning rate")
    expert_learning_rate: float | None = option(
        None, help="peak learning rate of the expert parameters (default: learning_rate); see `trainable`"
    )
    lr_scheduler_type: Schedule = option("linear", help="learning-rate schedule after warm-up")
    warmup_steps: int = option(0, help="linear warm-up steps")
    warmup_ratio: float = option(0.0, help="linear warm-up as a share of the steps (instead of warmup_steps)")
    save_steps: int = option(0, help="save a checkpoint in output_dir/checkpoint-N every N steps; 0 saves none")
    logging_steps: int = option(10, help="log the loss every N steps")
    ddp_backend: str | None = option(None, help="data-parallel backend (default: gloo when launched on CPU)")
    max_seq_length: int | None = option(
        None, help="truncate training inputs to this many tokens (the saved model keeps its own)"
    )
    curriculum: str = option(
        "task_aware",
        help="task_aware (TA-CL: per-task entries, prompts and temperatures) or static (one mixed entry, "
        "prompts written into the text, one temperature)",
    )
    temperature: float = option(
        0.03, help="InfoNCE temperature of the static curriculum (task_aware uses each task type's)"
    )
    loss: LossConfig = option(
        help="loss options: cached_mini_batch_size, matryoshka_dims, gather_across_devices", default_factory=LossConfig
    )
    arch: str | None = option(
        None,
        help="upcycle the dense `model` first and train the result: mote or moe (`moe-embed upcycle` with the "
        "`upcycle` options), comoe (CoMoE-PEFT with the `adapter` options) or lora (peft LoRA, saved merged)",
    )
    upcycle: dict | None = option(
        None, help="arch mote / moe: options of `moe-embed upcycle` by their Python names, e.g. {expert_layers: all}"
    )
    trainable: str = option(
        "all",
        help="all, or experts: only the expert parameters train (MoTE's task experts, the MoE's experts and "
        "routers, adapters; on a dense model the blocks MoTE turns into experts); the rest stays bit-identical",
    )
    regularizer: RegularizerConfig = option(
        help="keep the model close to where it started: kind (none, distill, l2) and weight",
        default_factory=RegularizerConfig,
    )
    dev: DevConfig | None = option(
        None, help="choose the checkpoint on dev sets: tasks and eval_steps (the data folder as for {data})"
    )
    adapter: CoMoeOptions = option(
        help="adapter options for arch comoe / lora: the options of `moe-embed upcycle --arch comoe` by their Python "
        "names (arch lora reads the LoRA ones: rank, alpha, dropout, target modules, layers)",
        default_factory=CoMoeOptions,
    )
    save_adapter_only: bool = option(
        False, help="CoMoE: write the adapter-only folder (adapter_config.json naming the base) instead of the full one"
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
        self.upcycle_options(Path("."), Path("."))  # the `upcycle:` section checked now, not after the data is read
        if self.adapter.lora_rank < 1:
            raise UsageError(f"adapter.lora_rank must be a positive integer, got {self.adapter.lora_rank}")
        default = CoMoeOptions()
        given = [name for name in SET_BY_THE_RUN if getattr(self.adapter, name) != getattr(default, name)]
        if given:
            raise UsageError(
                f"adapter.{given[0]} is set by the run itself (`model`, `output_dir`, `seed`); `adapter:` takes the "
                "CoMoE hyper-parameters"
            )
        if self.trainable not in TRAINABLE:
            raise UsageError(f"unknown trainable {self.trainable!r}; expected one of {', '.join(TRAINABLE)}")
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

    def upcycle_options(self, base: Path, output: Path) -> UpcycleOptions | None:
        """The options `moe-embed upcycle` gets for `arch` mote / moe / comoe (the `upcycle:` section, CoMoE's
        `adapter:`) to upcycle the dense `base` into `output` with the run's seed; None for other runs."""
        if self.arch not in ARCH_OPTIONS:
            return None
        if self.arch == "comoe":
            return replace(self.adapter, base=str(base), output=output, seed=self.seed)
        values = {**(self.upcycle or {}), "base": str(base), "output": output}
        if self.arch != "mote":  # MoTE's upcycling is deterministic: it has no seed
            values.setdefault("seed", self.seed)
        return from_mapping(ARCH_OPTIONS[self.arch], values, "upcycle")


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
    resolved = hints(cls)
    lines = []
    hidden = SET_BY_THE_RUN if issubclass(cls, UpcycleOptions) else ()
    for f in [f for f in fields(cls) if f.name not in hidden]:
        if f.default is not MISSING:
            stated = f.default is None or "default" in f.metadata["help"]
            default = "" if stated else f" (default: {f.default})"
        elif f.default_factory is not MISSING:
            default = ""
        else:
            default = " (required)"
        lines.append(f"{indent}{f.name}: {type_name(resolved[f.name])}{default}\n{indent}    {f.metadata['help']}")
        nested = resolved[f.name]
        if isinstance(nested, type) and hasattr(nested, "__dataclass_fields__"):
            lines.append(describe_options(nested, indent + "    "))
    return "\n".join(lines)


__all__ = [
    "TrainingConfig",
    "LossConfig",
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
