"""`sm120check crossover BASE.jsonl SPEC.jsonl`: where speculation stops paying, and policies that act on it.

Each file holds one or more runs of `sm120check bench` (append repeated sweeps to the same file to get an
uncertainty). Exit 0 with a result (a crossover, or the statement that there is none in range), 2 for bad input.
The verdict comes first (the crossover, what to launch, the files written), then the table; --verbose adds the
cost model and each engine's settings and notes. Then --write-policies (with the plot beside the policy files,
crossover.png, unless --no-png; without matplotlib it is left out and stderr says so) and --png. Files whose records
say they came from the other server (the speculative sweep given first, or the plain one second) are refused. Exit 2
when --write-policies was asked for but cannot be made (the draft length is unknown: pass --steps) or written, or
when --png cannot be drawn (no matplotlib) - after everything else has been done.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import json
import os
import statistics
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from sm120check import argtypes, findings
from sm120check.bench import tiers
from sm120check.bench.crossover import (
    METRICS,
    X_AXES,
    Analysis,
    ModeAnalysis,
    ZeroStep,
    analyze,
    analyze_mode,
    spec_steps,
    zero_step,
)
from sm120check.bench.crossover_report import SweepFacts, render_json, render_text, role_problem, sweep_facts
from sm120check.bench.plot import PlotUnavailable, write_png
from sm120check.bench.policy import (
    ALL_POLICY_FILES,
    REDUCED_TIER_FINDING,
    ROUTER_FILE,
    SGLANG_FILE,
    TRTLLM_FILES,
    VLLM_FILES,
    ZERO_STEP_FILE,
    Policies,
    PolicyError,
    make_policies,
    sglang_zero_step_config,
    trtllm_file,
    trtllm_yaml,
    vllm_config,
    vllm_file,
)
from sm120check.bench.records import LevelSummary, RecordError, read_jsonl
from sm120check.bench.tiers import TierError, TierPlan
from sm120check.console import write_stdout
from sm120check.exitcodes import Exit
from sm120check.safetext import terminal_text
from sm120check.sglang import plain_decode
from sm120check.sglang.errors import SglangError
from sm120check.sglang.tree import SourceTree, find_installed, resolve_source


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "crossover",
        help="compare a baseline and a speculative sweep; crossover, cost model, policies",
        description=__doc__,
    )
    p.add_argument("base", type=Path, help="JSONL from `sm120check bench` against the plain server")
    p.add_argument("spec", type=Path, help="JSONL from `sm120check bench` against the speculative server")
    p.add_argument(
        "--png",
        type=Path,
        help="write the plot here (needs matplotlib; with --write-policies it goes to DIR/crossover.png by default)",
    )
    p.add_argument("--no-png", action="store_true", help="no plot beside the --write-policies files")
    p.add_argument("--verbose", action="store_true", help="also the cost model and every engine's settings and notes")
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.add_argument(
        "--x", choices=X_AXES, default="concurrency", help="axis: concurrency (closed loop) or request rate (open)"
    )
    p.add_argument(
        "--metric", choices=METRICS, default="throughput", help="what is compared; goodput needs bench --slo"
    )
    p.add_argument(
        "--steps", type=_steps, help="speculative steps for the policies, >= 1 (default: what the server reported)"
    )
    p.add_argument(
        "--hysteresis", type=_hysteresis, default=0.15, help="router band around the crossover, a fraction in [0, 1)"
    )
    p.add_argument("--max-batch", type=_max_batch, default=1024, help="largest batch size the vLLM table covers")
    p.add_argument(
        "--draft-model",
        metavar="PATH",
        help="the EAGLE-3 draft model (path or hub id): makes the vLLM and TensorRT-LLM outputs complete "
        "(without it they are fragments to merge into your speculative config)",
    )
    p.add_argument(
        "--draft-floor",
        type=int,
        choices=(0, 1),
        default=1,
        help="TensorRT-LLM: fewest draft tokens at any batch size (default 1: a 0 tier on the EAGLE-3 one-model "
        "path ruins acceptance after speculation resumes until TensorRT-LLM PR #16888; 0 = off above the crossover)",
    )
    p.add_argument(
        "--reduced-tier",
        action="store_true",
        help="add a one-draft-step tier in the half-decade below the crossover (off by default: no sweep at reduced "
        "steps backs it, and full speculation measured ahead there on a real SGLang server: "
        f"see {findings.get(REDUCED_TIER_FINDING).cite()})",
    )
    p.add_argument(
        "--zero-step",
        type=Path,
        metavar="SWEEP",
        help="JSONL from `bench` against the speculative SGLang server held at 0 draft steps (started with "
        f"--speculative-adaptive-config {ZERO_STEP_FILE}, which --write-policies writes): the SGLang file gets a "
        "0-step slot only from where this sweep overtakes full speculation (a 0-step slot is not the plain server)",
    )
    p.add_argument(
        "--more-spec",
        type=Path,
        action="append",
        default=[],
        metavar="SWEEP",
        help="another speculative sweep at another draft depth (repeatable): tiers from the measured winner per "
        "level, in sglang-tiers.json and sglang-static-launch.json with --write-policies",
    )
    p.add_argument(
        "--sglang-source",
        metavar="DIR",
        help="the SGLang tree the servers ran (default: the installed one): its patch state says whether it has "
        "the speculation switch (sglang patch --plain-decode), which alone allows a plain tier",
    )
    p.add_argument("--write-policies", type=Path, metavar="DIR", help="write the policy files into DIR")
    p.add_argument("--force", action="store_true", help="replace policy files already in the --write-policies DIR")
    p.set_defaults(handler=handle)


_steps = argtypes.whole(1, 64, unit="of draft steps")
_max_batch = argtypes.whole(1, 1 << 16, unit="of requests")
_hysteresis = argtypes.real(0, 1, high_open=True, hint="a fraction: 0.15 = a band of +-15%")


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
        present = [name for name in ALL_POLICY_FILES if (directory / name).exists()]
        if present and not getattr(args, "force", False):
            return f"--write-policies {directory}: already holds {', '.join(present)}; pass --force to replace them"
    return ""


def handle(args: argparse.Namespace) -> int:
    names = (str(args.base), str(args.spec))
    if problem := output_problem(args):
        print(f"sm120check crossover: {problem}", file=sys.stderr)
        return Exit.USAGE
    x_axis, metric = getattr(args, "x", "concurrency"), getattr(args, "metric", "throughput")
    if (x_axis, metric) != ("concurrency", "throughput"):
        if args.write_policies or getattr(args, "zero_step", None):
            print(
                "sm120check crossover: --write-policies and --zero-step come from the throughput crossover on "
                "concurrency (the policies act on batch size); drop them or --x/--metric",
                file=sys.stderr,
            )
            return Exit.USAGE
        try:
            base, spec = read_jsonl(args.base), read_jsonl(args.spec)
            if problem := role_problem(base, spec, names):
                print(f"sm120check crossover: {terminal_text(problem)}", file=sys.stderr)
                return Exit.USAGE
            mode = analyze_mode(base, spec, names, x_axis, metric)
        except RecordError as exc:
            print(f"sm120check crossover: {terminal_text(exc)}", file=sys.stderr)
            return Exit.USAGE
        if problem := write_stdout(
            (json.dumps(mode.to_json(), indent=2) if args.format == "json" else terminal_text(mode.render_text(names)))
            + "\n"
        ):
            print(f"sm120check crossover: {problem}", file=sys.stderr)
            return Exit.USAGE
        return _write_png(mode, args.png, sweep_facts(base, spec)) if args.png else Exit.OK
    zero: ZeroStep | None = None
    try:
        spec, base = read_jsonl(args.spec), read_jsonl(args.base)
        if problem := role_problem(base, spec, names):
            print(f"sm120check crossover: {terminal_text(problem)}", file=sys.stderr)
            return Exit.USAGE
        analysis = analyze(base, spec, names)
        if getattr(args, "zero_step", None) is not None:
            zero = zero_step(read_jsonl(args.zero_step), spec, (str(args.zero_step), names[1]))
            said = tuple(f"--zero-step: {w}" for w in zero.warnings)
            analysis = dataclasses.replace(analysis, warnings=(*analysis.warnings, *said))
    except RecordError as exc:
        print(f"sm120check crossover: {terminal_text(exc)}", file=sys.stderr)
        return Exit.USAGE
    policies: Policies | None = None
    reason = ""
    try:
        policies = make_policies(
            analysis,
            args.steps,
            args.hysteresis,
            args.max_batch,
            draft_model=getattr(args, "draft_model", None),
            draft_floor=getattr(args, "draft_floor", 1),
            reduced_tier=getattr(args, "reduced_tier", False),
            zero_step=zero,
        )
    except PolicyError as exc:
        reason = str(exc).removeprefix("no policy: ")

    plan: TierPlan | None = None
    if getattr(args, "more_spec", None) or getattr(args, "sglang_source", None):
        try:
            plan, launch = _tiers(args, base, spec)
        except (RecordError, TierError, SglangError) as exc:
            print(f"sm120check crossover: {terminal_text(exc)}", file=sys.stderr)
            return Exit.USAGE
    facts = sweep_facts(base, spec)
    png: Path | None = args.png
    no_matplotlib = False  # the default plot left out: said on stderr at the end, not an error
    if png is None and args.write_policies and not getattr(args, "no_png", False) and policies is not None:
        if importlib.util.find_spec("matplotlib"):
            png = args.write_policies / PNG_FILE
        else:
            no_matplotlib = True
    files = [str(args.write_policies / name) for name in policy_file_names(policies)] if args.write_policies else []
    files += [str(png)] if png is not None else []
    status = Exit.OK
    if args.format == "json":
        text = render_json(analysis, names, policies, reason)
    else:  # the records' text made inert
        verbose = getattr(args, "verbose", False)
        text = terminal_text(render_text(analysis, names, policies, reason, files, verbose=verbose))
    if plan is not None:
        if args.format == "json":
            text = json.dumps({**json.loads(text), "tiers": tiers.to_json(plan, launch)}, indent=2)
        else:
            text += "\n" + terminal_text("\n".join(tiers.render_lines(plan, launch)))
    if problem := write_stdout(text + "\n"):  # a reader gone is no error
        print(f"sm120check crossover: {problem}", file=sys.stderr)
        status = Exit.USAGE
    if args.write_policies:
        status = max(status, _write_policies(args.write_policies, policies, reason, analysis.crossover.value))
        if plan is not None:
            status = max(status, _write_tiers(args.write_policies, plan, launch))
    if png is not None:
        status = max(status, _write_png(analysis, png, facts))
    if no_matplotlib:
        print(
            f"no plot: matplotlib is not installed (`pip install matplotlib` puts {args.write_policies / PNG_FILE} "
            "beside the policies; --no-png says you want none)",
            file=sys.stderr,
        )
    return status


PNG_FILE = "crossover.png"


def _switch(args: argparse.Namespace) -> bool:
    """Whether the servers' SGLang tree has the speculation switch, from its source (never guessed: no tree, no
    switch)."""
    source = getattr(args, "sglang_source", None)
    try:
        root = resolve_source(source) if source else find_installed()
    except SglangError as exc:
        raise SglangError(str(exc).replace(f"--source {source}:", f"--sglang-source {source}:", 1)) from None
    if root is None:
        return False
    tree = SourceTree(root)
    path = plain_decode.PATH
    return plain_decode.survey(tree.read(path) if tree.exists(path) else None, tree.version).applied


def _model_of(record: LevelSummary) -> str:
    """The model the record's server said it serves ("" when it says none)."""
    server = record.meta.get("server")
    model = (server.get("model_path") or server.get("model")) if isinstance(server, Mapping) else None
    return model if isinstance(model, str) else ""


