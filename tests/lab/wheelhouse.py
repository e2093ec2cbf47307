"""A profile's wheelhouse, built once on the control node and reused until its inputs change.

The cache lives at .cache/wheelhouse/<profile>; `<profile>.key` beside it holds the hash of what built it (the
manifest and the wheelhouse playbook). Nodes mount it read-only, so converges download nothing.
"""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Iterable
from pathlib import Path

from . import cache_lock
from .playbook import REPO_ROOT, PlaybookRun, playbook_argv, run_playbook

CACHE_ROOT = REPO_ROOT / ".cache" / "wheelhouse"
NODE_PATH = "/srv/sm120kit/wheelhouse"
PLAYBOOK = REPO_ROOT / "playbooks" / "wheelhouse.yml"
MANIFEST_DIR = REPO_ROOT / "inventory" / "group_vars" / "all"


class WheelhouseError(Exception):
    """The wheelhouse playbook failed; the message carries its log."""


def _files(paths: Iterable[Path]) -> list[Path]:
    found: list[Path] = []
    for path in paths:
        if path.is_dir():
            found += sorted(p for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
        elif path.is_file():
            found.append(path)
    return found


def wheelhouse_key(profile: str) -> str:
    """Hash of everything that decides a wheelhouse's contents: the manifest and the wheelhouse playbook."""
    digest = hashlib.sha256(profile.encode())
    for path in _files([MANIFEST_DIR, PLAYBOOK]):
        digest.update(str(path.relative_to(REPO_ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def cached_wheelhouse(profile: str) -> Path | None:
    """The cached wheelhouse of a profile when it is current, else None."""
    directory, stamp = CACHE_ROOT / profile, CACHE_ROOT / f"{profile}.key"
    if directory.is_dir() and stamp.is_file() and stamp.read_text().strip() == wheelhouse_key(profile):
        return directory
    return None


def build_wheelhouse(profile: str, timeout: float = 1800) -> tuple[Path, PlaybookRun | None]:
    """The current wheelhouse of a profile, built by playbooks/wheelhouse.yml when the cache is stale.

    Returns the directory and the build run (None when the cache was current). Under a lock: a second pytest
    worker waits for the first's build and then finds it current.
    """
    if (cached := cached_wheelhouse(profile)) is not None:
        return cached, None
    with cache_lock(CACHE_ROOT / f"{profile}.lock"):
        if (cached := cached_wheelhouse(profile)) is not None:
            return cached, None
        return _build(profile, timeout)


def _build(profile: str, timeout: float) -> tuple[Path, PlaybookRun]:
    key = wheelhouse_key(profile)
    directory, stamp = CACHE_ROOT / profile, CACHE_ROOT / f"{profile}.key"
    # Built in place (its requirement files may name the directory); the stamp is written only on success.
    stamp.unlink(missing_ok=True)
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    argv = playbook_argv(PLAYBOOK, None, {"wheelhouse_profile": profile, "wheelhouse_dir": str(directory)})
    run = run_playbook(argv, timeout=timeout)
    if run.rc != 0:
        raise WheelhouseError(f"building the {profile} wheelhouse failed\n{run.tail()}")
    stamp.write_text(key + "\n")
    return directory, run
