"""`sm120check doctor`: run the checks, print verdicts, write machine-readable reports."""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import inspect
import math
import os
import re
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from sm120check import __version__, argtypes, console, manifest
from sm120check.doctor import child, facts
from sm120check.doctor.model import Context
from sm120check.exitcodes import Exit
from sm120check.safetext import terminal_text

if TYPE_CHECKING:
    from sm120check.doctor.model import Check, Result

# The check catalogue, the runner and the report writers are imported in `main`, after the torch probe (the slowest
# child of a level-2 run) has started: their import (a fifth of a second) then overlaps with it.


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "doctor",
        help="check this node: verdict, evidence and fix for each part of the CUDA 13 / SM120 stack",
        description="Check this node: each check gives pass, warn, fail or skip, its evidence and the fix. "
        "Exit 0 when nothing failed, 1 when a check failed, 2 on usage or internal errors.",
    )
    parser.add_argument(
        "--level",
        type=int,
        default=2,
        choices=(1, 2, 3),
        help="run checks up to this level: 1 static, 2 single-GPU work, 3 multi-GPU communication (default 2)",
    )
    parser.add_argument(
        "--select", metavar="IDS", default="", help="comma-separated check ids to run (with their prerequisites)"
    )
    parser.add_argument("--skip", metavar="IDS", default="", help="comma-separated check ids not to run")
    parser.add_argument("--list", action="store_true", help="list the checks with level and description, run nothing")
    parser.add_argument("--json", action="store_true", help="print the JSON report to stdout instead of the table")
    parser.add_argument("--junit", metavar="FILE", type=Path, help="also write a JUnit XML report")
    parser.add_argument("--prometheus", metavar="FILE", type=Path, help="also write a Prometheus textfile")
    parser.add_argument(
        "--manifest",
        metavar="PATH",
        type=Path,
        help=f"node manifest (default ${manifest.ENV_VAR} or {manifest.DEFAULT_PATH})",
    )
    parser.add_argument(
        "--timeout", metavar="S", type=argtypes.seconds, default=120.0, help="hard limit per GPU child process"
    )
    parser.add_argument(
        "--jit-timeout",
        metavar="S",
        type=argtypes.seconds,
        default=None,
        help="hard limit for a check that must JIT-compile first (FlashInfer's comm module: minutes cold; default 900)",
    )
    parser.add_argument("--gpus", metavar="0,1", default="", help="GPU indices multi-GPU checks may use")
    parser.set_defaults(handler=main)


