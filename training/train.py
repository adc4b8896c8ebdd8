"""Task-aware contrastive learning (TA-CL) with SentenceTransformerTrainer, from a YAML config.

    moe-embed train --config examples/train_mote.yaml
    moe-embed data download data/ && moe-embed train --config training/configs/example.yaml --data-dir data/

(`python -m moe_embed.training.train ...` is the same command.) A config (see `examples/train_mote.yaml`; every option
is listed at the end of `--help`):

    model: models/mote-minilm
    trust_remote_code: true
    output_dir: models/mote-tacl
    max_steps: 100
    tasks:
      retrieval:                     # a task type from training/tasks.py
        - {name: snli, path: data/snli.jsonl}
      clustering:
        - {name: pairs, path: data/pairs.jsonl}

Each dataset is JSONL with `anchor`, `positive` and optionally `negative` (a hard negative, used
as an extra candidate), or another `format` (`training/datasets.py`). Under the task-aware curriculum (TA-CL)
retrieval datasets are separate entries (homogeneous batches); the datasets of a classification or clustering
task are concatenated into one entry (heterogeneous batches). Each entry gets
`MultipleNegativesRankingLoss(scale=1/τ)` with its task type's τ and its task type's prompts,
which route MoTE's experts; a token-routed MoE's load-balancing loss, and CoMoE's contrastive expert
loss, are added. With `arch: mote | moe | comoe` the dense `model` is first upcycled (options under
`upcycle:`, CoMoE's under `adapter:`); with `arch: lora` it gets peft LoRA adapters and is saved merged
(`merge_and_unload`). Batches are drawn with `TaskAwareBatchSampler`, so all data-parallel ranks train on
one entry per step. The static curriculum (the paper's baseline) writes each row's prompt into its text,
concatenates all datasets into one entry and uses one temperature: batches mix tasks, and MoTE routes each
row by the prefix its text starts with. Every dataset and dev set is read before the model is upcycled or
loaded, so a missing file is reported at once.
"""

from __future__ import annotations

import logging
import re
import shutil
import tempfile
from pathlib import Path

from moe_embed.convert.options import CoMoeOptions
from moe_embed.errors import UsageError, run_cli
from moe_embed.folders import check_output, load_sentence_transformer
from moe_embed.options import add_options, command_parser, parse
from moe_embed.training.config import (
    DatasetSpec,
    LossConfig,
    TrainingConfig,
    describe_options,
    load_config,
)
from moe_embed.training.tasks import column_prompts, task_type

logger = logging.getLogger(__name__)

REQUIRED_COLUMNS = ("anchor", "positive")
OPTIONAL_COLUMNS = ("negative",)


def read_pair_dataset(spec: DatasetSpec, base: Path, data_dir: str | None = None):
    """One dataset of the config as a `datasets.Dataset` with anchor/positive[/negative] columns."""
    from datasets import Dataset

    from moe_embed.training.datasets import read_rows

    rows = read_rows(spec, base, data_dir)
    columns = [c for c in REQUIRED_COLUMNS + OPTIONAL_COLUMNS if c in rows[0]]
    if any(any(c not in row for c in columns) for row in rows):
        raise UsageError(f"dataset {spec.hub or spec.path}: every row needs the columns {columns}")
    return Dataset.from_dict({c: [row[c] for row in rows] for c in columns})


AUX_LOSS_MODEL_TYPES = ("moe_bert", "comoe_bert")  # models whose output has an aux_loss to train


def make_loss(model, temperature: float, options: LossConfig, with_aux: bool):
    """InfoNCE at temperature τ (`scale=1/τ`), with the configured GradCache, Matryoshka and
    gathering options, plus the model's aux loss (token-routed MoE, CoMoE) when `with_aux`."""
    from sentence_transformers.sentence_transformer import losses

    common = {"scale": 1.0 / temperature, "gather_across_devices": options.gather_across_devices}
    if options.cached_mini_batch_size:
        if with_aux:
            raise UsageError(
                "loss.cached_mini_batch_size cannot train a token-routed MoE or CoMoE: GradCache embeds copies "
                "of the inputs, so the model's auxiliary loss would be lost"
            )
        loss = losses.CachedMultipleNegativesRankingLoss(
            model, mini_batch_size=options.cached_mini_batch_size, **common
        )
    else:
        loss = losses.MultipleNegativesRankingLoss(model, **common)
    if options.matryoshka_dims:
        loss = losses.MatryoshkaLoss(model, loss, options.matryoshka_dims)
    if with_aux:
        from moe_embed.training.losses import WithAuxLoss

        loss = WithAuxLoss(loss)  # outside Matryoshka, so it is added once
    return loss


