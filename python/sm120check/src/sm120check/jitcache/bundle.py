"""A cache bundle: FlashInfer module directories with their ninja state, the key they were built for, and a sha256
per file.

Layout: a gzip'd tar whose first member is `sm120kit-jit.json` (the manifest) and whose other members are the
listed files, at their paths under FlashInfer's cache root (`<version>/<arch>/cached_ops/<module>/<file>`). File
times travel in the manifest to the nanosecond, because ninja compares them: an output that looks newer than the
dependencies ninja recorded for it is rebuilt.

Unpacking checks the key, then every file's size and sha256 while extracting into a staging directory beside the
cache, and only then moves each module directory into place, so a bad or partial bundle changes nothing.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import socket
import tarfile
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath
from typing import IO, Any

from sm120check.jitcache.key import BuildContext, CacheKey, KeyProblem

SCHEMA = 1
KIND = "sm120kit-flashinfer-jit"
MANIFEST_NAME = "sm120kit-jit.json"
STAMP_NAME = "sm120kit-jit.json"  # also written into each module directory: where the module came from
SKIP_SUFFIXES = (".lock",)
_CHUNK = 1 << 20


class BundleError(Exception):
    """The bundle cannot be used; the message lists every problem and the fix."""


@dataclass(frozen=True)
class FileEntry:
    path: str  # relative to the cache root, POSIX separators
    sha256: str
    size: int
    mtime_ns: int


@dataclass(frozen=True)
class Manifest:
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


def module_dir(cache_root: Path, version: str, arch: str, module: str) -> Path:
    return cache_root / version / arch / "cached_ops" / module


def _safe_relpath(text: str) -> PurePosixPath:
    path = PurePosixPath(text)
    if path.is_absolute() or ".." in path.parts or not path.parts or len(path.parts) < 5:
        raise BundleError(f"bundle lists an unsafe or malformed path {text!r}; rebuild the bundle")
    return path


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
) -> Manifest:
    """Write a bundle of these modules (already built under `cache_root` for `key`) to `out`, atomically.

    `libraries_only` keeps just each module's .so: enough for `install_aot`, not for FlashInfer's JIT cache (a load
    there would find no ninja state and rebuild).
    """
    files = _collect(cache_root, key, modules, libraries_only)
    manifest = Manifest(
        key=key,
        context=asdict(context),
        modules={
            m: {
                "dir": f"{key.flashinfer}/{key.arch}/cached_ops/{m}",
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


def parse_manifest(raw: Mapping[str, Any], source: str) -> Manifest:
    if raw.get("kind") != KIND or raw.get("schema") != SCHEMA:
        raise BundleError(f"{source} is not a schema {SCHEMA} {KIND} bundle; rebuild it with this sm120check")
    try:
        key = CacheKey.from_mapping(dict(raw["key"]), source)
        files = tuple(
            FileEntry(str(f["path"]), str(f["sha256"]), int(f["size"]), int(f["mtime_ns"])) for f in raw["files"]
        )
        modules = {str(k): dict(v) for k, v in dict(raw["modules"]).items()}
    except (KeyError, TypeError, ValueError, KeyProblem) as exc:
        raise BundleError(f"{source}: manifest lacks or mangles {exc}; rebuild the bundle") from None
    for entry in files:
        _safe_relpath(entry.path)
    return Manifest(
        key, dict(raw.get("context") or {}), modules, files, str(raw.get("created", "")), str(raw.get("host", ""))
    )


def _open(bundle: Path) -> tarfile.TarFile:
    try:
        return tarfile.open(bundle, "r:gz")
    except FileNotFoundError:
        raise BundleError(f"{bundle} does not exist") from None
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise BundleError(f"{bundle} is not a readable gzip'd tar ({exc}): copy it again") from None


def read_manifest(bundle: Path) -> Manifest:
    with _open(bundle) as tar:
        try:
            member = tar.next()
            if member is None or member.name != MANIFEST_NAME:
                raise BundleError(f"{bundle} does not start with {MANIFEST_NAME}: not an sm120kit JIT bundle")
            handle = tar.extractfile(member)
            raw = json.load(handle) if handle else None
        except (tarfile.TarError, OSError, EOFError, json.JSONDecodeError) as exc:
            raise BundleError(f"{bundle}: cannot read its manifest ({exc}): copy it again") from None
    if not isinstance(raw, dict):
        raise BundleError(f"{bundle}: its manifest is not a JSON object")
    return parse_manifest(raw, str(bundle))


def _copy_hashing(src: IO[bytes], dest: Path) -> tuple[str, int]:
    digest, size = hashlib.sha256(), 0
    with dest.open("wb") as out:
        while chunk := src.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
            out.write(chunk)
    return digest.hexdigest(), size


def _extract_verified(bundle: Path, manifest: Manifest, staging: Path) -> list[str]:
    """Extract every listed file into `staging`, checking size and sha256; return the problems found."""
    wanted = {entry.path: entry for entry in manifest.files}
    problems: list[str] = []
    seen: set[str] = set()
    with _open(bundle) as tar:
        try:
            for member in tar:
                if member.name == MANIFEST_NAME:
                    continue
                entry = wanted.get(member.name)
                if entry is None or not member.isfile():
                    problems.append(f"{member.name}: in the bundle but not in its manifest (or not a plain file)")
                    continue
                target = staging / _safe_relpath(member.name)
                target.parent.mkdir(parents=True, exist_ok=True)
                handle = tar.extractfile(member)
                if handle is None:
                    problems.append(f"{member.name}: unreadable member")
                    continue
                digest, size = _copy_hashing(handle, target)
                seen.add(member.name)
                if size != entry.size or digest != entry.sha256:
                    problems.append(
                        f"{member.name}: sha256 {digest[:12]}... size {size}, manifest says "
                        f"{entry.sha256[:12]}... size {entry.size} (tampered or corrupted)"
                    )
                    continue
                os.utime(target, ns=(entry.mtime_ns, entry.mtime_ns))
        except (tarfile.TarError, OSError, EOFError) as exc:
            problems.append(f"the bundle ends early or is damaged ({exc}): copy it again")
    problems.extend(
        f"{path}: listed in the manifest but missing from the bundle" for path in sorted(set(wanted) - seen)
    )
    return problems


def verify(bundle: Path, expect: CacheKey | None = None, ignore: Sequence[str] = ()) -> Manifest:
    """Check the key (when given) and every file's checksum; raise BundleError listing every problem."""
    manifest = read_manifest(bundle)
    _check_key(bundle, manifest.key, expect, ignore)
    with tempfile.TemporaryDirectory(prefix="sm120kit-jit-verify-") as tmp:
        problems = _extract_verified(bundle, manifest, Path(tmp))
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


