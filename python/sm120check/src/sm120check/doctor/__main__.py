"""`python -m sm120check.doctor [options]`: the doctor alone, the same as `sm120check doctor [options]`."""

from __future__ import annotations

import argparse
import sys

from sm120check.doctor.cli import register


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sm120check")
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["doctor", *(sys.argv[1:] if argv is None else argv)])
    code: int = args.handler(args)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
