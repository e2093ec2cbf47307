"""A cache bundle: FlashInfer module directories with their ninja state, the key they were built for, and a sha256
per file.

Layout: a gzip'd tar whose first member is `sm120kit-jit.json` (the manifest) and whose other members are the
listed files, at their paths under FlashInfer's cache root (`<version>/<arch>/cached_ops/<module>/<file>`). File
times travel in the manifest to the nanosecond, because ninja compares them: an output that looks newer than the
dependencies ninja recorded for it is rebuilt.

Unpacking checks the key, then every file's size and sha256 while extracting into a staging directory beside the
cache, and only then moves each module directory into place, so a bad or partial bundle changes nothing.

A bundle is data from another machine, so the manifest is parsed once, strictly, where it enters (`parse_manifest`):
module names match `_NAME`, each module's dir is exactly the one the key implies
(`<version>/<arch>/cached_ops/<name>`), every file lies under one listed module's dir, nothing is listed twice, and
sizes and counts are bounded. The archive is read in one pass (the manifest first, then the members): a member that
is not a plain file listed in the manifest with exactly the listed size is refused before any of it is written, and
no copy goes past the listed size. Everything after the parse uses only the validated manifest. Failures of the
node (read-only cache, full disk) are `CacheProblem`s naming the path, not bundle problems.
"""

from __future__ import annotations

import errno
import fcntl
import gzip
import hashlib
import io
import json
import os
import re
import shutil
import socket
import tarfile
import tempfile
import time
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath
from typing import IO, Any, TypeGuard

from sm120check import bounded
from sm120check.jitcache import layout
from sm120check.jitcache.key import BuildContext, CacheKey, KeyProblem
from sm120check.jitcache.layout import module_dir

SCHEMA = 1
KIND = "sm120kit-flashinfer-jit"
MANIFEST_NAME = "sm120kit-jit.json"
STAMP_NAME = "sm120kit-jit.json"  # also written into each module directory: where the module came from
SKIP_SUFFIXES = (".lock",)
LOCK_WAIT_S = 600.0  # how long an unpack waits for another one on the same cache
_CHUNK = 1 << 20
STAGING_PREFIX = ".sm120kit-jit-staging-"
# A module name: one path component FlashInfer could have written (never "." or "..": the first character is not
# a dot). Key components that become directories (version, arch) may also carry a local version ("+cu130").
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
_KEY_COMPONENT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,127}")
_SHA256 = re.compile(r"[0-9a-f]{64}")
# Bounds on what a manifest may claim (a real one: a few modules, tens of files, a few hundred MB).
MAX_MANIFEST_BYTES = 8 << 20
MAX_MODULES = 256
MAX_FILES = 20_000
MAX_FILE_BYTES = 16 << 30
MAX_TOTAL_BYTES = 64 << 30
MAX_PATH_CHARS = 1024
MAX_TEXT_CHARS = 4096
MAX_PROBLEMS = 200
MAX_TRAILER_BYTES = 1 << 20  # after the last member: the end-of-archive blocks and record padding (10 KiB)
_MTIME_MAX = (1 << 63) - 1


class BundleError(Exception):
    """The bundle cannot be used; the message lists every problem and the fix."""


class CacheProblem(Exception):
    """This node cannot take the bundle (read-only or full disk, a file where a directory belongs); names the path."""


@dataclass(frozen=True)
class FileEntry:
    path: str  # relative to the cache root, POSIX separators
    sha256: str
    size: int
    mtime_ns: int


@dataclass(frozen=True)
class BundleManifest:
    key: CacheKey
    context: Mapping[str, str]
    modules: Mapping[str, Mapping[str, Any]]  # name -> {"dir": ..., "seconds": ...}
    files: tuple[FileEntry, ...]
    created: str
    host: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "kind": KIND,
            "key": self.key.as_dict(),
            "context": dict(self.context),
            "modules": {name: dict(info) for name, info in self.modules.items()},
            "files": [_entry_dict(f) for f in self.files],
            "created": self.created,
            "host": self.host,
        }


