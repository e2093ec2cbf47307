"""Whether a FlashInfer load would compile, as ninja itself decides (real ninja, FlashInfer-shaped build files)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from jitcache_helpers import built_module, module_dir, ninja

from sm120check.jitcache.ninja import dry_run


def test_module_never_built_here_is_not_cached(tmp_path: Path) -> None:
    verdict = dry_run(module_dir(tmp_path), ninja())
    assert not verdict.clean and "missing" in verdict.reasons[0]


def test_module_built_in_its_own_directory_loads_without_work(tmp_path: Path) -> None:
    directory = built_module(tmp_path / "cache", tmp_path / "src")
    assert dry_run(directory, ninja()).clean


def test_combined_prebuild_leaves_the_first_load_a_full_rebuild(tmp_path: Path) -> None:
    """FlashInfer's build_jit_specs runs ninja one directory up: the module's own run finds no log of it."""
    root = tmp_path / "cache"
    directory = built_module(root, tmp_path / "src", run_in=module_dir(root).parent)
    verdict = dry_run(directory, ninja())
    assert not verdict.clean
    assert verdict.commands == 2
    assert "deps for" in verdict.reasons[0] and "are missing" in verdict.reasons[0]
    assert (module_dir(root).parent / ".ninja_log").exists() and not (directory / ".ninja_log").exists()


def test_source_newer_than_the_module_is_reported_with_ninja_reason(tmp_path: Path) -> None:
    directory = built_module(tmp_path / "cache", tmp_path / "src")
    later = (directory / "demo.so").stat().st_mtime_ns + 10**9
    os.utime(tmp_path / "src" / "demo.cuh", ns=(later, later))
    verdict = dry_run(directory, ninja())
    assert not verdict.clean and "older than most recent input" in verdict.summary()


def test_module_copied_to_another_cache_path_is_not_cached(tmp_path: Path) -> None:
    """Its build.ninja still names the first path: FlashInfer rewrites it on load and ninja rebuilds."""
    directory = built_module(tmp_path / "cache", tmp_path / "src")
    moved = tmp_path / "elsewhere" / "demo"
    shutil.copytree(directory, moved)
    verdict = dry_run(moved, ninja())
    assert not verdict.clean and "written for another cache path" in verdict.summary()


def test_a_module_never_built_here_says_a_load_builds_all_of_it(tmp_path: Path) -> None:
    """Not "a load would run 0 build command(s)": with no build file ninja cannot count, and a load builds it all."""
    summary = dry_run(module_dir(tmp_path), ninja()).summary()
    assert summary.startswith("a load would build the whole module (write build.ninja, compile every source, link): ")
    assert "build.ninja is missing (never built here)" in summary
    assert "0 build command" not in summary
