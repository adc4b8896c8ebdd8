"""The README's commands run in the order it lists them: every model folder a command reads was written
by an earlier one (or is the bundled checkpoint), no command writes a folder an earlier one wrote
unless it says `--overwrite`, and every file a command names (configs, calibration texts) ships here."""

import re
import shlex

import yaml
from conftest import REPO

from convert.upcycle import DEFAULT_OUTPUTS

# tool -> how many leading positional arguments name an input folder
READERS = {
    "convert/merge_experts.py": 1,
    "convert/export_onnx.py": 1,
    "convert/extract_adapter.py": 1,
    "convert/calibrate_aea.py": 1,
    "convert/push_to_hub.py": 1,
    "evaluation.run": 1,
    "evaluation.expert_usage": 1,
    "evaluation.intertask": 2,
}


def readme_commands(text: str) -> list[list[str]]:
    """The commands of the README's bash blocks, continuation lines joined, as argument lists."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words and "=" not in words[0]:  # not a variable assignment
                commands.append(words)
    return commands


def tool_and_arguments(words: list[str]) -> tuple[str | None, list[str]]:
    """`("convert/x.py" or "package.module", the arguments after it)`, or `(None, [])` for other commands."""
    for i, word in enumerate(words):
        if word.endswith(".py") and word.startswith("convert/"):
            return word, words[i + 1 :]
        if word == "-m" and i + 1 < len(words):
            return words[i + 1], words[i + 2 :]
    return None, []


def option(arguments: list[str], name: str) -> str | None:
    return arguments[arguments.index(name) + 1] if name in arguments else None


def positionals(arguments: list[str], count: int) -> list[str]:
    found = [a for a in arguments if not a.startswith("-") and a not in ("mine", "filter")]
    return found[:count]


def order_problems(text: str) -> tuple[list[str], int]:
    """`(problems, commands checked)` of running the bash blocks of `text` top to bottom."""
    written: dict[str, str] = {}  # folder -> the command that wrote it
    problems, checked = [], 0
    for words in readme_commands(text):
        tool, arguments = tool_and_arguments(words)
        if tool is None or "--help" in arguments:
            continue
        checked += 1
        command = " ".join(words)
        reads = [p for p in positionals(arguments, READERS.get(tool, 0)) if p.startswith("models/")]
        output = option(arguments, "--output")
        if tool == "convert/upcycle.py":
            output = output or DEFAULT_OUTPUTS[option(arguments, "--arch") or "mote"]
        if tool == "training.train":
            config = yaml.safe_load((REPO / option(arguments, "--config")).read_text())
            if config.get("model"):  # none: the bundled MiniLM
                reads.append(config["model"])
            output = config["output_dir"]
        if tool == "training.data_tools":
            reads.append(option(arguments, "--model"))
        for name in ("--calibration", "--config"):
            if option(arguments, name) and not (REPO / option(arguments, name)).is_file():
                problems.append(f"{command}: {option(arguments, name)} is not shipped")
        problems += [f"{command} reads {f}, which no earlier command writes" for f in reads if f not in written]
        if output and output.startswith("models/") and not output.endswith(".json"):
            if output in written and "--overwrite" not in arguments:
                problems.append(f"{command} writes {output}, already written by: {written[output]}")
            written[output] = command
    return problems, checked


def test_readme_commands_run_in_order():
    problems, checked = order_problems((REPO / "README.md").read_text())
    assert problems == []
    assert checked >= 20  # the parser found the README's commands


def test_the_order_check_can_fail():
    text = (
        "```bash\npython convert/upcycle.py --arch moe\npython convert/upcycle.py --arch moe --norm-topk-prob\n"
        "python convert/merge_experts.py models/comoe-tacl --calibration texts.txt --output models/x\n```\n"
    )
    problems, checked = order_problems(text)
    assert checked == 3 and len(problems) == 3, problems
    assert "already written by" in problems[0] and "not shipped" in problems[1] and "models/comoe-tacl" in problems[2]
