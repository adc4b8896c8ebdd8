"""The one writer of model folders (`moe_embed.convert.folder_writer.write_model_folder`): what it writes, what it
refuses, and that each command writes each file of a folder once (an audit of every file opened for writing)."""

import contextlib
import json
import os
import shutil
import sys
from collections import Counter
from pathlib import Path

import pytest
from conftest import REPO

from moe_embed.convert.folder_writer import write_model_folder

TINY = REPO / "tests" / "data" / "tiny-minilm"


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


# Every file opened for writing while `_WRITES` is a list: Python's `open` / `os.open` with a write mode (an audit
# hook; it cannot be removed, so it records only inside `audited_writes`), and the native writers that bypass
# Python's open (tokenizers' `Tokenizer.save`, safetensors' `serialize_file`, under every name they are called by).
_WRITES: list | None = None
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC


def _audit(event: str, args: tuple) -> None:
    if event != "open" or _WRITES is None:
        return
    path, mode, flags = args
    if isinstance(path, (str, bytes, os.PathLike)) and (
        (mode is not None and any(c in str(mode) for c in "wax+")) or (mode is None and flags & WRITE_FLAGS)
    ):
        _WRITES.append(os.fsdecode(path))


sys.addaudithook(_audit)


@contextlib.contextmanager
def audited_writes(monkeypatch):
    """The list of every path opened for writing inside the block, in order."""
    import safetensors.torch
    import tokenizers

    global _WRITES

    def recording(native):
        def write(*args, **kwargs):  # Tokenizer.save(self, path, ...), serialize_file(tensors, path, ...)
            if _WRITES is not None:
                _WRITES.append(os.fsdecode(args[1]))
            return native(*args, **kwargs)

        return write

    monkeypatch.setattr(tokenizers.Tokenizer, "save", recording(tokenizers.Tokenizer.save))
    monkeypatch.setattr(safetensors.torch, "serialize_file", recording(safetensors.torch.serialize_file))
    _WRITES = []
    try:
        yield _WRITES
    finally:
        _WRITES = None


# what a folder holds besides its weights and graphs: each is written by one writer, once per command
NOT_FOLDER_FILES = (".safetensors", ".onnx", ".onnx_data", ".data", ".xml", ".bin", ".png")


def writes_per_file(writes: list[str], output: Path) -> Counter:
    """How often each file of the folder `output` was opened for writing, by its path inside the folder (a
    command writes into a temporary `.NAME.tmp-*` sibling renamed at the end)."""
    counts = Counter()
    parent = output.resolve().parent
    for written in writes:
        path = Path(written).resolve()
        if parent not in path.parents:
            continue
        inside = path.relative_to(parent).parts
        if inside[0] == output.name or inside[0].startswith(f".{output.name}.tmp-"):
            relative = "/".join(inside[1:])
            if relative and not relative.endswith(NOT_FOLDER_FILES):
                counts[relative] += 1
    return counts


def assert_each_file_written_once(writes: list[str], output: Path) -> None:
    counts = writes_per_file(writes, output)
    twice = {name: count for name, count in counts.items() if count > 1}
    assert not twice, f"folder files opened for writing more than once: {twice}"
    files = {
        str(p.relative_to(output)) for p in output.rglob("*") if p.is_file() and not p.name.endswith(NOT_FOLDER_FILES)
    }
    assert files and files <= set(counts), f"written where the audit does not see: {sorted(files - set(counts))}"


def test_the_audit_sees_every_writer_and_counts_a_second_write(tmp_path, monkeypatch):
    """The audit itself: Python's open, os.open, shutil's copies and the native tokenizer writer all count."""
    from tokenizers import Tokenizer

    output = tmp_path / "folder"
    output.mkdir()
    with audited_writes(monkeypatch) as writes:
        (output / "a.json").write_text("{}")
        shutil.copy2(TINY / "config.json", output / "config.json")
        os.close(os.open(output / "b.txt", os.O_WRONLY | os.O_CREAT))
        Tokenizer.from_file(str(TINY / "tokenizer.json")).save(str(output / "tokenizer.json"))
    assert writes_per_file(writes, output) == {"a.json": 1, "config.json": 1, "b.txt": 1, "tokenizer.json": 1}
    assert_each_file_written_once(writes, output)
    with audited_writes(monkeypatch) as writes:
        (output / "a.json").write_text("{}")
        (output / "a.json").write_text("{}")
    with pytest.raises(AssertionError, match="more than once"):
        assert_each_file_written_once(writes, output)


def test_upcycle_writes_each_folder_file_once(dense_path, tmp_path, monkeypatch):
    from moe_embed.convert.options import upcycle_options
    from moe_embed.convert.upcycle import upcycle

    for arch in ("mote", "comoe"):
        output = tmp_path / arch
        with audited_writes(monkeypatch) as writes:
            upcycle(upcycle_options(arch, base=dense_path, output=output))
        assert_each_file_written_once(writes, output)


def test_merge_writes_each_folder_file_once(mote_dir, comoe_dir, tmp_path, monkeypatch):
    from moe_embed.convert.merge_experts import MergeOptions, merge

    for name, folder, extra in (("ea", mote_dir, {}), ("task", mote_dir, {"task": "query"}), ("lora", comoe_dir, {})):
        output = tmp_path / name
        with audited_writes(monkeypatch) as writes:
            merge(MergeOptions(model_dir=folder, output=str(output), **extra))
        assert_each_file_written_once(writes, output)


def test_extract_adapter_writes_each_folder_file_once(comoe_dir, tmp_path, monkeypatch):
    from moe_embed.convert.extract_adapter import extract_adapter

    output = tmp_path / "adapter"
    with audited_writes(monkeypatch) as writes:
        extract_adapter(comoe_dir, output)
    assert_each_file_written_once(writes, output)


def test_the_onnx_folder_files_are_each_written_once(mote_dir, tmp_path, monkeypatch):
    """The files around a graph (config, tokenizer for clients, module settings, prompts): the export's part
    that needs no graph, in the default lane; the whole export is the slow test below."""
    from moe_embed.convert.onnx_folder import write_folder_files
    from moe_embed.folders import load_sentence_transformer

    st = load_sentence_transformer(mote_dir, trust_remote_code=True, device="cpu")
    output = tmp_path / "onnx"
    output.mkdir()
    with audited_writes(monkeypatch) as writes:
        write_folder_files(Path(mote_dir), output, st, st.max_seq_length + 8)
    assert_each_file_written_once(writes, output)


@pytest.mark.slow
def test_export_with_int8_writes_each_folder_file_once(mote_dir, tmp_path, monkeypatch):
    from moe_embed.convert.export_onnx import ExportOptions, export_onnx

    output = tmp_path / "onnx"
    with audited_writes(monkeypatch) as writes:
        export_onnx(ExportOptions(model_dir=mote_dir, output=output, quantize="int8", int8_min_cosine=0.9))
    assert_each_file_written_once(writes, output)
    assert {"README.md", "onnx_config.json", "tokenizer.json", "modules.json"} <= set(writes_per_file(writes, output))