def _depths(records: Sequence[LevelSummary]) -> dict[int, list[int]]:
    """The draft steps each record's server reported -> the levels measured at it."""
    out: dict[int, list[int]] = {}
    for r in records:
        server = r.meta.get("server")
        steps = server.get("speculative_num_steps") if isinstance(server, Mapping) else None
        if isinstance(steps, int) and not isinstance(steps, bool):
            out.setdefault(steps, []).append(r.concurrency)
    return out


def _measured(records: Sequence[LevelSummary], name: str) -> dict[int, float]:
    """Throughput per level (the median of a level measured twice) over the levels with no failed request; a
    TierError when none is left (a sweep that adds nothing is never dropped without a word)."""
    by_level: dict[int, list[float]] = {}
    for r in records:
        if r.requests > 0 and not r.errors:
            by_level.setdefault(r.concurrency, []).append(r.throughput_tok_s)
    if not by_level:
        raise TierError(f"{name}: no level in it finished without failed requests; bench it again")
    return {c: statistics.median(v) for c, v in by_level.items()}


def _curve(records: Sequence[LevelSummary], name: str, model: str) -> tiers.Sweep:
    depths = _depths(records)
    if len(depths) > 1:
        said = "; ".join(f"{k} steps at C={', '.join(map(str, sorted(set(v))))}" for k, v in sorted(depths.items()))
        raise TierError(f"{name}: mixes sweeps of different draft depths ({said}); give one sweep per file")
    steps = spec_steps(records)
    if steps is None:
        raise TierError(
            f"{name}: its records do not say the server's draft steps (bench records them from SGLang's "
            "/server_info); bench it again against the running server"
        )
    models = {_model_of(r) for r in records} - {""}
    if len(models) > 1:
        raise TierError(f"{name}: mixes sweeps of different models ({', '.join(sorted(models))}); give one per file")
    if model and models and models != {model}:
        raise TierError(
            f"{name}: measured on {models.pop()}, but the speculative sweep on {model}: tiers combine sweeps of "
            "one model at different draft depths"
        )
    return tiers.Sweep(name, steps, _measured(records, name))


