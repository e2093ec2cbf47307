"""jitcache as the one home of FlashInfer JIT knowledge: layout, module registry, cold-cost table, the one builder.

The builder runs real ninja over a stand-in spec (FlashInfer cannot be imported here): the spec writes FlashInfer's
build-file shape (`cp` standing in for nvcc) and builds with one ninja run in the module directory, as
`JitSpec.build` does.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from jitcache_helpers import BUILD_NINJA, KEY, ninja

from sm120check.doctor import remedies
from sm120check.doctor.flashinfer_jit.flashinfer_jit import judge, module_rows
from sm120check.doctor.model import Status
from sm120check.jitcache import build as builder
from sm120check.jitcache import bundle, cost, layout
from sm120check.jitcache import modules as jit_modules


class StandInSpec:
    """A stand-in for FlashInfer's JitSpec: same paths, same one-ninja-per-module build."""

    def __init__(self, root: Path, name: str, sources: Path, aot: Path | None = None) -> None:
        self.name, self.sources, self.aot = name, sources, aot
        self.directory = layout.module_dir(root, KEY.flashinfer, KEY.arch, name)
        self.builds = 0

    @property
    def jit_library_path(self) -> Path:
        return self.directory / f"{self.name}.so"

    @property
    def is_aot(self) -> bool:
        return self.aot is not None

    def get_library_path(self) -> Path:
        return self.aot if self.aot is not None else self.jit_library_path

    def write_ninja(self) -> None:
        self.sources.mkdir(parents=True, exist_ok=True)
        for suffix, text in ((".cu", "__global__ void k() {}\n"), (".cuh", "#pragma once\n")):
            if not (self.sources / f"{self.name}{suffix}").exists():  # FlashInfer's sources are not rewritten
                (self.sources / f"{self.name}{suffix}").write_text(text)
        self.directory.mkdir(parents=True, exist_ok=True)
        text = BUILD_NINJA.replace("demo", self.name).format(
            dir=self.directory, src=self.sources / f"{self.name}.cu", header=self.sources / f"{self.name}.cuh"
        )
        path = self.directory / "build.ninja"
        if not path.exists() or path.read_text() != text:
            path.write_text(text)

    def build(self, verbose: bool = False, need_lock: bool = False) -> None:
        self.builds += 1
        subprocess.run([ninja(), "-C", str(self.directory)], check=True, capture_output=True)


@pytest.fixture
def specs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    made: dict[str, Any] = {}

    def spec_for(name: str) -> StandInSpec:
        if name not in made:
            made[name] = StandInSpec(tmp_path / "cache", name, tmp_path / "src")
        return made[name]  # type: ignore[no-any-return]

    monkeypatch.setattr(builder, "spec_for", spec_for)
    monkeypatch.setattr(builder, "_cuda_home", lambda: tmp_path / "no-cuda")
    monkeypatch.setattr(builder, "SYSTEM_LIB_DIRS", ())
    monkeypatch.delenv("LIBRARY_PATH", raising=False)
    monkeypatch.delenv("FLASHINFER_EXTRA_LDFLAGS", raising=False)
    return made


def test_bundle_and_doctor_use_the_one_cache_path_formula(tmp_path: Path) -> None:
    root = layout.cache_root({"FLASHINFER_WORKSPACE_BASE": str(tmp_path)})
    directory = layout.module_dir(root, KEY.flashinfer, KEY.arch, "trtllm_comm")
    assert directory == tmp_path / ".cache/flashinfer/0.7.2/90a/cached_ops/trtllm_comm"
    assert root / bundle.module_relpath(KEY, "trtllm_comm") == directory
    assert vars(bundle)["module_dir"] is layout.module_dir


def test_target_majors_read_flashinfer_target_names() -> None:
    assert layout.target_majors(("90a", "120f")) == (9, 12)
    with pytest.raises(ValueError, match="not of the form"):
        layout.target_majors(("sm_120",))


def test_serving_modules_follow_the_release() -> None:
    assert jit_modules.for_release("0.7.2", (12,)) == ("trtllm_comm", "pcie_ipc_comm")
    assert jit_modules.for_release("0.6.17", (12,)) == ("trtllm_comm",)  # no PcieIpcAllReduceWorkspace before 0.7.0
    assert jit_modules.for_release("0.6.10", (12,)) == ()  # no SM120 allreduce-fusion kernels before 0.6.17
    assert jit_modules.for_release("0.6.10", (9,)) == ("trtllm_comm",)


def test_unknown_module_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match="known: trtllm_comm, pcie_ipc_comm"):
        jit_modules.spec_for("no_such_module")


