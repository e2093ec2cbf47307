"""`sm120check crossover BASE.jsonl SPEC.jsonl`: where speculation stops paying, and policies that act on it.

Each file holds one or more runs of `sm120check bench` (append repeated sweeps to the same file to get an
uncertainty). Exit 0 with a result (a crossover, or the statement that there is none in range), 2 for bad input.
"""

from __future__ import annotations

import argparse
import json
import sys
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
    p.add_argument("--steps", type=int, help="speculative steps for the policies (default: what the server reported)")
    p.add_argument("--hysteresis", type=float, default=0.15, help="router band around the crossover (fraction)")
    p.add_argument("--max-batch", type=int, default=1024, help="largest batch size the vLLM table covers")
    p.add_argument("--write-policies", type=Path, metavar="DIR", help="write the policy files into DIR")
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    names = (str(args.base), str(args.spec))
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
        print(f"plot written to {args.png}", file=sys.stderr)
    if args.write_policies and policies is not None:
        write_policy_files(args.write_policies, policies)
        print(f"policy files written to {args.write_policies}", file=sys.stderr)
    return 0


def write_policy_files(directory: Path, policies: Policies) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "sglang-spec-adaptive.json").write_text(json.dumps(policies.sglang_adaptive, indent=2) + "\n")
    (directory / "vllm-speculative-config.json").write_text(json.dumps(vllm_config(policies), indent=2) + "\n")
    (directory / "trtllm-extra-llm-api-options.yaml").write_text(trtllm_yaml(policies))
    (directory / "router-rule.json").write_text(json.dumps(policies.router, indent=2) + "\n")
