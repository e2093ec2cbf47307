"""`sm120check fleet report|diff`: the fleet matrix from saved node reports, and what changed between two runs.

playbooks/doctor.yml runs the doctor on every node and saves the reports; these commands need only the files.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from sm120check import bounded
from sm120check.console import write_stdout
from sm120check.doctor.report import write_file
from sm120check.exitcodes import Exit
from sm120check.fleet import collect, diff, outliers, render
from sm120check.fleet.load import FleetInputError, load
from sm120check.fleet.model import Fleet
from sm120check.safetext import terminal_text

MAX_RESULTS_BYTES = 256 << 20  # every node's registered doctor result (a node's report is bounded at 16 MiB)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "fleet",
        help="the doctor matrix of many nodes (from playbooks/doctor.yml runs), and what changed between runs",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = parser.add_subparsers(dest="fleet_command", metavar="ACTION", parser_class=type(parser))
    actions.required = True
    report = actions.add_parser(
        "report",
        help="render the matrix (nodes x checks) and every failure with its remedy",
        description="Render the fleet matrix from a run directory (nodes/<host>.json) or a node report, and the "
        "nodes whose measured figures are outliers against the fleet median of the same GPU model. Exit 0 when "
        "every node is ready (outliers are warnings), 1 when a node failed, is unreachable or has no report (or, "
        "with --fail-on-outlier, when there is an outlier), 2 on bad input.",
    )
    report.add_argument("run", metavar="DIR", type=Path, help="fleet run directory, e.g. build/fleet/latest")
    report.add_argument("--format", choices=render.FORMATS, default="table", help="output format (default table)")
    report.add_argument("--out", metavar="FILE", type=Path, help="write the report to FILE instead of stdout")
    report.add_argument(
        "--write",
        metavar="DIR",
        type=Path,
        help="also write every format into DIR: " + ", ".join(render.FILE_NAMES.values()),
    )
    report.add_argument(
        "--outlier-threshold",
        metavar="METRIC=FRACTION",
        action="append",
        default=[],
        help="how far from the fleet median, as a fraction of it, flags a figure: a family (bandwidth, default "
        "0.15 below; latency, 0.25 above; link, 0 below) or a metric as the report names it "
        "(gpu_copy_bandwidth.h2d_gbps, nccl_allreduce.latency_us.8); repeatable",
    )
    report.add_argument(
        "--fail-on-outlier", action="store_true", help="exit 1 when any figure is an outlier (default: a warning)"
    )
    report.set_defaults(handler=run_report)
    changes = actions.add_parser(
        "diff",
        help="per node, the checks whose status changed between two runs; nodes added and removed",
        description="Compare two fleet runs (directories) or two node reports (files). "
        "Exit 0 when nothing changed, 1 when something did, 2 on bad input.",
    )
    changes.add_argument("old", metavar="OLD", type=Path, help="the earlier run directory or node report")
    changes.add_argument("new", metavar="NEW", type=Path, help="the later run directory or node report")
    changes.add_argument("--json", action="store_true", help="print JSON")
    changes.set_defaults(handler=run_diff)
    gather = actions.add_parser(
        "collect",
        help="write a run directory from the doctor results Ansible registered (used by playbooks/doctor.yml)",
        description="Read {host: registered result of the doctor task} as JSON, write RUN/nodes/<host>.json "
        "(a stub for unreachable nodes, nodes without sm120check and doctor errors), point RUN/../latest at RUN, "
        "write every report format into RUN and print the table. Exit codes as `fleet report`.",
    )
    gather.add_argument("run", metavar="RUN", type=Path, help="the run directory to create, e.g. build/fleet/<time>")
    gather.add_argument(
        "--results", metavar="FILE", default="-", help="the registered results as JSON (default: stdin)"
    )
    gather.add_argument("--no-latest", action="store_true", help="leave the `latest` link beside RUN alone")
    gather.set_defaults(handler=run_collect)


def _error(message: str) -> int:
    print(f"sm120check fleet: error: {terminal_text(message)}", file=sys.stderr)
    return Exit.USAGE


def _write(path: Path, text: str) -> None:
    """Atomic and exclusive: a new temporary file (mkstemp: never a planted link), renamed onto `path`; nothing is
    left behind on failure."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_file(path, text)


def run_report(args: argparse.Namespace) -> int:
    try:
        limits = outliers.thresholds(args.outlier_threshold)
    except outliers.ThresholdError as error:
        return _error(str(error))
    try:
        fleet = load(args.run).judged(limits, fail_on_outlier=args.fail_on_outlier)
    except FleetInputError as error:
        return _error(str(error))
    try:
        if args.write is not None:
            for fmt, name in render.FILE_NAMES.items():
                _write(args.write / name, render.render(fleet, fmt))
        output = render.render(fleet, args.format)
        if args.out is not None:
            _write(args.out, output)
        elif problem := write_stdout(output):  # a reader that went away (`| head`) is not an error
            return _error(problem)
    except OSError as error:
        return _error(f"cannot write {error.filename}: {error.strerror}")
    return Exit.OK if fleet.passed else Exit.FOUND


def run_collect(args: argparse.Namespace) -> int:
    source = "stdin" if args.results == "-" else args.results
    try:
        if args.results == "-":
            binary = getattr(sys.stdin, "buffer", None)  # a text stream stands in for stdin in tests
            raw = binary.read(MAX_RESULTS_BYTES + 1) if binary else sys.stdin.read(MAX_RESULTS_BYTES + 1).encode()
            if len(raw) > MAX_RESULTS_BYTES:
                raise bounded.TooLarge(f"stdin: larger than {bounded.size_text(MAX_RESULTS_BYTES)}")
            text = bounded.decode(raw, "stdin")
        else:
            text = bounded.read_text(Path(args.results), MAX_RESULTS_BYTES)
        results = json.loads(text)
    except bounded.Unreadable as error:
        return _error(f"cannot read the results: {error}")
    except ValueError as error:  # JSONDecodeError, or an integer over Python's 4300-digit limit
        return _error(f"the results from {source} are not JSON ({error}); pass {{host: registered result}}")
    except RecursionError:
        return _error(f"the results from {source} are nested too deeply to read; pass {{host: registered result}}")
    if not isinstance(results, dict) or not results:
        return _error(f"the results from {source} must be a non-empty JSON object {{host: registered result}}")
    try:
        collect.write_run(args.run, results, link_latest=not args.no_latest)
    except ValueError as error:
        return _error(str(error))
    except OSError as error:
        return _error(f"cannot write the run directory {args.run}: {error.strerror} ({error.filename})")
    return run_report(
        argparse.Namespace(
            run=args.run, format="table", out=None, write=args.run, outlier_threshold=[], fail_on_outlier=False
        )
    )


def _pair(old_path: Path, new_path: Path) -> tuple[Fleet, Fleet]:
    old, new = load(old_path), load(new_path)
    if old_path.is_file() and new_path.is_file():  # two reports of one node, whatever their file names
        host = new.nodes[0].host
        old = dataclasses.replace(old, nodes=(dataclasses.replace(old.nodes[0], host=host),))
    return old, new


def run_diff(args: argparse.Namespace) -> int:
    try:
        old, new = _pair(args.old, args.new)
    except FleetInputError as error:
        return _error(str(error))
    changes = diff.compare(old, new)
    render_diff = diff.to_json if args.json else diff.text
    if problem := write_stdout(render_diff(changes, str(args.old), str(args.new))):
        return _error(problem)
    return Exit.OK if changes.empty else Exit.FOUND
