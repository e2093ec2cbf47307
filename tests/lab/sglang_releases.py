"""Helpers for the SGLang tests: real releases from PyPI, cached in .cache/sglang/<version>, and the CLI in-process."""

from __future__ import annotations

import argparse
import contextlib
import difflib
import hashlib
import io
import json
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lab import cache_lock

# Imported here, at collection, not in the first test that calls run_cli: cli binds tree.flashinfer_version by name,
# so a first import under a test's monkeypatch of it (test_doctor_check.py) kept the stand-in for every later test in
# that process (a scan without --flashinfer-version then saw FlashInfer 0.7.2).
from sm120check.sglang import cli

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / ".cache" / "sglang"
FIXTURES = REPO / "tests" / "sglang" / "fixtures"
# A `--json` document of `sm120check sglang`, as json.loads gives it: untyped JSON the tests index into.
Json = dict[str, Any]
RELEASES = ("0.5.4", "0.5.9", "0.5.10", "0.5.14", "0.5.16", "0.5.23")


def release_dir(version: str) -> Path:
    """The unpacked wheel of `sglang==version` (it holds `sglang/`), downloaded once (under a lock, so two pytest
    workers do not download and unpack the same release at once)."""
    target = CACHE / version
    if (target / "sglang" / "srt").is_dir():
        return target
    with cache_lock(CACHE / f".{version}.lock"):
        if (target / "sglang" / "srt").is_dir():
            return target
        return _download(version, target)


def _download(version: str, target: Path) -> Path:
    wheels = CACHE / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(wheels), f"sglang=={version}"],
        check=True,
        timeout=600,
    )
    wheel = next(w for w in sorted(wheels.glob(f"sglang-{version}-*.whl")))
    partial = CACHE / f".{version}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(partial)
    partial.rename(target)
    return target


def run_cli(*argv: str) -> tuple[int, str]:
    """`sm120check sglang ARGV` in-process: (exit status, stdout)."""
    parser = argparse.ArgumentParser(prog="sm120check")
    cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["sglang", *argv])
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        status = args.handler(args)
    return status, out.getvalue()


def tree_hashes(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@dataclass(frozen=True)
class PatchCycle:
    """What happened to a copy of one release: patch, scan again, patch again, revert."""

    version: str
    first: Json
    scan_after: Json
    scan_after_status: int
    second: Json
    check_after_status: int
    reverted: Json
    hashes_before: dict[str, str]
    hashes_after_revert: dict[str, str]


def upstream_diff(original: str, patched: str, rel: str) -> str:
    """One file's edit as a unified diff rooted at the sglang package's parent (`git apply` and `patch -p1` take it
    from site-packages or a checkout's python/ folder): what a docs/patches file holds. `rel` is under sglang/."""
    name = f"sglang/{rel}"
    lines = difflib.unified_diff(original.splitlines(True), patched.splitlines(True), f"a/{name}", f"b/{name}")
    return "".join(lines)


def git_apply(patch_file: Path, tree: Path) -> subprocess.CompletedProcess[str]:
    """`git apply PATCH_FILE` in a fresh git repository at the parent of `tree` (a copied release's sglang/)."""
    subprocess.run(["git", "init", "-q"], cwd=tree.parent, check=True, timeout=60)
    argv = ["git", "apply", str(patch_file)]
    return subprocess.run(argv, cwd=tree.parent, capture_output=True, text=True, timeout=60, check=False)


def earlier_edit_refused_until_reverted(tree: Path, patch_id: str, args: tuple[str, ...]) -> None:
    """A tree holding an earlier version of an opt-in `--plain-decode` edit: scan names it with the fix, patch
    refuses it (exit 2) with nothing changed, and revert then patch succeed (the caller checks the current edit)."""
    scanned = json.loads(run_cli("scan", "--source", str(tree), "--plain-decode", *args)[1])
    finding = next(f for f in scanned["findings"] if f["id"] == patch_id)
    assert not finding["ok"] and "earlier version" in finding["summary"] and "--revert" in finding["summary"]
    before = tree_hashes(tree)
    status, out = run_cli("patch", "--source", str(tree), "--plain-decode", *args)
    assert status == 2 and "sglang patch --revert" in json.loads(out)["error"]
    assert tree_hashes(tree) == before
    assert run_cli("patch", "--source", str(tree), "--revert", "--json")[0] == 0
    assert run_cli("patch", "--source", str(tree), "--plain-decode", *args)[0] == 0
