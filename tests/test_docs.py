"""The documentation runs: every code block of README.md runs as written, in the order shown, in a fresh folder
(the data fixtures standing in for the data folder), and every command in the bash blocks of `docs/` is
accepted by its own argument parser, so a renamed or removed option fails here."""

import argparse
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import FIXTURE_DATA, REPO

# The README's first block: the two commands that set up an environment. The test command runs this very test,
# and both install packages, so they are run by CI (`.ci/run`) and in a fresh clone, not here.
SETUP_COMMANDS = {"bash scripts/demo.sh", "bash scripts/test.sh"}
# what README commands read from the repository (they run from a scratch folder that links to these)
LINKED = ("examples", "convert", "scripts")


def code_blocks(text: str) -> list[tuple[str, str]]:
    """`(language, code)` of every fenced code block, in order."""
    return re.findall(r"^```(\w*)\n(.*?)^```", text, flags=re.S | re.M)


def commands(code: str) -> list[list[str]]:
    """The commands of a bash block, continuation lines joined, comments dropped, as argument lists."""
    found = []
    for line in code.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        if words:
            found.append(words)
    return found


@pytest.mark.slow
def test_readme_code_blocks_run_in_order(tmp_path):
    blocks = code_blocks((REPO / "README.md").read_text(encoding="utf-8"))
    assert len(blocks) >= 10 and all(language in ("bash", "python") for language, _ in blocks), blocks
    for name in LINKED:
        (tmp_path / name).symlink_to(REPO / name)
    bin_dir = str(Path(sys.executable).parent)  # `moe-embed` and `python` of this environment
    env = {**os.environ, "MOE_EMBED_DATA": str(FIXTURE_DATA), "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    skipped = set()
    for index, (language, code) in enumerate(blocks):
        lines = {" ".join(words) for words in commands(code)} if language == "bash" else set()
        if lines and lines <= SETUP_COMMANDS:
            skipped |= lines
            continue
        argv = ["bash", "-euo", "pipefail", "-c", code] if language == "bash" else [sys.executable, "-c", code]
        result = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
        assert result.returncode == 0, f"README block {index} failed:\n{code}\n{result.stderr[-3000:]}"
    assert skipped == SETUP_COMMANDS  # the setup block is the only one not run here, and it is still there


# a documented command -> (module whose `main(argv)` parses it, the arguments): the forms the docs use
def tool_of(words: list[str]) -> tuple[str, list[str]] | None:
    """`(module, arguments)` of a command of this package, or `None` for any other command."""
    from moe_embed_cli import SUBCOMMANDS

    for i, word in enumerate(words):
        if word == "moe-embed" and i + 1 < len(words):
            return "moe_embed_cli", words[i + 1 :]
        if word.endswith(".py") and word.split("/")[0] in ("convert", "benchmarks", "experiments"):
            return word.removesuffix(".py").replace("/", "."), words[i + 1 :]
        if word == "-m" and i + 1 < len(words) and words[i + 1] != "pytest":
            module = words[i + 1]
            known = {module for module, _, _ in SUBCOMMANDS.values()}
            if module in known or module.split(".")[0] in ("benchmarks", "experiments", "moe_embed_cli"):
                return module, words[i + 2 :]
    return None


class Parsed(Exception):
    """Raised instead of running a command once its arguments have parsed."""


def parse_problems(text: str, monkeypatch) -> tuple[list[str], int]:
    """`(problems, commands parsed)` of the package's commands in the bash blocks of `text`."""
    import importlib

    def parse_only(parser, args=None, namespace=None):
        raise Parsed(original(parser, args, namespace))  # parsed (or exited on an error): stop before any work

    original = argparse.ArgumentParser.parse_args
    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_only)
    problems, parsed = [], 0
    for language, code in code_blocks(text):
        if language != "bash":
            continue
        for words in commands(code):
            found = tool_of(words)
            if found is None:
                continue
            module, arguments = found
            try:
                main = importlib.import_module(module).main
                main(arguments)
                problems.append(f"{' '.join(words)}: ran without parsing its arguments")
            except Parsed:
                parsed += 1
            except SystemExit as stop:
                problems.append(f"{' '.join(words)}: rejected by its parser (exit {stop.code})")
            except Exception as error:  # noqa: BLE001 - any failure is a problem of the documented command
                problems.append(f"{' '.join(words)}: {type(error).__name__}: {error}")
    return problems, parsed


@pytest.mark.parametrize(
    ("page", "at_least"), [("results.md", 10), ("benchmarks.md", 10), ("serving.md", 1), ("data.md", 3)]
)
def test_documented_commands_parse(page, at_least, monkeypatch, capsys):
    problems, parsed = parse_problems((REPO / "docs" / page).read_text(encoding="utf-8"), monkeypatch)
    assert problems == [], capsys.readouterr().err[-2000:]
    assert parsed >= at_least  # the walk found the page's commands


def test_the_parse_check_can_fail(monkeypatch, capsys):
    text = (
        "```bash\nmoe-embed upcycle --arch moe --num-experts 4\n"  # fine
        "moe-embed upcycle --arch moe --no-such-option 1\n"  # a removed option
        "python -m benchmarks.bench_mote --seq-length 16\n"  # a renamed option (now --seq-lens)
        "cp a b   # not a command of this package\n```\n"
    )
    problems, parsed = parse_problems(text, monkeypatch)
    assert parsed == 1 and len(problems) == 2, problems