@dataclass(frozen=True)
class Unpacked:
    key: CacheKey
    modules: tuple[str, ...]
    files: int
    bytes: int
    seconds: float


def _entry_dict(entry: FileEntry) -> dict[str, Any]:
    return {"path": entry.path, "sha256": entry.sha256, "size": entry.size, "mtime_ns": entry.mtime_ns}


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def module_relpath(key: CacheKey, module: str) -> PurePosixPath:
    """The only directory a module of `key` may occupy, relative to the cache root."""
    return layout.module_relpath(key.flashinfer, key.arch, module)


def _collect(cache_root: Path, key: CacheKey, modules: Sequence[str], libraries_only: bool) -> list[FileEntry]:
    entries: list[FileEntry] = []
    for module in modules:
        directory = module_dir(cache_root, key.flashinfer, key.arch, module)
        library = directory / f"{module}.so"
        if not library.is_file():
            raise BundleError(f"{library} does not exist: build {module} before packing it")
        for path in sorted(p for p in directory.rglob("*") if p.is_file() and not p.is_symlink()):
            if path.name.endswith(SKIP_SUFFIXES) or path.name == STAMP_NAME:
                continue
            if libraries_only and path != library:
                continue
            stat = path.stat()
            rel = path.relative_to(cache_root).as_posix()
            entries.append(FileEntry(rel, sha256_file(path), stat.st_size, stat.st_mtime_ns))
    return entries


def pack(
    cache_root: Path,
    key: CacheKey,
    context: BuildContext,
    modules: Sequence[str],
    out: Path,
    seconds: Mapping[str, float] | None = None,
    libraries_only: bool = False,
) -> BundleManifest:
    """Write a bundle of these modules (already built under `cache_root` for `key`) to `out`, atomically.

    `libraries_only` keeps just each module's .so: enough for `install_aot`, not for FlashInfer's JIT cache (a load
    there would find no ninja state and rebuild).
    """
    files = _collect(cache_root, key, modules, libraries_only)
    manifest = BundleManifest(
        key=key,
        context=asdict(context),
        modules={
            m: {
                "dir": module_relpath(key, m).as_posix(),
                "seconds": round(float((seconds or {}).get(m, 0.0)), 1),
            }
            for m in modules
        },
        files=tuple(files),
        created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        host=socket.gethostname(),
    )
    body = json.dumps(manifest.as_dict(), indent=1, sort_keys=True).encode()
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{out.name}.", dir=out.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        with tarfile.open(tmp, "w:gz", compresslevel=6, format=tarfile.PAX_FORMAT) as tar:
            info = tarfile.TarInfo(MANIFEST_NAME)
            info.size, info.mtime, info.mode = len(body), int(time.time()), 0o644
            tar.addfile(info, io.BytesIO(body))
            for entry in files:
                tar.add(cache_root / entry.path, arcname=entry.path, recursive=False)
        tmp.chmod(0o644)
        tmp.replace(out)
    finally:
        tmp.unlink(missing_ok=True)
    return manifest


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for name, value in pairs:
        if name in result:
            raise BundleError(f"its manifest lists {name[:80]!r} twice")
        result[name] = value
    return result


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _text(raw: Mapping[str, Any], name: str) -> str:
    value = raw.get(name, "")
    return value[:MAX_TEXT_CHARS] if isinstance(value, str) else ""


def _path_problem(text: object) -> str | None:
    """Why `text` is not a canonical relative POSIX path (None when it is one)."""
    if not isinstance(text, str) or not text:
        return "not a path"
    if len(text) > MAX_PATH_CHARS or "\x00" in text:
        return "too long or has a NUL"
    path = PurePosixPath(text)
    if path.is_absolute() or path.as_posix() != text or any(part in ("", ".", "..") for part in path.parts):
        return "absolute, not canonical, or has '..'"
    return None


