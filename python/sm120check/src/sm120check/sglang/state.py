"""The patch state in `<sglang>/.sm120kit/`: the ledger (a journal while a patch runs), the backups, and what they
mean for the tree as it is now.

A `Survey` judges every file the ledger names or `backup/` holds, with three witnesses: the ledger's checksums, the
backup's own checksum, and the dist-info RECORD of the installed release (absent in a checkout). The writes that
change the state (`atomic_write`, `remove`) go through `_replace` and `_remove`, so that tests can kill the process
at any one of them.
"""

from __future__ import annotations

import base64
import contextlib
import csv
import glob
import hashlib
import json
import os
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from enum import Enum
from pathlib import Path, PurePosixPath

from sm120check import bounded
from sm120check.sglang.errors import SglangError

STATE_DIR = ".sm120kit"
LEDGER = "ledger.json"
BACKUP = "backup"
TMP_SUFFIX = ".sm120kit-tmp"
FORMAT = 2
IN_PROGRESS, COMPLETE = "in-progress", "complete"
MAX_FILE_BYTES = 64 << 20  # a source file, a backup, the ledger or RECORD (SGLang's largest module is under 1 MiB)
_HEX = frozenset("0123456789abcdef")


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def describe(exc: OSError) -> str:
    """An OS error as "<path>: <reason>", the path first."""
    where = " -> ".join(str(p) for p in (exc.filename, exc.filename2) if p is not None)
    reason = exc.strerror or str(exc)
    return f"{where}: {reason}" if where else reason


# --- the ledger -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Entry:
    """One patched file: its original (kept in backup/), what sm120check wrote, and why."""

    sha256_before: str
    sha256_after: str
    changes: tuple[str, ...]
    sha256_previous: str | None = None  # while in progress: the patched bytes this write replaces
    link: str | None = None  # the file was a symbolic link to this target: revert puts the link back

    def ours(self) -> frozenset[str]:
        """Checksums of bytes sm120check wrote over the original."""
        return frozenset(h for h in (self.sha256_after, self.sha256_previous) if h is not None)

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {
            "sha256_before": self.sha256_before,
            "sha256_after": self.sha256_after,
            "changes": list(self.changes),
        }
        if self.sha256_previous is not None:
            out["sha256_previous"] = self.sha256_previous
        if self.link is not None:
            out["link"] = self.link
        return out


@dataclass(frozen=True)
class Ledger:
    state: str  # IN_PROGRESS while files are being written, COMPLETE after the last one
    sglang_version: str
    files: Mapping[str, Entry]
    sm120check_version: str = ""
    source: str = ""
    cc: str = ""
    flashinfer: str | None = None
    updated: str = ""

    def completed(self) -> Ledger:
        files = {rel: replace(e, sha256_previous=None) for rel, e in self.files.items()}
        return replace(self, state=COMPLETE, files=files)

    def to_bytes(self) -> bytes:
        data = {
            "format": FORMAT,
            "state": self.state,
            "tool": "sm120check",
            "sm120check_version": self.sm120check_version,
            "sglang_version": self.sglang_version,
            "source": self.source,
            "cc": self.cc,
            "flashinfer": self.flashinfer,
            "updated": self.updated,
            "files": {rel: e.to_json() for rel, e in sorted(self.files.items())},
        }
        return (json.dumps(data, indent=2, sort_keys=True) + "\n").encode("utf-8")


class _Malformed(ValueError):
    pass


def _text(data: Mapping[str, object], key: str, default: str | None = None) -> str:
    value = data.get(key, default)
    if not isinstance(value, str):
        raise _Malformed(f"{key!r} is {value!r}, not a string")
    return value


def _digest_field(data: Mapping[str, object], key: str, where: str) -> str:
    value = _text(data, key)
    if len(value) != 64 or not set(value) <= _HEX:
        raise _Malformed(f"{where}: {key!r} is not a sha256")
    return value


def _rel(text: str) -> str:
    path = PurePosixPath(text)
    if not text or path.is_absolute() or ".." in path.parts or str(path) != text:
        raise _Malformed(f"{text!r} is not a path inside the sglang package")
    return text


