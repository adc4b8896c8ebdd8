"""What the Sentence-Transformers modules of this package need to run on sentence-transformers 5.x as on 6.x.

sentence-transformers 6 calls `preprocess(inputs, prompt=..., task=...)` on the input module and saves
module settings that 5.x does not know (`transformer_task`, `modality_config`, `module_output_name`);
5.x puts the prompt into the texts itself, calls `tokenize(texts, task=...)`, and its `Transformer`
takes only its own arguments. Saved model folders carry this file inlined into their modules.

The sentence-transformers version is told apart here, once; docs/architecture.md, "Versions and shims", lists
every shim that depends on it (here, in the modules' `tokenize` and in `st_folder.py`) and when each can go.
"""

import inspect
import re

import sentence_transformers

from .compat import REQUIREMENTS


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version)[:2])


_NEEDED = REQUIREMENTS["sentence-transformers"].lstrip(">=")
if _release(sentence_transformers.__version__) < _release(_NEEDED):  # say so, before an error from inside it
    raise ImportError(
        f"this model folder needs sentence-transformers>={_NEEDED}, found {sentence_transformers.__version__}: "
        f"pip install -U 'sentence-transformers>={_NEEDED}'"
    )

try:  # sentence-transformers 6 (its old path `sentence_transformers.models` warns there)
    from sentence_transformers.sentence_transformer.modules import Transformer
except ImportError:  # sentence-transformers 5.x
    from sentence_transformers.models import Transformer

LEGACY = not hasattr(Transformer, "preprocess")  # sentence-transformers 5.x


def init_kwargs(kwargs: dict) -> dict:
    """`kwargs` for `Transformer.__init__`: on 5.x without the settings that only 6.x saves and reads."""
    if not LEGACY:
        return kwargs
    accepted = inspect.signature(Transformer.__init__).parameters
    return {key: value for key, value in kwargs.items() if key in accepted}


def tokenize_texts(module: Transformer, texts: list, **kwargs) -> dict:
    """`Transformer`'s own tokenization of `texts` as they are (no prompt added): `preprocess` on 6.x,
    `tokenize` on 5.x (which takes only `padding`)."""
    if LEGACY:
        return Transformer.tokenize(module, texts, padding=kwargs.get("padding", True))
    return Transformer.preprocess(module, texts, **kwargs)


def output_name(module: Transformer) -> str:
    """The feature that holds the token embeddings (`module_output_name` on 6.x)."""
    return getattr(module, "module_output_name", "token_embeddings")


__all__ = ["LEGACY", "Transformer", "init_kwargs", "output_name", "tokenize_texts"]