def _parse_key(raw: object, source: str, problems: list[str]) -> CacheKey | None:
    if not isinstance(raw, dict):
        problems.append("key: missing or not an object")
        return None
    try:
        key = CacheKey.from_mapping(raw, source)
    except KeyProblem as exc:
        problems.append(str(exc))
        return None
    for name in ("flashinfer", "arch"):  # these two become directories under the cache root
        if not _KEY_COMPONENT.fullmatch(getattr(key, name)):
            problems.append(f"key.{name} {getattr(key, name)[:80]!r} is not a plain directory name")
    for name in ("cuda", "torch", "context"):
        if len(getattr(key, name)) > 256:
            problems.append(f"key.{name} is longer than 256 characters")
    return None if problems else key


def _parse_modules(raw: object, key: CacheKey, problems: list[str]) -> dict[str, dict[str, Any]]:
    if not isinstance(raw, dict) or not raw:
        problems.append("modules: missing, empty or not an object")
        return {}
    if len(raw) > MAX_MODULES:
        problems.append(f"modules: {len(raw)} listed, at most {MAX_MODULES}")
        return {}
    modules: dict[str, dict[str, Any]] = {}
    owners: dict[str, str] = {}
    for name, info in raw.items():
        shown = repr(name[:80])
        if not _NAME.fullmatch(name) or name in (".", ".."):
            problems.append(f"module name {shown} is not a plain name ({_NAME.pattern})")
            continue
        if not isinstance(info, dict) or not isinstance(info.get("dir"), str):
            problems.append(f"module {shown}: no dir")
            continue
        claimed, expected = info["dir"], module_relpath(key, name).as_posix()
        if claimed in owners:
            problems.append(f"modules {owners[claimed]!r} and {name!r} both claim dir {claimed[:200]!r}")
            continue
        owners[claimed] = name
        if claimed != expected:
            problems.append(f"module {shown}: dir {claimed[:200]!r} is not {expected!r}, the one its key implies")
            continue
        seconds = info.get("seconds", 0.0)
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 <= seconds < 1e9:
            problems.append(f"module {shown}: seconds {str(seconds)[:40]!r} is not a build time")
            continue
        modules[name] = {"dir": expected, "seconds": float(seconds)}
    return modules


def _parse_files(raw: object, modules: Mapping[str, Mapping[str, Any]], problems: list[str]) -> tuple[FileEntry, ...]:
    if not isinstance(raw, list) or not raw:
        problems.append("files: missing, empty or not a list")
        return ()
    if len(raw) > MAX_FILES:
        problems.append(f"files: {len(raw)} listed, at most {MAX_FILES}")
        return ()
    module_of = {PurePosixPath(info["dir"]).parts: name for name, info in modules.items()}
    files: list[FileEntry] = []
    seen: set[str] = set()
    total = 0
    for item in raw:
        if not isinstance(item, dict):
            problems.append("files: an entry is not an object")
            continue
        path, sha, size, mtime = item.get("path"), item.get("sha256"), item.get("size"), item.get("mtime_ns")
        shown = repr(str(path)[:200])
        why = _path_problem(path)
        if why is not None or not isinstance(path, str):
            problems.append(f"{shown}: unsafe or malformed path ({why})")
            continue
        parts = PurePosixPath(path).parts
        if len(parts) < 5 or parts[:4] not in module_of:
            problems.append(f"{shown}: lies under no listed module's dir")
            continue
        if len(parts) == 5 and parts[4] == STAMP_NAME:
            problems.append(f"{shown}: {STAMP_NAME} is written by unpack, not carried")
            continue
        if path in seen:
            problems.append(f"{shown}: listed twice")
            continue
        if not (isinstance(sha, str) and _SHA256.fullmatch(sha)):
            problems.append(f"{shown}: sha256 is not 64 lowercase hex digits")
            continue
        if not (_is_int(size) and 0 <= size <= MAX_FILE_BYTES):
            problems.append(f"{shown}: size {str(size)[:40]!r} is not 0..{MAX_FILE_BYTES}")
            continue
        if not (_is_int(mtime) and 0 <= mtime <= _MTIME_MAX):
            problems.append(f"{shown}: mtime_ns {str(mtime)[:40]!r} is not a file time")
            continue
        seen.add(path)
        total += size
        files.append(FileEntry(path, sha, size, mtime))
    if total > MAX_TOTAL_BYTES:
        problems.append(f"files: {total} bytes in all, at most {MAX_TOTAL_BYTES}")
    parents = {parent.as_posix() for entry in files for parent in PurePosixPath(entry.path).parents}
    problems.extend(f"{entry.path!r}: listed as a file and as a directory" for entry in files if entry.path in parents)
    have = {entry.path for entry in files}
    for name, info in modules.items():
        if f"{info['dir']}/{name}.so" not in have:
            problems.append(f"module {name!r}: its library {info['dir']}/{name}.so is not listed")
    return tuple(files)