def _entry(rel: str, raw: object) -> Entry:
    if not isinstance(raw, dict):
        raise _Malformed(f"files[{rel!r}] is {type(raw).__name__}, not an object")
    changes = raw.get("changes", [])
    if not isinstance(changes, list) or not all(isinstance(c, str) for c in changes):
        raise _Malformed(f"files[{rel!r}]: 'changes' is not a list of strings")
    previous, link = raw.get("sha256_previous"), raw.get("link")
    if link is not None and (not isinstance(link, str) or not link or "\x00" in link):
        raise _Malformed(f"files[{rel!r}]: 'link' is not a link target")
    return Entry(
        _digest_field(raw, "sha256_before", f"files[{rel!r}]"),
        _digest_field(raw, "sha256_after", f"files[{rel!r}]"),
        tuple(changes),
        None if previous is None else _digest_field(raw, "sha256_previous", f"files[{rel!r}]"),
        link,
    )


def parse_ledger(raw: bytes) -> Ledger:
    """The ledger from its JSON; format 1 (no "state", written only once complete) reads as complete."""
    data = json.loads(raw.decode("utf-8"))
    if not isinstance(data, dict) or not isinstance(data.get("files"), dict):
        raise _Malformed("no 'files' object")
    if data.get("format", 1) not in (1, FORMAT):
        raise _Malformed(f"format {data.get('format')!r}, this sm120check reads 1 and {FORMAT}")
    state = _text(data, "state", COMPLETE)
    if state not in (IN_PROGRESS, COMPLETE):
        raise _Malformed(f"state {state!r}")
    flashinfer = data.get("flashinfer")
    return Ledger(
        state,
        _text(data, "sglang_version", "unknown"),
        {_rel(rel): _entry(rel, raw) for rel, raw in data["files"].items()},
        _text(data, "sm120check_version", ""),
        _text(data, "source", ""),
        _text(data, "cc", ""),
        flashinfer if isinstance(flashinfer, str) else None,
        _text(data, "updated", ""),
    )


def load_ledger(root: Path) -> Ledger | None:
    path = root / STATE_DIR / LEDGER
    try:
        raw = bounded.read_bytes(path, MAX_FILE_BYTES)
    except bounded.Missing:
        return None
    except bounded.Unreadable as exc:
        raise SglangError(f"{exc}; cannot read the sm120check ledger") from exc
    try:
        return parse_ledger(raw)
    except ValueError as exc:  # json.JSONDecodeError, UnicodeDecodeError, _Malformed
        raise SglangError(
            f"{path}: not a valid sm120check ledger ({exc}). Nothing was changed. Move it aside and run "
            f"`sm120check sglang patch --revert`: it restores the backups in {root / STATE_DIR / BACKUP} that the "
            "release's RECORD verifies, and names the rest; or reinstall SGLang and remove "
            f"{root / STATE_DIR}"
        ) from exc


# --- the RECORD witness ---------------------------------------------------------------------------------------


def record_path(root: Path, version: str) -> Path | None:
    """The installed release's RECORD beside the package, when its dist-info is that release's."""
    exact = root.parent / f"{root.name}-{version}.dist-info" / "RECORD"
    if exact.is_file():
        return exact
    found = sorted(root.parent.glob(f"{root.name}-*.dist-info/RECORD"))
    return found[0] if version == "unknown" and len(found) == 1 else None


def read_record(root: Path, version: str) -> dict[str, str]:
    """{path in the package: sha256 hex} of the installed release's own files; {} for a checkout."""
    path = record_path(root, version)
    if path is None:
        return {}
    try:
        text = bounded.read_text(path, MAX_FILE_BYTES)
    except bounded.Unreadable as exc:
        raise SglangError(f"unreadable RECORD ({exc}); reinstall SGLang") from exc
    prefix = f"{root.name}/"
    out: dict[str, str] = {}
    for row in csv.reader(text.splitlines()):
        if len(row) >= 2 and row[0].startswith(prefix) and row[1].startswith("sha256="):
            b64 = row[1].removeprefix("sha256=")
            with contextlib.suppress(ValueError):
                out[row[0].removeprefix(prefix)] = base64.urlsafe_b64decode(b64 + "=" * (-len(b64) % 4)).hex()
    return out


