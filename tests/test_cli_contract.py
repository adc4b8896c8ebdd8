"""moe_embed.cli: bad input ends a script with one line on stderr and exit code 2; bugs keep their traceback."""

import re

import pytest

from moe_embed.usage import UsageError, run_cli


def _main_raising(error):
    def main(argv):
        raise error

    return main


def test_usage_error_is_one_line_and_exit_2(capsys):
    with pytest.raises(SystemExit) as exit_:
        run_cli(_main_raising(UsageError("--tasks needs at least one task")), [])
    assert exit_.value.code == 2
    assert capsys.readouterr().err == "error: --tasks needs at least one task\n"


def test_os_error_is_one_line_and_exit_2(capsys):
    with pytest.raises(SystemExit) as exit_:
        run_cli(_main_raising(PermissionError(13, "Permission denied", "/read-only/out")), [])
    assert exit_.value.code == 2
    assert capsys.readouterr().err == "error: Permission denied: /read-only/out\n"


def test_other_exceptions_are_bugs_and_propagate():
    with pytest.raises(KeyError):
        run_cli(_main_raising(KeyError("model_type")), [])


def test_main_gets_argv_and_its_result_is_returned():
    assert run_cli(lambda argv: ["seen", *argv], ["--x"]) == ["seen", "--x"]


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["push", "--help"], "you/comoe-adapter \\\n        --base-model-id"),  # the continuation, on two lines
        (["data", "list", "--help"], "Print the datasets this package names"),
        (["data", "download", "--help"], "Copy Hub datasets into a data folder"),
        (["expert-usage", "--help"], "texts per forward pass"),
    ],
)
def test_help_texts_say_what_each_command_and_option_does(argv, expected, capsys):
    from moe_embed.cli import main

    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == 0
    assert expected in capsys.readouterr().out


def test_the_parser_is_generated_from_the_options_fields(capsys):
    """`options_parser` reads each `option()` field once: a positional, a required flag, a typed default, a bool
    flag, choices, a group; what it parses builds the dataclass, whose own check runs."""
    import argparse
    from dataclasses import dataclass

    from moe_embed.usage import option, options_parser, parse_options

    @dataclass
    class Options:
        model: str = option(required=True, positional=True, help="the model")
        output: str = option(required=True, help="where to write")
        count: int = option(3, help="how many")
        ratio: float | None = option(help="a ratio", group="tuning")
        fast: bool = option(False, help="go fast")
        mode: str = option("a", choices=("a", "b"), help="the mode")
        internal: int = 7  # not an option: no help, not on the command line

        def __post_init__(self):
            if self.count < 1:
                raise UsageError("--count must be at least 1")

    parsed = parse_options(Options, ["m", "--output", "o", "--count", "5", "--ratio", "0.5", "--fast"], None)
    assert parsed == Options("m", "o", count=5, ratio=0.5, fast=True, mode="a", internal=7)
    assert parse_options(Options, ["m", "--output", "o"], None) == Options("m", "o")
    parser = options_parser(Options, None, prog="tool")
    assert "--internal" not in parser.format_help() and "how many (default: 3)" in parser.format_help()
    assert [group.title for group in parser._action_groups][-1] == "tuning"
    for argv in (["m"], ["m", "--output", "o", "--mode", "c"], ["m", "--output", "o", "--count", "x"]):
        with pytest.raises(SystemExit):  # a missing required flag, a bad choice, a bad type: argparse's exit 2
            parse_options(Options, argv, None)
    assert "--output" in capsys.readouterr().err
    with pytest.raises(UsageError, match="--count must be at least 1"):
        parse_options(Options, ["m", "--output", "o", "--count", "0"], None)
    assert isinstance(parser, argparse.ArgumentParser)


def test_options_are_declared_once():
    """Every command's options are one dataclass whose fields generate its parser: at most a dozen `add_argument`
    calls are written by hand in the package (the generator's, `--verbose`, the sub-command choices of `data`
    and of `python -m moe_embed.training.data_tools`, and `train`'s three beside its YAML config)."""
    import ast
    import subprocess

    from conftest import REPO

    listed = subprocess.run(["git", "ls-files", "*.py"], cwd=REPO, capture_output=True, text=True, check=True)
    package = ("modeling/", "convert/", "training/", "evaluation/", "hub_cards/", "moe_embed/")
    calls = []
    for path in listed.stdout.split():
        if path.startswith(package):
            for node in ast.walk(ast.parse((REPO / path).read_text(encoding="utf-8"))):
                if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument":
                    calls.append(f"{path}:{node.lineno}")
    assert 0 < len(calls) <= 12, calls