def parse_manifest(raw: Mapping[str, Any], source: str) -> BundleManifest:
    """The one check of a manifest from elsewhere: everything later uses only what this returns."""
    if raw.get("kind") != KIND or raw.get("schema") != SCHEMA:
        raise BundleError(f"{source} is not a schema {SCHEMA} {KIND} bundle; rebuild it with this sm120check")
    problems: list[str] = []
    key = _parse_key(raw.get("key"), source, problems)
    if key is None:
        raise BundleError(_refused(source, problems))
    modules = _parse_modules(raw.get("modules"), key, problems)
    files = _parse_files(raw.get("files"), modules, problems) if modules else ()
    context = raw.get("context") or {}
    if not isinstance(context, dict) or len(context) > 64:
        problems.append("context: not an object of at most 64 entries")
    if problems:
        raise BundleError(_refused(source, problems))
    return BundleManifest(
        key,
        {str(k)[:256]: str(v)[:MAX_TEXT_CHARS] for k, v in context.items()},
        modules,
        files,
        _text(raw, "created"),
        _text(raw, "host"),
    )


def _refused(source: str, problems: Sequence[str]) -> str:
    shown = "\n  ".join(problems[:20]) + (f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else "")
    return f"{source}: its manifest is refused, nothing was installed (rebuild the bundle with jit pack):\n  {shown}"


@contextmanager
def _open(bundle: Path) -> Iterator[tarfile.TarFile]:
    """The bundle as a stream: read once, front to back (the manifest, then the members it lists)."""
    # gzip.GzipFile, not tarfile's own "r|gz": it checks the stream's CRC and length at its end (_check_whole).
    try:
        raw = gzip.open(bundle, "rb")  # noqa: SIM115 (closed by the with below)
    except FileNotFoundError:
        raise BundleError(f"{bundle} does not exist") from None
    except OSError as exc:
        raise BundleError(f"{bundle} cannot be read ({exc.strerror or exc})") from None
    with raw:
        try:
            tar = tarfile.open(fileobj=raw, mode="r|")  # noqa: SIM115 (closed by the with below)
        except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:
            raise BundleError(f"{bundle} is not a readable gzip'd tar ({exc}): copy it again") from None
        with tar:
            yield tar


def _check_whole(tar: tarfile.TarFile) -> str:
    """Read the stream past the archive's last member to its end, where gzip checks its CRC and length: a copy with
    its trailer cut passes every member's sha256 yet is damaged. "" when whole, else the problem."""
    left = MAX_TRAILER_BYTES
    try:
        while tar.fileobj is not None and (chunk := tar.fileobj.read(min(_CHUNK, left + 1))):
            left -= len(chunk)
            if left < 0:
                return f"the bundle holds more than {MAX_TRAILER_BYTES} bytes after its last file: copy it again"
    except (OSError, EOFError, zlib.error) as exc:
        return f"the bundle's gzip stream ends early or is damaged ({exc}), though every file's sha256 matched: copy it"
    return ""


def _read_manifest(tar: tarfile.TarFile, bundle: Path) -> BundleManifest:
    try:
        member = tar.next()
        if member is None or member.name != MANIFEST_NAME:
            raise BundleError(f"{bundle} does not start with {MANIFEST_NAME}: not an sm120kit JIT bundle")
        if not member.isfile() or member.size > MAX_MANIFEST_BYTES:
            raise BundleError(f"{bundle}: its manifest is not a file of at most {MAX_MANIFEST_BYTES} bytes")
        handle = tar.extractfile(member)
        body = handle.read(MAX_MANIFEST_BYTES + 1) if handle else b""
        raw = json.loads(body, object_pairs_hook=_no_duplicate_keys)
    except (tarfile.TarError, OSError, EOFError, ValueError, RecursionError) as exc:
        raise BundleError(f"{bundle}: cannot read its manifest ({str(exc)[:200]}): copy it again") from None
    if not isinstance(raw, dict):
        raise BundleError(f"{bundle}: its manifest is not a JSON object")
    return parse_manifest(raw, str(bundle))