# --- what the state means for the tree ------------------------------------------------------------------------


class Verdict(Enum):
    ORIGINAL = "original"  # the file already holds its original: nothing to restore
    PRISTINE = "pristine"  # the file is the installed release's own (RECORD): the entry or backup is stale
    PATCHED = "patched"  # sm120check's bytes, with the verified original in backup/
    STRAY = "stray"  # a backup no ledger lists, that RECORD verifies as the original of a changed file
    BLOCKED = "blocked"  # not safe to decide; `problem` names the file and what to do


@dataclass(frozen=True)
class FileState:
    rel: str
    verdict: Verdict
    entry: Entry | None  # None: a backup no ledger lists
    backup_sha: str | None  # None: no backup
    problem: str = ""


@dataclass(frozen=True)
class Survey:
    root: Path
    version: str
    present: bool  # .sm120kit/ exists
    ledger: Ledger | None = None
    files: tuple[FileState, ...] = field(default=())

    @property
    def state_dir(self) -> Path:
        return self.root / STATE_DIR

    def backup(self, rel: str) -> Path:
        return self.state_dir / BACKUP / rel

    @property
    def interrupted(self) -> bool:
        return self.ledger is not None and self.ledger.state != COMPLETE

    def having(self, *verdicts: Verdict) -> list[FileState]:
        return [f for f in self.files if f.verdict in verdicts]

    def raise_problems(self) -> None:
        problems = [f.problem for f in self.having(Verdict.BLOCKED)]
        if problems:
            more = [f"(and {len(problems) - 3} more files like these)"] if len(problems) > 3 else []
            raise SglangError("\n".join([*problems[:3], *more, "Nothing was changed."]))


def digest(path: Path) -> str | None:
    """sha256 of a file, None when it does not exist; a FIFO, a device or any OS error names the path."""
    try:
        fd = bounded.open_regular(path)
    except bounded.Missing:
        return None
    except bounded.Unreadable as exc:
        raise SglangError(str(exc)) from exc
    hasher = hashlib.sha256()
    try:
        while chunk := os.read(fd, 1 << 20):
            hasher.update(chunk)
    except OSError as exc:
        raise SglangError(f"{path}: {exc.strerror or exc}") from exc
    finally:
        os.close(fd)
    return hasher.hexdigest()


def read_file(path: Path) -> bytes:
    """A file of the tree or of the state, bounded and regular only; SglangError names it."""
    try:
        return bounded.read_bytes(path, MAX_FILE_BYTES)
    except bounded.Unreadable as exc:
        raise SglangError(str(exc)) from exc


def inside(root: Path, path: Path) -> Path:
    """`path`, once no directory between `root` and it is a symbolic link: a write there stays in the tree.
    Otherwise SglangError naming the link and the fix, before anything is written."""
    try:
        parts = path.relative_to(root).parts
    except ValueError:
        raise SglangError(f"{path} is outside {root}; sm120check writes only inside --source") from None
    here = root
    for part in parts[:-1]:
        here = here / part
        if here.is_symlink():
            raise SglangError(
                f"{here} is a symbolic link to {here.readlink()}: sm120check writes only inside {root} and "
                f"does not follow directory links there. Nothing was changed. Replace the link by a copy of the "
                f"directory, or patch the tree it leads to (--source), and run the command again"
            )
    return path


def _backups(folder: Path) -> list[str]:
    if not folder.exists():
        return []
    if not folder.is_dir():
        raise SglangError(f"{folder} is not a directory; sm120check keeps the originals there. Move it away")
    return sorted(
        p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file() and not p.name.endswith(TMP_SUFFIX)
    )


def survey(root: Path, version: str) -> Survey:
    """Read the state and judge every file it names; writes nothing."""
    folder = root / STATE_DIR
    if not folder.exists():
        return Survey(root, version, present=False)
    if not folder.is_dir():
        raise SglangError(
            f"{folder} is not a directory: sm120check keeps its ledger and backups there. Move it away and run "
            "the command again"
        )
    ledger = load_ledger(root)
    entries = dict(ledger.files) if ledger else {}
    rels = sorted(set(entries) | set(_backups(folder / BACKUP)))
    record = read_record(root, version)
    judge = _Judge(Survey(root, version, True, ledger), record)
    return Survey(root, version, True, ledger, tuple(judge(rel, entries.get(rel)) for rel in rels))


