"""The `sm120check` command line: one subcommand per job, each defined in its own module.

Subcommand modules are imported here only to declare their arguments; they keep heavy imports
(torch, FlashInfer, SGLang) inside the functions that run the work.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import cast

from sm120check import __version__
from sm120check.bench import cli as bench_cli
from sm120check.bench import crossover_cli
from sm120check.doctor import cli as doctor_cli
from sm120check.exitcodes import Exit
from sm120check.fleet import cli as fleet_cli
from sm120check.jitcache import cli as jitcache_cli
from sm120check.sglang import cli as sglang_cli

# Each subcommand's `register(subparsers)` adds its parser and sets `handler` (a callable taking the parsed namespace
# and returning the exit status); in `--help` order: doctor, sglang, fleet, bench, crossover, jit.
REGISTER: tuple[Callable[[argparse._SubParsersAction[argparse.ArgumentParser]], None], ...] = (
    doctor_cli.register,
    sglang_cli.register,
    fleet_cli.register,
    bench_cli.register,
    crossover_cli.register,
    jitcache_cli.register,
)


class _Parser(argparse.ArgumentParser):
    """argparse exits 2 on usage errors already; keep that, and say how to get help."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        self.exit(Exit.USAGE, f"{self.prog}: error: {message}\n(see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="sm120check", description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--version", action="version", version=f"sm120check {__version__}")
    # Typed as the registrars take it: they only call add_parser, and a _Parser is an ArgumentParser.
    subparsers = cast(
        "argparse._SubParsersAction[argparse.ArgumentParser]",
        parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser),
    )
    for register in REGISTER:
        register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Callable[[argparse.Namespace], int] | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return Exit.USAGE
    try:
        return handler(args)
    except KeyboardInterrupt:
        print("sm120check: interrupted", file=sys.stderr)
        return Exit.INTERRUPTED