def _node_problem(exc: OSError, path: Path) -> CacheProblem:
    """What this node lacks, naming the path: the bundle is not at fault."""
    where = exc.filename or path
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return CacheProblem(
            f"the disk holding {where} is full ({exc.strerror}): free space there (or set "
            f"FLASHINFER_WORKSPACE_BASE to a larger disk) and unpack again; the staging directory was removed"
        )
    return CacheProblem(
        f"cannot write {where} ({exc.strerror or exc}): the cache must be a writable directory on a read-write "
        f"filesystem (check FLASHINFER_WORKSPACE_BASE); the staging directory was removed"
    )


def _write_all(out: IO[bytes], chunk: bytes) -> None:
    out.write(chunk)


def _copy_bounded(src: IO[bytes], dest: Path | None, limit: int) -> tuple[str, int]:
    """Hash `src` (copying it to `dest` when given), reading at most `limit` + 1 bytes."""
    digest, size = hashlib.sha256(), 0
    try:
        out = dest.open("wb") if dest is not None else None
    except OSError as exc:
        raise _node_problem(exc, dest or Path()) from None
    try:
        while size <= limit:
            chunk = src.read(min(_CHUNK, limit + 1 - size))
            if not chunk:
                break
            digest.update(chunk)
            size += len(chunk)
            if out is not None and dest is not None:
                try:
                    _write_all(out, chunk)
                except OSError as exc:
                    raise _node_problem(exc, dest) from None
        if out is not None and dest is not None:
            try:
                out.close()
            except OSError as exc:
                raise _node_problem(exc, dest) from None
    finally:
        if out is not None and not out.closed:
            with suppress(OSError):
                out.close()
    return digest.hexdigest(), size


def _extract_verified(
    tar: tarfile.TarFile,
    manifest: BundleManifest,
    staging: Path | None,
    keep: Callable[[FileEntry], bool] = lambda entry: True,
) -> list[str]:
    """Read every member after the manifest, checking it against the manifest; write the kept ones under `staging`
    (at the manifest's validated path, never the member's). Return the problems found.

    A member that is not listed, not a plain file, listed twice or not of its listed size stops the reading before
    any of it is written: a bundle that disagrees with its own manifest is hostile or broken, and the rest of it is
    not worth decompressing.
    """
    wanted = {entry.path: entry for entry in manifest.files}
    problems: list[str] = []
    seen: set[str] = set()
    try:
        while (member := tar.next()) is not None:
            name = member.name[:200]
            entry = wanted.get(member.name)
            if entry is None or not member.isfile():
                problems.append(f"{name!r}: in the bundle but not in its manifest (or not a plain file)")
                break
            if member.name in seen:
                problems.append(f"{name!r}: in the bundle twice")
                break
            if member.size != entry.size:
                problems.append(
                    f"{entry.path}: sha256 not read, {member.size} bytes in the bundle but the manifest says "
                    f"{entry.size} (tampered or corrupted); none of it was written"
                )
                break
            seen.add(member.name)
            handle = tar.extractfile(member)
            if handle is None:
                problems.append(f"{name!r}: unreadable member")
                break
            target = staging / entry.path if staging is not None and keep(entry) else None
            if target is not None:
                try:
                    target.parent.mkdir(parents=True, exist_ok=True)
                except OSError as exc:
                    raise _node_problem(exc, target.parent) from None
            digest, size = _copy_bounded(handle, target, entry.size)
            if size != entry.size or digest != entry.sha256:
                problems.append(
                    f"{entry.path}: sha256 {digest[:12]}... size {size}, manifest says "
                    f"{entry.sha256[:12]}... size {entry.size} (tampered or corrupted)"
                )
                if len(problems) >= MAX_PROBLEMS:
                    break
                continue
            if target is not None:
                try:
                    os.utime(target, ns=(entry.mtime_ns, entry.mtime_ns))
                except OSError as exc:
                    raise _node_problem(exc, target) from None
    except (tarfile.TarError, OSError, EOFError) as exc:
        problems.append(f"the bundle ends early or is damaged ({exc}): copy it again")
    if not problems:
        problems.extend(
            f"{path}: listed in the manifest but missing from the bundle" for path in sorted(set(wanted) - seen)
        )
    if not problems and (damaged := _check_whole(tar)):
        problems.append(damaged)
    return problems


