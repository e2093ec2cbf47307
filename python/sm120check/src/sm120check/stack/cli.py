"""`sm120check stack resolve` (what preflight runs on the control node) and `sm120check stack plan` (a bump).

Exit codes: 0 the pins resolve (or, for resolve, the resolution was skipped: the output says why), 1 a conflict
or a blocked plan (nothing written), 2 bad usage or an unreadable stack file.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from sm120check import argtypes
from sm120check.exitcodes import Exit
from sm120check.stack import pip
from sm120check.stack.dist import NEEDS_PACKAGING
from sm120check.stack.model import DEFAULT_GLIBC, Sources, Stack, Status, Target, glibc

if TYPE_CHECKING:
    from sm120check.cli import Subparsers

DEFAULT_STACK = Path("inventory/group_vars/all/stack.yml")


def _target_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--python", default="3.12", help="the node's Python, MAJOR.MINOR (default 3.12)")
    parser.add_argument("--arch", default="x86_64", choices=["x86_64", "aarch64"], help="the node's architecture")
    parser.add_argument(
        "--glibc", type=_glibc, default=DEFAULT_GLIBC, help=f"the node's glibc (default {DEFAULT_GLIBC})"
    )
    parser.add_argument("--wheelhouse", default="", help="resolve from this wheelhouse directory (--no-index)")
    parser.add_argument(
        "--timeout", type=argtypes.seconds, default=pip.DEFAULT_TIMEOUT, help="seconds pip may take in all"
    )
    parser.add_argument("--json", action="store_true", help="one JSON object")


def _glibc(text: str) -> str:
    try:
        return glibc(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def register(subparsers: Subparsers) -> None:
    stack = subparsers.add_parser("stack", help="resolve the manifest's pins with pip; plan a version bump")
    sub = stack.add_subparsers(dest="stack_command", metavar="STACK_COMMAND")
    res = sub.add_parser("resolve", help="resolve the manifest's pins for the node, as preflight does")
    source = res.add_mutually_exclusive_group(required=True)
    source.add_argument("--stack", type=Path, help="a stack.yml (inventory/group_vars/all/stack.yml)")
    source.add_argument("--request", help="a JSON request, as the preflight role writes it")
    res.add_argument("--profile", help="the profile of --stack (default: its sm120kit_profile)")
    res.add_argument("--refresh", action="store_true", help="resolve again even when this manifest is cached")
    _target_arguments(res)
    res.set_defaults(handler=_with_packaging(_resolve))
    plan = sub.add_parser("plan", help="what a bump moves with it: --set torch=2.15.0 [--write]")
    plan.add_argument("--stack", type=Path, default=DEFAULT_STACK, help=f"the stack.yml (default {DEFAULT_STACK})")
    plan.add_argument("--profile", help="the profile (default: the file's sm120kit_profile)")
    plan.add_argument("--set", dest="sets", action="append", required=True, metavar="NAME=VERSION", help="a new pin")
    plan.add_argument("--write", action="store_true", help="write the moves into --stack when nothing blocks them")
    _target_arguments(plan)
    plan.set_defaults(handler=_with_packaging(_plan))

    def _help(args: argparse.Namespace) -> int:
        stack.print_help()
        return Exit.USAGE

    stack.set_defaults(handler=_help)


def _target(args: argparse.Namespace) -> Target:
    return Target(python=args.python, arch=args.arch, glibc=args.glibc)


def _strings(value: object) -> dict[str, str]:
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, Mapping) else {}


def _names(pins: dict[str, str]) -> dict[str, str]:
    from sm120check.stack import stackfile

    if bad := next((n for n in pins if not stackfile.NAME.fullmatch(n)), None):
        raise ValueError(f"{bad!r} is not a package name; nothing was passed to pip")
    return pins


def _section(data: Mapping[str, object], key: str) -> Mapping[str, object]:
    value = data.get(key)
    return value if isinstance(value, dict) else {}


def request_from_json(text: str) -> tuple[Stack, Target, Sources]:
    """The preflight role's request {"stack": {...}, "target": {...}, "sources": {...}}; ValueError naming a bad one."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        raise ValueError("--request is not JSON (the preflight role writes it)") from None
    if not isinstance(data, dict):
        raise ValueError("the request is not a JSON object")
    s, t, src = (_section(data, k) for k in ("stack", "target", "sources"))
    extra = _names(_strings(s.get("extra_python_packages")))
    stack = Stack(
        profile=str(s.get("profile", "")),
        python_packages={**_names(_strings(s.get("python_packages"))), **extra},
        cuda_version=str(s.get("cuda_version", "")),
        cuda_components=_strings(s.get("cuda_components")),
        nccl_version=str(s.get("nccl_version", "")),
        cuda_apt_version=str(s.get("cuda_apt_version", "")),
        extra_names=frozenset(extra),
    )
    target = Target(
        python=str(t.get("python", "")), arch=str(t.get("arch", "")), glibc=glibc(str(t.get("glibc") or DEFAULT_GLIBC))
    )
    if not target.python or target.arch not in ("x86_64", "aarch64"):
        raise ValueError(f"target {t!r}: python (MAJOR.MINOR) and arch (x86_64 or aarch64) are required")
    urls = src.get("extra_index_urls")
    sources = Sources(
        index_url=str(src.get("index_url") or ""),
        extra_index_urls=tuple(str(u) for u in urls) if isinstance(urls, list) else (),
        wheelhouse=str(src.get("wheelhouse") or ""),
    )
    return stack, target, sources


