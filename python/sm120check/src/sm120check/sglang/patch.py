"""Plan, apply and revert the SM120 patches: backups, atomic writes, compiled results, a journal and recovery.

State lives beside the code it changed, in `<sglang>/.sm120kit/` (model and survey in `state`):

- `ledger.json`: `{"format": 2, "state": "in-progress" | "complete", "tool", "sm120check_version",
  "sglang_version", "source", "cc", "flashinfer", "updated", "files": {"srt/x.py": {"sha256_before",
  "sha256_after", "changes": [...]}}}`. It is a journal: written with state "in-progress", naming every file about
  to change, before the first write to the tree, and "complete" after the last; each write is atomic (temporary
  file, fsync, os.replace, fsync of the directory). While in progress, `sha256_previous` is the earlier patched
  content of a file patched again. Format 1 (no "state") was written only when complete and reads as such.
- `backup/<path>`: the original bytes of each file (`sha256_before`), written before the file itself.

Every file the ledger names or `backup/` holds is judged by three witnesses: the ledger's checksums, the backup's,
and the dist-info RECORD of the installed release (a checkout has none). A file that holds its original, or the
release's own bytes (after `pip install -U`, which keeps `.sm120kit/`), needs nothing: its entry and backup are
stale and dropped. A file that holds sm120check's bytes gets its verified backup back on `--revert`. A backup no
ledger lists is restored when RECORD proves it the original. Anything else (a hand edit, a missing file or backup,
a backup RECORD cannot verify) is refused with exit 2, naming the path and the fix. A killed patch leaves an
in-progress journal: the next patch rolls it back first, `--revert` finishes it. `--revert` removes `.sm120kit/`.
"""

from __future__ import annotations

import difflib
import fcntl
import functools
import hashlib
import os
import py_compile
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from sm120check import __version__
from sm120check.sglang import eagle, fusion_gates, plain_decode, preflight, spec_stream, state, symm_mem_gates
from sm120check.sglang.errors import SglangError
from sm120check.sglang.scan import AUTO_ENABLE_ID, PREFLIGHT_ID, ScanReport
from sm120check.sglang.state import Verdict
from sm120check.sglang.tree import SourceTree

STATE_DIR, LEDGER = state.STATE_DIR, state.LEDGER
BOM = "\ufeff"


@dataclass(frozen=True)
class FileChange:
    path: str  # relative to the sglang package
    before: bytes
    after: bytes
    changes: tuple[str, ...]
    link: str | None = None  # revert: `path` was a symbolic link to this target, put back instead of the bytes


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _decode(data: bytes) -> tuple[str, str]:
    text = data.decode("utf-8")
    return (BOM, text[1:]) if text.startswith(BOM) else ("", text)


def _admit(text: str, *, rel: str) -> str:
    return fusion_gates.admit_sm120(text, rel)


def _delegate(text: str, *, rel: str, target: eagle.Delegation) -> str:
    return eagle.add_delegation(text, rel, target.cls, target.methods, target.attr, target.inner)


