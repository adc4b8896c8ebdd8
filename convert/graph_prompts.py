"""What sentence-transformers does to a MoTE input before the encoder, done on token ids inside an ONNX graph.

A client that knows nothing of this package (Text Embeddings Inference, fastembed, onnxruntime with a
tokenizer) sends `input_ids` of the text, with or without a prompt in front, truncated at the folder's
input length. `SentenceTransformer.encode` of the PyTorch folder does three things to the text that such a
client cannot be asked to do, and `PromptInputs` does them on the ids:

- routing: the prompt (a task prefix) the ids start with picks the expert, else an explicit `task_ids`
  entry, else the folder's default task;
- the prefix: a folder that feeds it to the encoder (`prepend_task_prefix`, the default) puts the chosen
  task's prefix in front of a row that has none (what `encode()` does with the default prompt); a
  prefix-routed folder (`--prefix-routes-only`) takes it off (what its module does to the text);
- the length: sentence-transformers truncates what the encoder sees at `max_seq_length` tokens, prefix
  included or removed; the client's tokenizer truncates at `max_seq_length` plus the longest prefix, so that
  after the prefix is taken off or put in, the graph can cut each row to `max_seq_length` with its separator
  token last, as the tokenizer would have.

The rows come out right-padded, as wide as the longest of them (at most `max_seq_length`): a batch whose rows
all bring their prompt costs what the same rows cost the dense model. Every step is a tensor op, so a batch
may mix tasks, prompts and lengths.
"""

from __future__ import annotations

import torch
from torch import nn

from modeling.modeling_mote import detect_task_ids, route_rows


def leading_specials(config, tokenizer) -> int:
    """How many special tokens (`[CLS]`) a tokenised text starts with before its prompt."""
    task = config.tasks[0]
    prompt = tokenizer(config.task_prefixes[task], add_special_tokens=False)["input_ids"]
    return len(config.task_prefix_ids[task]) - len(prompt)


def keep_width(length: torch.Tensor, max_length: int, available: int) -> int:
    """The width the rows keep: the longest row's length, at most `max_length` (and the `available` columns). A
    data-dependent size, which a traced graph computes (`ReduceMax`, then `Slice`)."""
    width = length.max().clamp(max=max_length).item()
    torch._check(width >= 1)  # every row keeps its leading special token
    torch._check(width <= max_length)
    torch._check(width <= available)
    return width


class PromptInputs(nn.Module):
    """`(input_ids, attention_mask[, task_ids]) -> (input_ids, attention_mask, task_ids)` as the encoder must
    see them (see the module docstring); `task_ids` -1 where no task resolves (a strict folder)."""

    def __init__(self, config, lead: int, max_length: int, sep_token_id: int, pad_token_id: int, strip: bool):
        super().__init__()
        self.config, self.lead, self.max_length, self.strip = config, lead, max_length, strip
        self.sep_token_id, self.pad_token_id = sep_token_id, pad_token_id
        prefixes = [config.task_prefix_ids[task][lead:] for task in config.tasks]
        if any(
            config.task_prefix_ids[task][:lead] != config.task_prefix_ids[config.tasks[0]][:lead]
            for task in config.tasks
        ):
            raise ValueError("task prefixes start with different special tokens")
        self.longest = max(len(p) for p in prefixes)
        table = torch.full((len(prefixes), max(self.longest, 1)), pad_token_id, dtype=torch.long)
        for index, prefix in enumerate(prefixes):
            table[index, : len(prefix)] = torch.tensor(prefix, dtype=torch.long)
        self.register_buffer("prefix_table", table, persistent=False)
        self.register_buffer("prefix_lengths", torch.tensor([len(p) for p in prefixes]), persistent=False)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, task_ids: torch.Tensor | None = None):
        found = detect_task_ids(input_ids, self.config)  # the prefix the row starts with, -1: none
        candidates = (found,) if task_ids is None else (task_ids, found)
        chosen = route_rows(*candidates, default=self.config.default_task_index)
        tasks = self.prefix_lengths.shape[0]
        valid = (chosen >= 0) & (chosen < tasks)
        safe = chosen.clamp(0, tasks - 1)  # an index for the tables (an invalid row gains no prefix)
        # a column reads itself up to the row's inserted ids (the leading specials and the inserted prefix), and
        # the column `skip` further on after them: past the unused slot and any removed prefix
        if self.strip:  # the prefix only routes: take it off
            removed = torch.where(found >= 0, self.prefix_lengths[found.clamp(min=0)], 0)
            inserted, skip = 0, self.longest + removed.unsqueeze(1)
        else:  # the encoder reads the prefix: put the chosen task's in front of a row that has none
            inserted = torch.where((found < 0) & valid, self.prefix_lengths[safe], 0).unsqueeze(1)
            skip = self.longest - inserted
        # one gather over [leading specials | a slot of `longest` prefix ids | the rest of the row]
        block = self.prefix_table[safe]  # (batch, longest)
        ids = torch.cat([input_ids[:, : self.lead], block, input_ids[:, self.lead :]], dim=1)
        ones = torch.ones_like(block)
        mask = torch.cat([attention_mask[:, : self.lead], ones, attention_mask[:, self.lead :]], dim=1)
        width = ids.shape[1]
        position = torch.arange(width, device=ids.device).unsqueeze(0)
        source = position + skip * (position - self.lead >= inserted)
        inside = source < width
        source = source.clamp(max=width - 1)
        mask = torch.gather(mask, 1, source) * inside
        ids = torch.where(mask.bool(), torch.gather(ids, 1, source), self.pad_token_id)
        length = mask.sum(dim=1, keepdim=True)
        # as wide as the longest row after its prompt is handled (not the input plus the prompt slot, which only
        # a row that gains a prompt uses), and at most `max_length`
        width = keep_width(length, self.max_length, ids.shape[1])
        ids, mask = ids[:, :width], mask[:, :width]
        cut = (position[:, : ids.shape[1]] == self.max_length - 1) & (length > self.max_length)
        ids = torch.where(cut, self.sep_token_id, ids)
        task = chosen.masked_fill(~valid, -1)
        return ids, mask, task


__all__ = ["PromptInputs", "leading_specials"]
