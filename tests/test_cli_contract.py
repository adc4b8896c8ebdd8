"""moe_embed.cli: bad input ends a script with one line on stderr and exit code 2; bugs keep their traceback."""

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
