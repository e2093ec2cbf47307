"""`sm120check stack plan --set NAME=VERSION`: every pin that moves with a bump, from the real wheels' metadata.

The metadata comes from pip's configured indexes once and is cached outside the checkout (~/.cache/sm120kit).
"""

from __future__ import annotations

import contextlib
import io
import shutil
from pathlib import Path

import pytest
import yaml

from sm120check.cli import main

ROOT = Path(__file__).resolve().parents[3]
SHIPPED = ROOT / "inventory/group_vars/all/stack.yml"


def plan(stack: Path, *argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(["stack", "plan", "--stack", str(stack), *argv])
    return status, out.getvalue(), err.getvalue()


@pytest.fixture
def stack_file(tmp_path: Path) -> Path:
    copy = tmp_path / "stack.yml"
    shutil.copy(SHIPPED, copy)
    return copy


@pytest.mark.slow  # torch 2.15.0's and cuda-toolkit 13.2.2's metadata from the index, once
def test_torch_2_15_moves_the_toolkit_and_its_components_and_names_what_blocks_it(stack_file: Path) -> None:
    before = stack_file.read_text()
    status, out, _ = plan(stack_file, "--set", "torch=2.15.0", "--write")
    assert status == 1
    assert "sm120kit_profiles.full.python_packages['torch']: 2.14.1 -> 2.15.0  (you set it)" in out
    assert "sm120kit_cuda_version: 13.0.1 -> 13.2.2  (torch 2.15.0 requires cuda-toolkit[" in out
    assert (
        "sm120kit_cuda_components['nvidia-cuda-nvcc']: 13.0.88 -> 13.2.86  "
        "(cuda-toolkit 13.2.2 requires nvidia-cuda-nvcc==13.2.86.*)" in out
    )
    assert "sm120kit_cuda_components['nvidia-cuda-cccl']: 13.0.85 -> 13.2.86" in out
    assert "sm120kit_cuda_apt_version: 13.0.1-1 -> 13.2.2-1" in out
    assert "sm120kit_nccl_version" not in out  # torch 2.15.0 keeps nvidia-nccl-cu13==2.30.7
    assert "Blocked: these pins do not move with it" in out
    assert "sglang 0.5.23 requires torch==2.14.1" in out and "sglang-kernel 0.4.10 requires torch==2.14.1" in out
    assert "Fix: move sglang too (--set sglang=VERSION" in out
    assert f"Nothing written to {stack_file}: the plan is blocked or pip refused it." in out
    assert stack_file.read_text() == before


@pytest.mark.slow  # cuda-toolkit 13.2.2's metadata and the core profile's resolution, once
def test_write_puts_only_the_moved_values_into_stack_yml_and_keeps_its_comments(stack_file: Path) -> None:
    before = stack_file.read_text()
    status, out, _ = plan(stack_file, "--profile", "core", "--set", "cuda-toolkit=13.2.2", "--write")
    assert status == 0, out
    assert "pip resolved the pins" in out and f"Wrote 8 value(s) into {stack_file}." in out
    after = stack_file.read_text()
    written, shipped = yaml.safe_load(after), yaml.safe_load(before)
    assert written["sm120kit_cuda_version"] == "13.2.2" and written["sm120kit_cuda_apt_version"] == "13.2.2-1"
    assert set(written["sm120kit_cuda_components"].values()) == {"13.2.86"}
    for key in ("sm120kit_cuda_version", "sm120kit_cuda_components", "sm120kit_cuda_apt_version"):
        shipped.pop(key), written.pop(key)
    assert written == shipped  # nothing else changed
    assert [line for line in after.splitlines() if line.startswith("#")] == [
        line for line in before.splitlines() if line.startswith("#")
    ]
    assert "Comments that still name an old version (reread them):" in out and "CUDA toolkit 13.0.1" in out


def test_a_set_that_is_not_a_pin_is_refused_naming_it_and_the_fix(stack_file: Path) -> None:
    status, _, err = plan(stack_file, "--set", "tensorflow=2.20.0")
    assert status == 2
    assert "--set tensorflow: not a pin of profile 'full'" in err
    assert "add a new package to sm120kit_extra_python_packages first" in err


def test_a_set_without_a_version_is_refused_with_the_form_to_write(stack_file: Path) -> None:
    status, _, err = plan(stack_file, "--set", "torch")
    assert status == 2 and "--set 'torch': write NAME=VERSION, e.g. --set torch=2.15.0" in err
