"""`sm120check sglang scan|patch|verify-launch`: find what keeps SGLang off SM120, close it, prove the launch."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sm120check.exitcodes import Exit
from sm120check.safetext import terminal_text
from sm120check.sglang import launch_cli, patch, port_cli, scan
from sm120check.sglang.errors import SglangError
from sm120check.sglang.state import describe
from sm120check.sglang.tree import SourceTree, find_installed, flashinfer_version, local_cc, parse_cc, resolve_source


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("sglang", help="scan or patch SGLang's source for SM120", description=__doc__)
    actions = parser.add_subparsers(dest="sglang_command", metavar="ACTION", parser_class=type(parser))
    actions.required = True
    scan_action = actions.add_parser(
        "scan", help="report capability maps, multicast fallback, fusion gates, EAGLE-3 gaps"
    )
    fix = actions.add_parser("patch", help="close the gaps the scan finds (minimal, idempotent, revertible)")
    for sub in (scan_action, fix):
        sub.add_argument("--source", metavar="DIR", help="SGLang tree to use (default: the installed sglang)")
        sub.add_argument(
            "--cc", metavar="MAJOR.MINOR", help="compute capability to check for (default: this GPU, else 12.0)"
        )
        sub.add_argument(
            "--flashinfer-version",
            metavar="VER",
            help="FlashInfer version to assume (default: the installed one); the fusion gate admits SM120 from 0.6.17",
        )
        sub.add_argument(
            "--plain-decode",
            action="store_true",
            help="the speculation switch (SGLang 0.5.16 and 0.5.23): a 0-step decode batch of an EAGLE server runs "
            "the target's plain decode, and its output streamer sends the speculative histograms only with a request's "
            "last output; scan: report them as needed, patch: apply them (off unless given)",
        )
        sub.add_argument("--json", action="store_true", help="print JSON")
    scan_action.add_argument(
        "--model",
        metavar="NAME",
        help="show the EAGLE-3 findings of the model classes whose name holds NAME (e.g. Qwen3VL); else counts",
    )
    scan_action.set_defaults(handler=run_scan)
    fix.add_argument("--check", action="store_true", help="change nothing; exit 1 when a patch (or revert) is needed")
    fix.add_argument("--diff", action="store_true", help="print the unified diff of the change")
    fix.add_argument("--revert", action="store_true", help="restore the original files recorded in the ledger")
    fix.set_defaults(handler=run_patch)
    launch_cli.register(actions)  # verify-launch
    port_cli.register(actions)  # port-owner


def _target(args: argparse.Namespace) -> SourceTree | None:
    if args.source:
        return SourceTree(resolve_source(args.source))
    root = find_installed()
    return SourceTree(root) if root else None


def _scan(tree: SourceTree, args: argparse.Namespace) -> scan.ScanReport:
    cc = parse_cc(args.cc) if args.cc else local_cc()
    if args.flashinfer_version:
        fi, origin = args.flashinfer_version, "--flashinfer-version"
    else:
        fi, origin = flashinfer_version(tree.root if args.source else None)
    return scan.run(tree, cc, fi, origin, plain=args.plain_decode)


def _not_installed(args: argparse.Namespace) -> int:
    message = "SGLang is not installed in this environment; nothing to scan or patch (pass --source DIR for a tree)"
    if args.json:
        print(json.dumps({"installed": False, "changed": False, "needed": False, "message": message}))
    else:
        print(message)
    return Exit.OK


def _error(args: argparse.Namespace, exc: SglangError) -> int:
    if args.json:
        print(json.dumps({"error": str(exc), "changed": False}))
    print(f"sm120check sglang: {terminal_text(exc)}", file=sys.stderr)
    return Exit.USAGE


def run_scan(args: argparse.Namespace) -> int:
    try:
        tree = _target(args)
        if tree is None:
            return _not_installed(args)
        found = _scan(tree, args)
    except SglangError as exc:
        return _error(args, exc)
    model = getattr(args, "model", None) or ""
    print(json.dumps(found.to_dict(), indent=2) if args.json else terminal_text(scan.render(found, model)))
    return Exit.FOUND if found.needs_patch else Exit.OK


def run_patch(args: argparse.Namespace) -> int:
    try:
        tree = _target(args)
        if tree is None:
            return _not_installed(args)
        with patch.tree_lock(tree.root):  # a second run on this tree waits for the first, bounded
            return _revert(tree, args) if args.revert else _patch(tree, args)
    except SglangError as exc:
        return _error(args, exc)
    except BrokenPipeError:  # stdout closed by the reader: not a problem with the tree
        raise
    except OSError as exc:  # every OS error names its path and exits 2, never "patch needed"
        return _error(args, SglangError(describe(exc)))


def _emit(args: argparse.Namespace, root: Path, result: dict[str, object], changes: list[patch.FileChange]) -> None:
    result["files"] = [
        {
            "path": ch.path,
            "changes": list(ch.changes),
            "sha256_before": patch.sha256(ch.before),
            "sha256_after": patch.sha256(ch.after),
        }
        for ch in changes
    ]
    diff = patch.unified_diff(root, changes) if args.diff else ""
    if args.json:
        if args.diff:
            result["diff"] = diff
        print(json.dumps(result, indent=2))
        return
    verb = "would change" if args.check else "changed"
    for ch in changes:
        print(terminal_text(f"{verb} {ch.path}:", one_line=True))  # file names of the tree are anyone's pick
        for note in ch.changes:
            print(terminal_text(f"  - {note}", one_line=True))
    if not changes:
        print(terminal_text(result["message"]))
    if diff:
        print(terminal_text(diff), end="")


def _patch(tree: SourceTree, args: argparse.Namespace) -> int:
    recovery = patch.recover(tree, check=args.check)  # an interrupted, stale or unrecorded state comes first
    found = _scan(tree, args)
    for opt_in in (found.switch, found.stream) if args.plain_decode else ():
        if opt_in is not None and not opt_in.applied and opt_in.reason:
            raise SglangError(f"--plain-decode refused, nothing changed: {opt_in.reason}")
    changes = patch.plan(tree, found)
    needed = bool(changes) or recovery.pending
    result: dict[str, object] = {
        "installed": True,
        "action": "patch",
        "source": str(tree.root),
        "sglang_version": tree.version,
        "cc": str(found.cc),
        "flashinfer": found.flashinfer,
        "check": args.check,
        "needed": needed,
        "changed": needed and not args.check,
        "ledger": str(tree.root / patch.STATE_DIR / patch.LEDGER),
        "recovered": list(recovery.restored),
        "rebaselined": list(recovery.rebaselined),
        "left_as_is": [f.summary for f in found.blocked],
        "message": "nothing to patch: the scan is clean" if not changes else "",
    }
    if changes and not args.check:
        patch.apply(tree, found, changes)
        changed = {ch.path for ch in changes}
        fresh = SourceTree(tree.root, {rel: mod for rel, mod in tree._cache.items() if rel not in changed})
        after = scan.run(fresh, found.cc, found.flashinfer, found.flashinfer_origin, plain=args.plain_decode)
        result["remaining"] = [f.summary for f in after.findings if not f.ok and f.patchable]
    if not args.json:
        for note in recovery.notes(check=args.check):
            print(terminal_text(note, one_line=True))
    _emit(args, tree.root, result, changes)
    if args.check:
        return Exit.FOUND if needed else Exit.OK
    # A gap the patch should have closed and did not is still a patch needed (1), not a usage error.
    return Exit.FOUND if result.get("remaining") else Exit.OK


def _revert(tree: SourceTree, args: argparse.Namespace) -> int:
    plan = patch.plan_revert(tree)  # refuses (exit 2) unless every file is accounted for
    message = ""
    if not plan.needed:
        message = "nothing to revert: no sm120check ledger here"
    elif not plan.changes:
        verb = "would remove" if args.check else "removed"
        message = f"every file already holds its original; {verb} {tree.root / patch.STATE_DIR}"
    result: dict[str, object] = {
        "installed": True,
        "action": "revert",
        "source": str(tree.root),
        "check": args.check,
        "needed": plan.needed,
        "changed": plan.needed and not args.check,
        "skipped": list(plan.skipped),
        "message": message,
    }
    if plan.needed and not args.check:
        patch.revert(plan)
    if not args.json:
        for rel in plan.skipped:
            print(terminal_text(f"{rel}: already the original, left as is", one_line=True))
    _emit(args, tree.root, result, plan.changes)
    return Exit.FOUND if args.check and plan.needed else Exit.OK