def _tiers(
    args: argparse.Namespace, base: Sequence[LevelSummary], spec: Sequence[LevelSummary]
) -> tuple[TierPlan, tiers.StaticLaunch | None]:
    models = {_model_of(r) for r in spec} - {""}
    model = models.pop() if len(models) == 1 else ""
    sweeps = [
        tiers.Sweep(str(args.base), tiers.PLAIN, _measured(base, str(args.base))),
        _curve(spec, str(args.spec), model),
    ]
    sweeps += [_curve(read_jsonl(path), str(path), model) for path in args.more_spec]
    plan = tiers.plan(sweeps, switch=_switch(args))
    try:
        launch: tiers.StaticLaunch | None = tiers.static_launch(plan)
    except TierError:
        launch = None
    return plan, launch


def _write_tiers(directory: Path, plan: TierPlan, launch: tiers.StaticLaunch | None) -> Exit:
    files: dict[str, object] = {tiers.TIERS_FILE: tiers.sglang_config(plan)}
    if launch is not None:
        files[tiers.STATIC_FILE] = tiers.static_json(launch)
    try:
        make_policy_dir(directory)
        _write_texts(directory, {name: json.dumps(data, indent=2) + "\n" for name, data in files.items()})
    except OSError as exc:
        print(f"sm120check crossover: --write-policies {directory}: {exc}", file=sys.stderr)
        return Exit.USAGE
    return Exit.OK


