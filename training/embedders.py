"""What embeds texts inside one `moe-embed embed` worker: a model folder loaded once, called on lists of texts.

- A folder `SentenceTransformer` loads (every family of this package: MoTE, token-routed MoE, CoMoE, AEA; or
  any plain Sentence-Transformers model): `encode(texts, prompt_name=task)`, so a MoTE folder routes by the
  task's prompt exactly as `SentenceTransformer.encode` does.
- An exported ONNX folder (`moe-embed export`, with `onnx_config.json`): the graph named, else the one for this
  CPU (`convert/cpu_graph.py`: the int8 graph where it is faster here, else fp32), through onnxruntime (an
  OpenVINO `.xml` through OpenVINO), fed as any client feeds it: the task's prompt in front of the text,
  `tokenizer.json` alone. The rows of a call are sorted by length before batching, as `encode` sorts them.

Both count the texts longer than the model reads (embedded from their first tokens, as `encode` embeds them).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np

from moe_embed.convert.cpu_graph import GRAPH_FILE
from moe_embed.errors import UsageError
from moe_embed.modeling.defaults import prompt_key

logger = logging.getLogger(__name__)


def is_onnx_folder(model: str | Path) -> bool:
    return (Path(model) / "onnx_config.json").is_file()


def folder_prompts(folder: Path) -> dict:
    path = folder / "config_sentence_transformers.json"
    return (json.loads(path.read_text(encoding="utf-8")).get("prompts") or {}) if path.is_file() else {}


def check_model(model: str, task: str | None, onnx_file: str | None, trust_remote_code: bool) -> str:
    """The local folder of `model` (a Hub id is fetched), refused in one line before any worker loads it: not a
    model folder, its own code not allowed, no such prompt for `task`, no such `onnx_file`."""
    from moe_embed.folders import locate, open_model_folder

    folder = locate(str(model))  # a Hub id: fetched (or found in the cache)
    onnx = is_onnx_folder(folder)
    if not onnx:  # the folder contract (weights, remote code); an ONNX folder's weights are its graphs
        folder = open_model_folder(model, trust_remote_code=trust_remote_code).path
    if onnx_file and not onnx:
        raise UsageError(f"--onnx-file applies to exported ONNX folders; {model} has no onnx_config.json")
    if onnx and not (folder / (onnx_file or GRAPH_FILE)).is_file():
        raise UsageError(f"{model} has no {onnx_file or GRAPH_FILE} (--onnx-file)")
    task_prompt_name(model, task, folder_prompts(folder))
    return str(folder)


def graph_file(folder: str | Path, onnx_file: str | None) -> str | None:
    """The graph to embed an exported ONNX `folder` with: `onnx_file` where given, else the one for this CPU (the
    choice logged, shown with `--verbose`); None for a folder that is not an ONNX export."""
    from moe_embed.convert.cpu_graph import serving_file

    if not is_onnx_folder(folder) or onnx_file:
        return onnx_file
    file, why = serving_file(folder)
    logger.info("embedding with %s", why)
    return file


def prompt_name(prompts: dict, *names: str) -> str | None:
    """The name in `prompts` of the first of `names` the folder has a prompt for, each taken as a prompt name or
    as a MoTE task's name (`classification` -> its prompt `Classification`); None where it has none. What
    `--task` names, and the prompts `mine` and `filter` embed with (`query`; `document`, else `passage`)."""
    for name in names:
        for key in (name, prompt_key(name)):
            if key in prompts:
                return key
    return None


def task_prompt_name(model, task: str | None, prompts: dict) -> str | None:
    """The prompt name `--task` names (None without a task), refused in one line where the folder has none."""
    if task is None:
        return None
    name = prompt_name(prompts, task)
    if name is None:
        raise UsageError(f"{model} has no prompt {task!r} for --task; its prompts are: {', '.join(prompts) or 'none'}")
    return name


def untruncated(tokenizer):
    """A copy of a `tokenizers.Tokenizer` that neither truncates nor pads: it counts a text's tokens, and, being a
    copy, can do so in a thread while the model's own tokenizer is in use."""
    from tokenizers import Tokenizer

    counter = Tokenizer.from_str(tokenizer.to_str())
    counter.no_truncation()
    counter.no_padding()
    return counter


