"""The documentation runs: every code block of README.md and docs/*.md runs as written, in the order shown, in a
fresh folder per page (the data fixtures standing in for the data folder), unless the line before it says why
it is not run (`<!-- not run: REASON -->`, or `<!-- code blocks not run: REASON -->` once for a page of
reproduction commands); every command of this package in a bash block, run or not, is accepted by its own
argument parser, so a renamed or removed option fails here; a YAML block is a training config that loads."""

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
# what documented commands read from the repository (they run from a scratch folder that links to these; the
# README's `evaluate` reads the data fixtures as tests/data)
LINKED = ("examples", "convert", "scripts", "tests")
PAGES = sorted(path.name for path in (REPO / "docs").glob("*.md"))
NOT_RUN = re.compile(r"<!-- not run: (?P<why>[^>]+?) -->\s*$")
PAGE_NOT_RUN = re.compile(r"^<!-- code blocks not run: (?P<why>[^>]+?) -->\s*$", flags=re.M)
RUNNABLE = ("bash", "python")


def code_blocks(text: str) -> list[tuple[str, str]]:
    """`(language, code)` of every fenced code block, in order."""
    return [(language, code) for language, code, _ in blocks_with_reasons(text)]


def blocks_with_reasons(text: str) -> list[tuple[str, str, str | None]]:
    """`(language, code, why it is not run or None)` of every fenced code block, in order."""
    page = PAGE_NOT_RUN.search(text)
    found = []
    for match in re.finditer(r"^```(\w*)\n(.*?)^```", text, flags=re.S | re.M):
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = NOT_RUN.search(before)
        why = marker.group("why") if marker else page.group("why") if page else None
        found.append((match.group(1), match.group(2), why))
    return found


def commands(code: str) -> list[list[str]]:
    """The commands of a bash block, continuation lines joined, comments dropped, as argument lists."""
    found = []
    for line in code.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        if words:
            found.append(words)
    return found


def run_blocks_in_order(text: str, folder: Path, skip=lambda language, code: False, data_folder=True) -> int:
    """Run the page's runnable blocks in order in `folder` (bash with -euo pipefail, python in a new interpreter);
    returns how many ran. `data_folder`: the fixtures stand in for the data folder ($MOE_EMBED_DATA); without it,
    the page's commands find data only where they say (the README, as a new user runs it)."""
    for name in LINKED:
        (folder / name).symlink_to(REPO / name)
    bin_dir = str(Path(sys.executable).parent)  # `moe-embed` and `python` of this environment
    env = {key: value for key, value in os.environ.items() if key != "MOE_EMBED_DATA"}
    env["PATH"] = f"{bin_dir}{os.pathsep}{os.environ['PATH']}"
    if data_folder:
        env["MOE_EMBED_DATA"] = str(FIXTURE_DATA)
    ran = 0
    for index, (language, code, why) in enumerate(blocks_with_reasons(text)):
        if language not in RUNNABLE or why or skip(language, code):
            continue
        argv = ["bash", "-euo", "pipefail", "-c", code] if language == "bash" else [sys.executable, "-c", code]
        result = subprocess.run(argv, cwd=folder, env=env, capture_output=True, text=True, timeout=900)
        assert result.returncode == 0, f"block {index} failed:\n{code}\n{result.stderr[-3000:]}"
        ran += 1
    return ran


@pytest.mark.slow
def test_readme_code_blocks_run_in_order(tmp_path):
    text = (REPO / "README.md").read_text(encoding="utf-8")
    blocks = blocks_with_reasons(text)
    assert len(blocks) >= 10 and all(language in RUNNABLE and why is None for language, _, why in blocks), blocks
    skipped = set()

    def setup_block(language, code):
        lines = {" ".join(words) for words in commands(code)} if language == "bash" else set()
        if lines and lines <= SETUP_COMMANDS:
            skipped.update(lines)
            return True
        return False

    # as a new user runs it: offline (as the suite runs), no data folder but what the README names
    assert run_blocks_in_order(text, tmp_path, setup_block, data_folder=False) == len(blocks) - 1
    assert skipped == SETUP_COMMANDS  # the setup block is the only one not run here, and it is still there


