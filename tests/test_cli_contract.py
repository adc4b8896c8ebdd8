"""moe_embed.cli: bad input ends a script with one line on stderr and exit code 2; bugs keep their traceback."""

import re

import pytest

from moe_embed.errors import UsageError, run_cli


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
    flag (a true one with its `--no-` form), choices from a `Literal`, a list spelt with commas or the word it
    is, a group; what it parses builds the dataclass, whose own check runs."""
    import argparse
    from dataclasses import dataclass
    from typing import Literal

    from moe_embed.options import option, options_parser, parse_options

    @dataclass
    class Options:
        model: str = option(required=True, positional=True, help="the model")
        output: str = option(required=True, help="where to write")
        count: int = option(3, help="how many")
        ratio: float | None = option(help="a ratio", group="tuning")
        fast: bool = option(False, help="go fast")
        check: bool = option(True, help="check the result")
        mode: Literal["a", "b"] = option("a", help="the mode")
        layers: str | list[int] = option("all", help="layers")
        internal: int = 7  # not an option: no help, not on the command line

        def __post_init__(self):
            if self.count < 1:
                raise UsageError("--count must be at least 1")

    argv = ["m", "--output", "o", "--count", "5", "--ratio", "0.5", "--fast", "--no-check", "--layers", "1,3"]
    parsed = parse_options(Options, argv, None)
    assert parsed == Options("m", "o", count=5, ratio=0.5, fast=True, check=False, layers=[1, 3], internal=7)
    assert parse_options(Options, ["m", "--output", "o", "--layers", "every_other"], None).layers == "every_other"
    assert parse_options(Options, ["m", "--output", "o"], None) == Options("m", "o")
    parser = options_parser(Options, None, prog="tool")
    assert "--internal" not in parser.format_help() and "how many (default: 3)" in parser.format_help()
    assert "--check, --no-check" in parser.format_help()
    assert [group.title for group in parser._action_groups][-1] == "tuning"
    capsys.readouterr()
    for argv in (["m"], ["m", "--output", "o", "--mode", "c"], ["m", "--output", "o", "--count", "x"]):
        with pytest.raises(SystemExit) as stop:  # a missing required flag, a bad choice, a bad type
            parse_options(Options, argv, None)
        assert stop.value.code == 2
        err = capsys.readouterr().err
        assert len(err.splitlines()) == 1 and err.startswith("error: "), err  # one line, not argparse's usage
    with pytest.raises(SystemExit):  # no abbreviations: --coun is not --count
        parse_options(Options, ["m", "--output", "o", "--coun", "4"], None)
    assert "unrecognized arguments: --coun 4; did you mean --count?" in capsys.readouterr().err
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

    from moe_embed.logs import set_verbosity

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
        ({"dtype": "int4"}, "unknown upcycle.dtype 'int4'; expected one of float32, float16, bfloat16"),
        ({"num_local_experts": 3}, "unknown key 'num_local_experts' in upcycle"),  # a MoE option, not MoTE's
    ],
)
def test_the_upcycle_section_is_read_by_the_one_typed_loader(section, message):
    """`upcycle:` is the arch's options class read by the same loader as the rest of the YAML: values of the wrong
    type are refused naming the key and the types it takes (the options' own checks follow)."""
    from moe_embed.convert.options import MoeOptions, MoteOptions
    from moe_embed.errors import UsageError
    from moe_embed.options import from_mapping

    read = from_mapping(MoteOptions, {"expert_layers": [1, 3], "tasks": {"query": "q: "}}, "upcycle")
    assert (read.expert_layers, read.tasks) == ([1, 3], {"query": "q: "})
    with pytest.raises(UsageError, match=re.escape(message)):
        from_mapping(MoteOptions, section, "upcycle")
    with pytest.raises(UsageError, match=re.escape("upcycle.seed must be an integer, got 'x'")):
        from_mapping(MoeOptions, {"seed": "x"}, "upcycle")
    with pytest.raises(UsageError, match=re.escape("upcycle: 'num_experts' is now 'num_local_experts'")):
        from_mapping(MoeOptions, {"num_experts": 3}, "upcycle")


def test_one_options_class_per_architecture():
    """Each architecture has its own typed options with its own defaults (those of its model config), built by
    name in Python (`upcycle_options`) as `--arch` picks them; a former name is refused naming the new one, in
    Python as on the command line; an option of another architecture names the ones it applies to."""
    import pickle

    from moe_embed.convert.options import (
        ARCH_OPTIONS,
        CoMoeOptions,
        MoeOptions,
        MoteOptions,
        UpcycleOptions,
        upcycle_options,
    )
    from moe_embed.modeling.configuration_comoe import CoMoeBertConfig
    from moe_embed.modeling.configuration_moe import MoeBertConfig

    assert ARCH_OPTIONS == {"mote": MoteOptions, "moe": MoeOptions, "comoe": CoMoeOptions}
    for options, config in ((MoeOptions(), MoeBertConfig()), (CoMoeOptions(), CoMoeBertConfig())):
        for name in ("num_local_experts", "num_experts_per_tok", "router_aux_loss_coef"):
            assert getattr(options, name) == getattr(config, name), (type(options).__name__, name)
    assert MoeOptions().num_local_experts != CoMoeOptions().num_local_experts  # typed per arch, not None
    moe = upcycle_options("moe", expert_noise=0.02)
    assert type(moe) is MoeOptions and moe.expert_noise == 0.02 and moe.output_path.name == "moe-minilm"
    assert pickle.loads(pickle.dumps(moe)) == moe
    for call in (lambda: UpcycleOptions(num_experts=4), lambda: MoeOptions(num_experts=4)):
        with pytest.raises(TypeError, match="num_experts is now num_local_experts"):
            call()
    with pytest.raises(UsageError, match=re.escape("--lora-rank only applies to --arch comoe")):
        upcycle_options("moe", lora_rank=4)
    with pytest.raises(UsageError, match="unknown router_init 'zero'; expected one of normal, zeros"):
        MoeOptions(router_init="zero")


def test_the_training_adapter_section_is_the_comoe_options_class():
    """Training's `adapter:` is `CoMoeOptions` itself: the CoMoE options `moe-embed upcycle --arch comoe` takes,
    with the same defaults CoMoE's config gets; the fields the run sets itself (base, output, seed, ...) are
    refused there, and the help lists only the others."""
    import pickle
    import typing

    from moe_embed.convert.options import CoMoeOptions
    from moe_embed.modeling.configuration_comoe import CoMoeBertConfig
    from moe_embed.options import from_mapping
    from moe_embed.training.config import SET_BY_THE_RUN, TrainingConfig, describe_options

    assert typing.get_type_hints(TrainingConfig)["adapter"] is CoMoeOptions
    defaults = CoMoeOptions()
    assert pickle.loads(pickle.dumps(defaults)) == defaults  # a training config travels to launcher processes
    config = CoMoeBertConfig()
    for name in ("num_local_experts", "num_experts_per_tok", "lora_rank", "lora_alpha", "contrastive_loss_coef"):
        assert getattr(defaults, name) == getattr(config, name), name
    tasks = {"retrieval": [{"path": "pairs.jsonl"}]}
    read = from_mapping(TrainingConfig, {"tasks": tasks, "arch": "comoe", "adapter": {"lora_rank": 4}})
    assert read.adapter.lora_rank == 4
    for key, value in (("seed", 3), ("output", "x")):
        with pytest.raises(UsageError, match=f"adapter.{key} is set by the run itself"):
            from_mapping(TrainingConfig, {"tasks": tasks, "arch": "comoe", "adapter": {key: value}})
    with pytest.raises(UsageError, match="adapter: 'rank' is now 'lora_rank'"):
        from_mapping(TrainingConfig, {"tasks": tasks, "adapter": {"rank": 4}})
    listed = describe_options()
    assert "lora_rank: int" in listed and not any(f"    {name}:" in listed for name in SET_BY_THE_RUN)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["upcycle", "--num-experts", "8"], "error: --num-experts is now --num-local-experts"),
        (["upcycle", "--arch", "moe", "--num-expert", "8"], "did you mean --num-local-experts?"),  # no abbreviations
        (["upcycle", "--num-expert", "8"], "unrecognized arguments: --num-expert 8"),
        (["merge", "m", "--output", "o", "--weights", "1,x"], "expected comma-separated numbers, got '1,x'"),
        (["merge", "m"], "the following arguments are required: --output"),
        (["train", "--overwrite"], "--overwrite is now --overwrite-output-dir"),
        (["train", "--config", "c.yaml", "--bogus"], "unrecognized arguments: --bogus"),
        ([], "error: name a subcommand (see moe-embed --help)"),
    ],
)
def test_an_option_error_is_one_line_and_exit_2(argv, message, capsys):
    """argparse prints its whole usage before the one line that says what is wrong: here only that line is
    printed (and `moe-embed` without a subcommand says so in one line)."""
    from moe_embed.cli import main

    try:
        code = main(argv)
    except SystemExit as stop:
        code = stop.code
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "cannot be reached" not in line]  # the offline notice
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], err
    assert "is now --num-experts" not in err and "--num-experts," not in err  # a retired name is never offered