def unpack(bundle: Path, cache_root: Path, expect: CacheKey | None = None, ignore: Sequence[str] = ()) -> Unpacked:
    """Verify the bundle, then install its module directories under `cache_root` (replacing older copies)."""
    start = time.monotonic()
    manifest = read_manifest(bundle)
    _check_key(bundle, manifest.key, expect, ignore)
    cache_root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".sm120kit-jit-staging-", dir=cache_root))
    try:
        problems = _extract_verified(bundle, manifest, staging)
        if problems:
            raise BundleError(_problems(bundle, problems))
        stamp = {
            "key": manifest.key.as_dict(),
            "bundle": bundle.name,
            "built_on": manifest.host,
            "created": manifest.created,
            "installed": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        for name, info in manifest.modules.items():
            rel = _safe_relpath(str(info["dir"]) + "/x").parent
            new, final = staging / rel, cache_root / rel
            new.mkdir(parents=True, exist_ok=True)
            (new / STAMP_NAME).write_text(json.dumps({**stamp, "module": name}, indent=1) + "\n")
            final.parent.mkdir(parents=True, exist_ok=True)
            if final.exists():
                old = staging / "replaced" / name
                old.parent.mkdir(parents=True, exist_ok=True)
                final.replace(old)
            new.replace(final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return Unpacked(
        key=manifest.key,
        modules=tuple(manifest.modules),
        files=len(manifest.files),
        bytes=sum(f.size for f in manifest.files),
        seconds=round(time.monotonic() - start, 2),
    )


def install_aot(bundle: Path, aot_dir: Path, expect: CacheKey | None = None, ignore: Sequence[str] = ()) -> Unpacked:
    """Verify the bundle, then place each module's library where FlashInfer loads prebuilt (AOT) modules.

    FlashInfer loads `<package>/data/aot/<module>/<module>.so` without running ninja, so paths need not agree; but it
    does so for any target and any later FlashInfer version, so this is for a scratch install (the device test), not
    for a serving venv.
    """
    start = time.monotonic()
    manifest = read_manifest(bundle)
    _check_key(bundle, manifest.key, expect, ignore)
    with tempfile.TemporaryDirectory(prefix="sm120kit-jit-aot-") as tmp:
        problems = _extract_verified(bundle, manifest, Path(tmp))
        if problems:
            raise BundleError(_problems(bundle, problems))
        for name, info in manifest.modules.items():
            library = Path(tmp) / str(info["dir"]) / f"{name}.so"
            (aot_dir / name).mkdir(parents=True, exist_ok=True)
            shutil.copy2(library, aot_dir / name / f"{name}.so")
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
        raw = json.loads((directory / STAMP_NAME).read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return raw if isinstance(raw, dict) else {}
