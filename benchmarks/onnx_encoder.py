"""An exported folder's ONNX graph as an mteb encoder: `mteb.evaluate` scores it as it scores a
SentenceTransformer, the graph fed as a client feeds it (`tokenizer.json` alone, through onnxruntime or OpenVINO).

mteb picks each task's prompt from the folder's prompts (`config_sentence_transformers.json`) as it does for a
SentenceTransformer: `{TaskName}-{prompt_type}`, `{TaskName}`, `{TaskType}-{prompt_type}`, `{TaskType}`,
`{prompt_type}`, the first the folder has; the prompt is written before each text, as Sentence-Transformers
writes it, and a routed MoTE graph picks its expert from it.
"""

from __future__ import annotations

from pathlib import Path

from mteb.models.abs_encoder import AbsEncoder, get_prompt
from mteb.models.model_meta import ModelMeta, ScoringFunction

from moe_embed.files import read_json


class OnnxEncoder(AbsEncoder):
    """The graph `file` of the exported `folder` (e.g. `onnx/model.onnx`, through onnxruntime; an OpenVINO `.xml`
    through OpenVINO), scored by cosine similarity."""

    def __init__(self, folder: Path, file: str):
        from tokenizers import Tokenizer

        from moe_embed.convert.onnx_graph import session
        from moe_embed.convert.openvino_int8 import OpenVinoSession

        folder = Path(folder)
        self.session = OpenVinoSession(folder / file) if file.endswith(".xml") else session(folder / file)
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.model_prompts = read_json(folder / "config_sentence_transformers.json").get("prompts") or None
        self.mteb_model_meta = ModelMeta.create_empty(
            {"name": f"onnx/{folder.name}", "revision": file, "similarity_fn_name": ScoringFunction.COSINE}
        )

    def prompt(self, task_metadata, prompt_type=None) -> str:
        """The prompt mteb chooses for a task (and prompt type) among the folder's prompts; "" for none."""
        return get_prompt(self.model_prompts, task_metadata, prompt_type) or ""

    def encode(self, inputs, *, task_metadata, hf_split: str, hf_subset: str, prompt_type=None, **kwargs):
        """Embeddings (numpy, one row per text) of the texts of mteb's `inputs` batches, each after its prompt."""
        from moe_embed.convert.onnx_graph import embed

        prompt = self.prompt(task_metadata, prompt_type)
        texts = [prompt + text for batch in inputs for text in batch["text"]]
        return embed(self.session, self.tokenizer, texts, kwargs.get("batch_size") or 32)


__all__ = ["OnnxEncoder"]
