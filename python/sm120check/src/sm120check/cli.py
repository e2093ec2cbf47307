"""The `sm120check` command line: one subcommand per job, each defined in its own module.

Subcommand modules are imported here only to declare their arguments; they keep heavy imports
(torch, FlashInfer, SGLang) inside the functions that run the work.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from typing import Any

from sm120check import __version__

# Subcommand name -> module exposing `register(subparsers)`, which adds the parser and sets
# `handler` (a callable taking the parsed namespace and returning the exit code).
SUBCOMMANDS: dict[str, str] = {
    "doctor": "sm120check.doctor.cli",
    "sglang": "sm120check.sglang.cli",
    "fleet": "sm120check.fleet.cli",
    "bench": "sm120check.bench.cli",
    "crossover": "sm120check.bench.crossover_cli",
    "jit": "sm120check.jitcache.cli",
}

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    """argparse exits 2 on usage errors already; keep that, and say how to get help."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n(see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="sm120check", description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--version", action="version", version=f"sm120check {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for module_name in SUBCOMMANDS.values():
        register: Callable[[Any], None] = importlib.import_module(module_name).register
        register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Callable[[argparse.Namespace], int] | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return EXIT_USAGE
    try:
        return handler(args)
    except KeyboardInterrupt:
        print("sm120check: interrupted", file=sys.stderr)
        return 130