def test_help_shows_the_defaults_that_are_zero(capsys):
    from moe_embed.convert.upcycle import main

    with pytest.raises(SystemExit):
        main(["--arch", "moe", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for flag in ("--seed", "--expert-noise", "--router-z-loss-coef", "--router-jitter-noise"):
        assert re.search(re.escape(flag) + r" [A-Z_]+ [^()]*\(default: 0(\.0)?\)", text), flag


@pytest.mark.slow
def test_input_checks_answer_before_torch_is_imported(mote_dir, tmp_path):
    """A wrong --default-task, training into an existing output and a retired key of a training config are
    refused in one line before torch is imported; a task a MoTE folder does not have (`merge --task`, read from
    its config.json) before any model is loaded (the test's `tmp_path` gets no output)."""
    import json
    import subprocess
    import sys

    output = tmp_path / "trained"
    output.mkdir()
    config = {"tasks": {"retrieval": [{"path": "pairs.jsonl"}]}, "output_dir": str(output)}
    existing, retired = tmp_path / "existing.yaml", tmp_path / "retired.yaml"
    existing.write_text(json.dumps(config))
    retired.write_text(json.dumps({**config, "arch": "moe", "upcycle": {"num_experts": 4}}))
    runs = [
        ["upcycle", "--default-task", "nope", "--output", str(tmp_path / "u")],
        ["train", "--config", str(existing)],
        ["train", "--config", str(retired)],
        ["merge", mote_dir, "--task", "nope", "--output", str(tmp_path / "m")],
    ]
    code = (
        "import io, json, sys\nfrom contextlib import redirect_stderr\nfrom moe_embed.cli import main\nout = []\n"
        "for argv in json.loads(sys.argv[1]):\n    err = io.StringIO()\n    with redirect_stderr(err):\n"
        "        try:\n            code = main(argv)\n"
        "        except SystemExit as stop:\n            code = stop.code\n"
        "    out.append([code, err.getvalue(), 'torch' in sys.modules])\nprint(json.dumps(out))\n"
    )
    env = {**__import__("os").environ, "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(
        [sys.executable, "-c", code, json.dumps(runs)], cwd=tmp_path, capture_output=True, text=True, env=env
    )
    report = json.loads(result.stdout.strip().splitlines()[-1])
    expected = ["Unknown task 'nope'", "already exists", "'num_experts' is now", "Unknown task 'nope'"]
    for (status, err, _), message in zip(report, expected, strict=True):
        assert status == 2 and len(err.splitlines()) == 1 and message in err, err
    assert [torch for _, _, torch in report] == [False, False, False, False]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["existing.yaml", "retired.yaml", "trained"]


def test_the_schedules_a_config_takes_are_transformers_names():
    """`lr_scheduler_type` is checked without importing transformers, against a copy of its names: the copy is
    the installed transformers' `SchedulerType`."""
    import typing

    from transformers.trainer_utils import SchedulerType

    from moe_embed.training.config import Schedule

    assert set(typing.get_args(Schedule)) == {kind.value for kind in SchedulerType}