@dataclass(frozen=True)
class _Judge:
    base: Survey
    record: dict[str, str]

    def __call__(self, rel: str, entry: Entry | None) -> FileState:
        path, backup = self.base.root / rel, self.base.backup(rel)
        current, kept = digest(path), digest(backup)
        witness = self.record.get(rel)

        def blocked(problem: str) -> FileState:
            return FileState(rel, Verdict.BLOCKED, entry, kept, problem)

        if entry is None:  # a backup that no ledger accounts for
            if current == kept:
                return FileState(rel, Verdict.ORIGINAL, None, kept)
            if current is not None and current == witness:
                return FileState(rel, Verdict.PRISTINE, None, kept)
            if current is None:
                return blocked(self._missing(path, backup))
            if kept == witness:
                return FileState(rel, Verdict.STRAY, None, kept)
            return blocked(self._unverified(path, backup))
        if current == entry.sha256_before:
            return FileState(rel, Verdict.ORIGINAL, entry, kept)
        if current is not None and current == witness:
            return FileState(rel, Verdict.PRISTINE, entry, kept)
        if current is None:
            if self.record and witness is None:  # the installed release has no such file any more
                return FileState(rel, Verdict.PRISTINE, entry, kept)
            return blocked(self._missing(path, backup))
        if current not in entry.ours():
            return blocked(self._edited(path, backup))
        if kept is None:
            return blocked(self._lost(path, backup))
        if kept not in (entry.sha256_before, witness):
            return blocked(f"{backup} does not match the original's sha256 in the ledger; " + self._reinstall())
        if self._other_release() and witness is not None and kept != witness:
            return blocked(f"{backup} is not the original of {path} in SGLang {self.base.version}; " + self._upgrade())
        return FileState(rel, Verdict.PATCHED, entry, kept)

    def _other_release(self) -> bool:
        ledger = self.base.ledger
        return ledger is not None and ledger.sglang_version != self.base.version

    def _reinstall(self) -> str:
        version = self.base.version
        if self.record:
            return (
                f"reinstall SGLang {version} (pip install --force-reinstall --no-deps sglang=={version}) and run the "
                "command again"
            )
        return f"restore SGLang {version}'s own file (git checkout, or reinstall it) and run the command again"

    def _upgrade(self) -> str:
        ledger = self.base.ledger
        old = ledger.sglang_version if ledger else "?"
        return (
            f"the ledger records SGLang {old} but this tree is {self.base.version}: after an upgrade the backups "
            f"are of the old release, so remove {self.base.state_dir} and patch again; otherwise " + self._reinstall()
        )

    def _edited(self, path: Path, backup: Path) -> str:
        head = f"{path} changed after sm120check patched it (its sha256 is neither the patched one nor the original)"
        if self._other_release():
            return f"{head}; {self._upgrade()}"
        return (
            f"{head}; not touching it. To go back to the original, copy it back (cp {backup} {path}) and run the "
            f"command again; or {self._reinstall()}"
        )

    def _missing(self, path: Path, backup: Path) -> str:
        return (
            f"{path} is missing (sm120check patched it; its original is {backup}); copy the original back "
            f"(cp {backup} {path}) and run the command again, or {self._reinstall()}"
        )

    def _lost(self, path: Path, backup: Path) -> str:
        return f"{backup} is missing, so the original of {path} is not here; {self._reinstall()}"

    def _unverified(self, path: Path, backup: Path) -> str:
        folder, root = self.base.state_dir, self.base.root
        return (
            f"{backup} is a backup of {path} that no ledger lists and that no dist-info RECORD can verify, so "
            f"sm120check will not guess whether it is the original. If the backups in {folder / BACKUP} are the "
            f"originals, copy them back (cp -r {folder / BACKUP}/. {root}/) and remove {folder}; otherwise reinstall "
            f"SGLang and remove {folder}"
        )


# --- writes ---------------------------------------------------------------------------------------------------


def _replace(tmp: Path, path: Path) -> None:
    tmp.replace(path)