def with_prompts_in_text(data, prompts: dict[str, str]):
    """`data` with each column's prompt written in front of its texts."""
    return data.map(lambda row: {c: prompts.get(c, "") + row[c] for c in data.column_names}, desc="prompts")


def read_datasets(config: TrainingConfig, base: Path) -> dict[str, list]:
    """Every dataset of the config, read: task type -> `[(entry name, datasets.Dataset)]`."""
    return {
        task: [(spec.entry_name(), read_pair_dataset(spec, base, config.data_dir)) for spec in specs]
        for task, specs in config.tasks.items()
    }


def build_entries(config: TrainingConfig, read: dict[str, list], model) -> tuple[dict, dict, dict]:
    """(datasets, losses, prompts) per trainer entry of the datasets `read`, following the task registry and
    curriculum."""
    from datasets import concatenate_datasets

    with_aux = getattr(model[0].auto_model.config, "model_type", None) in AUX_LOSS_MODEL_TYPES
    datasets, temperatures, prompts = {}, {}, {}
    for task, loaded in read.items():
        kind = task_type(task)
        if kind.batching == "homogeneous":
            groups = {f"{task}/{name}": data for name, data in loaded}
        else:
            columns = set.intersection(*(set(d.column_names) for _, d in loaded))
            groups = {
                task: concatenate_datasets([d.select_columns(sorted(columns)) for _, d in loaded]).shuffle(
                    seed=config.seed
                )
            }
        for entry, data in groups.items():
            datasets[entry] = data.select_columns(
                [c for c in REQUIRED_COLUMNS + OPTIONAL_COLUMNS if c in data.column_names]
            )
            temperatures[entry] = kind.temperature
            prompts[entry] = column_prompts(kind, datasets[entry].column_names, model.prompts or {})
    if config.curriculum == "static":
        columns = set.intersection(*(set(d.column_names) for d in datasets.values()))
        mixed = [with_prompts_in_text(d.select_columns(sorted(columns)), prompts[e]) for e, d in datasets.items()]
        datasets = {"static": concatenate_datasets(mixed).shuffle(seed=config.seed)}
        temperatures = {"static": config.temperature}
        prompts = {"static": {}}
    losses = {entry: make_loss(model, temperatures[entry], config.loss, with_aux) for entry in datasets}
    return datasets, losses, prompts


def model_source(config: TrainingConfig, base: Path) -> str:
    """`config.model` as a folder relative to `base` (the working directory) when there is one, else as given
    (the bundled all-MiniLM-L6-v2 when it names none)."""
    if config.model is None:
        from moe_embed.folders import bundled_minilm_path

        return bundled_minilm_path()
    return str(base / config.model) if (base / config.model).is_dir() else config.model


def lora_config(adapter: CoMoeOptions, num_layers: int):
    """peft's `LoraConfig` for `adapter`: exactly the linears a CoMoE model with these options adapts."""
    from peft import LoraConfig

    from moe_embed.modeling.configuration_comoe import resolve_target_modules
    from moe_embed.modeling.configuration_encoder import resolve_layer_indices

    try:
        targets = resolve_target_modules(adapter.target_modules)
        layers = resolve_layer_indices(adapter.adapter_layers, num_layers, "adapter.adapter_layers")
    except ValueError as error:
        raise UsageError(str(error)) from None
    pattern = rf"encoder\.layer\.({'|'.join(map(str, layers))})\.({'|'.join(re.escape(t) for t in targets)})"
    return LoraConfig(
        r=adapter.lora_rank,
        lora_alpha=adapter.lora_alpha,
        lora_dropout=adapter.lora_dropout,
        target_modules=pattern,
        bias="none",
    )


def add_lora(model, adapter: CoMoeOptions, seed: int) -> None:
    """Wrap the model's transformer in peft LoRA adapters on `adapter`'s target modules and layers."""
    import torch
    from peft import get_peft_model

    transformer = model[0].auto_model
    lora = lora_config(adapter, transformer.config.num_hidden_layers)
    torch.manual_seed(seed)  # the LoRA A init
    model[0].model = get_peft_model(transformer, lora)  # `auto_model` is a read-only alias of `model`


