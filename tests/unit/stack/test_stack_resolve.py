"""Preflight's resolution of the profile's pins (sm120check stack resolve), against the real index's metadata.

The slow tests run pip against its configured indexes for the wheels' real metadata; pip's own cache and the
resolution cache (`~/.cache/sm120kit`, outside the checkout) make every run after the first fast.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from pathlib import Path

import pytest
import yaml

from sm120check.cli import main
from sm120check.stack import resolve
from sm120check.stack.model import Sources, Stack, Status, Target
from sm120check.stack.stackfile import stack_of

ROOT = Path(__file__).resolve().parents[3]
SHIPPED = ROOT / "inventory/group_vars/all/stack.yml"
NODE = Target(python="3.12", arch="x86_64")


def shipped(profile: str = "full", **pins: str) -> Stack:
    stack = stack_of(yaml.safe_load(SHIPPED.read_text()), profile)
    return Stack(**{**stack.__dict__, "python_packages": {**stack.python_packages, **pins}})


def cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(list(argv))
    return status, out.getvalue(), err.getvalue()


@pytest.mark.slow  # pip reads torch 2.15.0's, FlashInfer 0.7.4's and SGLang 0.5.23's metadata from the index once
def test_the_torch_2_15_bump_is_refused_before_anything_changes_with_pips_conflict_and_the_fix(tmp_path: Path) -> None:
    bumped = tmp_path / "stack.yml"
    text = SHIPPED.read_text().replace('torch: "2.14.1"', 'torch: "2.15.0"')
    bumped.write_text(text.replace('flashinfer-python: "0.7.2"', 'flashinfer-python: "0.7.4"'))
    status, out, _ = cli("stack", "resolve", "--stack", str(bumped), "--json", "--timeout", "600")
    verdict = json.loads(out)
    shown = "\n".join(verdict["lines"])
    assert status == 1 and verdict["status"] == "conflict"
    assert "The pins conflict for Python 3.12 on x86_64 (glibc 2.35)" in shown and "nothing was changed" in shown
    # pip's own words
    assert "ERROR: Cannot install" in shown and "sglang 0.5.23 depends on torch==2.14.1" in shown
    # the wheels' requirements held against the other pins, each with its fix
    assert (
        "torch 2.15.0 requires cuda-toolkit[cublas,cudart,cufft,cufile,cupti,cusolver,cusparse,nvjitlink,nvrtc,nvtx]"
        "==13.2.2, but sm120kit_cuda_version is 13.0.1" in shown
    )
    assert "Fix: move the toolkit with it: sm120kit_cuda_version 13.2.2" in shown
    assert (
        "sglang 0.5.23 requires torch==2.14.1, but sm120kit_profiles.full.python_packages['torch'] is 2.15.0" in shown
    )
    assert "sglang 0.5.23 requires flashinfer_python[cu13]==0.7.2" in shown
    assert "`sm120check stack plan --set torch=2.15.0`" in shown


@pytest.mark.slow  # the core profile: NCCL and nvidia-ml-py from the index
def test_the_core_profile_resolves_once_and_the_second_run_reads_the_cache(tmp_path: Path) -> None:
    first = resolve.resolve(shipped("core"), NODE, Sources(), timeout=600, cache=tmp_path)
    assert first.status is Status.OK and not first.cached
    assert first.resolved["nvidia-nccl-cu13"] == "2.30.7"
    second = resolve.resolve(shipped("core"), NODE, Sources(), timeout=600, cache=tmp_path)
    assert second.cached and second.status is Status.OK
    assert "(cached: this manifest was resolved before" in resolve.render(second)[0]
    assert list((tmp_path / "resolve").glob("*.json")) == [tmp_path / "resolve" / f"{first.digest}.json"]


def test_offline_with_no_wheelhouse_the_resolution_is_skipped_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL", "PIP_INDEX_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("PIP_TIMEOUT", "5")
    offline = Sources(index_url="http://127.0.0.1:9/simple")
    verdict = resolve.resolve(shipped("core"), NODE, offline, timeout=120, cache=tmp_path)
    assert verdict.status is Status.SKIPPED
    line = resolve.render(verdict)[0]
    assert line.startswith("The pins were not resolved for Python 3.12 on x86_64 (glibc 2.35) from the indexes http")
    assert "pip could not reach the indexes http://127.0.0.1:9/simple" in line
    assert not (tmp_path / "resolve").exists()  # a skipped resolution is never cached


def test_a_wheelhouse_with_no_copy_on_the_control_node_is_skipped_and_says_why(tmp_path: Path) -> None:
    status, out, _ = cli(
        "stack", "resolve", "--stack", str(SHIPPED), "--profile", "core", "--wheelhouse", str(tmp_path / "none")
    )
    assert status == 0
    assert f"the node installs from its wheelhouse and no copy of it is on this machine at {tmp_path / 'none'}" in out


def test_a_request_without_the_node_target_is_refused_naming_it() -> None:
    request = json.dumps({"stack": {"profile": "core"}, "target": {"python": "3.12", "arch": "sparc"}})
    status, _, err = cli("stack", "resolve", "--request", request)
    assert status == 2
    assert "python (MAJOR.MINOR) and arch (x86_64 or aarch64) are required" in err


def test_the_shipped_stack_file_copies_keep_the_pins_preflight_passes(tmp_path: Path) -> None:
    copy = tmp_path / "stack.yml"
    shutil.copy(SHIPPED, copy)
    stack = stack_of(yaml.safe_load(copy.read_text()), None)
    assert stack.profile == "full" and stack.pins()["nvidia-nccl-cu13"] == "2.30.7"
    assert stack.where("torch") == "sm120kit_profiles.full.python_packages['torch']"
    assert stack.where("cuda-toolkit") == "sm120kit_cuda_version"
