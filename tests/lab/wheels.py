"""Real release wheels for the tests, downloaded once with pip (its configured indexes) into the cache outside the
checkout: `${SM120KIT_CACHE:-${XDG_CACHE_HOME:-~/.cache}/sm120kit}/wheels/`."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from lab import cache_lock
from sm120check.stack.resolve import cache_root


def wheels_dir() -> Path:
    return cache_root() / "wheels"


def flashinfer_wheel(version: str) -> Path:
    """flashinfer-python==version's wheel, downloaded the first time it is asked for (pip takes one version of a
    project per run)."""
    folder = wheels_dir()
    # Looked up under the lock too: pip may still be writing the file another pytest worker asked for.
    with cache_lock(folder / f".flashinfer_python-{version}.lock"):
        found = sorted(folder.glob(f"flashinfer_python-{version}-*.whl"))
        return found[0] if found else _download(folder, version)


def _download(folder: Path, version: str) -> Path:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "-q",
            "--no-deps",
            "-d",
            str(folder),
            f"flashinfer-python=={version}",
        ],
        check=True,
        timeout=900,
    )
    return sorted(folder.glob(f"flashinfer_python-{version}-*.whl"))[0]


def read_member(wheel: Path, member: str) -> str:
    """One source file of a wheel, read from the zip (nothing installed)."""
    with zipfile.ZipFile(wheel) as archive:
        return archive.read(member).decode("utf-8")
