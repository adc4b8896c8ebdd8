"""The house: every import between top-level folders points down the layers `docs/architecture.md` draws,
the model code imports nothing of the package (its files are copied into model folders), and the front
door (`moe-embed`) answers `--help` and bad arguments without importing torch."""

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

# folder (or top-level module) -> the folders it may import; a folder may always import itself
LAYERS = {
    "modeling": set(),
    "hub_cards": set(),
    "moe_embed": {"modeling"},
    "convert": {"moe_embed", "modeling", "hub_cards"},
    "evaluation": {"moe_embed", "modeling"},
    "training": {"moe_embed", "modeling", "convert", "evaluation"},
    "moe_embed_cli": {"moe_embed", "modeling", "convert", "evaluation", "training"},
    "benchmarks": {"moe_embed", "modeling", "convert", "evaluation", "training"},
    "experiments": {"moe_embed", "modeling", "convert", "evaluation", "training"},
    "examples": {"moe_embed", "modeling", "convert", "evaluation", "training"},
    "scripts": {"moe_embed", "modeling", "convert", "evaluation", "training"},
}
# what model code may import: it runs from saved model folders, where nothing of this package exists
MODEL_CODE_IMPORTS = {"torch", "transformers", "safetensors", "sentence_transformers"}


def imports_of(source: str) -> list[tuple[int, str]]:
    """`(line, top-level name)` of every absolute import in `source`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name.split(".")[0]) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module.split(".")[0]))
    return found


def layer_problems(files: dict[str, str]) -> list[str]:
    """Imports that point up or sideways, for `{path relative to the repository: source}`."""
    problems = []
    for path, source in files.items():
        owner = path.split("/")[0].removesuffix(".py")
        if owner not in LAYERS:
            continue
        for line, name in imports_of(source):
            if name in LAYERS and name != owner and name not in LAYERS[owner]:
                problems.append(f"{path}:{line} imports {name} ({owner} may import {sorted(LAYERS[owner])})")
            elif owner == "modeling" and name not in MODEL_CODE_IMPORTS | set(sys.stdlib_module_names):
                problems.append(f"{path}:{line} imports {name}: model code imports only torch, transformers, siblings")
            if owner == "modeling" and name == "sentence_transformers" and not Path(path).name.startswith("st_"):
                problems.append(f"{path}:{line}: only the Sentence-Transformers modules (st_*.py) import it")
    return problems


def repository_sources() -> dict[str, str]:
    tracked = subprocess.run(["git", "ls-files", "*.py"], cwd=REPO, capture_output=True, text=True, check=True)
    untracked = subprocess.run(
        ["git", "ls-files", "--others", "--exclude-standard", "*.py"], cwd=REPO, capture_output=True, text=True
    )
    paths = set(tracked.stdout.split()) | set(untracked.stdout.split())
    return {path: (REPO / path).read_text(encoding="utf-8") for path in sorted(paths) if (REPO / path).is_file()}


def test_every_arrow_between_folders_points_down():
    files = repository_sources()
    assert len([p for p in files if p.startswith("convert/")]) >= 10  # the walk found the tree
    assert layer_problems(files) == []


def test_the_layer_check_can_fail():
    files = {
        "convert/x.py": "from evaluation.run import TASKS\n",  # sideways
        "moe_embed/y.py": "import convert.upcycle\n",  # up
        "modeling/z.py": "from moe_embed.usage import UsageError\nimport numpy\n",  # model code importing the package
        "modeling/w.py": "from sentence_transformers import SentenceTransformer\n",  # not an st_ module
        "training/ok.py": "from convert.upcycle import upcycle\nfrom evaluation.run import evaluate\n",  # down
    }
    problems = layer_problems(files)
    assert len(problems) == 5, problems
    assert not any(problem.startswith("training/") for problem in problems)


def _run_front_door(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)


def test_every_subcommand_answers_help_without_importing_torch():
    from moe_embed_cli import SUBCOMMANDS

    code = (
        "import sys, json\nfrom moe_embed_cli import main\n"
        "try:\n    code = main([sys.argv[1], '--help'])\nexcept SystemExit as stop:\n    code = stop.code\n"
        "print(json.dumps({'code': code, 'heavy': sorted(m for m in ('torch', 'transformers', "
        "'sentence_transformers') if m in sys.modules)}))\n"
    )
    for name in SUBCOMMANDS:
        result = subprocess.run([sys.executable, "-c", code, name], cwd=REPO, capture_output=True, text=True)
        assert result.returncode == 0, result.stderr
        report = json.loads(result.stdout.strip().splitlines()[-1])
        assert report == {"code": 0, "heavy": []}, (name, report)
        assert f"moe-embed {name}" in result.stdout  # the usage line names the command as typed


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["upcycle", "--arch", "dense"], "invalid choice: 'dense'"),
        (["upcycle", "--arch", "moe", "--expert-layers", "all"], "--expert-layers only apply to --arch mote"),
        (["upcycle", "--expert-noise", "-1", "--arch", "moe"], "--expert-noise must be >= 0"),
        (["merge", "m", "--output", "o", "--task", "query", "--experts", "query"], "pass --task or --experts"),
        (["export", "m", "--output", "o", "--opset", "9"], "--opset must lie in 18..23"),
        (["calibrate-aea", "m", "--output", "o", "--prompt", "no text slot"], "--prompt must contain [TEXT]"),
        (["no-such-command"], "unknown subcommand 'no-such-command'"),
    ],
)
def test_bad_arguments_are_one_line_before_any_heavy_import(argv, message):
    code = (
        "import sys\nfrom moe_embed_cli import main\n"
        "try:\n    code = main(sys.argv[1:])\nexcept SystemExit as stop:\n    code = stop.code\n"
        "print('torch' in sys.modules, file=sys.stderr)\nsys.exit(code)\n"
    )
    result = subprocess.run([sys.executable, "-c", code, *argv], cwd=REPO, capture_output=True, text=True)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr
    assert message in lines[-2] and "Traceback" not in result.stderr, result.stderr
    assert lines[-1] == "False"  # torch was never imported


def test_the_console_script_is_installed():
    script = Path(sys.executable).parent / "moe-embed"
    result = subprocess.run([str(script), "--help"], capture_output=True, text=True)
    assert result.returncode == 0 and "upcycle" in result.stdout and "calibrate-aea" in result.stdout
