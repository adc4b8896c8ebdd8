"""Configuration of MoTE, the Mixture of Task Experts encoder (Romero et al., 2025)."""

from .configuration_encoder import EncoderConfig, resolve_layer_indices
from .defaults import DEFAULT_TASK_PREFIXES, TASK_NAME_ALIASES, TASK_TYPE_EXPERTS, describe_tasks, find_task

# Other names accepted for the default tasks: sentence-transformers' names for documents, each prefix's own
# words, and every task type, mapped to the task whose expert serves it (`TASK_TYPE_EXPERTS`).
DEFAULT_TASK_ALIASES = {**TASK_NAME_ALIASES, **TASK_TYPE_EXPERTS}


class MoteBertConfig(EncoderConfig):
    r"""
    Configuration of [`MoteBertModel`]: a BERT encoder whose expert layers hold one expert per
    task, chosen per sequence by the task instruction. All fields of [`EncoderConfig`] apply.

    Args:
        tasks (`list[str]`, *optional*, defaults to `["query", "document", "classification", "clustering"]`):
            Task names; expert `i` of every expert layer belongs to `tasks[i]`.
        task_prefixes (`dict[str, str]`, *optional*): Instruction prefix of each task, e.g.
            `{"query": "search_query: "}`. Every task needs one.
        task_prefix_ids (`dict[str, list[int]]`, *optional*): Token ids that a tokenized input starts
            with when its text starts with the task's prefix (leading special tokens included). Set by
            the converter from the tokenizer; used to route inputs that carry no explicit task.
        task_prefix_start (`int`, *optional*, defaults to 1): How many leading special tokens (`[CLS]`) of
            `task_prefix_ids` come before the prefix's own tokens.
        prefix_routes_only (`bool`, *optional*, defaults to `False`): The prefix picks the expert and the encoder
            reads the text as if it were not there (`TaskRouter.hide_prefix`); `False` reads it (the paper).
        task_aliases (`dict[str, str]`, *optional*): Other names accepted for a task (`"passage"` for
            `"document"`, unseen task types such as `"sts"` mapped as in the paper).
        default_task (`str`, *optional*): Task used when an input names none and starts with no known
            prefix. `None` makes such inputs an error.
        expert_layers (`list[int]` or `str`, *optional*, defaults to `"every_other"`): Layers that hold
            task experts: `"all"` (EB), `"every_other"` (EOB: layers 1, 3, 5, ...) or explicit indices.
            Stored resolved, as a list.
        active_tasks (`list[str]`, *optional*): Tasks whose experts the model holds; `None` holds all.
            `from_pretrained(..., active_tasks=["query"])` reads only those experts' tensors, so a model
            serving one task takes the memory of the dense model. Other tasks are still recognised
            (by name or prefix) and requesting one is an error.
    """

    model_type = "mote_bert"

    tasks: list[str] | None = None
    task_prefixes: dict[str, str] | None = None
    task_prefix_ids: dict[str, list[int]] | None = None
    task_prefix_start: int = 1
    prefix_routes_only: bool = False
    task_aliases: dict[str, str] | None = None
    default_task: str | None = None
    expert_layers: list[int] | str = "every_other"
    active_tasks: list[str] | None = None

    def __post_init__(self, **kwargs):
        if self.tasks is None:
            self.tasks = list(DEFAULT_TASK_PREFIXES)
        self.tasks = list(self.tasks)
        if not self.tasks:
            raise ValueError("`tasks` must name at least one task")
        if len(set(self.tasks)) != len(self.tasks):
            raise ValueError(f"`tasks` repeats a name: {self.tasks!r}")
        if self.task_prefixes is None:
            self.task_prefixes = {t: DEFAULT_TASK_PREFIXES.get(t, f"{t}: ") for t in self.tasks}
        missing = [t for t in self.tasks if t not in self.task_prefixes]
        if missing:
            raise ValueError(f"`task_prefixes` lacks a prefix for tasks {missing}; tasks are {self.tasks}")
        if self.task_aliases is None:
            self.task_aliases = {
                alias: task
                for alias, task in DEFAULT_TASK_ALIASES.items()
                if task in self.tasks and alias not in self.tasks
            }
        bad_aliases = {a: t for a, t in self.task_aliases.items() if t not in self.tasks}
        if bad_aliases:
            raise ValueError(f"`task_aliases` map to unknown tasks {bad_aliases}; tasks are {self.tasks}")
        if self.default_task is not None:
            self.default_task = self.tasks[self.task_index(self.default_task)]
        if self.task_prefix_ids is not None:
            unknown = [t for t in self.task_prefix_ids if t not in self.tasks]
            if unknown:
                raise ValueError(f"`task_prefix_ids` names unknown tasks {unknown}; tasks are {self.tasks}")
        self.expert_layers = resolve_layer_indices(self.expert_layers, self.num_hidden_layers, "expert_layers")
        super().__post_init__(**kwargs)

    @property
    def num_tasks(self) -> int:
        """Number of task experts per expert layer."""
        return len(self.tasks)

    @property
    def default_task_index(self) -> int:
        """Index of the default task's expert; -1 where inputs that name no task are an error."""
        return self.tasks.index(self.default_task) if self.default_task is not None else -1

    def task_index(self, name: str) -> int:
        """Index of the expert serving task `name`: a task name or an alias, in any case where that names one
        expert (`"Classification"`, mteb's spelling, is the task `"classification"`).

        Raises:
            ValueError: naming the valid tasks, aliases and prefixes when `name` is unknown or, compared without
                case, names several experts.
        """
        return self.tasks.index(find_task(name, self.tasks, self.task_aliases, self.task_prefixes))

    def describe_tasks(self) -> str:
        """One line listing the valid task names, prefixes and aliases, for error messages."""
        return describe_tasks(self.tasks, self.task_prefixes, self.task_aliases)


__all__ = ["MoteBertConfig", "DEFAULT_TASK_ALIASES"]
