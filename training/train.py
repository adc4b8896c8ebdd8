"""Task-aware contrastive learning (TA-CL) with SentenceTransformerTrainer, from a YAML config.

    python -m training.train --config training/configs/example.yaml

Config (see `training/configs/example.yaml`):

    model: models/mote-minilm        # folder or Hub id; MoTE, token-routed MoE or dense
    trust_remote_code: true
    config_kwargs: {hidden_dropout_prob: 0.1}   # optional: passed to SentenceTransformer (also model_kwargs)
    output_dir: models/mote-tacl
    seed: 0
    batch_size: 32
    max_steps: 100                   # or epochs: 1
    learning_rate: 2.0e-5
    save_steps: 50                   # checkpoints in output_dir/checkpoint-N (0: none)
    ddp_backend: gloo                # data-parallel backend (default: gloo when launched on CPU)
    max_seq_length: 128              # optional: truncate training inputs (the saved model keeps its own)
    curriculum: task_aware           # or `static` (one entry, heterogeneous batches, one temperature)
    temperature: 0.03                # static curriculum only
    loss:                            # all optional
      cached_mini_batch_size: 16     # GradCache: CachedMultipleNegativesRankingLoss, large batches in small memory
      matryoshka_dims: [384, 128]    # MatryoshkaLoss over these embedding sizes
      gather_across_devices: true    # in-batch negatives from all data-parallel ranks
    tasks:
      retrieval:                     # a task type from training/tasks.py
        - {name: snli, path: data/snli.jsonl}
      clustering:
        - {name: pairs, path: data/pairs.jsonl}

Each dataset is JSONL with `anchor`, `positive` and optionally `negative` (a hard negative, used
as an extra candidate). Under the task-aware curriculum (TA-CL) retrieval datasets are separate
entries (homogeneous batches); the datasets of a classification or clustering task are
concatenated into one entry (heterogeneous batches). Each entry gets
`MultipleNegativesRankingLoss(scale=1/τ)` with its task type's τ and its task type's prompts,
which route MoTE's experts; a token-routed MoE's load-balancing loss is added. Batches are drawn
with `TaskAwareBatchSampler`, so all data-parallel ranks train on one entry per step.
The static curriculum (the paper's baseline) writes each row's prompt into its text, concatenates
all datasets into one entry and uses one temperature: batches mix tasks, and MoTE routes each row
by the prefix its text starts with.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from training.tasks import column_prompts, task_type

logger = logging.getLogger("training")

REQUIRED_COLUMNS = ("anchor", "positive")
OPTIONAL_COLUMNS = ("negative",)


class ConfigError(Exception):
    """A bad training config or dataset; reported as one line with exit code 2."""


def load_config(path: Path) -> dict:
    """The YAML config, checked for the keys training needs."""
    import yaml

    try:
        config = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"config file {path} not found") from None
    except yaml.YAMLError as error:
        raise ConfigError(f"{path} is not valid YAML: {str(error).splitlines()[0]}") from None
    if not isinstance(config, dict) or not config.get("model") or not config.get("tasks"):
        raise ConfigError(f"{path} must define `model` and `tasks` (task type -> list of datasets)")
    for name in config["tasks"]:
        try:
            task_type(name)
        except ValueError as error:
            raise ConfigError(str(error)) from None
    return config


def load_dataset(spec: dict, base: Path):
    """One JSONL dataset as a `datasets.Dataset` with anchor/positive[/negative] columns."""
    from datasets import Dataset

    from training.data_tools import DataToolError, read_pairs

    if not isinstance(spec, dict) or "path" not in spec:
        raise ConfigError(f"each dataset needs a `path` (and a `name`), got {spec!r}")
    path = Path(spec["path"]) if Path(spec["path"]).is_absolute() else (base / spec["path"]).resolve()
    try:
        rows = read_pairs(path)
    except DataToolError as error:
        raise ConfigError(str(error)) from None
    columns = [c for c in REQUIRED_COLUMNS + OPTIONAL_COLUMNS if c in rows[0]]
    if any(any(c not in row for c in columns) for row in rows):
        raise ConfigError(f"dataset {path}: every row needs the columns {columns}")
    return Dataset.from_dict({c: [row[c] for row in rows] for c in columns})


CURRICULA = ("task_aware", "static")
LOSS_OPTIONS = ("cached_mini_batch_size", "matryoshka_dims", "gather_across_devices")


def loss_options(config: dict) -> dict:
    """The `loss:` section, checked: unknown keys and bad values are ConfigErrors."""
    options = config.get("loss") or {}
    if not isinstance(options, dict) or set(options) - set(LOSS_OPTIONS):
        raise ConfigError(f"`loss` takes the keys {', '.join(LOSS_OPTIONS)}, got {options!r}")
    dims = options.get("matryoshka_dims")
    if dims is not None and (not isinstance(dims, list) or not dims or not all(isinstance(d, int) and d > 0 for d in dims)):
        raise ConfigError(f"loss.matryoshka_dims must be a list of positive integers, got {dims!r}")
    size = options.get("cached_mini_batch_size")
    if size is not None and (not isinstance(size, int) or size < 1):
        raise ConfigError(f"loss.cached_mini_batch_size must be a positive integer, got {size!r}")
    return options


def make_loss(model, temperature: float, options: dict, is_moe: bool):
    """InfoNCE at temperature τ (`scale=1/τ`), with the configured GradCache, Matryoshka and
    gathering options, plus a token-routed MoE's aux loss."""
    from sentence_transformers.sentence_transformer import losses

    common = {"scale": 1.0 / temperature, "gather_across_devices": bool(options.get("gather_across_devices"))}
    if options.get("cached_mini_batch_size"):
        if is_moe:
            raise ConfigError("loss.cached_mini_batch_size cannot train a token-routed MoE: GradCache embeds copies "
                              "of the inputs, so the router's load-balancing loss would be lost")
        loss = losses.CachedMultipleNegativesRankingLoss(model, mini_batch_size=options["cached_mini_batch_size"], **common)
    else:
        loss = losses.MultipleNegativesRankingLoss(model, **common)
    if options.get("matryoshka_dims"):
        loss = losses.MatryoshkaLoss(model, loss, options["matryoshka_dims"])
    if is_moe:
        from training.losses import RouterAuxLoss

        loss = RouterAuxLoss(loss)  # outside Matryoshka, so it is added once
    return loss


