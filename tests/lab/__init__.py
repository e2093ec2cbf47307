"""The container lab: podman nodes, ansible-playbook runs against them, and the wheelhouse they install from.

Prepare a machine with `scripts/lab/setup` (root). Fixtures built on this live in tests/conftest.py and
tests/integration/conftest.py.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path


def in_ci() -> bool:
    """CI=true (as .ci/run sets it): a missing lab or lab input is then a failure, never a skip."""
    return os.environ.get("CI", "").strip().lower() in {"true", "1", "yes"}


@contextlib.contextmanager
def cache_lock(lock: Path) -> Iterator[None]:
    """Hold an exclusive flock on `lock` (created, with its parent): two pytest workers (pytest-xdist) that fill the
    same cache entry take turns, and the second finds the first's result instead of downloading or building again."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    with lock.open("a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