def verify(bundle: Path, expect: CacheKey | None = None, ignore: Sequence[str] = ()) -> BundleManifest:
    """Check the manifest, the key (when given) and every file's checksum, writing nothing; raise BundleError listing
    every problem."""
    with _open(bundle) as tar:
        manifest = _read_manifest(tar, bundle)
        _check_key(bundle, manifest.key, expect, ignore)
        problems = _extract_verified(tar, manifest, None)
    if problems:
        raise BundleError(_problems(bundle, problems))
    return manifest


def _check_key(bundle: Path, have: CacheKey, expect: CacheKey | None, ignore: Sequence[str]) -> None:
    if expect is None:
        return
    differences = have.differences(expect, ignore)
    if differences:
        raise BundleError(
            f"{bundle} was built for another key ({'; '.join(differences)}; bundle vs this node): "
            f"a load here would rebuild it. Build on this node instead "
            f"(ansible-playbook site.yml --tags flashinfer_jit_build --limit <node>)"
        )


def _problems(bundle: Path, problems: Iterable[str]) -> str:
    listed = list(problems)
    shown = "\n  ".join(listed[:20]) + (f"\n  ... and {len(listed) - 20} more" if len(listed) > 20 else "")
    return f"{bundle} failed verification, nothing was installed:\n  {shown}"


def _check_space(where: Path, needed: int) -> None:
    try:
        free = shutil.disk_usage(where).free
    except OSError:
        return
    if free < needed:
        raise CacheProblem(
            f"the disk holding {where} is full for this bundle: {needed} bytes needed, {free} free; free space "
            f"there (or set FLASHINFER_WORKSPACE_BASE to a larger disk) and unpack again"
        )


@contextmanager
def _cache_lock(cache_root: Path) -> Iterator[None]:
    """One unpack at a time per cache; while holding it, any staging directory left is a dead run's: remove it."""
    try:
        cache_root.mkdir(parents=True, exist_ok=True)
        fd = os.open(cache_root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)  # the lock is the directory's own
    except OSError as exc:
        raise _node_problem(exc, cache_root) from None
    try:
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:  # bounded: a wedged unpack elsewhere must not hang this one (and the play) forever
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise CacheProblem(
                        f"another unpack has held the lock on {cache_root} for over {LOCK_WAIT_S:.0f} s; wait for "
                        f"it to finish, or end it (`fuser -v {cache_root}` names it) and unpack again"
                    ) from None
                time.sleep(0.5)
        for stale in cache_root.glob(f"{STAGING_PREFIX}*"):
            if stale.is_dir() and not stale.is_symlink():
                shutil.rmtree(stale, ignore_errors=True)
        yield
    finally:
        os.close(fd)


def _install(
    manifest: BundleManifest, staged: Path, replaced: Path, cache_root: Path, stamp: Mapping[str, Any]
) -> None:
    """Move each staged module directory into place, keeping what it replaces under `replaced`; on any failure or
    interruption put every directory back as it was."""
    done: list[tuple[Path, Path, Path | None]] = []  # (final, staged, old)
    try:
        for name in manifest.modules:
            rel = module_relpath(manifest.key, name)
            new, final = staged / rel, cache_root / rel
            new.mkdir(parents=True, exist_ok=True)
            (new / STAMP_NAME).write_text(json.dumps({**stamp, "module": name}, indent=1) + "\n")
            final.parent.mkdir(parents=True, exist_ok=True)
            old: Path | None = None
            if final.exists() or final.is_symlink():
                old = replaced / name
                replaced.mkdir(exist_ok=True)
                final.replace(old)
            try:
                new.replace(final)
            except BaseException:
                if old is not None:
                    old.replace(final)
                raise
            done.append((final, new, old))
    except BaseException as exc:
        for final, new, old in reversed(done):
            try:
                final.replace(new)
                if old is not None:
                    old.replace(final)
            except OSError:
                pass
        if isinstance(exc, OSError):
            raise _node_problem(exc, cache_root) from None
        raise


