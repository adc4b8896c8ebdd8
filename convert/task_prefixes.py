"""MoTE's task prefixes as the upcycling converter reads and stores them: `NAME=PREFIX` from the command
line, and the token ids every input that starts with a prefix starts with (what the model matches to route
raw `input_ids`)."""

from __future__ import annotations

import re

from moe_embed.errors import UsageError
from moe_embed.modeling.defaults import DEFAULT_TASK_PREFIXES


def parse_task_prefixes(specs: list[str] | dict[str, str]) -> dict[str, str]:
    """`NAME=PREFIX` (or a bare known NAME) per task, in order, to `{name: prefix}`; a dict is checked as it is."""
    pairs = list(specs.items()) if isinstance(specs, dict) else [_split(spec) for spec in specs]
    tasks = {}
    for name, prefix in pairs:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise UsageError(f"task name {name!r} must be an identifier (letters, digits, underscores)")
        if not prefix.strip():
            raise UsageError(f"task {name!r} has an empty prefix; routing by prefix needs text")
        if name in tasks:
            raise UsageError(f"task {name!r} is given twice")
        tasks[name] = prefix
    if not tasks:
        raise UsageError("--tasks needs at least one task")
    return tasks


def _split(spec: str) -> tuple[str, str]:
    name, sep, prefix = spec.partition("=")
    name = name.strip()
    if sep:
        return name, prefix
    if name not in DEFAULT_TASK_PREFIXES:
        known = ", ".join(DEFAULT_TASK_PREFIXES)
        raise UsageError(f"task {name!r} needs a prefix: write {name}='{name}: ' (known defaults: {known})")
    return name, DEFAULT_TASK_PREFIXES[name]


def leading_special_tokens(tokenizer) -> int:
    """How many special tokens (BERT's `[CLS]`) the tokenizer puts in front of every text."""
    bare = tokenizer("hello world")["input_ids"]
    leading = 0
    while leading < len(bare) and bare[leading] in tokenizer.all_special_ids:
        leading += 1
    return leading


def prefix_token_ids(tokenizer, prefix: str) -> list[int]:
    """Token ids every input starting with `prefix` starts with (leading special tokens included).

    Found as the common start of two tokenized texts that begin with the prefix and then differ in
    their first character, so it works for WordPiece, BPE and SentencePiece alike.
    """
    first = tokenizer(prefix + "hello world")["input_ids"]
    second = tokenizer(prefix + "42 apples")["input_ids"]
    common = []
    for a, b in zip(first, second, strict=False):
        if a != b:
            break
        common.append(a)
    leading = leading_special_tokens(tokenizer)
    if len(common) <= leading:
        raise UsageError(f"prefix {prefix!r} produces no tokens of its own with this tokenizer")
    return common


__all__ = ["leading_special_tokens", "parse_task_prefixes", "prefix_token_ids"]