def _ids(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _usage(message: str) -> int:
    print(f"sm120check doctor: error: {terminal_text(message)}", file=sys.stderr)
    return Exit.USAGE


# A sentence ends at . ! or ? before a space and a capital or the end; "e.g. x" and "(1.2 s)" do not end one.
_SENTENCE_END = re.compile(r"(?<!\be\.g)(?<!\bi\.e)(?<!\bvs)[.!?](?=\s+[A-Z(`]|\s*$)")


def describe(check: Check) -> str:
    """The first sentence of the check's docstring, whole (a docstring wraps its first sentence over lines)."""
    doc = inspect.getdoc(check) or ""
    paragraph = " ".join(doc.split("\n\n", 1)[0].split())
    end = _SENTENCE_END.search(paragraph)
    return paragraph[: end.end()] if end else paragraph


def list_checks(checks: list[Check]) -> str:
    width = max([len(c.id) for c in checks] + [5])
    family = max([len(c.family) for c in checks] + [6])
    header = f"{'CHECK'.ljust(width)}  LEVEL  {'FAMILY'.ljust(family)}  REQUIRES          USES              DESCRIPTION"
    lines = [header]
    for check in sorted(checks, key=lambda c: c.level):  # stable: registry order inside a level
        needs, uses = ",".join(check.requires) or "-", ",".join(check.uses) or "-"
        lines.append(
            f"{check.id.ljust(width)}  {check.level:<5}  {check.family.ljust(family)}  {needs:<16}  {uses:<16}  "
            f"{describe(check)}"
        )
    return "\n".join(lines) + "\n"


def build_context(args: argparse.Namespace) -> Context:
    """Read the manifest; an explicit --manifest that cannot be read is a usage error (ValueError). The local facts
    (`facts.local`) are the caller's next step."""
    ctx = Context(timeout=args.timeout, jit_timeout=args.jit_timeout, facts=facts.NodeFacts())
    if args.gpus:
        try:
            ctx.gpus = tuple(int(part) for part in _ids(args.gpus))
        except ValueError:
            raise ValueError(f"--gpus {args.gpus!r}: give GPU indices separated by commas, for example 0,1") from None
    path = args.manifest
    try:
        ctx.manifest = manifest.load(path)
    except manifest.ManifestError as exc:
        if path is not None:
            raise ValueError(f"--manifest: {exc}") from None
        ctx.manifest_error, ctx.manifest_error_kind = str(exc), exc.kind
    return ctx


def main(args: argparse.Namespace) -> int:
    if not (math.isfinite(args.timeout) and args.timeout > 0):  # callers that build the Namespace themselves
        return _usage(f"--timeout {args.timeout}: give a finite, positive number of seconds")
    if args.jit_timeout is not None and not (math.isfinite(args.jit_timeout) and args.jit_timeout > 0):
        return _usage(f"--jit-timeout {args.jit_timeout}: give a finite, positive number of seconds")
    if args.list:
        from sm120check.doctor.catalogue import all_checks

        sys.stdout.write(list_checks(all_checks()))
        return Exit.OK
    try:
        ctx = build_context(args)
    except ValueError as exc:
        return _usage(str(exc))
    early = _torch_first(args, ctx)
    ctx.facts = facts.local(ctx.manifest)  # the stack venv's distributions: read while torch imports
    try:
        return _planned(args, ctx, early)
    except BaseException:  # Ctrl-C before the signal handlers are in: the early child must not outlive the doctor
        _end_early(early)
        raise


def _torch_first(args: argparse.Namespace, ctx: Context) -> Future[child.ChildOutcome] | None:
    """Start the torch probe now when the torch check is sure to run (level >= 2, no --select, torch not skipped:
    it has no prerequisite) and a torch package is in the stack venv; else the check starts it with the facts."""
    if args.select or args.level < 2 or "torch" in _ids(args.skip):
        return None
    venv = facts.NodeFacts(venv=facts.venv_of(ctx.manifest))  # the venv alone: its distributions are read next
    if not any((site / "torch").is_dir() for site in facts.site_packages(venv.venv)):
        return None
    return facts.start(facts.torch_probe(str(venv.venv_python), ctx.timeout), "torch")


def _end_early(early: Future[child.ChildOutcome] | None) -> None:
    """End the early torch probe (nothing else runs yet): kill it, wait for its thread (killed, it returns at once;
    bounded anyway), then let children start again for a caller that runs the doctor again in this process."""
    if early is None:
        return
    child.kill_all()
    with contextlib.suppress(Exception):
        early.result(timeout=10)
    child.resume()


def _abandon(early: Future[child.ChildOutcome] | None, code: int) -> int:
    """A usage error after the early torch probe started: end it and return `code`."""
    _end_early(early)
    return code


def _planned(args: argparse.Namespace, ctx: Context, early: Future[child.ChildOutcome] | None) -> int:
    from sm120check.doctor import report, runner
    from sm120check.doctor.catalogue import all_checks

    try:
        chosen = runner.plan(all_checks(), level=args.level, select=_ids(args.select), skip=_ids(args.skip))
    except runner.SelectionError as exc:
        return _abandon(early, _usage(str(exc)))
    for path in (args.junit, args.prometheus):  # now, not after minutes of checks
        if path is not None and (problem := report.output_problem(path)):
            return _abandon(early, _usage(f"cannot write the report: {problem}"))
    # Ctrl-C and SIGTERM (a `timeout`, systemd, Ansible) kill every child process group and stop the run;
    # the report of what finished is still printed (exit 130 / 143). A second signal exits at once.
    on_main = threading.current_thread() is threading.main_thread()
    previous = {sig: signal.signal(sig, runner.on_signal) for sig in _SIGNALS} if on_main else {}
    try:
        return _run(args, chosen, ctx, early)
    except (runner.Stopped, KeyboardInterrupt) as exc:  # outside the checks: nothing ran, or nothing to report
        return Exit.signalled(exc.signum) if isinstance(exc, runner.Stopped) else Exit.INTERRUPTED
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _run(
    args: argparse.Namespace, chosen: list[Check], ctx: Context, early: Future[child.ChildOutcome] | None = None
) -> int:
    from sm120check.doctor import report, runner
    from sm120check.doctor.node_health import health
    from sm120check.doctor.python_stack import torch as torch_check

    started_epoch = time.time()
    start = time.monotonic()
    signum = 0
    try:
        # NVML is asked once, for every check, when the driver check (which judges its answer) or a check that reads
        # its GPU list (`needs_nvml`) is in the run.
        # The node-health probe too, once, when a health check is in the run (with the loads for level 2).
        ctx.facts = facts.gather(
            ctx.facts,
            timeout=ctx.timeout,
            nvml=any(facts.needs_nvml(c) for c in chosen),
            health=health.plan(chosen, ctx.gpus),
            torch_probe=early if early is not None else torch_check.early_probe(chosen, ctx),
            pcie=facts.pcie_reader(chosen),  # once, when a check that declares `needs_pcie` is in the run
        )
        results = runner.run(chosen, ctx, on_result=progress(len(chosen), sys.stderr))
    except runner.Interrupted as stopped:  # Ctrl-C or SIGTERM: the children are dead; report what finished
        results, signum = stopped.results, stopped.signum
    info = report.RunInfo(
        host=socket.gethostname(),
        version=__version__,
        started=dt.datetime.fromtimestamp(started_epoch, dt.timezone.utc).isoformat(timespec="seconds"),
        seconds=time.monotonic() - start,
        level=args.level,
        manifest=str(ctx.manifest.path) if ctx.manifest else "",
        started_epoch=started_epoch,
        interrupted=child.signal_name(signum) if signum else "",
    )
    code = runner.exit_code(results)
    try:  # the files first: a closed, gone or full stdout must not cost them
        if args.junit:
            _write(args.junit, report.to_junit(results, info))
        if args.prometheus:
            _write(args.prometheus, report.to_prometheus(results, info))
    except OSError as exc:
        print(f"sm120check doctor: cannot write report {exc.filename}: {exc.strerror}", file=sys.stderr)
        code = Exit.USAGE
    if problem := console.write_stdout(report.to_json(results, info) if args.json else report.table(results, info)):
        print(f"sm120check doctor: {problem}", file=sys.stderr)
    if signum:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):  # a closed or gone stream must not cost the exit status
                if stream is sys.stderr:
                    print(f"sm120check doctor: interrupted by {info.interrupted}", file=stream)
                stream.flush()
        # Not a return: a check still running in-process (not in a child) would keep the interpreter's exit
        # waiting for its worker thread; every child process group is already killed.
        os._exit(Exit.signalled(signum))
    return code


def progress(total: int, stream: TextIO) -> Callable[[Result], None] | None:
    """On a terminal, one line per finished check on `stream` (`[3/28] driver skip 0.1 s`), so a level-3 run that
    takes minutes shows it moves; nothing when `stream` is a pipe or a file (the report alone stays parseable)."""
    try:
        if not stream.isatty():
            return None
    except (AttributeError, ValueError):  # a closed or replaced stream
        return None
    done = 0

    def show(result: Result) -> None:
        nonlocal done
        done += 1
        with contextlib.suppress(OSError, ValueError):
            print(f"[{done}/{total}] {result.id} {result.status.value} {result.seconds:.1f} s", file=stream, flush=True)

    return show


def _write(path: Path, text: str) -> None:
    """Write via a temporary file and rename, so node_exporter never reads half a file."""
    from sm120check.doctor import report

    report.write_file(path, text)
