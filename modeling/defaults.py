"""Defaults and task tables of the model types, readable without importing transformers or torch.

The config classes take their defaults from here, and so do the command lines (`moe-embed upcycle --help`
shows them at once) and the tools that choose a MoTE expert per task type (evaluation, training): one
source per value. Saved model folders carry this file inlined with the configs that read it.
"""

from dataclasses import dataclass

# MoTE: the default tasks, one expert each, in expert order, with the instruction prefix that selects it.
DEFAULT_TASK_PREFIXES = {
    "query": "search_query: ",
    "document": "search_document: ",
    "classification": "classification: ",
    "clustering": "clustering: ",
}

# The MoTE task whose expert serves each task type. Task types without an expert of their own use the
# closest one, as in the MoTE paper (section 5.3): STS, pair classification and summarization the
# classification expert; reranking encodes its queries and documents as retrieval does.
TASK_TYPE_EXPERTS = {
    "retrieval_query": "query",
    "retrieval_document": "document",
    "reranking_query": "query",
    "reranking_document": "document",
    "classification": "classification",
    "clustering": "clustering",
    "sts": "classification",
    "pair_classification": "classification",
    "summarization": "classification",
}

# The task of an input that names none and starts with no prefix (a plain `encode(texts)`, as mteb, LangChain
# or a vector database call it): the expert of generic similarity, STS's.
DEFAULT_TASK = TASK_TYPE_EXPERTS["sts"]

# mteb's task types, as mteb names them, for the task types it encodes with no prompt type (mteb looks a prompt
# up as `{TaskName}-{prompt_type}`, `{TaskName}`, `{TaskType}-{prompt_type}`, `{TaskType}`, `{prompt_type}`):
# a saved folder's prompts carry these keys, so that `mteb.evaluate` routes each type to its expert with no
# wrapper. Retrieval and reranking need none: mteb encodes them with the prompt types `query` and `document`.
MTEB_TASK_TYPES = {
    "STS": "sts",
    "PairClassification": "pair_classification",
    "Classification": "classification",
    "MultilabelClassification": "classification",
    "Clustering": "clustering",
    "Summarization": "summarization",
}


def prompt_key(task: str) -> str:
    """mteb's spelling of a task's prompt name: mteb's task type where the task is one (`classification` ->
    `Classification`, `clustering` -> `Clustering`), else the task's name. mteb looks prompts up by its task
    types, prompt types (`query`, `document`) and task names, so this is the name through which mteb reaches the
    task's expert; a folder also names each prompt by the task's own name (`sentence_transformers_prompts`)."""
    return next((key for key in MTEB_TASK_TYPES if key.lower() == task.lower()), task)


def sentence_transformers_prompts(task_prefixes: dict[str, str]) -> dict[str, str]:
    """The prompts of a saved MoTE folder: each task's prefix under the task's own name and under its prompt name
    (`prompt_key`), and mteb's task types (`MTEB_TASK_TYPES`), each type the prefix of its expert. So
    `encode(texts, prompt_name=...)` takes a task's name in either spelling (sentence-transformers looks prompt
    names up as they are written); at each evaluation mteb warns about the names that are not its own and
    leaves them out (`moe-embed evaluate` keeps its warnings for `--verbose`)."""
    prompts = {}
    for task, prefix in task_prefixes.items():
        prompts[prompt_key(task)] = prefix
        prompts.setdefault(task, prefix)
    for mteb_type, task_type in MTEB_TASK_TYPES.items():
        expert = TASK_TYPE_EXPERTS[task_type]
        if expert in task_prefixes:
            prompts.setdefault(mteb_type, task_prefixes[expert])
    return prompts


# Other names of the default tasks: sentence-transformers' names for documents, and each prefix's own words.
TASK_NAME_ALIASES = {
    "passage": "document",
    "corpus": "document",
    "search_query": "query",
    "search_document": "document",
}