def _write_policies(directory: Path, policies: Policies | None, reason: str, crossover: float | None) -> Exit:
    where = f"--write-policies {directory}"
    if policies is None:
        if crossover is None:  # no crossover in range is a result, not an error: nothing to write
            print(f"sm120check crossover: {where}: no policy files written ({reason})", file=sys.stderr)
            return Exit.OK
        print(f"sm120check crossover: {where}: no policy files written: {reason}", file=sys.stderr)
        return Exit.USAGE
    try:
        written = write_policy_files(directory, policies)
    except OSError as exc:
        print(f"sm120check crossover: {where}: {exc.strerror or exc}", file=sys.stderr)
        return Exit.USAGE
    print(f"policy files written to {directory}: {', '.join(written)}", file=sys.stderr)
    return Exit.OK


def _write_png(analysis: Analysis | ModeAnalysis, png: Path, facts: SweepFacts) -> Exit:
    try:
        write_png(analysis, png, facts)
        png.chmod(POLICY_MODE)  # beside the policies, for whoever reads them; a plot holds no secret
    except PlotUnavailable as exc:
        print(
            f"sm120check crossover: {terminal_text(exc)}; everything else was done, only the plot is missing",
            file=sys.stderr,
        )
        return Exit.USAGE
    except OSError as exc:
        print(f"sm120check crossover: --png {png}: {exc.strerror or exc}", file=sys.stderr)
        return Exit.USAGE
    print(f"plot written to {png}", file=sys.stderr)
    return Exit.OK


