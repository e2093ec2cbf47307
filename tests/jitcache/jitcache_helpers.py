"""A real ninja-built module directory laid out like FlashInfer's cache: <root>/<version>/<arch>/cached_ops/<module>.

The build file has FlashInfer's shape (absolute paths, a compile rule with a gcc depfile, a link rule), with `cp`
standing in for nvcc so the tests run in milliseconds; ninja itself keeps the log and the dependency records.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from sm120check.jitcache.key import CacheKey

KEY = CacheKey(flashinfer="0.7.2", cuda="13.0.88", arch="90a", torch="2.14.1", context="3db7a3a5f8161882")
FIXTURES = Path(__file__).parent / "fixtures"

BUILD_NINJA = """ninja_required_version = 1.3
rule compile
  command = cp $in $out && echo "$out: $in {header}" > $out.d
  depfile = $out.d
  deps = gcc
rule link
  command = cat $in > $out
build {dir}/demo.cuda.o: compile {src}
build {dir}/demo.so: link {dir}/demo.cuda.o
default {dir}/demo.so
"""


def ninja() -> str:
    found = shutil.which("ninja")
    if found is None:
        pytest.skip("ninja is not installed here (pip install ninja)")
    return found


def module_dir(root: Path, name: str = "demo", key: CacheKey = KEY) -> Path:
    return root / key.flashinfer / key.arch / "cached_ops" / name


def built_module(root: Path, sources: Path, run_in: Path | None = None) -> Path:
    """Build the demo module under `root` with real ninja, run in the module directory (as a FlashInfer load does)."""
    sources.mkdir(parents=True, exist_ok=True)
    (sources / "demo.cu").write_text("__global__ void k() {}\n")
    (sources / "demo.cuh").write_text("#pragma once\n")
    directory = module_dir(root)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "build.ninja").write_text(
        BUILD_NINJA.format(dir=directory, src=sources / "demo.cu", header=sources / "demo.cuh")
    )
    workdir = run_in or directory
    subprocess.run([ninja(), "-C", str(workdir), "-f", str(directory / "build.ninja")], check=True, capture_output=True)
    return directory
