"""Resolve a manifest: each pinned wheel's metadata, pip's full resolution, the rules between them; cached.

The verdict is cached per manifest hash (`model.digest`: the pins, the toolkit and NCCL, the node's Python and
platform, the sources) under `${SM120KIT_CACHE:-${XDG_CACHE_HOME:-~/.cache}/sm120kit}/resolve/`, so the plays of one
converge, and the next converge of the same manifest, do not resolve again. A skipped resolution is never cached.
Wheel metadata is cached the same way (`metadata/`): a wheel's METADATA never changes once published.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict, replace
from pathlib import Path

from sm120check import bounded
from sm120check.stack import pip, rules
from sm120check.stack.model import Resolution, Sources, Stack, Status, Target, WheelMetadata, digest


def cache_root() -> Path:
    if explicit := os.environ.get("SM120KIT_CACHE"):
        return Path(explicit)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "sm120kit"


MAX_ENTRY = 16 << 20  # one cache entry (a verdict or a wheel's metadata) is a few KiB
CACHE_FIX = "remove it (`rm -rf {root}`; after a `sudo` run: `sudo rm -rf {root}`) or set SM120KIT_CACHE"
_WARNED: set[str] = set()


def new_run() -> None:
    """Each cache warning is said once per run (a CLI invocation)."""
    _WARNED.clear()


def _warn(message: str) -> None:
    if message not in _WARNED:  # once per run
        _WARNED.add(message)
        print(f"sm120check stack: warning: {message}", file=sys.stderr, flush=True)


def _write(path: Path, document: object) -> None:
    """Atomically (bounded.write_atomic), so a concurrent reader sees the old file or the new one. A cache that
    cannot be written (a file where its directory should be, a root-owned or read-only directory) is said on stderr
    with the fix; the verdict stands, it is only not cached."""
    root = path.parent.parent
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        bounded.write_atomic(path, json.dumps(document, indent=1, sort_keys=True).encode("utf-8"))
    except OSError as exc:
        where = exc.filename or path.parent
        _warn(
            f"the resolution cache {root} cannot be written ({where}: {exc.strerror or exc}), so nothing is cached; "
            + CACHE_FIX.format(root=root)
        )


def _read(path: Path) -> dict[str, object] | None:
    """A cache entry, or None when there is none or it cannot be used (said on stderr, with the fix): a damaged or
    planted entry is resolved again and overwritten, never trusted."""
    try:
        data = json.loads(bounded.read_text(path, MAX_ENTRY))
    except bounded.Missing:
        return None
    except (bounded.Unreadable, ValueError, RecursionError) as exc:
        reason = str(exc) if isinstance(exc, bounded.Unreadable) else f"{path}: not a JSON cache entry"
        _warn(f"ignoring the cache entry {reason}; resolving again (`--refresh` does the same)")
        return None
    if not isinstance(data, dict):
        _warn(f"ignoring the cache entry {path}: not a JSON object; resolving again")
        return None
    return data


def _metadata_entry(data: Mapping[str, object], name: str) -> WheelMetadata | None:
    """A cached wheel's metadata when it is what this cache writes, for that wheel; None otherwise."""
    requires = data.get("requires", [])
    fields = (data.get("name"), data.get("version"), data.get("requires_python", ""))
    if not all(isinstance(v, str) for v in fields) or not isinstance(requires, list):
        return None
    if not all(isinstance(r, str) for r in requires) or data.get("name") != name:
        return None
    return WheelMetadata(
        name=name, version=str(data["version"]), requires=tuple(requires), requires_python=str(fields[2])
    )


class MetadataError(Exception):
    """pip refused to find a pinned wheel: `words` are pip's."""

    def __init__(self, words: str) -> None:
        super().__init__(words)
        self.words = words


