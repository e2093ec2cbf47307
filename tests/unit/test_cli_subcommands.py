"""`sm120check <subcommand>` loads only that subcommand's modules; the full list still shows without one."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

from sm120check import __version__, cli

# The doctor reads the FlashInfer JIT cache (sm120check.jitcache) itself, but not the `jit` subcommand.
OTHERS = ("sm120check.bench", "sm120check.sglang", "sm120check.fleet", "sm120check.jitcache.cli")


def loaded_after(argv: list[str]) -> list[str]:
    """The sm120check modules a fresh interpreter holds after building the parser for `argv`."""
    code = (
        "import json, sys\nfrom sm120check.cli import build_parser\n"
        f"build_parser({argv!r})\nprint(json.dumps(sorted(m for m in sys.modules if m.startswith('sm120check'))))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    modules: list[str] = json.loads(done.stdout)
    return modules


def test_the_doctor_loads_no_other_subcommand() -> None:
    modules = loaded_after(["doctor", "--level", "2", "--json"])
    assert "sm120check.doctor.cli" in modules
    assert [m for m in modules if m.startswith(OTHERS)] == []


def test_the_doctor_runs_without_packaging() -> None:
    """Nodes install the checker with --no-deps: only `sm120check stack` (control node) reads with `packaging`."""
    code = (
        "import sys\nimport sm120check.doctor.cli\nfrom sm120check.cli import build_parser\n"
        "build_parser(['doctor', '--level', '2'])\nprint(sorted(m for m in sys.modules if m.startswith('packaging')))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == "[]"


def without_packaging(*argv: str) -> subprocess.CompletedProcess[str]:
    """`sm120check ARGV` in an interpreter where `packaging` cannot be imported, as on a node (--no-deps install)."""
    code = (
        f"import sys\nsys.modules['packaging'] = None\nfrom sm120check import cli\nsys.exit(cli.main({list(argv)!r}))"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("argv", [["--version"], ["--help"], ["stack", "--help"]])
def test_every_subcommand_is_listed_on_a_node_without_packaging(argv: list[str]) -> None:
    """The whole parser (every subcommand's options) is built without `packaging`: `sm120check --version` on a node."""
    done = without_packaging(*argv)
    assert done.returncode == 0, done.stderr
    assert f"sm120check {__version__}" in done.stdout if argv == ["--version"] else "usage:" in done.stdout


@pytest.mark.parametrize("command", ["resolve", "plan"])
def test_a_stack_command_without_packaging_names_the_module(command: str) -> None:
    args = ["--stack", "inventory/group_vars/all/stack.yml"] + (["--set", "torch=2.15.0"] if command == "plan" else [])
    done = without_packaging("stack", command, *args)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert f"sm120check stack {command}: sm120check stack needs the `packaging` module (pip install packaging" in (
        done.stderr
    )


def test_without_a_subcommand_every_one_is_listed() -> None:
    modules = loaded_after(["--help"])
    assert {"sm120check.bench.cli", "sm120check.sglang.cli", "sm120check.fleet.cli", "sm120check.jitcache.cli"} <= set(
        modules
    )


def choices(parser: argparse.ArgumentParser) -> list[str]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return list(action.choices)


@pytest.mark.parametrize("name", list(cli.REGISTER))
def test_each_registrar_adds_the_subcommand_it_is_named_for(name: str) -> None:
    assert choices(cli.build_parser([name])) == [name]


def test_an_unknown_subcommand_is_a_usage_error_listing_them_all(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        cli.main(["bogus"])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'bogus'" in err
    assert all(f"'{name}'" in err for name in cli.REGISTER)
