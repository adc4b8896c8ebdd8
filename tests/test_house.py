"""The house: every import between top-level folders points down the layers `docs/architecture.md` draws,
the model code imports nothing of the package (its files are copied into model folders), and the front
door (`moe-embed`) answers `--help` and bad arguments without importing torch."""

import ast
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import REPO

# layer -> the layers it may import; a layer may always import itself. A layer is a folder of the repository,
# installed as a subpackage of `moe_embed` (`modeling/` is `moe_embed.modeling`), or the package's own modules
# (`moe_embed/*.py`: the contracts the tools share), or the front door `moe_embed/cli.py`.
LAYERS = {
    "modeling": set(),
    "hub_cards": set(),
    "moe_embed": {"modeling"},
    "convert": {"moe_embed", "modeling", "hub_cards"},
    "evaluation": {"moe_embed", "modeling"},
    "training": {"moe_embed", "modeling", "convert", "evaluation"},
    "cli": {"moe_embed", "modeling", "convert", "evaluation", "training"},
    "benchmarks": {"moe_embed", "modeling", "convert", "evaluation", "training"},
    "experiments": {"moe_embed", "modeling", "convert", "evaluation", "training"},
    "examples": {"moe_embed", "modeling", "convert", "evaluation", "training"},
    "scripts": {"moe_embed", "modeling", "convert", "evaluation", "training"},
}
# the folders installed under `moe_embed`, and the module that is a layer of its own
SUBPACKAGES = {"modeling", "convert", "training", "evaluation", "hub_cards", "cli"}
# what model code may import: it runs from saved model folders, where nothing of this package exists
MODEL_CODE_IMPORTS = {"torch", "transformers", "safetensors", "sentence_transformers"}


def imports_of(source: str) -> list[tuple[int, str]]:
    """`(line, dotted name)` of every absolute import in `source`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
    return found


def layer_of_import(name: str) -> str | None:
    """The layer an import names (`moe_embed.convert.upcycle` -> convert, `moe_embed.errors` -> moe_embed), or
    None for another package's."""
    parts = name.split(".")
    if parts[0] != "moe_embed":
        return None
    return parts[1] if len(parts) > 1 and parts[1] in SUBPACKAGES else "moe_embed"


def layer_of_file(path: str) -> str:
    owner = path.split("/")[0].removesuffix(".py")
    return "cli" if path in ("moe_embed/cli.py", "moe_embed/__main__.py") else owner


def layer_problems(files: dict[str, str]) -> list[str]:
    """Imports that point up or sideways, or name a folder as a top-level package, for `{path relative to the
    repository: source}`."""
    problems = []
    for path, source in files.items():
        owner = layer_of_file(path)
        if owner not in LAYERS:
            continue
        for line, name in imports_of(source):
            top, layer = name.split(".")[0], layer_of_import(name)
            if top in SUBPACKAGES:
                problems.append(f"{path}:{line} imports {name}: installed, it is moe_embed.{name}")
            elif layer and layer != owner and layer not in LAYERS[owner]:
                problems.append(f"{path}:{line} imports {layer} ({owner} may import {sorted(LAYERS[owner])})")
            elif owner == "modeling" and top not in MODEL_CODE_IMPORTS | set(sys.stdlib_module_names):
                problems.append(f"{path}:{line} imports {name}: model code imports only torch, transformers, siblings")
            if owner == "modeling" and top == "sentence_transformers" and not Path(path).name.startswith("st_"):
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
        "convert/x.py": "from moe_embed.evaluation.run import TASKS\n",  # sideways
        "moe_embed/y.py": "import moe_embed.convert.upcycle\n",  # up
        "evaluation/v.py": "from training.train import train\n",  # the old top-level name
        "modeling/z.py": "from moe_embed.errors import UsageError\nimport numpy\n",  # model code importing the package
        "modeling/w.py": "from sentence_transformers import SentenceTransformer\n",  # not an st_ module
        # down
        "training/ok.py": "from moe_embed.convert.upcycle import upcycle\nfrom moe_embed.evaluation import run\n",
    }
    problems = layer_problems(files)
    assert len(problems) == 6, problems
    assert not any(problem.startswith("training/") for problem in problems)


def _run_front_door(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)