def unpack(bundle: Path, cache_root: Path, expect: CacheKey | None = None, ignore: Sequence[str] = ()) -> Unpacked:
    """Verify the bundle, then install its module directories under `cache_root` (replacing older copies).

    The staging directory beside the cache is removed on every exit (an exception, KeyboardInterrupt, or the CLI's
    SIGTERM, which it turns into an exception); one left by a killed run is removed by the next unpack.
    """
    start = time.monotonic()
    with _open(bundle) as tar:
        manifest = _read_manifest(tar, bundle)
        _check_key(bundle, manifest.key, expect, ignore)
        total = sum(f.size for f in manifest.files)
        with _cache_lock(cache_root):
            staging: Path | None = None
            try:
                try:
                    staging = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=cache_root))
                except OSError as exc:
                    raise _node_problem(exc, cache_root) from None
                _check_space(staging, total)
                problems = _extract_verified(tar, manifest, staging / "files")
                if problems:
                    raise BundleError(_problems(bundle, problems))
                stamp = {
                    "key": manifest.key.as_dict(),
                    "bundle": bundle.name,
                    "built_on": manifest.host,
                    "created": manifest.created,
                    "installed": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                }
                _install(manifest, staging / "files", staging / "replaced", cache_root, stamp)
            finally:
                if staging is not None:
                    shutil.rmtree(staging, ignore_errors=True)
    return Unpacked(
        key=manifest.key,
        modules=tuple(manifest.modules),
        files=len(manifest.files),
        bytes=total,
        seconds=round(time.monotonic() - start, 2),
    )


def install_aot(bundle: Path, aot_dir: Path, expect: CacheKey | None = None, ignore: Sequence[str] = ()) -> Unpacked:
    """Verify the bundle, then place each module's library where FlashInfer loads prebuilt (AOT) modules.

    FlashInfer loads `<package>/data/aot/<module>/<module>.so` without running ninja, so paths need not agree; but it
    does so for any target and any later FlashInfer version, so this is for a scratch install (the device test), not
    for a serving venv.
    """
    start = time.monotonic()
    with _open(bundle) as tar:
        manifest = _read_manifest(tar, bundle)
        _check_key(bundle, manifest.key, expect, ignore)
        libraries = {f"{info['dir']}/{name}.so": name for name, info in manifest.modules.items()}
        with tempfile.TemporaryDirectory(prefix="sm120kit-jit-aot-") as tmp:
            problems = _extract_verified(tar, manifest, Path(tmp), keep=lambda entry: entry.path in libraries)
            if problems:
                raise BundleError(_problems(bundle, problems))
            for path, name in libraries.items():
                target = aot_dir / name / f"{name}.so"
                try:
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(Path(tmp) / path, target)
                except OSError as exc:
                    raise _node_problem(exc, target) from None
    return Unpacked(manifest.key, tuple(manifest.modules), len(manifest.modules), 0, round(time.monotonic() - start, 2))


def write_stamp(directory: Path, key: CacheKey, module: str, seconds: float) -> None:
    """Record in a module directory built here which key it was built for."""
    stamp = {
        "key": key.as_dict(),
        "module": module,
        "built_on": socket.gethostname(),
        "seconds": round(seconds, 1),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    (directory / STAMP_NAME).write_text(json.dumps(stamp, indent=1) + "\n")


def read_stamp(directory: Path) -> dict[str, Any]:
    try:
        raw = json.loads(bounded.read_text(directory / STAMP_NAME, MAX_MANIFEST_BYTES))
    except (bounded.Unreadable, ValueError, RecursionError):
        return {}
    return raw if isinstance(raw, dict) else {}