def _with_packaging(handler: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """The subcommand, or exit 2 naming the missing module where this Python lacks `packaging` (a node's venv: the
    stack commands run on the control node)."""

    def run(args: argparse.Namespace) -> int:
        try:
            import packaging.version  # noqa: F401
        except ImportError:
            print(f"sm120check stack {args.stack_command}: {NEEDS_PACKAGING}", file=sys.stderr)
            return Exit.USAGE
        return handler(args)

    return run


def _resolve(args: argparse.Namespace) -> int:
    from sm120check.stack import resolve, stackfile

    try:
        if args.request is not None:
            stack, target, sources = request_from_json(args.request)
        else:
            stack = stackfile.stack_of(stackfile.load(args.stack), args.profile)
            target, sources = _target(args), Sources(wheelhouse=args.wheelhouse)
    except (ValueError, stackfile.StackFileError) as exc:
        print(f"sm120check stack resolve: {exc}", file=sys.stderr)
        return Exit.USAGE
    resolve.new_run()
    verdict = resolve.resolve(stack, target, sources, timeout=args.timeout, refresh=args.refresh)
    if args.json:
        print(json.dumps({**verdict.to_json(), "lines": resolve.render(verdict)}, indent=1))
    else:
        print("\n".join(resolve.render(verdict)))
    return Exit.FOUND if verdict.status is Status.CONFLICT else Exit.OK


def _plan(args: argparse.Namespace) -> int:
    from sm120check.stack import stackfile

    if not args.write:
        return _plan_under(args)
    try:
        with stackfile.lock(args.stack):  # the read, the plan and the write: one run at a time per file
            return _plan_under(args)
    except stackfile.StackFileError as exc:
        print(f"sm120check stack plan: {exc}", file=sys.stderr)
        return Exit.USAGE


def _plan_under(args: argparse.Namespace) -> int:
    from sm120check.stack import plan, resolve, stackfile

    try:
        sets = plan.parse_sets(args.sets)
        stack = stackfile.stack_of(stackfile.load(args.stack), args.profile)
    except (plan.PlanError, stackfile.StackFileError) as exc:
        print(f"sm120check stack plan: {exc}", file=sys.stderr)
        return Exit.USAGE
    target, sources = _target(args), Sources(wheelhouse=args.wheelhouse)
    resolve.new_run()
    try:
        result = plan.plan(stack, sets, target, sources, timeout=args.timeout)
    except plan.PlanError as exc:
        print(f"sm120check stack plan: {exc}", file=sys.stderr)
        return Exit.USAGE
    except resolve.MetadataError as exc:
        print(
            f"sm120check stack plan: pip cannot find a pinned wheel for {target.describe()}:\n{exc.words}",
            file=sys.stderr,
        )
        return Exit.FOUND
    except pip.PipUnavailable as exc:
        print(f"sm120check stack plan: no metadata to plan from: {exc}", file=sys.stderr)
        return Exit.USAGE
    lines = [f"Plan for profile '{stack.profile}' in {args.stack}, for {target.describe()}:", *plan.render(result)]
    written: list[str] = []
    if args.write and result.ok:
        try:
            changes = stackfile.write(args.stack, result.before, result.after)
        except stackfile.StackChanged as exc:
            print(f"sm120check stack plan: {exc}", file=sys.stderr)
            return Exit.FOUND
        except stackfile.StackFileError as exc:
            print(f"sm120check stack plan: {exc}", file=sys.stderr)
            return Exit.USAGE
        written = [".".join(c.path) for c in changes]
        lines.append(f"Wrote {len(changes)} value(s) into {args.stack}.")
        stale = stackfile.stale_comments(stackfile.read_text(args.stack), result.before, result.after)
        if stale:
            lines.append("Comments that still name an old version (reread them):")
            lines += [f"  {s}" for s in stale]
    elif args.write:
        lines.append(f"Nothing written to {args.stack}: the plan is blocked or pip refused it.")
    elif result.ok:
        lines.append(f"Nothing written: add --write to put these values into {args.stack}.")
    if args.json:
        document = {
            "ok": result.ok,
            "moves": [m.__dict__ for m in result.moves],
            "blockers": [b.__dict__ for b in result.blockers],
            "resolution": result.resolution.to_json() if result.resolution else None,
            "notes": list(result.notes),
            "written": written,
            "lines": lines,
        }
        print(json.dumps(document, indent=1))
    else:
        print("\n".join(lines))
    return Exit.OK if result.ok else Exit.FOUND