def plan(tree: SourceTree, report: ScanReport) -> list[FileChange]:
    """Every file change the report calls for, computed in memory; nothing is written here."""
    originals: dict[str, bytes] = {}
    texts: dict[str, str] = {}
    notes: dict[str, list[str]] = {}

    def edit(rel: str, fn: Callable[[str], str], note: str) -> None:
        if rel not in texts:
            target = state.inside(tree.root, tree.root / rel)  # a link to a directory elsewhere is refused here
            state.inside(tree.root, tree.root / STATE_DIR / state.BACKUP / rel)
            originals[rel] = state.read_file(target)
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
            lambda t: symm_mem_gates.add_size_major(t, sizes.path, sizes.name, major),
            f"{sizes.name}: added major {major} (sizes of {max(sizes.majors)})",
        )
    if "multimem-lookup" in failing:
        edit(
            symm.communicator_path,
            lambda t: symm_mem_gates.tolerate_multimem_lookup(t, symm.communicator_path, symm.communicator),
            f"{symm.multimem_map.name}: lookup by .get(major, ()) so an unlisted major selects two-shot",
        )
    if "multicast-early-return" in failing:
        edit(
            symm.communicator_path,
            lambda t: symm_mem_gates.relax_multicast_return(t, symm.communicator_path, symm.communicator),
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
            functools.partial(fusion_gates.restrict_auto_enable, rel=rel),
            "fusion auto-enable limited to SM100 (FlashInfer without SM120 kernels, sglang#15650)",
        )
    for rel in sorted({f.path for f in report.findings if f.id.startswith("fusion-gate:") and f.id in failing}):
        functions = sorted(g.function for g in report.gates if g.path == rel and g.kind != "auto-enable")
        edit(rel, functools.partial(_admit, rel=rel), f"fusion gate admits SM120 in {', '.join(functions)}")
    if any(f.startswith("eagle3:") for f in failing):
        # Only the scan's targets: each one a class whose inner model has every method added there. Unsupported
        # and run-time-chosen inner models (eagle3-unsupported:, eagle3-runtime:) are never patched.
        for target in report.eagle.targets:
            edit(
                target.path,
                functools.partial(_delegate, rel=target.path, target=target),
                f"{target.cls}: EAGLE-3 delegation {', '.join(target.methods)} to self.{target.attr} "
                f"({', '.join(target.inner)})",
            )
    if plain_decode.PATCH_ID in failing:
        edit(
            plain_decode.PATH,
            functools.partial(plain_decode.add_switch, version=report.version),
            f"{plain_decode.WORKER}: the speculation switch (a 0-step decode batch runs the target's plain decode)",
        )
    if spec_stream.PATCH_ID in failing:
        edit(
            spec_stream.PATH,
            functools.partial(spec_stream.add, version=report.version),
            "speculative histograms sent only with a request's last output",
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


def _py_compile(path: Path, scratch: str) -> None:
    py_compile.compile(str(path), cfile=str(Path(scratch) / "check.pyc"), doraise=True)


def _original(found: state.Survey, f: state.FileState) -> bytes:
    """The backup's bytes, checked against the survey that vouched for them."""
    backup = found.backup(f.rel)
    data = state.read_file(backup)
    if sha256(data) != f.backup_sha:
        raise SglangError(f"{backup} changed while sm120check read it; run the command again")
    return data


def _put(path: Path, data: bytes, link: str | None = None) -> None:
    """Put the original back: its bytes, or the symbolic link it was (whose target was never written)."""
    if link is None:
        state.atomic_write(path, data)
    else:
        state.restore_link(path, link)
    if state.digest(path) != sha256(data):
        where = f" (through the link to {link}, which changed since the patch)" if link else ""
        raise SglangError(f"{path}: restored bytes do not match the original{where}")


@dataclass(frozen=True)
class Recovery:
    """What `recover` found (and, unless checking, did) before a patch."""

    restored: tuple[str, ...] = ()  # originals put back: an interrupted patch, or backups no ledger lists
    rebaselined: tuple[str, ...] = ()  # entries and backups dropped: the file is its original or the release's own
    pending: bool = False  # the state needed tidying

    def notes(self, *, check: bool) -> list[str]:
        verb = ("would restore", "would drop") if check else ("restored", "dropped")
        return [f"{verb[0]} the original of {rel} (interrupted or unrecorded patch)" for rel in self.restored] + [
            f"{verb[1]} the stale ledger entry and backup of {rel}: it holds its original or the installed release's"
            for rel in self.rebaselined
        ]


def recover(tree: SourceTree, *, check: bool = False) -> Recovery:
    """Bring `.sm120kit/` to a complete ledger of this release, or none, before a patch; refuse where ambiguous.

    An interrupted patch is rolled back from its journal; backups no ledger lists are restored where RECORD proves
    them originals; entries of files that hold their original, or the installed release's own bytes (an upgrade),
    are dropped with their backups. With `check`, nothing is written."""
    found = state.survey(tree.root, tree.version)
    found.raise_problems()
    if not found.present:
        return Recovery()
    patched = found.having(Verdict.PATCHED)
    restore = found.having(Verdict.STRAY) + (patched if found.interrupted else [])
    keep = {} if found.interrupted else {f.rel: f.entry for f in patched if f.entry is not None}
    # stale entries and backups; in a rolled-back journal these are files it had not reached, not worth a note
    dropped = () if found.interrupted else tuple(f.rel for f in found.having(Verdict.ORIGINAL, Verdict.PRISTINE))
    ledger = found.ledger
    stale = bool(found.having(Verdict.ORIGINAL, Verdict.PRISTINE))
    pending = ledger is None or found.interrupted or ledger.sglang_version != tree.version or bool(restore) or stale
    result = Recovery(tuple(f.rel for f in restore), dropped, pending)
    if not pending or check:
        return result
    for f in restore:
        _put(state.inside(tree.root, tree.root / f.rel), _original(found, f), f.entry.link if f.entry else None)
    state.clear(found, replace(ledger, files=keep, sglang_version=tree.version) if ledger and keep else None)
    return result


LOCK_WAIT_S = 60.0  # a patch or revert takes seconds; a run that holds the lock longer is stuck, not slow


@contextmanager
def tree_lock(root: Path, wait_s: float | None = None) -> Iterator[None]:
    """One patch or revert at a time per tree: an exclusive flock on the package directory itself (nothing is
    written for it). A second run waits up to LOCK_WAIT_S for the first, then refuses, naming the tree."""
    limit = LOCK_WAIT_S if wait_s is None else wait_s
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise SglangError(state.describe(exc)) from exc
    try:
        deadline = time.monotonic() + limit
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise SglangError(
                        f"another `sm120check sglang patch` is working on {root} (it has held the lock for over "
                        f"{limit:g} s); nothing was changed. Let it finish (`fuser -v {root}` names it), then run "
                        "this command again"
                    ) from None
                time.sleep(min(0.2, max(deadline - time.monotonic(), 0.01)))
        yield
    finally:
        os.close(fd)


def _link(path: Path) -> str | None:
    """The target of `path` when it is a symbolic link to a file: the patch writes a regular file in its place (the
    target, maybe outside the tree, is never written) and the ledger keeps the target, so revert puts the link back."""
    return str(path.readlink()) if path.is_symlink() else None


def _journal(
    tree: SourceTree, report: ScanReport, prior: state.Ledger | None, changes: list[FileChange]
) -> state.Ledger:
    files = dict(prior.files) if prior else {}
    for ch in changes:
        old = files.get(ch.path)
        files[ch.path] = state.Entry(
            old.sha256_before if old else sha256(ch.before),
            sha256(ch.after),
            tuple(dict.fromkeys([*(old.changes if old else ()), *ch.changes])),
            old.sha256_after if old else None,
            old.link if old else _link(tree.root / ch.path),
        )
    return state.Ledger(
        state.IN_PROGRESS,
        tree.version,
        files,
        __version__,
        str(tree.root),
        str(report.cc),
        report.flashinfer,
        time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    )


def apply(tree: SourceTree, report: ScanReport, changes: list[FileChange]) -> state.Ledger:
    """Write the changes under a journal: the ledger, "in-progress" and naming every file about to change, first;
    then per file the backup of its original (first patch of it only) and the file (atomic, compiled); then the
    ledger, "complete". A failure puts back what was written; a kill leaves the journal for `recover`."""
    root = tree.root
    prior = state.load_ledger(root)
    if prior is not None and prior.state != state.COMPLETE:
        raise SglangError(
            f"{root / STATE_DIR / LEDGER} records an interrupted patch that was not rolled back; run "
            "`sm120check sglang patch --revert` to finish it"
        )
    for ch in changes:
        state.inside(root, root / STATE_DIR / state.BACKUP / ch.path)
        if state.digest(state.inside(root, root / ch.path)) != sha256(ch.before):
            raise SglangError(f"{root / ch.path} changed while planning; run the patch again")
        backup = root / STATE_DIR / state.BACKUP / ch.path
        if (prior is None or ch.path not in prior.files) and backup.exists():
            raise SglangError(f"{backup} exists but no ledger lists it; `sm120check sglang patch` recovers it first")
    journal = _journal(tree, report, prior, changes)
    written: list[FileChange] = []
    try:
        state.write_ledger(root, journal)
        with tempfile.TemporaryDirectory(prefix="sm120check-") as scratch:
            for ch in changes:
                if prior is None or ch.path not in prior.files:
                    backup = root / STATE_DIR / state.BACKUP / ch.path
                    state.make_dirs(backup.parent)
                    state.atomic_write(backup, ch.before)
                written.append(ch)  # before the write: a failure after os.replace still gets undone
                state.atomic_write(root / ch.path, ch.after)
                _py_compile(root / ch.path, scratch)
        final = journal.completed()
        state.write_ledger(root, final)
    except BaseException as exc:
        _undo(tree, prior, journal, written)
        if isinstance(exc, py_compile.PyCompileError):
            raise SglangError(f"{exc.file}: does not compile once patched ({exc.msg}); nothing was changed") from exc
        if isinstance(exc, OSError):
            raise SglangError(f"{state.describe(exc)}; nothing was changed") from exc
        if isinstance(exc, SglangError):
            raise SglangError(f"{exc}; nothing was changed") from exc
        raise
    return final


def _undo(tree: SourceTree, prior: state.Ledger | None, journal: state.Ledger, written: list[FileChange]) -> None:
    """Put back what `apply` wrote, and the ledger as it was; should that fail too, the journal stays for `recover`."""
    try:
        for ch in reversed(written):
            path = tree.root / ch.path
            first = prior is None or ch.path not in prior.files  # a link before this run: put the link back
            link = journal.files[ch.path].link if first else None
            if link is not None:
                if not path.is_symlink():
                    state.restore_link(path, link)
            elif state.digest(path) != sha256(ch.before):
                state.atomic_write(path, ch.before)
        found = state.survey(tree.root, tree.version)
        for f in found.files:  # drop no backup whose file is not back to that original
            if (prior is None or f.rel not in prior.files) and f.verdict is not Verdict.ORIGINAL:
                raise SglangError(f"{tree.root / f.rel} is not back to its original")
        state.clear(found, prior)
    except SglangError as exc:
        raise SglangError(
            f"{exc}, while undoing a failed patch; the journal {tree.root / STATE_DIR / LEDGER} lets "
            "`sm120check sglang patch` (or --revert) finish once that is fixed"
        ) from exc


@dataclass(frozen=True)
class RevertPlan:
    survey: state.Survey
    changes: list[FileChange]  # current bytes -> original bytes, for the files that need their original back
    skipped: tuple[str, ...]  # files that already hold their original (or the installed release's own bytes)

    @property
    def needed(self) -> bool:
        return self.survey.present


def plan_revert(tree: SourceTree) -> RevertPlan:
    """What `revert` will do, after checking every file against the ledger, its backup and RECORD; writes nothing."""
    found = state.survey(tree.root, tree.version)
    found.raise_problems()
    changes = []
    for f in found.having(Verdict.PATCHED, Verdict.STRAY):
        current = state.read_file(state.inside(tree.root, tree.root / f.rel))
        notes = (
            tuple(f"restored original ({c})" for c in f.entry.changes)
            if f.entry
            else ("restored original from a backup no ledger lists (its sha256 is the release's, from RECORD)",)
        )
        changes.append(FileChange(f.rel, current, _original(found, f), notes, f.entry.link if f.entry else None))
    skipped = tuple(f.rel for f in found.having(Verdict.ORIGINAL, Verdict.PRISTINE))
    return RevertPlan(found, changes, skipped)


def revert(plan: RevertPlan) -> None:
    """Put every original back, then remove `.sm120kit/`: backups first, the ledger last, so that a kill leaves a
    state the next revert finishes."""
    for ch in plan.changes:
        _put(plan.survey.root / ch.path, ch.after, ch.link)
    state.clear(plan.survey)
