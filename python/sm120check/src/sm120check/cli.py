"""The `sm120check` command line: one subcommand per job, each defined in its own module.

Subcommand modules are imported here only to declare their arguments; they keep heavy imports
(torch, FlashInfer, SGLang) inside the functions that run the work. Only the subcommand the command line names is
imported (`sm120check doctor` never loads the bench's asyncio client or the SGLang patcher: a third of the doctor's
start-up); `--help`, no subcommand or an unknown one imports them all, for the full list.
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, cast

from sm120check import __version__, console
from sm120check.exitcodes import Exit, epilog

if TYPE_CHECKING:
    from typing import TypeAlias

    Subparsers: TypeAlias = argparse._SubParsersAction[argparse.ArgumentParser]


# Each subcommand's `register(subparsers)` adds its parser and sets `handler` (a callable taking the parsed namespace
# and returning the exit status). The imports sit in these functions so that only the one that runs is loaded.
def _doctor(subparsers: Subparsers) -> None:
    from sm120check.doctor import cli

    cli.register(subparsers)


def _sglang(subparsers: Subparsers) -> None:
    from sm120check.sglang import cli

    cli.register(subparsers)


def _fleet(subparsers: Subparsers) -> None:
    from sm120check.fleet import cli

    cli.register(subparsers)


def _bench(subparsers: Subparsers) -> None:
    from sm120check.bench import cli

    cli.register(subparsers)


def _crossover(subparsers: Subparsers) -> None:
    from sm120check.bench import crossover_cli

    crossover_cli.register(subparsers)


def _mock_server(subparsers: Subparsers) -> None:
    from sm120check.bench import simserver

    simserver.register(subparsers)


def _jit(subparsers: Subparsers) -> None:
    from sm120check.jitcache import cli

    cli.register(subparsers)


def _soak(subparsers: Subparsers) -> None:
    from sm120check.soak import cli

    cli.register(subparsers)


def _stack(subparsers: Subparsers) -> None:
    from sm120check.stack import cli

    cli.register(subparsers)


# Subcommand name -> its registrar, in `--help` order.
REGISTER: dict[str, Callable[[Subparsers], None]] = {
    "doctor": _doctor,
    "sglang": _sglang,
    "fleet": _fleet,
    "bench": _bench,
    "crossover": _crossover,
    "mock-server": _mock_server,
    "jit": _jit,
    "stack": _stack,
    "soak": _soak,
}


def _named(argv: Sequence[str]) -> str | None:
    """The subcommand `argv` runs when its first word is one (options of `sm120check` itself come first only as
    --help/--version, which need every subcommand or none)."""
    return argv[0] if argv and argv[0] in REGISTER else None


class _Parser(argparse.ArgumentParser):
    """argparse exits 2 on usage errors already; keep that, and say how to get help."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        self.exit(Exit.USAGE, f"{self.prog}: error: {message}\n(see `{self.prog} --help`)\n")


class _Help(argparse.HelpFormatter):
    """Keeps the exit-status epilog's lines; drops defaults that say nothing ("(default: None)", False, "")."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if text.startswith("exit status:"):
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = super()._get_help_string(action)
        if text and (action.default is None or action.default is False or action.default == ""):
            text = text.replace(" (default: %(default)s)", "")
        return text


def _finish(parser: argparse.ArgumentParser, command: str) -> None:
    """Every subcommand's help ends with its exit statuses and keeps its own formatter's other rules."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                _finish(sub, f"{command} {name}".strip())
    if command:
        parser.epilog = parser.epilog or epilog(command)
        base = parser.formatter_class
        if not (isinstance(base, type) and issubclass(base, _Help)):
            parser.formatter_class = type("Help", (_Help, base), {})  # type: ignore[misc, arg-type, assignment]


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser; with `argv`, only the subcommand it names (when it names one) is registered."""
    parser = _Parser(prog="sm120check", description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--version", action="version", version=f"sm120check {__version__}")
    # Typed as the registrars take it: they only call add_parser, and a _Parser is an ArgumentParser.
    subparsers = cast("Subparsers", parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser))
    named = _named(argv) if argv is not None else None
    for name, register in REGISTER.items():
        if named is None or name == named:
            register(subparsers)
    _finish(parser, "")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(words)
    args = parser.parse_args(words)
    handler: Callable[[argparse.Namespace], int] | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return Exit.USAGE
    try:
        return handler(args)
    except KeyboardInterrupt:
        print("sm120check: interrupted", file=sys.stderr)
        return Exit.INTERRUPTED
    except BrokenPipeError:  # the reader of stdout went away (`| head`): the shell's status for it, no traceback
        console.silence_stdout()
        return Exit.signalled(signal.SIGPIPE)
