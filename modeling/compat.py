"""The transformers names that moved between 4.57 and 5.x, resolved once, so that the model code (and the
folders that carry it) runs on transformers 4.57+ and 5.x with the same results.

On 5.x every name is transformers' own. On 4.x:
- `ConfigBase` is `PretrainedConfig`, and `DATACLASS_CONFIGS` is false: `EncoderConfig` then gives its
  subclasses the keyword `__init__` that 5.x derives from their annotated fields;
- `create_bidirectional_mask` builds what 5.x builds: `None` when nothing is padded (outside traced
  graphs), a boolean `(batch, 1, 1, seq)` mask for sdpa, an additive float mask for eager;
- `attention_function` looks the backend up in `ALL_ATTENTION_FUNCTIONS` (eager is ours);
- `init` is `torch.nn.init` (5.x's `transformers.initialization` adds only bookkeeping of which
  tensors were initialised);
- `use_experts_implementation` leaves the experts class as it is (its eager forward), and
  `ALL_EXPERTS_FUNCTIONS` (5.x's table of experts backends) is `None`: 4.x has no `grouped_mm` / `batched_mm`;
- `OutputRecorder` comes from `transformers.utils.generic`.

Saved model folders carry this file inlined into their code: it imports only torch and public transformers names.
"""

import torch
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

try:  # transformers 5
    from transformers import PreTrainedConfig as ConfigBase

    DATACLASS_CONFIGS = True
except ImportError:  # transformers 4.x
    from transformers import PretrainedConfig as ConfigBase

    DATACLASS_CONFIGS = False

try:
    from transformers import initialization as init
except ImportError:
    from torch.nn import init

try:
    from transformers.integrations import use_experts_implementation
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS
except ImportError:
    ALL_EXPERTS_FUNCTIONS = None

    def use_experts_implementation(cls=None, **_):
        """transformers 4.x has no experts backends: the class keeps its own (eager) forward."""
        return cls if cls is not None else (lambda klass: klass)


try:
    from transformers.utils.output_capturing import OutputRecorder
except ImportError:
    from transformers.utils.generic import OutputRecorder


def is_exporting() -> bool:
    """Whether this forward pass is being traced or compiled (ONNX export, `torch.export`, `torch.jit.trace`,
    `torch.compile`), where the model takes its graph-safe path: no host syncs (`.tolist()`, `bool(tensor)`),
    no Python branches on tensor values, every routing decision made by tensor ops inside the graph."""
    return torch.jit.is_tracing() or torch.compiler.is_compiling() or torch.onnx.is_in_onnx_export()


def exporting_program() -> bool:
    """Whether `torch.export` (and so `torch.onnx.export(dynamo=True)`) is tracing this forward pass, whose
    shapes may be data-dependent, unlike `torch.compile`'s; False on a torch without the query."""
    query = getattr(torch.compiler, "is_exporting", None)
    return bool(query()) if query is not None else False


def legacy_bidirectional_mask(config, inputs_embeds: torch.Tensor, attention_mask: torch.Tensor | None):
    """transformers 5's padding mask for a bidirectional encoder, for 4.x (see the module docstring)."""
    if attention_mask is None:
        return None
    if not is_exporting() and bool(attention_mask.all()):
        return None
    keep = attention_mask[:, None, None, :].to(torch.bool)
    if config._attn_implementation == "sdpa":
        return keep
    dtype = inputs_embeds.dtype
    return torch.zeros(keep.shape, dtype=dtype, device=keep.device).masked_fill(~keep, torch.finfo(dtype).min)


try:
    from transformers.masking_utils import create_bidirectional_mask
except ImportError:
    create_bidirectional_mask = legacy_bidirectional_mask


# The versions this code is tested on (`scripts/test_old_stack.sh` for the oldest); written into the
# `config.json` and the model card of every folder the converters make.
REQUIREMENTS = {"transformers": ">=4.57", "sentence-transformers": ">=5.1", "torch": ">=2.4"}


def attention_function(implementation: str, eager):
    """The attention function of `implementation` ("sdpa", "flash_attention_2", ...); `eager` for eager."""
    if hasattr(ALL_ATTENTION_FUNCTIONS, "get_interface"):  # transformers 5
        return ALL_ATTENTION_FUNCTIONS.get_interface(implementation, eager)
    return eager if implementation == "eager" else ALL_ATTENTION_FUNCTIONS[implementation]


__all__ = [
    "REQUIREMENTS",
    "exporting_program",
    "is_exporting",
    "ConfigBase",
    "DATACLASS_CONFIGS",
    "init",
    "use_experts_implementation",
    "ALL_EXPERTS_FUNCTIONS",
    "OutputRecorder",
    "create_bidirectional_mask",
    "attention_function",
]