def test_both_modules_cold_block_what_the_pair_took_not_more() -> None:
    # Measured: the pair 330-460 s on 2x H200, 307-350 s on 1x H200; the old table summed to 330-600 s.
    assert cost.blocking_seconds(["trtllm_comm", "pcie_ipc_comm"]) == (300, 460)
    assert cost.blocking_seconds(["pcie_ipc_comm"]) == (11, 15)  # measured alone: not the old derived 70-140 s
    assert cost.blocking_seconds(["trtllm_comm", "other"]) == (260 + 60, 340 + 300)
    result = judge(
        [{"module": m, "cached": False, "dir": "d", "why": "cold", "from": ""} for m in jit_modules.SERVING],
        "here",
        "90a",
    )
    assert result.status is Status.WARN and "~300-460 s" in result.summary
    assert result.data["blocking_seconds_measured"] is True
    assert result.remedy == remedies.FLASHINFER_JIT


def test_builder_builds_cold_then_finds_it_cached(specs: dict[str, Any], tmp_path: Path) -> None:
    (tmp_path / "stubs").mkdir()
    (tmp_path / "stubs" / "libcuda.so").write_bytes(b"")
    lines: list[str] = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LIBRARY_PATH", str(tmp_path / "stubs"))
        first = builder.build(["trtllm_comm", "pcie_ipc_comm"], ninja(), lines.append, parallel=True)
    assert [o.name for o in first] == ["trtllm_comm", "pcie_ipc_comm"]
    assert all(o.built and not o.cached_before for o in first)
    assert all("no work" in o.verdict_after for o in first)
    # The second run needs no libcuda.so: nothing links when everything is cached.
    second = builder.build(["trtllm_comm", "pcie_ipc_comm"], ninja(), lines.append)
    assert all(o.cached_before and not o.built for o in second)
    assert specs["trtllm_comm"].builds == 1
    rows = module_rows(tmp_path / "cache", KEY.flashinfer, KEY.arch, ["trtllm_comm"], ninja())
    assert rows[0]["cached"] is True


def test_builder_refuses_before_compiling_without_libcuda(specs: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=r"no libcuda\.so"):
        builder.build(["trtllm_comm"], ninja(), lambda line: None)
    assert specs["trtllm_comm"].builds == 0


def test_builder_takes_a_prebuilt_module_only_when_asked(specs: dict[str, Any], tmp_path: Path) -> None:
    aot = tmp_path / "aot" / "trtllm_comm" / "trtllm_comm.so"
    aot.parent.mkdir(parents=True)
    aot.write_bytes(b"\x7fELF")
    specs["trtllm_comm"] = StandInSpec(tmp_path / "cache", "trtllm_comm", tmp_path / "src", aot=aot)
    [outcome] = builder.build(["trtllm_comm"], ninja(), lambda line: None, use_prebuilt=True)
    assert outcome.cached_before and outcome.library == str(aot)
    with pytest.raises(ValueError, match=r"no libcuda\.so"):  # the CLI builds the JIT cache itself, to pack it
        builder.build(["trtllm_comm"], ninja(), lambda line: None)


def test_builder_without_ninja_names_the_fix(specs: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(builder, "find_ninja", lambda env=None: None)
    with pytest.raises(ValueError, match="no `ninja` on PATH"):
        builder.build(["trtllm_comm"], None, lambda line: None)


def test_a_module_the_installed_flashinfer_lacks_names_its_version_and_the_release_it_needs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """FlashInfer 0.6.14 (SGLang 0.5.16's pin, the GPU machine's carry) has no pcie_ipc_comm generator: the error
    names the installed version and the module's release. A stand-in package replaces the import (the real 0.6.14
    wheel is not in CI's indexes; the GPU machine's carry has it)."""
    import sys
    import types

    flashinfer = types.ModuleType("flashinfer")
    flashinfer.__version__ = "0.6.14"  # type: ignore[attr-defined]
    comm = types.ModuleType("flashinfer.jit.comm")
    monkeypatch.setitem(sys.modules, "flashinfer", flashinfer)
    monkeypatch.setitem(sys.modules, "flashinfer.jit", types.ModuleType("flashinfer.jit"))
    monkeypatch.setitem(sys.modules, "flashinfer.jit.comm", comm)
    with pytest.raises(ValueError, match=r"FlashInfer 0\.6\.14 does not provide module 'pcie_ipc_comm' \(.*0\.7\.0\+"):
        jit_modules.spec_for("pcie_ipc_comm")
