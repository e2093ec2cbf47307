"""Every command's --help, as a user reads it: its exit statuses at the end, no empty defaults, no module names."""

from __future__ import annotations

import argparse
import re

import pytest

from sm120check import cli
from sm120check.exitcodes import Exit


def _commands(parser: argparse.ArgumentParser, prefix: list[str]) -> list[list[str]]:
    """Every command and subcommand the parser registers, as the words a user types."""
    found = [prefix] if prefix else []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += _commands(sub, [*prefix, name])
    return found


COMMANDS = _commands(cli.build_parser(), [])


def _help(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as done:
        cli.main([*argv, "--help"])
    assert done.value.code == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("argv", COMMANDS, ids=" ".join)
def test_help_ends_with_the_exit_statuses(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    tail = _help(argv, capsys).rstrip("\n").split("\n\nexit status:\n", 1)[1].splitlines()
    assert [line.split()[0] for line in tail] == [str(Exit.OK), str(Exit.FOUND), str(Exit.USAGE), str(Exit.INTERRUPTED)]
    assert tail[2].split(None, 1)[1] == "usage error, unreadable input, or the job could not be done"
    assert "143: terminated" in tail[3]


def test_what_1_means_is_said_per_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert "  1    a check failed\n" in _help(["doctor"], capsys)
    assert "  1    a gap the patch closes was found\n" in _help(["sglang", "scan"], capsys)


@pytest.mark.parametrize("argv", COMMANDS, ids=" ".join)
def test_help_shows_no_empty_default_and_no_module_name(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    text = _help(argv, capsys)
    joined = " ".join(text.split())  # argparse wraps lines
    for empty in ("(default: None)", "(default: False)", "(default: )"):
        assert empty not in joined
    assert not re.search(r"\b\w+\.py\b", text), re.findall(r"\b\w+\.py\b", text)
    # a module only as a command to type (`python -m sm120check.jitcache`, what the stack venv runs), never as a name
    assert not re.search(r"(?<!-m )\bsm120check\.\w", joined), re.findall(r"\S*\bsm120check\.\w+", joined)


def test_every_command_says_what_1_means(capsys: pytest.CaptureFixture[str]) -> None:
    vague = [" ".join(argv) for argv in COMMANDS if "  1    the command found something\n" in _help(argv, capsys)]
    assert vague == []


def test_the_walk_finds_every_command() -> None:
    names = {" ".join(argv) for argv in COMMANDS}
    assert {"doctor", "bench", "crossover", "mock-server", "soak", "jit unpack", "sglang port-owner"} <= names


def test_bench_help_keeps_the_defaults_that_say_something(capsys: pytest.CaptureFixture[str]) -> None:
    joined = " ".join(_help(["bench"], capsys).split())
    assert "seconds per request (default: 600.0)" in joined and "(default: 1.0)" in joined