def policy_file_names(policies: Policies | None) -> list[str]:
    """The files --write-policies writes for these policies (none without policies)."""
    if policies is None:
        return []
    return [SGLANG_FILE, ZERO_STEP_FILE, vllm_file(policies), trtllm_file(policies), ROUTER_FILE]


POLICY_MODE = 0o644  # read by servers and routers running as other users; the files hold no secret
POLICY_DIR_MODE = 0o755  # and a directory they can enter, whatever the umask (027 and 077 on hardened hosts)


def make_policy_dir(directory: Path) -> None:
    """Create DIR and any missing parents as 0755 (mkdir's mode is cut by the umask); an existing one is left as
    it is. Raises OSError."""
    missing = [d for d in (directory, *directory.parents) if not d.exists()]
    directory.mkdir(parents=True, exist_ok=True)
    for created in missing:
        created.chmod(POLICY_DIR_MODE)


def write_policy_files(directory: Path, policies: Policies) -> list[str]:
    """Write the policy files (and SGLang's 0-step measuring file), each atomically (a temporary file in DIR, then a
    rename): a reader sees the old file or the new one, never half of one. The vLLM and TensorRT-LLM files are named
    `*.fragment.*` when they lack the draft model; the other variant, left from an earlier run (replaced with
    --force), is removed. Returns the names written. Raises OSError."""
    make_policy_dir(directory)
    texts = {
        SGLANG_FILE: json.dumps(policies.sglang.config, indent=2) + "\n",
        ZERO_STEP_FILE: json.dumps(sglang_zero_step_config(policies.steps), indent=2) + "\n",
        vllm_file(policies): json.dumps(vllm_config(policies), indent=2) + "\n",
        trtllm_file(policies): trtllm_yaml(policies),
        ROUTER_FILE: json.dumps(policies.router, indent=2) + "\n",
    }
    _write_texts(directory, texts)
    for stale in (*VLLM_FILES, *TRTLLM_FILES):
        if stale not in texts:
            with contextlib.suppress(FileNotFoundError):
                (directory / stale).unlink()
    return list(texts)


def _write_texts(directory: Path, texts: dict[str, str]) -> None:
    """Each file atomically: a temporary file in DIR, then a rename. Raises OSError."""
    for name, text in texts.items():
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(text)
            Path(tmp).chmod(POLICY_MODE)  # mkstemp makes it 0600
            Path(tmp).replace(directory / name)
        except BaseException:
            with contextlib.suppress(OSError):
                Path(tmp).unlink()
            raise
