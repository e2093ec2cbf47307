"""The patcher writes only inside --source (directory links refused, file links restored as links), and two runs on
one tree take turns (reliability probe 2: N77, N78, N82). Fast tier: a small tree of real SGLang 0.5.9 excerpts."""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

import pytest

from lab.sglang_releases import FIXTURES, run_cli, tree_hashes
from sm120check.sglang import patch

SIZES_REL = "srt/distributed/device_communicators/all_reduce_utils.py"
SYMM_REL = "srt/distributed/device_communicators/torch_symm_mem.py"
# The one call on the target model an EAGLE-3 worker makes, so that the scan has a contract to check models against.
EAGLE_WORKER = "def init(self):\n    self.target_worker.model_runner.model.set_eagle3_layers_to_capture([1])\n"
MODEL = (  # a model registration that already has the method: nothing for EAGLE-3 to patch
    "class LlamaForCausalLM:\n    def set_eagle3_layers_to_capture(self, ids):\n        pass\n\n\n"
    "EntryClass = LlamaForCausalLM\n"
)
FLAGS = ("--cc", "12.0", "--flashinfer-version", "0.7.2", "--json")


def _fixture(name: str) -> str:
    return (FIXTURES / f"{name}.py.txt").read_text(encoding="utf-8")


def _tree(root: Path, communicators: Path | None = None) -> Path:
    """root/sglang with the two device_communicators files a 0.5.9 patch changes; `communicators` holds them
    instead, with a symbolic link to it in the tree."""
    pkg = root / "sglang"
    (pkg / "srt/distributed").mkdir(parents=True)
    (pkg / "srt/speculative").mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "srt/speculative/eagle_worker.py").write_text(EAGLE_WORKER)
    (pkg / "srt/models").mkdir()
    (pkg / "srt/models/llama.py").write_text(MODEL)
    folder = communicators or pkg / "srt/distributed/device_communicators"
    folder.mkdir(parents=True)
    (folder / "all_reduce_utils.py").write_text(_fixture("all_reduce_utils-0.5.9"))
    (folder / "torch_symm_mem.py").write_text(_fixture("torch_symm_mem-0.5.23"))
    if communicators is not None:
        (pkg / "srt/distributed/device_communicators").symlink_to(communicators, target_is_directory=True)
    return pkg


def test_a_directory_link_in_the_tree_is_refused_and_nothing_outside_is_written(tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere"
    pkg = _tree(tmp_path / "site", communicators=outside)
    before = tree_hashes(outside)
    status, out = run_cli("patch", "--source", str(pkg), *FLAGS)
    error = json.loads(out)["error"]
    assert status == 2
    assert error.startswith(f"{pkg}/srt/distributed/device_communicators is a symbolic link to {outside}: ")
    assert f"sm120check writes only inside {pkg} and does not follow directory links there" in error
    assert "Replace the link by a copy of the directory, or patch the tree it leads to (--source)" in error
    assert tree_hashes(outside) == before and not (pkg / ".sm120kit").exists()


def test_a_file_link_is_patched_as_a_file_and_revert_puts_the_link_back(tmp_path: Path) -> None:
    pkg = _tree(tmp_path / "site")
    outside = tmp_path / "shared" / "all_reduce_utils.py"
    outside.parent.mkdir()
    (pkg / SIZES_REL).rename(outside)
    (pkg / SIZES_REL).symlink_to(outside)
    original = outside.read_bytes()
    status, out = run_cli("patch", "--source", str(pkg), *FLAGS)
    assert status == 0, out
    assert SIZES_REL in [f["path"] for f in json.loads(out)["files"]]
    assert outside.read_bytes() == original  # the link's target is never written
    assert not (pkg / SIZES_REL).is_symlink() and (pkg / SIZES_REL).read_bytes() != original
    ledger = json.loads((pkg / ".sm120kit/ledger.json").read_text(encoding="utf-8"))
    assert ledger["files"][SIZES_REL]["link"] == str(outside)
    status, out = run_cli("patch", "--revert", "--source", str(pkg), "--json")
    assert status == 0, out
    assert (pkg / SIZES_REL).is_symlink() and (pkg / SIZES_REL).readlink() == outside
    assert outside.read_bytes() == original and not (pkg / ".sm120kit").exists()


def test_a_second_run_on_a_locked_tree_refuses_without_advising_a_race(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pkg = _tree(tmp_path / "site")
    before = tree_hashes(tmp_path)
    monkeypatch.setattr(patch, "LOCK_WAIT_S", 0.0)  # the default waits a minute for the first run
    first = os.open(pkg, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(first, fcntl.LOCK_EX)  # as a patch in progress holds it
        status, out = run_cli("patch", "--source", str(pkg), *FLAGS)
    finally:
        os.close(first)
    error = json.loads(out)["error"]
    assert status == 2
    assert error == (
        f"another `sm120check sglang patch` is working on {pkg} (it has held the lock for over 0 s); nothing was "
        f"changed. Let it finish (`fuser -v {pkg}` names it), then run this command again"
    )
    assert tree_hashes(tmp_path) == before
    status, out = run_cli("patch", "--source", str(pkg), *FLAGS)  # once the first is done, the lock is free
    assert status == 0, out