def select_trainable(config: TrainingConfig, model) -> set[str]:
    """The expert parameter names of the model (see `training/parameters.py`); with `trainable: experts`
    every other parameter is frozen. Empty when the model has no known experts and none are asked for."""
    from moe_embed.training.parameters import expert_parameter_names, train_only

    transformer = model[0].auto_model
    expert_layers = (config.upcycle or {}).get("expert_layers", "every_other")
    try:
        names = expert_parameter_names(transformer, expert_layers)
    except ValueError as error:
        if config.trainable == "experts" or config.expert_learning_rate is not None:
            raise UsageError(f"trainable: experts / expert_learning_rate: {error}") from None
        return set()
    if config.trainable == "experts":
        count = train_only(transformer, names)
        logger.info("training only the experts: %d parameters (%d tensors)", count, len(names))
    return names


def param_group_learning_rates(model, expert_names: set[str], config: TrainingConfig) -> list[tuple[list, float]]:
    """`[(shared parameters, learning_rate), (expert parameters, expert_learning_rate)]`, the trainable ones."""
    transformer = model[0].auto_model
    experts = {id(p) for name, p in transformer.named_parameters() if name in expert_names}
    trainable = [p for p in model.parameters() if p.requires_grad]
    groups = [
        ([p for p in trainable if id(p) not in experts], config.learning_rate),
        ([p for p in trainable if id(p) in experts], config.expert_learning_rate),
    ]
    return [(params, rate) for params, rate in groups if params]


def train(config: TrainingConfig, base: Path, trainer_cls=None):
    """Run TA-CL for `config`; returns the trained SentenceTransformer (also saved to output_dir).

    `trainer_cls` replaces `TaskAwareTrainer` (a subclass of it, e.g. to add callbacks or logging). The output
    is checked, and every dataset and dev set read, before torch is imported or a model loaded.
    """
    output_dir = (base / config.output_dir).resolve()
    source = model_source(config, base)
    inputs = (source,) if Path(source).is_dir() else ()
    check_output(
        output_dir, inputs, config.overwrite_output_dir, "overwrite_output_dir: true (or --overwrite-output-dir)"
    )
    read = read_datasets(config, base)
    dev_sets = None
    if config.dev:
        from moe_embed.training.dev import load_dev_sets  # imports torch: after the checks above

        dev_sets = load_dev_sets(config.dev.tasks, config.data_dir)
    scratch = Path(tempfile.mkdtemp(prefix="moe-embed-train-"))
    try:
        model = load_model(config, source, scratch)
        saved_max_seq_length = model.max_seq_length  # training truncates its inputs, the saved model does not
        trainer, dev = _trainer(config, model, read, dev_sets, output_dir, trainer_cls)
        trainer.train()
        model.max_seq_length = saved_max_seq_length
        _save(config, model, trainer, dev, output_dir, scratch)
        return model
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def load_model(config: TrainingConfig, source: str, scratch: Path):
    """The SentenceTransformer to train: `source` as it is, upcycled first (arch mote / moe / comoe, into
    `scratch`) or with LoRA adapters (arch lora), truncating inputs to `max_seq_length`."""
    upcycled = config.arch in ("mote", "moe", "comoe")
    if upcycled:
        from moe_embed.convert.upcycle import upcycle

        source = str(upcycle(config.upcycle_options(Path(source), scratch / config.arch)))
    model = load_sentence_transformer(
        source,
        trust_remote_code=config.trust_remote_code or upcycled,
        remote_code_option="trust_remote_code: true in the config",
        model_kwargs=config.model_kwargs,
        config_kwargs=config.config_kwargs,
    )
    model_type = getattr(model[0].auto_model.config, "model_type", None)
    if config.save_adapter_only and model_type != "comoe_bert":
        raise UsageError(f"save_adapter_only needs a CoMoE model; this one is {model_type!r}")
    if config.arch == "lora":
        add_lora(model, config.adapter, config.seed)
    return model