def test_a_library_line_its_own_handler_printed_is_not_printed_again(capsys):
    """huggingface_hub's logger has a handler of its own and passes its records on to the root: the command's
    handler prints what no library handler printed, once."""
    import io
    import logging

    from moe_embed.usage import set_verbosity

    own = io.StringIO()
    library = logging.getLogger("some_library")
    library.addHandler(logging.StreamHandler(own))
    try:
        set_verbosity(verbose=False)
        library.warning("retrying")
        logging.getLogger("some_library.module").warning("retrying again")
        logging.getLogger("other_library").warning("a warning of its own")
    finally:
        library.handlers.clear()
    assert own.getvalue().splitlines() == ["retrying", "retrying again"]
    assert capsys.readouterr().err.splitlines() == ["warning (other_library): a warning of its own"]


@pytest.mark.parametrize("name", ["train", "intertask", "evaluate", "calibrate-aea", "embed", "mine", "data"])
def test_help_names_no_folder_of_this_repository_s_neighbours(name, capsys):
    """A user's --help names what a user has (a data folder `moe-embed data download` writes, $MOE_EMBED_DATA),
    not the development machine's `../shared/data`."""
    from moe_embed.cli import main

    with pytest.raises(SystemExit):
        main([name, "--help"])
    text = capsys.readouterr().out
    assert "usage: moe-embed" in text and "shared/data" not in text


@pytest.mark.parametrize(
    "section, message",
    [
        ({"expert_layers": 1.5}, "upcycle.expert_layers must be a str or a list[int], got 1.5"),
        ({"expert_layers": ["1"]}, "upcycle.expert_layers must be a str or a list[int], got ['1']"),
        ({"seed": "x"}, "upcycle.seed must be an integer, got 'x'"),
        ({"num_experts": 3}, "upcycle: 'num_experts' is now 'num_local_experts'"),
    ],
)
def test_the_upcycle_section_is_read_by_the_one_typed_loader(section, message):
    """`upcycle:` is `UpcycleOptions` read by the same loader as the rest of the YAML: values of the wrong type
    are refused naming the key and the types it takes (the options' own checks follow)."""
    from moe_embed.convert.options import UpcycleOptions
    from moe_embed.usage import UsageError, from_mapping

    read = from_mapping(UpcycleOptions, {"expert_layers": [1, 3], "tasks": {"query": "q: "}}, "upcycle")
    assert (read.expert_layers, read.tasks) == ([1, 3], {"query": "q: "})
    with pytest.raises(UsageError, match=re.escape(message)):
        from_mapping(UpcycleOptions, section, "upcycle")


def test_the_training_adapter_section_is_upcycles_comoe_options():
    """Training's `adapter:` keys are exactly the options `moe-embed upcycle --help` shows for CoMoE (but the
    run's `seed`), with the same defaults CoMoE's config gets: one declaration serves both."""
    import pickle
    from dataclasses import fields

    from moe_embed.convert.options import UpcycleOptions
    from moe_embed.modeling.configuration_comoe import CoMoeBertConfig
    from moe_embed.training.config import AdapterConfig
    from moe_embed.usage import options_parser

    parser = options_parser(UpcycleOptions, None)
    comoe = {
        action.dest
        for group in parser._action_groups
        if "comoe" in (group.title or "")
        for action in group._group_actions
    }
    assert {f.name for f in fields(AdapterConfig)} == comoe - {"seed"}
    defaults = AdapterConfig()
    assert pickle.loads(pickle.dumps(defaults)) == defaults  # a training config travels to launcher processes
    config = CoMoeBertConfig()
    for name in ("num_local_experts", "num_experts_per_tok", "lora_rank", "lora_alpha", "contrastive_loss_coef"):
        assert getattr(defaults, name) == getattr(config, name), name
