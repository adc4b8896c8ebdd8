"""moe-embed: mixture-of-experts text embedding models for transformers and sentence-transformers.

One command for every tool of the package; `moe-embed SUBCOMMAND --help` describes each. A subcommand
is a thin parser over a typed function that code can call too
(`moe_embed.convert.upcycle.upcycle(MoeOptions(...))`, `moe_embed.training.train.train(...)`, ...);
`python -m moe_embed SUBCOMMAND`, `python convert/upcycle.py` and `python -m moe_embed.training.train` are the
same commands. Bad input ends with one line on stderr and exit code 2.
"""

from __future__ import annotations

import difflib
import importlib
import sys

# subcommand -> (module, entry point, one line of help); a module is imported only when its subcommand runs,
# so `moe-embed --help` and each subcommand's `--help` answer at once
SUBCOMMANDS = {
    "upcycle": ("moe_embed.convert.upcycle", "main", "a dense checkpoint -> MoTE, token-routed MoE or CoMoE folder"),
    "merge": (
        "moe_embed.convert.merge_experts",
        "main",
        "experts -> one dense model (Expert Averaging, one task, CoMoE)",
    ),
    "extract-adapter": ("moe_embed.convert.extract_adapter", "main", "a CoMoE folder -> its adapter-only folder"),
    "export": ("moe_embed.convert.export_onnx", "main", "a folder -> portable ONNX (and int8) for serving engines"),
    "push": ("moe_embed.convert.push_to_hub", "main", "validate a folder and publish it to the Hugging Face Hub"),
    "calibrate-aea": ("moe_embed.convert.calibrate_aea", "main", "AEA expert allocation for a trained MoE model"),
    "train": ("moe_embed.training.train", "main", "task-aware contrastive training (TA-CL) from a YAML config"),
    "embed": ("moe_embed.training.embed", "main", "embed a corpus on Ray Data (this machine or a cluster), resumable"),
    "mine": ("moe_embed.training.data_tools", "main_mine", "positive-aware hard-negative mining of JSONL pairs"),
    "filter": ("moe_embed.training.data_tools", "main_filter", "consistency filtering of JSONL pairs"),
    "evaluate": ("moe_embed.evaluation.run", "main", "scores on the evaluation suite's MTEB tasks, by mteb"),
    "data": ("moe_embed.data", "main", "download the Hub datasets of the suite and recipes for offline use; list them"),
    "intertask": ("moe_embed.evaluation.intertask", "main", "inter-task similarity of task embeddings (MoTE Fig. 3)"),
    "expert-usage": ("moe_embed.evaluation.expert_usage", "main", "routing shares and expert similarity per layer"),
}


def usage() -> str:
    width = max(len(name) for name in SUBCOMMANDS)
    rows = "\n".join(f"  {name:<{width}}  {text}" for name, (_, _, text) in SUBCOMMANDS.items())
    return f"usage: moe-embed SUBCOMMAND [options]   (moe-embed SUBCOMMAND --help)\n\n{__doc__}\nsubcommands:\n{rows}\n"


def main(argv: list[str] | None = None) -> int:
    """Run `moe-embed SUBCOMMAND ...` (the console script); returns the exit code."""
    from moe_embed.errors import run_cli

    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        print("error: name a subcommand (see moe-embed --help)", file=sys.stderr)
        return 2
    if argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in SUBCOMMANDS:
        close = difflib.get_close_matches(name, SUBCOMMANDS, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        print(f"error: unknown subcommand {name!r}; {hint}expected one of {', '.join(SUBCOMMANDS)}", file=sys.stderr)
        return 2
    module, entry, _ = SUBCOMMANDS[name]
    function = getattr(importlib.import_module(module), entry)
    run_cli(lambda args: function(args, f"moe-embed {name}"), rest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