class Embedder:
    """Texts -> float32 embeddings `(n, dim)` with the task's prompt; `longer_than_model(texts)` counts the
    texts cut at the model's length."""

    def __init__(self, model: str, task: str | None, *, onnx_file: str | None = None, trust_remote_code=False):
        """`model`: a local folder that `check_model` accepted."""
        prompts = folder_prompts(Path(model))
        self.task = task_prompt_name(model, task or None, prompts)
        self.prompt = prompts.get(self.task, "") if self.task else ""
        if is_onnx_folder(model):
            self._load_onnx(Path(model), graph_file(model, onnx_file))
        else:
            self._load_sentence_transformer(model, trust_remote_code)

    def _load_sentence_transformer(self, model: str, trust_remote_code: bool) -> None:
        import torch
        from sentence_transformers import SentenceTransformer

        device = "cuda" if torch.cuda.is_available() else "cpu"
        self.st = SentenceTransformer(model, trust_remote_code=trust_remote_code, device=device)
        self.max_tokens = self.st.max_seq_length
        self.tokenizer = self.st.tokenizer
        backend = getattr(self.tokenizer, "backend_tokenizer", None)  # a fast tokenizer's `tokenizers` object
        self.counter = untruncated(backend) if backend is not None else None
        self.dimension = getattr(self.st, "get_embedding_dimension", self.st.get_sentence_embedding_dimension)()

    def _load_onnx(self, folder: Path, file: str) -> None:
        from tokenizers import Tokenizer

        from moe_embed.convert.onnx_graph import session
        from moe_embed.convert.openvino_int8 import OpenVinoSession

        self.session = OpenVinoSession(folder / file) if file.endswith(".xml") else session(folder / file)
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.counter = untruncated(self.tokenizer)
        config = json.loads((folder / "onnx_config.json").read_text())
        self.max_tokens, self.dimension = config["input_length"], config["dimension"]
        self.st = None

    def __call__(self, texts: list[str], batch_size: int) -> np.ndarray:
        if self.st is not None:
            kwargs = {"prompt_name": self.task} if self.task else {}
            return self.st.encode(texts, batch_size=batch_size, convert_to_numpy=True, **kwargs).astype(np.float32)
        from moe_embed.convert.onnx_graph import embed

        order = np.argsort([-len(t) for t in texts], kind="stable")  # like lengths in a batch: less padding
        out = embed(self.session, self.tokenizer, [self.prompt + texts[i] for i in order], batch_size)
        result = np.empty_like(out, dtype=np.float32)
        result[order] = out
        return result

    def longer_than_model(self, texts: list[str]) -> int:
        """How many of `texts` (after the prompt) hold more tokens than the model reads. A token covers at least
        one UTF-8 byte, so only texts with more bytes than that are tokenised, by a tokenizer of their own (safe
        to call in a thread beside `__call__`)."""
        budget = self.max_tokens - 2  # the special tokens around the text
        prompt_bytes = len(self.prompt.encode("utf-8"))
        candidates = [self.prompt + t for t in texts if prompt_bytes + len(t.encode("utf-8")) > budget]
        if not candidates:
            return 0
        if self.counter is not None:
            encode = getattr(self.counter, "encode_batch_fast", self.counter.encode_batch)  # no offsets: faster
            return sum(len(e.ids) > self.max_tokens for e in encode(candidates))
        lengths = self.tokenizer(candidates, add_special_tokens=True, truncation=False)["input_ids"]
        return sum(len(ids) > self.max_tokens for ids in lengths)


__all__ = ["Embedder", "check_model", "graph_file", "is_onnx_folder"]