def _remove(path: Path) -> None:
    path.unlink(missing_ok=True)


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _own_like(path: Path, like: os.stat_result) -> None:
    """Give `path` the owner and group of what it replaces (or of its directory), where permitted."""
    mine = path.stat()
    if (mine.st_uid, mine.st_gid) != (like.st_uid, like.st_gid):
        with contextlib.suppress(PermissionError):
            os.chown(path, like.st_uid, like.st_gid)


def make_dirs(folder: Path) -> None:
    """mkdir -p, each new directory owned like its parent."""
    missing: list[Path] = []
    while not folder.is_dir():
        missing.append(folder)
        folder = folder.parent
    for new in reversed(missing):
        try:
            new.mkdir()
            _own_like(new, new.parent.stat())
        except OSError as exc:
            raise SglangError(describe(exc)) from exc


def restore_link(path: Path, target: str) -> None:
    """Put the symbolic link `path` -> `target` back in place of the regular file a patch wrote (atomic)."""
    tmp = path.with_name(f".{path.name}.link{TMP_SUFFIX}")
    try:
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(target)
        _replace(tmp, path)
        _fsync_dir(path.parent)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise SglangError(f"{path}: cannot put the link to {target} back ({exc.strerror or exc})") from exc


def atomic_write(path: Path, data: bytes) -> None:
    """Replace `path` by `data` (temporary file beside it, fsync, os.replace, fsync of the directory), keeping the
    mode and owner of the file replaced; a new file gets mode 0644 and the owner of its directory."""
    try:
        existing = path.exists()
        like = (path if existing else path.parent).stat()
        mode = like.st_mode & 0o7777 if existing else 0o644
        fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=TMP_SUFFIX)
    except OSError as exc:
        raise SglangError(f"{describe(exc)}; cannot write {path}") from exc
    tmp = Path(name)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        _own_like(tmp, like)
        tmp.chmod(mode)  # after chown, which may clear set-id bits
        _replace(tmp, path)
        _fsync_dir(path.parent)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise SglangError(f"{path}: cannot write ({exc.strerror or exc})") from exc
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def remove(path: Path) -> None:
    try:
        _remove(path)
    except OSError as exc:
        raise SglangError(f"{describe(exc)}; cannot remove {path}") from exc


def write_ledger(root: Path, ledger: Ledger) -> None:
    make_dirs(root / STATE_DIR)
    atomic_write(root / STATE_DIR / LEDGER, ledger.to_bytes())


def _leftovers(path: Path) -> Iterator[Path]:
    """Temporary files `atomic_write` leaves beside `path` when it is killed."""
    if path.parent.is_dir():
        yield from path.parent.glob(f".{glob.escape(path.name)}.*{TMP_SUFFIX}")


def clear(found: Survey, keep: Ledger | None = None) -> None:
    """Drop every backup and the ledger, or, with `keep`, write that ledger and drop the backups it does not list.

    Only files the survey accounted for are removed, and temporary files of this tool; a directory is removed only
    once empty, so anything else is left in place and named."""
    folder = found.state_dir
    if not folder.exists() and keep is None:
        return
    for f in found.files:
        for leftover in (*_leftovers(found.root / f.rel), *_leftovers(found.backup(f.rel))):
            remove(leftover)
    if keep is not None:
        write_ledger(found.root, keep)
    for f in found.files:
        if keep is None or f.rel not in keep.files:
            remove(found.backup(f.rel))
    if keep is not None:
        return
    for leftover in _leftovers(folder / LEDGER):
        remove(leftover)
    remove(folder / LEDGER)
    _prune(folder)


def _prune(folder: Path) -> None:
    try:
        for sub in sorted((p for p in folder.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
            if not any(sub.iterdir()):
                sub.rmdir()
        rest = sorted(folder.rglob("*"))
        if not rest:
            folder.rmdir()
            _fsync_dir(folder.parent)
            return
    except OSError as exc:
        raise SglangError(f"{describe(exc)}; cannot remove {folder}") from exc
    raise SglangError(
        f"the originals are in place, but {rest[0]} is left in {folder}: sm120check did not write it. Remove "
        f"{folder} by hand once you have checked it"
    )
