"""`wattflex <command> --help` (wattflex.cli): an example in every command's help that its own
parser accepts, defaults shown as values, options in groups where a command has many, one
meaning per option name across commands (old spellings accepted with a note)."""

import argparse
import re
import shlex

import pytest

from wattflex.cli import build_parser
from wattflex.commands._help import EXAMPLES, GROUPS


def _commands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


COMMANDS = _commands()


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_help_shows_an_example_its_parser_accepts(name):
    text = COMMANDS[name].format_help()
    assert "examples:\n  wattflex " + name in text
    parser = build_parser()
    for example in EXAMPLES[name]:
        args = parser.parse_args(shlex.split(example)[1:])
        assert args.command == name


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_defaults_are_shown_as_values_not_python_names(name):
    text = " ".join(COMMANDS[name].format_help().split())
    assert not re.search(r"default:? wattflex\.\w+\.[A-Z_]{3,}\b", text), text
    assert "<function" not in text and "PosixPath(" not in text


def test_the_many_options_of_control_are_grouped():
    text = COMMANDS["control"].format_help()
    for title in GROUPS["control"]:
        assert f"\n{title}:\n" in text
    options = text.split("\noptions:\n", 1)[1].split("\n\n", 1)[0]
    assert options.strip().splitlines()[0].lstrip().startswith("-h, --help")
    assert len([line for line in options.splitlines() if line.startswith("  -")]) <= 2


def test_one_meaning_per_option_name_and_old_spellings_still_work(capsys):
    """--job is a sweep group (offer); a job's GPUs are --job-gpus (control, restore-caps).
    --configfile everywhere."""
    flags: dict[str, set[str]] = {}
    for name, parser in COMMANDS.items():
        for action in parser._actions:
            for flag in action.option_strings:
                flags.setdefault(flag, set()).add(name)
    assert flags["--job-gpus"] == {"control", "restore-caps"} and "--configfile" in flags
    parser = build_parser()
    args = parser.parse_args(["control", "--budget-w", "100", "--job", "0-3", "--job", "4"])
    assert args.job == ["0-3", "4"]
    assert "--job is deprecated, use --job-gpus" in capsys.readouterr().err
    args = parser.parse_args(["offer", "--config", "my.yaml"])
    assert args.config == "my.yaml"
    assert "--config is deprecated, use --configfile" in capsys.readouterr().err
    args = parser.parse_args(["offer", "--configfile", "my.yaml"])
    assert args.config == "my.yaml" and capsys.readouterr().err == ""
    # no command names its config file --config as its first spelling any more
    for name, parser in COMMANDS.items():
        for action in parser._actions:
            assert action.option_strings[:1] != ["--config"], name
