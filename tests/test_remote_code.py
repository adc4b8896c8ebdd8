"""The code a folder carries (`moe_embed.convert.remote_code`): one generated file per entry point, with no
sibling import left, so every transformers and sentence-transformers version loads it alone; and the model
code it is generated from carries no import that exists only to be copied."""

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from moe_embed.convert.remote_code import (
    MODELING_DIR,
    dependency_order,
    folder_auto_map,
    generate,
    write_folder_code,
)
from moe_embed.modeling.manifest import AUTO_MAP, FOLDER_FILES

REPO = Path(__file__).resolve().parent.parent


def relative_imports(source: str) -> list[int]:
    return [node.lineno for node in ast.walk(ast.parse(source)) if isinstance(node, ast.ImportFrom) and node.level]


@pytest.mark.parametrize("kind", sorted(FOLDER_FILES))
def test_every_folder_file_is_generated_whole(kind, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": kind}))
    written = write_folder_code(tmp_path, kind)
    assert sorted(p.name for p in tmp_path.glob("*.py")) == sorted(written) == sorted(FOLDER_FILES[kind])
    for name in written:
        source = (tmp_path / name).read_text()
        assert relative_imports(source) == [], f"{name} still imports a sibling"
        compile(source, name, "exec")
        # every module it was made of is named in its header, in an order where each follows what it imports
        order = dependency_order(name.removesuffix(".py"))
        assert order[-1] == name.removesuffix(".py")
        assert all(f"# ---- modeling/{module}.py ----" in source for module in order)
    # the config is the folder writer's, written once with its `auto_map` (tests/test_folder_writer.py)
    assert json.loads((tmp_path / "config.json").read_text()) == {"model_type": kind}
    assert folder_auto_map(kind) == AUTO_MAP.get(kind)


def test_a_generated_model_file_imports_alone_and_holds_its_config(tmp_path):
    """The file `auto_map` names imports in a process where this package cannot be imported, and defines the
    config and model classes `auto_map` points to (every model type, one process)."""
    arguments = []
    for kind, auto_map in sorted(AUTO_MAP.items()):
        folder = tmp_path / kind
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({"model_type": kind}))
        write_folder_code(folder, kind)
        arguments += [f"{folder}/{reference}" for reference in sorted(auto_map.values())]
    script = (
        "import sys, importlib.util\n"
        "sys.path = [p for p in sys.path if p not in ('', '.') and 'moe_embed' not in p]\n"
        "sys.modules['moe_embed'] = None\n"  # blocked, whatever is installed
        "for argument in sys.argv[1:]:\n"
        "    folder, reference = argument.rsplit('/', 1)\n"
        "    module, name = reference.split('.')\n"
        "    spec = importlib.util.spec_from_file_location(module, f'{folder}/{module}.py')\n"
        "    code = importlib.util.module_from_spec(spec); spec.loader.exec_module(code)\n"
        "    print(argument, isinstance(getattr(code, name, None), type))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script, *arguments], capture_output=True, text=True, cwd=tmp_path, timeout=300
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.splitlines() == [f"{argument} True" for argument in arguments]


def test_a_model_file_needs_no_sentence_transformers(tmp_path):
    """transformers refuses to load a model file while any import it holds (outside a `try`) is missing; the model
    files must load with transformers alone, the Sentence-Transformers modules need sentence-transformers."""
    from transformers.dynamic_module_utils import get_imports

    for kind in FOLDER_FILES:
        folder = tmp_path / kind
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({"model_type": kind}))
        for name in write_folder_code(folder, kind):
            needed = set(get_imports(str(folder / name))) - set(sys.stdlib_module_names)
            assert ("sentence_transformers" in needed) == name.startswith("st_"), (kind, name, sorted(needed))
            assert needed <= {"torch", "transformers", "sentence_transformers", "safetensors"}, (name, needed)


def test_the_model_code_has_no_import_kept_only_for_copying():
    """The decoy imports (`# noqa: F401`) that made transformers 4.x copy siblings are gone, and ruff's unused
    import rule holds for every model file."""
    for path in MODELING_DIR.glob("*.py"):
        text = path.read_text()
        assert not re.search(r"noqa:\s*F401", text), f"{path.name} keeps an unused import"
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--select", "F401", "--no-cache", str(REPO / "modeling")],
        capture_output=True,
        text=True,
    )
    if "No module named ruff" in result.stderr:
        pytest.skip("ruff is not installed in this environment")
    assert result.returncode == 0, result.stdout[-2000:]


def write_modules(directory: Path, modules: dict[str, str]) -> Path:
    directory.mkdir()
    for name, source in modules.items():
        (directory / f"{name}.py").write_text(source)
    return directory


def test_two_modules_defining_one_name_are_refused(tmp_path):
    directory = write_modules(
        tmp_path / "m",
        {
            "a": "import torch\nSIZE = 1\n",
            "b": "import torch\nSIZE = 2\n",
            "entry": '"""doc"""\nfrom .a import SIZE\nfrom .b import SIZE as OTHER_SIZE\n',
        },
    )
    with pytest.raises(ValueError, match="aliased sibling import"):
        generate("entry", directory)
    (directory / "entry.py").write_text("from .a import SIZE\nfrom .b import *\n")
    with pytest.raises(ValueError, match=r"b\.py and a\.py both define 'SIZE'"):
        generate("entry", directory)


def test_the_same_import_in_two_modules_is_one_binding_and_order_follows_imports(tmp_path):
    directory = write_modules(
        tmp_path / "m",
        {
            "base": "import logging\n\nlogger = logging.getLogger(__name__)\nSIZE = 3\n",
            "middle": "import logging\n\nfrom .base import SIZE\n\n"
            "logger = logging.getLogger(__name__)\nTWICE = 2 * SIZE\n",
            "entry": "from .middle import TWICE\nfrom .base import SIZE\n\n"
            "__all__ = ['RESULT']\nRESULT = TWICE + SIZE\n",
        },
    )
    assert dependency_order("entry", directory) == ["base", "middle", "entry"]
    source = generate("entry", directory)
    assert source.count("import logging") == 1 and source.count("logger = ") == 1
    assert "__all__" not in source
    namespace: dict = {}
    exec(compile(source, "entry.py", "exec"), namespace)
    assert namespace["RESULT"] == 9


def test_a_cycle_or_a_nested_sibling_import_is_refused(tmp_path):
    directory = write_modules(tmp_path / "m", {"a": "from .b import Y\nX = 1\n", "b": "from .a import X\nY = 2\n"})
    with pytest.raises(ValueError, match="cycle"):
        generate("a", directory)
    (directory / "b.py").write_text("def y():\n    from .a import X\n    return X\n")
    with pytest.raises(ValueError, match="inside a function"):
        generate("a", directory)
