"""The one writer of model folders (`moe_embed.convert.folder_writer.write_model_folder`): what it writes, what it
refuses, and that the converters write folders through it alone."""

import ast
import json

import pytest
from conftest import REPO

from moe_embed.convert.folder_writer import write_model_folder

TINY = REPO / "tests" / "data" / "tiny-minilm"
# the pieces a folder is written from; only the folder writer (and the model's own adapter-only save) calls them
FOLDER_PIECES = {
    "write_modules",
    "write_model_config",
    "write_module_config",
    "copy_tokenizer_files",
    "write_folder_code",
}


def test_a_config_only_folder_gets_every_sentence_transformers_file(tmp_path):
    config = json.loads((TINY / "config.json").read_text())
    cards = []
    write_model_folder(
        tmp_path,
        config=config,
        tokenizer_from=TINY,
        input_module="sentence_transformers.models.Transformer",
        prompts={"query": "search_query: "},
        default_prompt_name="query",
        card=cards.append,
    )
    modules = json.loads((tmp_path / "modules.json").read_text())
    assert [m["type"].rsplit(".", 1)[-1] for m in modules] == ["Transformer", "Pooling"]  # mean pooling: no source
    pooling = json.loads((tmp_path / "1_Pooling" / "config.json").read_text())
    assert pooling["word_embedding_dimension"] == config["hidden_size"] and pooling["pooling_mode_mean_tokens"]
    settings = json.loads((tmp_path / "config_sentence_transformers.json").read_text())
    assert (settings["prompts"], settings["default_prompt_name"]) == ({"query": "search_query: "}, "query")
    assert json.loads((tmp_path / "config.json").read_text()) == config
    assert (tmp_path / "vocab.txt").is_file() or (tmp_path / "tokenizer.json").is_file()
    assert cards == [tmp_path]


@pytest.mark.parametrize(
    "arguments, message",
    [
        ({"config": {"hidden_size": 4}, "model": object()}, "model or its config, not both"),
        ({}, "model or its config, not both"),
        ({"config": {"hidden_size": 4}}, "tokenizer, not both"),
        ({"config": {"hidden_size": 4}, "tokenizer_from": TINY, "tokenizer": object()}, "tokenizer, not both"),
    ],
)
def test_a_folder_has_one_source_of_weights_and_one_of_tokenizer(tmp_path, arguments, message):
    with pytest.raises(ValueError, match=message):
        write_model_folder(tmp_path, input_module="sentence_transformers.models.Transformer", **arguments)
    assert list(tmp_path.iterdir()) == []  # refused before anything is written


def test_the_converters_write_folders_through_the_one_writer():
    """No converter assembles a folder's pieces itself: each calls `write_model_folder`."""
    writers = []
    for path in sorted((REPO / "convert").glob("*.py")):
        if path.name in ("folder_writer.py", "remote_code.py", "checkpoint.py"):
            continue
        tree = ast.parse(path.read_text())
        called = {
            node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            for node in ast.walk(tree)
            if isinstance(node, ast.Call)
        }
        assert not called & FOLDER_PIECES, f"convert/{path.name} writes folder pieces itself: {called & FOLDER_PIECES}"
        if "write_model_folder" in called:
            writers.append(path.name)
    assert set(writers) == {"builders.py", "merging.py", "onnx_folder.py", "aea_calibration.py"}