def test_every_subcommand_answers_help_without_importing_torch():
    from moe_embed.cli import SUBCOMMANDS

    code = (
        "import sys, json\nfrom moe_embed.cli import main\n"
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
        (["upcycle", "--arch", "moe", "--expert-layers", "all"], "--expert-layers only applies to --arch mote"),
        (["upcycle", "--expert-noise", "-1", "--arch", "moe"], "--expert-noise must be >= 0"),
        (["merge", "m", "--output", "o", "--task", "query", "--experts", "query"], "pass --task or --experts"),
        (["export", "m", "--output", "o", "--opset", "9"], "--opset must lie in 18..23"),
        (["export", "m", "--output", "o", "--int8-variants", "avx3"], "unknown avx3; expected names among avx512_vnni"),
        (["export", "m", "--output", "o", "--int8-variants", "avx2"], "--int8-variants applies with --quantize int8"),
        (["calibrate-aea", "m", "--output", "o", "--prompt", "no text slot"], "--prompt must contain [TEXT]"),
        (["no-such-command"], "unknown subcommand 'no-such-command'"),
    ],
)
def test_bad_arguments_are_one_line_before_any_heavy_import(argv, message):
    code = (
        "import sys\nfrom moe_embed.cli import main\n"
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


def module_of(path: str) -> str | None:
    """The installed name of a package file (`convert/upcycle.py` -> moe_embed.convert.upcycle), or None."""
    parts = Path(path).with_suffix("").parts
    if parts[0] == "moe_embed":
        return ".".join(parts).removesuffix(".__init__")
    if parts[0] in SUBPACKAGES:
        return ".".join(("moe_embed", *parts)).removesuffix(".__init__")
    return None


def mutual_imports(files: dict[str, str]) -> list[str]:
    """Pairs of package modules that import each other, anywhere in the file (in a function, under
    TYPE_CHECKING: a command and its worker that name each other are one idea in two rooms)."""
    modules = {module_of(path): source for path, source in files.items() if module_of(path)}
    graph = {}
    for module, source in modules.items():
        package = module.rsplit(".", 1)[0]
        names = set()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ImportFrom) and node.level:  # the model code's relative imports
                base = package if node.level == 1 else package.rsplit(".", node.level - 1)[0]
                names |= {f"{base}.{node.module}"} if node.module else {f"{base}.{a.name}" for a in node.names}
        names |= {name for _, name in imports_of(source)}
        graph[module] = {name for name in names if name in modules and name != module}
    return sorted(f"{a} <-> {b}" for a in graph for b in graph[a] if a < b and a in graph.get(b, ()))


def test_no_two_package_files_import_each_other():
    assert mutual_imports(repository_sources()) == []


def test_the_mutual_import_check_can_fail():
    files = {
        "convert/upcycle.py": "def f():\n    from moe_embed.convert.builders import write\n",
        "convert/builders.py": "if TYPE_CHECKING:\n    from moe_embed.convert.upcycle import X\n",
        "modeling/a.py": "from .b import y\n",
        "modeling/b.py": "def g():\n    from .a import x\n",
        "convert/options.py": "",
        "convert/merging.py": "from moe_embed.convert.options import MergeOptions\n",
    }
    assert mutual_imports(files) == [
        "moe_embed.convert.builders <-> moe_embed.convert.upcycle",
        "moe_embed.modeling.a <-> moe_embed.modeling.b",
    ]


