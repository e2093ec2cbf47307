"""Plan, apply and revert the SM120 patches: backups, atomic writes, compiled results and a ledger.

State lives beside the code it changed, in `<sglang>/.sm120kit/`: `ledger.json` (files, checksums before
and after, sm120check version, what changed) and `backup/<path>` (the original bytes). `--revert` puts the
originals back byte for byte and removes that directory.
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import json
import os
import py_compile
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sm120check import __version__
from sm120check.sglang import eagle, fusion, preflight, symm_mem
from sm120check.sglang.errors import SglangError
from sm120check.sglang.report import AUTO_ENABLE_ID, PREFLIGHT_ID, ScanReport
from sm120check.sglang.tree import SourceTree

STATE_DIR = ".sm120kit"
LEDGER = "ledger.json"
BOM = "\ufeff"


@dataclass(frozen=True)
class FileChange:
    path: str  # relative to the sglang package
    before: bytes
    after: bytes
    changes: tuple[str, ...]


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _decode(data: bytes) -> tuple[str, str]:
    text = data.decode("utf-8")
    return (BOM, text[1:]) if text.startswith(BOM) else ("", text)


def _admit(text: str, *, rel: str) -> str:
    return fusion.admit_sm120(text, rel)


def _delegate(text: str, *, rel: str, cls: str, methods: tuple[str, ...]) -> str:
    return eagle.add_delegation(text, rel, cls, methods)


def plan(tree: SourceTree, report: ScanReport) -> list[FileChange]:
    """Every file change the report calls for, computed in memory; nothing is written here."""
    originals: dict[str, bytes] = {}
    texts: dict[str, str] = {}
    notes: dict[str, list[str]] = {}

    def edit(rel: str, fn: Callable[[str], str], note: str) -> None:
        if rel not in texts:
            originals[rel] = (tree.root / rel).read_bytes()
            texts[rel] = _decode(originals[rel])[1]
        new = fn(texts[rel])
        if new != texts[rel]:
            texts[rel] = new
            notes.setdefault(rel, []).append(note)

    failing = {f.id for f in report.findings if not f.ok and f.patchable}
    major, symm = report.cc.major, report.symm
    if "capability-map" in failing:
        sizes = symm.sizes_map
        edit(
            sizes.path,
            lambda t: symm_mem.add_size_major(t, sizes.path, sizes.name, major),
            f"{sizes.name}: added major {major} (sizes of {max(sizes.majors)})",
        )
    if "multimem-lookup" in failing:
        edit(
            symm.communicator_path,
            lambda t: symm_mem.tolerate_multimem_lookup(t, symm.communicator_path, symm.communicator),
            f"{symm.multimem_map.name}: lookup by .get(major, ()) so an unlisted major selects two-shot",
        )
    if "multicast-early-return" in failing:
        edit(
            symm.communicator_path,
            lambda t: symm_mem.relax_multicast_return(t, symm.communicator_path, symm.communicator),
            f"{symm.communicator}: multicast early return only where multimem is selected",
        )
    if PREFLIGHT_ID in failing and report.preflight is not None:
        rel = report.preflight.path
        edit(
            rel,
            functools.partial(preflight.relax, rel=rel),
            f"{report.preflight.function}: sized as FlashInfer "
            "allocates its TRT-LLM workspace, without the multicast query that skips fusion on PCIe",
        )
    for rel in sorted({f.path for f in report.findings if f.id.startswith(AUTO_ENABLE_ID) and f.id in failing}):
        edit(
            rel,
            functools.partial(fusion.restrict_auto_enable, rel=rel),
            "fusion auto-enable limited to SM100 (FlashInfer without SM120 kernels, sglang#15650)",
        )
    for rel in sorted({f.path for f in report.findings if f.id.startswith("fusion-gate:") and f.id in failing}):
        functions = sorted(g.function for g in report.gates if g.path == rel and g.kind != "auto-enable")
        edit(rel, functools.partial(_admit, rel=rel), f"fusion gate admits SM120 in {', '.join(functions)}")
    if any(f.startswith("eagle3:") for f in failing):
        for (rel, cls), methods in eagle.delegation_targets(tree, report.eagle).items():
            edit(
                rel,
                functools.partial(_delegate, rel=rel, cls=cls, methods=methods),
                f"{cls}: EAGLE-3 delegation {', '.join(methods)} to self.language_model",
            )
    out = []
    for rel, text in texts.items():
        if rel not in notes:
            continue
        try:
            compile(text, rel, "exec", dont_inherit=True)
        except SyntaxError as exc:
            raise SglangError(
                f"internal error: the patched {rel} would not compile ({exc}); nothing was changed"
            ) from exc
        bom = _decode(originals[rel])[0]
        out.append(FileChange(rel, originals[rel], (bom + text).encode("utf-8"), tuple(notes[rel])))
    return out


def unified_diff(root: Path, changes: list[FileChange]) -> str:
    chunks: list[str] = []
    for ch in changes:
        chunks += difflib.unified_diff(
            ch.before.decode("utf-8").splitlines(keepends=True),
            ch.after.decode("utf-8").splitlines(keepends=True),
            fromfile=f"a/{root.name}/{ch.path}",
            tofile=f"b/{root.name}/{ch.path}",
        )
    return "".join(c if c.endswith("\n") else c + "\n\\ No newline at end of file\n" for c in chunks)


def _atomic_write(path: Path, data: bytes) -> None:
    mode = path.stat().st_mode & 0o7777 if path.exists() else 0o644
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".sm120kit-tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        Path(tmp).chmod(mode)
        Path(tmp).replace(path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _py_compile(path: Path, scratch: str) -> None:
    py_compile.compile(str(path), cfile=str(Path(scratch) / "check.pyc"), doraise=True)


def load_ledger(root: Path) -> dict[str, object] | None:
    path = root / STATE_DIR / LEDGER
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise SglangError(
            f"{path}: unreadable ledger ({exc}); restore from {root / STATE_DIR / 'backup'} by hand"
        ) from exc
    if not isinstance(data, dict) or not isinstance(data.get("files"), dict):
        raise SglangError(f"{path}: not an sm120check ledger; restore from {root / STATE_DIR / 'backup'} by hand")
    return data


def apply(tree: SourceTree, report: ScanReport, changes: list[FileChange]) -> dict[str, object]:
    """Write the changes: originals backed up first, each file replaced atomically and compiled, then the ledger."""
    root = tree.root
    state = root / STATE_DIR
    ledger = load_ledger(root) or {"files": {}}
    files: dict[str, dict[str, object]] = ledger["files"]  # type: ignore[assignment]
    for ch in changes:
        if sha256((root / ch.path).read_bytes()) != sha256(ch.before):
            raise SglangError(f"{root / ch.path} changed while planning; run the patch again")
    written: list[FileChange] = []
    with tempfile.TemporaryDirectory(prefix="sm120check-") as scratch:
        try:
            for ch in changes:
                if ch.path not in files:
                    backup = state / "backup" / ch.path
                    backup.parent.mkdir(parents=True, exist_ok=True)
                    _atomic_write(backup, ch.before)
                _atomic_write(root / ch.path, ch.after)
                written.append(ch)
                _py_compile(root / ch.path, scratch)
        except BaseException:
            for ch in reversed(written):
                _atomic_write(root / ch.path, ch.before)
            if not files:
                shutil.rmtree(state, ignore_errors=True)
            raise
    for ch in changes:
        entry = files.setdefault(ch.path, {"sha256_before": sha256(ch.before), "changes": []})
        entry["sha256_after"] = sha256(ch.after)
        entry["changes"] = [*entry["changes"], *ch.changes]  # type: ignore[misc]
    ledger.update(
        {
            "tool": "sm120check",
            "sm120check_version": __version__,
            "sglang_version": tree.version,
            "source": str(root),
            "cc": str(report.cc),
            "flashinfer": report.flashinfer,
            "updated": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
    )
    state.mkdir(exist_ok=True)
    _atomic_write(state / LEDGER, (json.dumps(ledger, indent=2, sort_keys=True) + "\n").encode("utf-8"))
    return ledger


def plan_revert(root: Path) -> list[FileChange]:
    """Changes that put the originals back, after checking nothing else touched the patched files."""
    ledger = load_ledger(root)
    if ledger is None:
        return []
    out = []
    files: dict[str, dict[str, object]] = ledger["files"]  # type: ignore[assignment]
    for rel, entry in sorted(files.items()):
        current = (root / rel).read_bytes()
        original = (root / STATE_DIR / "backup" / rel).read_bytes()
        if sha256(current) != entry.get("sha256_after"):
            raise SglangError(
                f"{root / rel} changed after sm120check patched it (sha256 differs from the ledger); "
                f"not reverting. Reinstall SGLang, or copy {root / STATE_DIR / 'backup' / rel} back by hand"
            )
        if sha256(original) != entry.get("sha256_before"):
            raise SglangError(f"backup of {rel} does not match the ledger's checksum; reinstall SGLang instead")
        out.append(FileChange(rel, current, original, tuple(f"restored original ({c})" for c in entry["changes"])))  # type: ignore[attr-defined]
    return out


def revert(root: Path, changes: list[FileChange]) -> None:
    for ch in changes:
        _atomic_write(root / ch.path, ch.after)
        if sha256((root / ch.path).read_bytes()) != sha256(ch.after):
            raise SglangError(f"{root / ch.path}: restored bytes do not match the original")
    shutil.rmtree(root / STATE_DIR, ignore_errors=False)
