"""`sm120check crossover BASE.jsonl SPEC.jsonl`: where speculation stops paying, and policies that act on it.

Each file holds one or more runs of `sm120check bench` (append repeated sweeps to the same file to get an
uncertainty). Exit 0 with a result (a crossover, or the statement that there is none in range), 2 for bad input.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import tempfile
from pathlib import Path

from sm120check.bench.crossover import analyze
from sm120check.bench.plot import PlotUnavailable, write_png
from sm120check.bench.policy import Policies, make_policies, trtllm_yaml, vllm_config
from sm120check.bench.records import RecordError, read_jsonl
from sm120check.bench.report import render_json, render_text


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "crossover",
        help="compare a baseline and a speculative sweep; crossover, cost model, policies",
        description=__doc__,
    )
    p.add_argument("base", type=Path, help="JSONL from `sm120check bench` against the plain server")
    p.add_argument("spec", type=Path, help="JSONL from `sm120check bench` against the speculative server")
    p.add_argument("--png", type=Path, help="write a plot of both curves (needs matplotlib)")
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.add_argument(
        "--steps", type=_steps, help="speculative steps for the policies, >= 1 (default: what the server reported)"
    )
    p.add_argument(
        "--hysteresis", type=_hysteresis, default=0.15, help="router band around the crossover, a fraction in [0, 1)"
    )
    p.add_argument("--max-batch", type=_steps, default=1024, help="largest batch size the vLLM table covers")
    p.add_argument("--write-policies", type=Path, metavar="DIR", help="write the policy files into DIR")
    p.add_argument("--force", action="store_true", help="replace policy files already in the --write-policies DIR")
    p.set_defaults(handler=handle)


POLICY_FILES = (
    "sglang-spec-adaptive.json",
    "vllm-speculative-config.json",
    "trtllm-extra-llm-api-options.yaml",
    "router-rule.json",
)


def _steps(text: str) -> int:
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be a whole number >= 1")
    return int(text)


def _hysteresis(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value) or not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be a fraction in [0, 1) (0.15 = a band of +-15%)")
    return value


def _writable_dir_problem(directory: Path) -> str:
    """Why files cannot be created in `directory` or the folders it would be made in ("" when they can)."""
    probe = directory
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if not probe.is_dir():
        return f"{probe} is not a directory"
    if not os.access(probe, os.W_OK | os.X_OK):
        return f"{probe} is not writable"
    return ""


def output_problem(args: argparse.Namespace) -> str:
    """Why --png or --write-policies cannot be written ("" when they can), found before any analysis is printed."""
    if args.png is not None:
        png: Path = args.png
        if png.is_dir():
            return f"--png {png}: is a directory; give a file name"
        if not png.parent.is_dir():
            return f"--png {png}: the directory {png.parent} does not exist"
        if not os.access(png.parent, os.W_OK | os.X_OK):
            return f"--png {png}: the directory {png.parent} is not writable"
    if args.write_policies is not None:
        directory: Path = args.write_policies
        if directory.exists() and not directory.is_dir():
            return f"--write-policies {directory}: exists and is not a directory"
        if problem := _writable_dir_problem(directory):
            return f"--write-policies {directory}: {problem}"
        present = [name for name in POLICY_FILES if (directory / name).exists()]
        if present and not getattr(args, "force", False):
            return f"--write-policies {directory}: already holds {', '.join(present)}; pass --force to replace them"
    return ""


def handle(args: argparse.Namespace) -> int:
    names = (str(args.base), str(args.spec))
    if problem := output_problem(args):
        print(f"sm120check crossover: {problem}", file=sys.stderr)
        return 2
    try:
        analysis = analyze(read_jsonl(args.base), read_jsonl(args.spec), names)
    except RecordError as exc:
        print(f"sm120check crossover: {exc}", file=sys.stderr)
        return 2
    policies: Policies | None = None
    reason = ""
    try:
        policies = make_policies(analysis, args.steps, args.hysteresis, args.max_batch)
    except ValueError as exc:
        reason = str(exc).removeprefix("no policy: ")
    render = render_json if args.format == "json" else render_text
    print(render(analysis, names, policies, reason))
    if args.png:
        try:
            write_png(analysis, args.png, names)
        except PlotUnavailable as exc:
            print(f"sm120check crossover: {exc}", file=sys.stderr)
            return 2
        except OSError as exc:
            print(f"sm120check crossover: --png {args.png}: {exc.strerror or exc}", file=sys.stderr)
            return 2
        print(f"plot written to {args.png}", file=sys.stderr)
    if args.write_policies and policies is not None:
        try:
            write_policy_files(args.write_policies, policies)
        except OSError as exc:
            where = f"--write-policies {args.write_policies}"
            print(f"sm120check crossover: {where}: {exc.strerror or exc}", file=sys.stderr)
            return 2
        print(f"policy files written to {args.write_policies}", file=sys.stderr)
    return 0


def write_policy_files(directory: Path, policies: Policies) -> None:
    """Write the four files, each atomically (a temporary file in DIR, then a rename): a reader sees the old
    file or the new one, never half of one. Raises OSError."""
    directory.mkdir(parents=True, exist_ok=True)
    texts = (
        json.dumps(policies.sglang_adaptive, indent=2) + "\n",
        json.dumps(vllm_config(policies), indent=2) + "\n",
        trtllm_yaml(policies),
        json.dumps(policies.router, indent=2) + "\n",
    )
    for name, text in zip(POLICY_FILES, texts, strict=True):
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(text)
            Path(tmp).replace(directory / name)
        except BaseException:
            with contextlib.suppress(OSError):
                Path(tmp).unlink()
            raise