def _metadata_key(name: str, version: str, target: Target, sources: Sources) -> str:
    text = json.dumps([name, version, asdict(target), asdict(sources)], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def metadata(
    pins: Mapping[str, str],
    target: Target,
    sources: Sources,
    *,
    timeout: float = pip.DEFAULT_TIMEOUT,
    cache: Path | None = None,
) -> dict[str, WheelMetadata]:
    """Each pinned wheel's own metadata (name -> metadata), from the cache or one `pip --no-deps` run for the rest.

    Raises MetadataError with pip's words when a pin is not on the sources, PipUnavailable when pip cannot answer.
    """
    root = (cache or cache_root()) / "metadata"
    found: dict[str, WheelMetadata] = {}
    missing: dict[str, str] = {}
    for name, version in pins.items():
        path = root / f"{_metadata_key(name, version, target, sources)}.json"
        data = _read(path)
        entry = _metadata_entry(data, name) if data is not None else None
        if entry is not None:
            found[name] = entry
        else:
            if data is not None:
                _warn(f"ignoring the cache entry {path}: not the metadata of {name} {version}; reading it again")
            missing[name] = version
    if missing:
        answer = pip.run(
            [f"{n}=={v}" for n, v in sorted(missing.items())], target, sources, deps=False, timeout=timeout
        )
        if not answer.ok:
            raise MetadataError(pip.conflict_words(answer.words))
        for wheel in answer.wheels:
            if wheel.name in missing:
                found[wheel.name] = wheel
                key = _metadata_key(wheel.name, missing[wheel.name], target, sources)
                _write(root / f"{key}.json", {**asdict(wheel), "requires": list(wheel.requires)})
    return found


def resolve(
    stack: Stack,
    target: Target,
    sources: Sources,
    *,
    timeout: float = pip.DEFAULT_TIMEOUT,
    cache: Path | None = None,
    refresh: bool = False,
) -> Resolution:
    """The verdict on `stack` for `target` from `sources`: from the cache, or pip's metadata and resolution."""
    key = digest(stack, target, sources)
    path = (cache or cache_root()) / "resolve" / f"{key}.json"
    if not refresh and (data := _read(path)) is not None:
        try:
            cached = Resolution.from_json(data)
        except (KeyError, ValueError, TypeError, AttributeError):
            cached = None
        if cached is not None and cached.digest == key:
            return replace(cached, cached=True)
        _warn(f"ignoring the cache entry {path}: not a verdict on this manifest; resolving again")
    deadline = time.monotonic() + timeout
    base = Resolution(Status.SKIPPED, key, target.describe(), sources.describe())
    if sources.wheelhouse and not Path(sources.wheelhouse).is_dir():
        return replace(
            base,
            reason=(
                f"the node installs from its wheelhouse and no copy of it is on this machine at {sources.wheelhouse} "
                "(preflight_resolve_wheelhouse; `make wheelhouse` builds one there). The wheelhouse was resolved by "
                "pip "
                "when it was built, and preflight checks on the node that it was built for this manifest"
            ),
        )
    try:
        wheels = metadata(stack.pins(), target, sources, timeout=timeout, cache=cache)
    except pip.PipUnavailable as exc:
        return replace(base, reason=str(exc))
    except MetadataError as exc:
        verdict = replace(base, status=Status.CONFLICT, pip_words=exc.words)
        _write(path, verdict.to_json())
        return verdict
    problems = rules.requirement_problems(stack, list(wheels.values()))
    try:
        answer = pip.run(
            stack.requirements(), target, sources, deps=True, timeout=max(1.0, deadline - time.monotonic())
        )
    except pip.PipUnavailable as exc:
        if problems:  # the metadata alone refuses the manifest
            verdict = replace(base, status=Status.CONFLICT, problems=tuple(problems), reason=str(exc))
            _write(path, verdict.to_json())
            return verdict
        return replace(base, reason=str(exc))
    resolved = {w.name: w.version for w in answer.wheels}
    if answer.ok:
        problems += rules.resolved_problems(stack, resolved, problems)
    status = Status.OK if answer.ok and not problems else Status.CONFLICT
    verdict = replace(
        base,
        status=status,
        problems=tuple(problems),
        pip_words="" if answer.ok else pip.conflict_words(answer.words),
        resolved=resolved,
    )
    _write(path, verdict.to_json())
    return verdict


def render(resolution: Resolution) -> list[str]:
    """What a user reads: one line per problem, pip's words, or why nothing was resolved."""
    head = f"for {resolution.target} from {resolution.sources}"
    cached = (
        " (cached: this manifest was resolved before; --refresh resolves again, in preflight "
        "-e preflight_resolve_refresh=true)"
        if resolution.cached
        else ""
    )
    if resolution.status is Status.SKIPPED:
        return [f"The pins were not resolved {head}: {resolution.reason}.{cached}"]
    if resolution.status is Status.OK:
        return [f"pip resolved the pins {head}: {len(resolution.resolved)} wheels, no conflict.{cached}"]
    lines = [f"The pins conflict {head}; nothing was changed.{cached}"]
    lines += [problem.message() for problem in resolution.problems]
    if resolution.pip_words:
        lines.append("pip says:\n" + resolution.pip_words)
    if resolution.reason:
        lines.append(f"(pip's full resolution did not run: {resolution.reason})")
    return lines