def test_installed_the_package_is_one_name():
    """Outside the repository, the folders are `moe_embed`'s subpackages and nothing else: a user's own
    `training/` or `evaluation/` neither shadows ours nor is shadowed."""
    code = (
        "import importlib, json, sys\n"
        "sys.path[:] = [p for p in sys.path if p not in ('', '.')]\n"
        "found = {}\n"
        "for name in ('modeling', 'convert', 'training', 'evaluation', 'hub_cards', 'moe_embed_cli',\n"
        "             'moe_embed.modeling', 'moe_embed.convert.upcycle', 'moe_embed.training',\n"
        "             'moe_embed.evaluation', 'moe_embed.hub_cards', 'moe_embed.cli'):\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "        found[name] = True\n"
        "    except ImportError:\n"
        "        found[name] = False\n"
        "print(json.dumps(found))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd="/", capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    assert {name for name, ok in found.items() if ok} == {name for name in found if name.startswith("moe_embed.")}
    main = subprocess.run([sys.executable, "-m", "moe_embed", "--help"], cwd="/", capture_output=True, text=True)
    assert main.returncode == 0 and "calibrate-aea" in main.stdout


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports, at any depth of its code."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


def test_the_model_code_passes_data_as_arguments():
    """No model file hands data to another through a context variable or per-thread state: a CoMoE layer's
    routing reaches its linears as an argument (`modeling_encoder.project`), and the auxiliary loss reaches
    sentence-transformers' features from the model's output (`st_moe.MoeTransformer.forward`). The exception,
    knowingly: AEA runs on models it does not own (OLMoE, Qwen-MoE, ...), so it works by hooks, and its two files
    hold a lock that serialises concurrent calls."""
    hidden = {
        path.name: imported_modules(path) & {"contextvars", "threading"}
        for path in sorted((REPO / "modeling").glob("*.py"))
    }
    known = {"aea_controller.py": {"threading"}, "st_aea.py": {"threading"}}
    assert {name: found for name, found in hidden.items() if found} == known


def _names_a_config(node: ast.AST) -> bool:
    """Whether an expression is a config: `config`, `self.config`, `model.config`, `sub_config`, ..."""
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
    return "config" in name.lower()


def _config_writes(function: ast.AST) -> list[int]:
    """Lines of `function` that assign to an attribute of a config (`config.x = `, `self.config.x += `,
    `setattr(config, ...)`)."""
    lines = []
    for node in ast.walk(function):
        targets = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        for target in targets:
            for leaf in ast.walk(target):  # unpacks tuples: `config.a, x = ...`
                if isinstance(leaf, ast.Attribute) and isinstance(leaf.ctx, ast.Store) and _names_a_config(leaf.value):
                    lines.append(node.lineno)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("setattr", "delattr"):
            if node.args and _names_a_config(node.args[0]):
                lines.append(node.lineno)
    return lines


def forward_config_writes(files: dict[str, str]) -> list[str]:
    """`path:line Class.method` wherever a `forward` of model code, or a method of its class (or of a base class
    in `files`) that it calls as `self.method(...)`, at any depth, assigns to an attribute of a config."""
    classes = {}
    for path, source in files.items():
        for node in ast.parse(source).body:
            if isinstance(node, ast.ClassDef):
                methods = {f.name: f for f in node.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}
                bases = [b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases]
                classes[node.name] = (path, methods, bases)

    def find(class_name: str, method: str):
        """`(path, class, function)` of `method` as `class_name` resolves it, through its bases in `files`."""
        if class_name not in classes:
            return None
        path, methods, bases = classes[class_name]
        if method in methods:
            return path, class_name, methods[method]
        return next((found for base in bases if (found := find(base, method))), None)

    problems = set()
    for class_name, (_, methods, _) in classes.items():
        if "forward" not in methods:
            continue
        todo, seen = [find(class_name, "forward")], set()
        while todo:
            path, owner, function = todo.pop()
            if (owner, function.name) in seen:
                continue
            seen.add((owner, function.name))
            problems |= {f"{path}:{line} {owner}.{function.name}" for line in _config_writes(function)}
            for call in ast.walk(function):
                if (
                    isinstance(call, ast.Call)
                    and isinstance(call.func, ast.Attribute)
                    and isinstance(call.func.value, ast.Name)
                    and call.func.value.id == "self"
                    and (found := find(class_name, call.func.attr))
                ):
                    todo.append(found)
    return sorted(problems)


def test_no_forward_of_the_model_code_writes_to_a_config():
    """A config is shared by every thread that runs the model (and by the models built from one config object):
    nothing a forward pass runs assigns to it. A choice made per call travels as an argument or is read from the
    call's own inputs."""
    files = {path: source for path, source in repository_sources().items() if path.startswith("modeling/")}
    assert len(files) >= 20  # the walk found the model code
    assert forward_config_writes(files) == []


def test_the_config_write_check_can_fail():
    files = {
        "modeling/a.py": (
            "class Base:\n"
            "    def choose(self, device):\n"
            "        if device:\n"
            "            self.config._experts_implementation = 'eager'\n"
            "class Model(Base):\n"
            "    def forward(self, x):\n"
            "        self.choose(x.device)\n"
            "        return self.helper(x)\n"
            "    def helper(self, x):\n"
            "        config = self.config\n"
            "        config.output_hidden_states, y = True, x\n"
            "        setattr(self.config, 'use_cache', False)\n"
            "        return y\n"
            "    def __init__(self, config):\n"
            "        config.active_tasks = None\n"  # building a model may settle its config
        ),
        "modeling/b.py": "class Layer:\n    def forward(self, x):\n        self.config.count += 1\n",
    }
    assert forward_config_writes(files) == [
        "modeling/a.py:11 Model.helper",
        "modeling/a.py:12 Model.helper",
        "modeling/a.py:4 Base.choose",
        "modeling/b.py:3 Layer.forward",
    ]


# the installed package's folders (not the benchmarks, experiments, scripts and tests beside it)
PACKAGE_FOLDERS = ("modeling/", "convert/", "training/", "evaluation/", "moe_embed/", "hub_cards/")
LONGEST_FUNCTION = 65


def long_functions(files: dict[str, str], limit: int = LONGEST_FUNCTION) -> list[str]:
    """`path:line name (N lines)` of each function longer than `limit` lines, from `def` to its last line."""
    found = []
    for path, source in files.items():
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > limit:
                    found.append(f"{path}:{node.lineno} {node.name} ({length} lines)")
    return found


def test_no_function_of_the_package_is_longer_than_a_reader_can_hold():
    files = {path: source for path, source in repository_sources().items() if path.startswith(PACKAGE_FOLDERS)}
    assert len(files) >= 50  # the walk found the package
    assert long_functions(files) == []


def test_the_length_check_can_fail():
    body = "".join(f"x{i} = {i}\n" for i in range(LONGEST_FUNCTION - 1))
    fits = "def fits():\n" + textwrap.indent(body, "    ")
    long = "class C:\n    def long(self):\n" + textwrap.indent(body + "y = 1\n", "        ")
    assert long_functions({"convert/a.py": fits, "convert/b.py": long}) == ["convert/b.py:2 long (66 lines)"]