def find_task(name: str, tasks: list[str], aliases: dict[str, str], prefixes: dict[str, str] | None = None) -> str:
    """The task that `name` names: a task or an alias of one, in any case where that names one task
    (`"Classification"`, mteb's spelling, is the task `"classification"`); the one lookup of the model's config
    and of the converters that check a folder's `config.json` before loading it.

    Raises:
        ValueError: naming the valid tasks (and their `prefixes`) when `name` is unknown or, compared without
            case, names several.
    """
    if name in tasks:
        return name
    if name in aliases:
        return aliases[name]
    folded = str(name).casefold()
    spellings = {task: task for task in tasks} | dict(aliases)
    found = {task for spelling, task in spellings.items() if spelling.casefold() == folded}
    if len(found) == 1:
        return found.pop()
    if found:
        raise ValueError(f"Task {name!r} is ambiguous: it names the tasks {sorted(found)} in another case")
    raise ValueError(f"Unknown task {name!r}. {describe_tasks(tasks, prefixes or {}, aliases)}")


def describe_tasks(tasks: list[str], prefixes: dict[str, str], aliases: dict[str, str]) -> str:
    """One line listing the valid task names, prefixes and aliases, for error messages."""
    valid = ", ".join(f"{t!r} (prefix {prefixes.get(t)!r})" if t in prefixes else repr(t) for t in tasks)
    also = ", ".join(f"{a!r}->{t!r}" for a, t in sorted(aliases.items()))
    return f"Valid tasks: {valid}" + (f"; aliases: {also}" if also else "")


# AEA: the sentence embeddings it makes (`aea_pooling.py`) and how per-token expert counts are rounded
# (`aea_allocation.py`).
AEA_EMBEDDINGS = ("hidden", "moee-concat", "moee-sum")
AEA_ROUNDINGS = ("floor", "largest-remainder")


@dataclass(frozen=True)
class MoeDefaults:
    """Defaults of the token-routed MoE (Nomic Embed v2's settings); see `MoeBertConfig` for each field."""

    num_local_experts: int = 8
    num_experts_per_tok: int = 2
    norm_topk_prob: bool = False
    moe_layers: str = "every_other"
    router_aux_loss_coef: float = 1.0
    router_z_loss_coef: float = 0.0
    router_jitter_noise: float = 0.0


@dataclass(frozen=True)
class CoMoeDefaults:
    """Defaults of CoMoE-PEFT (the CoMoE paper's settings); see `CoMoeBertConfig` for each field."""

    num_local_experts: int = 4
    num_experts_per_tok: int = 2
    lora_rank: int = 16
    lora_alpha: float = 32.0
    lora_dropout: float = 0.05
    target_modules: str = "query,key,value,attention.output.dense"
    adapter_layers: str = "all"
    contrastive_loss_coef: float = 0.01
    contrastive_tau: float = 0.07
    contrastive_eps: float = 1e-3
    router_aux_loss_coef: float = 0.0


MOE = MoeDefaults()
COMOE = CoMoeDefaults()

# The dense bases the converters upcycle (model_type -> its name in messages), in one order for every table of
# bases (`base_keys.py`, `convert/bases.py`); readable without torch, as the command lines read it.
DENSE_NAMES = {
    "bert": "BERT",
    "roberta": "RoBERTa",
    "xlm-roberta": "XLM-RoBERTa",
    "mpnet": "MPNet",
    "modernbert": "ModernBERT",
    "nomic_bert": "NomicBERT",
}

__all__ = [
    "DENSE_NAMES",
    "DEFAULT_TASK_PREFIXES",
    "TASK_TYPE_EXPERTS",
    "DEFAULT_TASK",
    "TASK_NAME_ALIASES",
    "MTEB_TASK_TYPES",
    "prompt_key",
    "sentence_transformers_prompts",
    "AEA_EMBEDDINGS",
    "AEA_ROUNDINGS",
    "MOE",
    "describe_tasks",
    "find_task",
    "COMOE",
    "MoeDefaults",
    "CoMoeDefaults",
]