@pytest.mark.slow
@pytest.mark.parametrize("page", [p for p in PAGES if any(
    language in RUNNABLE and why is None
    for language, _, why in blocks_with_reasons((REPO / "docs" / p).read_text(encoding="utf-8"))
)])  # fmt: skip
def test_docs_code_blocks_run_in_order(page, tmp_path):
    assert run_blocks_in_order((REPO / "docs" / page).read_text(encoding="utf-8"), tmp_path) >= 1


@pytest.mark.parametrize("page", PAGES)
def test_every_block_runs_or_says_why_and_yaml_blocks_load(page, tmp_path):
    """A block that is not run names its reason; a runnable block is bash or python; a YAML block is a training
    config that `moe-embed train` loads (its datasets are not read)."""
    from moe_embed.training.train import load_config

    for index, (language, code, why) in enumerate(blocks_with_reasons((REPO / "docs" / page).read_text())):
        assert why is None or len(why.split()) >= 2, f"{page} block {index}: say why it is not run"
        if language == "yaml":
            (tmp_path / f"{index}.yaml").write_text(code)
            load_config(tmp_path / f"{index}.yaml")
        else:
            # another language's block (transformers.js) is documented only where the page says where it runs
            known = (*RUNNABLE, "text", "", *(("javascript",) if why else ()))
            assert language in known, f"{page} block {index}: unknown language {language!r}"


# a documented command -> (module whose `main(argv)` parses it, the arguments): the forms the docs use
def tool_of(words: list[str]) -> tuple[str, list[str]] | None:
    """`(module, arguments)` of a command of this package, or `None` for any other command."""
    from moe_embed.cli import SUBCOMMANDS

    for i, word in enumerate(words):
        if word == "moe-embed" and i + 1 < len(words):
            return "moe_embed.cli", words[i + 1 :]
        if word.endswith(".py") and word.split("/")[0] in ("convert", "benchmarks", "experiments"):
            return word.removesuffix(".py").replace("/", "."), words[i + 1 :]
        if word == "-m" and i + 1 < len(words) and words[i + 1] != "pytest":
            module = words[i + 1]
            known = {module for module, _, _ in SUBCOMMANDS.values()}
            if module == "moe_embed":  # python -m moe_embed SUBCOMMAND
                return "moe_embed.cli", words[i + 2 :]
            if module in known or module.split(".")[0] in ("benchmarks", "experiments"):
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
    ("page", "at_least"),
    [
        ("docs/results.md", 10),
        ("docs/benchmarks.md", 10),
        ("docs/serving.md", 1),
        ("docs/data.md", 3),
        ("docs/embedding.md", 5),
        ("benchmarks/results/serving.md", 5),
        ("benchmarks/results/embedding.md", 1),
    ],
)
def test_documented_commands_parse(page, at_least, monkeypatch, capsys):
    problems, parsed = parse_problems((REPO / page).read_text(encoding="utf-8"), monkeypatch)
    assert problems == [], capsys.readouterr().err[-2000:]
    assert parsed >= at_least  # the walk found the page's commands


def test_the_parse_check_can_fail(monkeypatch, capsys):
    text = (
        "```bash\nmoe-embed upcycle --arch moe --num-local-experts 4\n"  # fine
        "moe-embed upcycle --arch moe --no-such-option 1\n"  # a removed option
        "python -m benchmarks.bench_mote --seq-length 16\n"  # a renamed option (now --seq-lens)
        "cp a b   # not a command of this package\n```\n"
    )
    problems, parsed = parse_problems(text, monkeypatch)
    assert parsed == 1 and len(problems) == 2, problems


@pytest.mark.slow
def test_the_readme_fast_lane_collects_from_an_activated_venv():
    """`source .venv/bin/activate; pytest`, as the README says: the venv's `pytest` console script, run from the
    repository root with no PYTHONPATH, collects every test (the repository's own folders, `experiments` and
    `benchmarks`, importable as `python -m pytest` would make them)."""
    bin_dir = Path(sys.executable).parent
    assert (bin_dir / "pytest").is_file(), "the dev extra installs the pytest console script"
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env.update(PATH=f"{bin_dir}{os.pathsep}{env['PATH']}", VIRTUAL_ENV=str(bin_dir.parent))  # what activate sets
    result = subprocess.run(
        ["pytest", "--collect-only", "-q", "-p", "no:cacheprovider"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "error" not in result.stdout.splitlines()[-1], result.stdout[-3000:]
    assert "tests/test_experiments.py::" in result.stdout