def with_prompts_in_text(data, prompts: dict[str, str]):
    """`data` with each column's prompt written in front of its texts."""
    return data.map(lambda row: {c: prompts.get(c, "") + row[c] for c in data.column_names}, desc="prompts")


def build_entries(config: dict, base: Path, model) -> tuple[dict, dict, dict]:
    """(datasets, losses, prompts) per trainer entry, following the task registry and curriculum."""
    from datasets import concatenate_datasets

    curriculum = config.get("curriculum", "task_aware")
    if curriculum not in CURRICULA:
        raise ConfigError(f"unknown curriculum {curriculum!r}; expected one of {', '.join(CURRICULA)}")
    options = loss_options(config)
    is_moe = getattr(model[0].auto_model.config, "model_type", None) == "moe_bert"
    seed = config.get("seed", 0)
    datasets, temperatures, prompts = {}, {}, {}
    for task, specs in config["tasks"].items():
        kind = task_type(task)
        loaded = [(spec.get("name") or Path(spec["path"]).stem, load_dataset(spec, base)) for spec in specs or []]
        if not loaded:
            raise ConfigError(f"task {task!r} lists no datasets")
        if kind.batching == "homogeneous":
            groups = {f"{task}/{name}": data for name, data in loaded}
        else:
            columns = set.intersection(*(set(d.column_names) for _, d in loaded))
            groups = {task: concatenate_datasets([d.select_columns(sorted(columns)) for _, d in loaded]).shuffle(seed=seed)}
        for entry, data in groups.items():
            datasets[entry] = data.select_columns([c for c in REQUIRED_COLUMNS + OPTIONAL_COLUMNS if c in data.column_names])
            temperatures[entry] = kind.temperature
            prompts[entry] = column_prompts(kind, datasets[entry].column_names, model.prompts or {})
    if curriculum == "static":
        columns = set.intersection(*(set(d.column_names) for d in datasets.values()))
        mixed = [with_prompts_in_text(d.select_columns(sorted(columns)), prompts[e]) for e, d in datasets.items()]
        datasets = {"static": concatenate_datasets(mixed).shuffle(seed=seed)}
        temperature = config.get("temperature", 0.03)
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or temperature <= 0:
            raise ConfigError(f"temperature must be a positive number, got {temperature!r}")
        temperatures = {"static": float(temperature)}
        prompts = {"static": {}}
    losses = {entry: make_loss(model, temperatures[entry], options, is_moe) for entry in datasets}
    return datasets, losses, prompts