def training_arguments(config: TrainingConfig, output_dir: Path, prompts: dict):
    """sentence-transformers' training arguments of the run."""
    import torch
    from sentence_transformers import SentenceTransformerTrainingArguments

    from moe_embed.training.sampler import TaskAwareBatchSampler, data_parallel_world_size

    cpu_data_parallel = data_parallel_world_size() > 1 and not torch.cuda.is_available()
    return SentenceTransformerTrainingArguments(
        output_dir=str(output_dir),
        per_device_train_batch_size=config.batch_size,
        max_steps=config.max_steps,
        num_train_epochs=config.epochs,
        learning_rate=config.learning_rate,
        lr_scheduler_type=config.lr_scheduler_type,
        warmup_steps=config.warmup_ratio or config.warmup_steps,  # transformers 5: a float < 1 is a ratio
        seed=config.seed,
        save_strategy="steps" if config.save_steps else "no",
        save_steps=config.save_steps or 500,
        logging_steps=config.logging_steps,
        report_to="none",
        dataloader_drop_last=True,
        # the batches are made on the CPU and moved by the trainer: pinning them needs an accelerator, and on
        # a machine without one torch warns on every loader that pinning is not used
        dataloader_pin_memory=torch.cuda.is_available(),
        prompts=prompts,
        multi_dataset_batch_sampler=TaskAwareBatchSampler,
        # Launched as several processes without a GPU, accelerate runs data-parallel (DDP over gloo)
        # only when told to use the CPU; otherwise each process would train a model of its own.
        use_cpu=cpu_data_parallel,
        ddp_backend=config.ddp_backend or ("gloo" if cpu_data_parallel else None),
    )


def _trainer(config: TrainingConfig, model, read: dict, dev_sets, output_dir: Path, trainer_cls):
    """The trainer of the run and its dev-set callback (None without `dev:`): entries, losses (with the
    regulariser) and prompts built on `model`, the expert parameters chosen (the rest frozen where asked)."""
    from datasets import DatasetDict

    from moe_embed.training.regularizers import regularizer
    from moe_embed.training.trainer import TaskAwareTrainer

    if config.max_seq_length:
        model.max_seq_length = config.max_seq_length
    expert_names = select_trainable(config, model)
    datasets, losses, prompts = build_entries(config, read, model)
    anchored = regularizer(config.regularizer.kind, config.regularizer.weight, model)  # after freezing
    losses = {entry: anchored(loss) for entry, loss in losses.items()}
    dev = None
    if config.dev:
        from moe_embed.training.dev import BestOnDev

        dev = BestOnDev(model, dev_sets, config.dev.eval_steps)
    trainer = (trainer_cls or TaskAwareTrainer)(
        model=model,
        args=training_arguments(config, output_dir, prompts),
        train_dataset=DatasetDict(datasets),
        loss=losses,
        callbacks=[dev] if dev else None,
    )
    if config.expert_learning_rate is not None:
        trainer.learning_rates = param_group_learning_rates(model, expert_names, config)
    return trainer, dev


def _save(config: TrainingConfig, model, trainer, dev, output_dir: Path, scratch: Path) -> None:
    """Write the trained model to `output_dir` (one process of a data-parallel run): LoRA merged into the
    weights, CoMoE's adapter-only folder where asked, the dev scores where there are some."""
    from moe_embed.modeling.st_folder import write_portable_module_files

    if config.arch == "lora":  # the adapters folded into the weights: a plain model
        model[0].model = model[0].model.merge_and_unload()
    if not trainer.is_world_process_zero():  # under torchrun / accelerate launch, one process writes
        return
    if config.save_adapter_only:
        from moe_embed.convert.extract_adapter import write_adapter_folder

        model.save(str(scratch / "full"))
        write_adapter_folder(scratch / "full", output_dir)
    else:
        model.save(str(output_dir))
        write_portable_module_files(output_dir)  # loadable by sentence-transformers 5.x too
    if dev:
        from moe_embed.training.dev import write_history

        write_history(dev, output_dir)
    print(f"saved the trained model to {output_dir}")


def build_parser(prog: str | None = None):
    parser = command_parser(__doc__, prog, epilog="config options:\n" + describe_options())
    parser.add_argument("--config", required=True, help="YAML training config")
    add_options(parser, TrainingConfig, only=COMMAND_LINE)
    return parser


# the config's fields that the command line also sets (it wins over the file)
COMMAND_LINE = ("overwrite_output_dir", "data_dir")


def main(argv: list[str] | None = None, prog: str | None = None):
    args = parse(build_parser(prog), argv)
    config = load_config(Path(args.config))
    config.overwrite_output_dir = config.overwrite_output_dir or args.overwrite_output_dir
    config.data_dir = args.data_dir or config.data_dir
    return train(config, Path.cwd())


if __name__ == "__main__":
    run_cli(main)