def train(config: dict, base: Path, trainer_cls=None):
    """Run TA-CL for `config`; returns the trained SentenceTransformer (also saved to output_dir).

    `trainer_cls` replaces `TaskAwareTrainer` (a subclass of it, e.g. to add callbacks or logging).
    """
    import torch
    from datasets import DatasetDict
    from sentence_transformers import SentenceTransformer, SentenceTransformerTrainingArguments

    from training.sampler import TaskAwareBatchSampler, data_parallel_world_size
    from training.trainer import TaskAwareTrainer

    model = SentenceTransformer(
        config["model"], trust_remote_code=bool(config.get("trust_remote_code")),
        model_kwargs=config.get("model_kwargs"), config_kwargs=config.get("config_kwargs"),
    )  # fmt: skip
    saved_max_seq_length = model.max_seq_length
    if config.get("max_seq_length"):
        model.max_seq_length = int(config["max_seq_length"])
    datasets, losses, prompts = build_entries(config, base, model)
    output_dir = str((base / config.get("output_dir", "models/tacl")).resolve())
    save_steps = int(config.get("save_steps", 0))
    cpu_data_parallel = data_parallel_world_size() > 1 and not torch.cuda.is_available()
    args = SentenceTransformerTrainingArguments(
        output_dir=output_dir,
        per_device_train_batch_size=int(config.get("batch_size", 32)),
        max_steps=int(config.get("max_steps", -1)),
        num_train_epochs=float(config.get("epochs", 1)),
        learning_rate=float(config.get("learning_rate", 2e-5)),
        warmup_steps=int(config.get("warmup_steps", 0)),
        seed=int(config.get("seed", 0)),
        save_strategy="steps" if save_steps else "no",
        save_steps=save_steps or 500,
        logging_steps=int(config.get("logging_steps", 10)),
        report_to="none",
        dataloader_drop_last=True,
        prompts=prompts,
        multi_dataset_batch_sampler=TaskAwareBatchSampler,
        # Launched as several processes without a GPU, accelerate runs data-parallel (DDP over gloo)
        # only when told to use the CPU; otherwise each process would train a model of its own.
        use_cpu=cpu_data_parallel,
        ddp_backend=config.get("ddp_backend") or ("gloo" if cpu_data_parallel else None),
    )
    trainer_cls = trainer_cls or TaskAwareTrainer
    trainer = trainer_cls(model=model, args=args, train_dataset=DatasetDict(datasets), loss=losses)
    trainer.train()
    model.max_seq_length = saved_max_seq_length  # the training truncation does not change the saved model
    if trainer.is_world_process_zero():  # under torchrun / accelerate launch, one process writes
        model.save(output_dir)
        logger.info("saved the trained model to %s", output_dir)
    return model


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="YAML training config")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        config = load_config(Path(args.config))
        train(config, Path.cwd())
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
