"""The patch functions on small real excerpts of SGLang (tests/sglang/fixtures, see its README): fast tier."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from lab.sglang_releases import FIXTURES, run_cli, tree_hashes
from sm120check.sglang import eagle, fusion_gates, symm_mem_gates
from sm120check.sglang.errors import Refusal

SIZES_REL = "srt/distributed/device_communicators/all_reduce_utils.py"


def fixture(name: str) -> str:
    return (FIXTURES / f"{name}.py.txt").read_text(encoding="utf-8")


def _sizes_after(text: str) -> dict[int, dict[int, int]]:
    scope: dict[str, object] = {}
    exec(compile(text, "all_reduce_utils.py", "exec"), scope)
    value = scope["TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES"]
    assert isinstance(value, dict)
    return value


def test_size_map_gains_major_12_with_the_sizes_of_10() -> None:
    patched = symm_mem_gates.add_size_major(
        fixture("all_reduce_utils-0.5.9"), SIZES_REL, "TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES", 12
    )
    sizes = _sizes_after(patched)
    assert sorted(sizes) == [9, 10, 12] and sizes[12] == sizes[10]


def test_size_map_patch_is_idempotent() -> None:
    once = symm_mem_gates.add_size_major(
        fixture("all_reduce_utils-0.5.9"), SIZES_REL, "TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES", 12
    )
    assert symm_mem_gates.add_size_major(once, SIZES_REL, "TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES", 12) == once


def test_size_map_patch_only_adds_lines() -> None:
    original = fixture("all_reduce_utils-0.5.9")
    patched = symm_mem_gates.add_size_major(original, SIZES_REL, "TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES", 12)
    added = [line for line in patched.splitlines() if line not in original.splitlines()]
    assert patched.splitlines()[: len(original.splitlines()) - 1] == original.splitlines()[:-1]
    assert added[0].strip().startswith("# sm120kit") and added[1].strip() == "12: {"


def test_renamed_size_map_is_refused() -> None:
    renamed = fixture("all_reduce_utils-0.5.9").replace("TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES", "SYMM_MEM_SIZES_V2")
    with pytest.raises(Refusal, match="TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES"):
        symm_mem_gates.add_size_major(renamed, SIZES_REL, "TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES", 12)


def test_multicast_early_return_kept_only_for_multimem_world_sizes() -> None:
    rel = "srt/distributed/device_communicators/torch_symm_mem.py"
    patched = symm_mem_gates.relax_multicast_return(fixture("torch_symm_mem-0.5.23"), rel, "TorchSymmMemCommunicator")
    test = next(
        n.test for n in ast.walk(ast.parse(patched)) if isinstance(n, ast.If) and "multicast_ptr" in ast.unparse(n.test)
    )
    assert ast.unparse(test) == (
        "handle.multicast_ptr == 0 and self.world_size in self._WORLD_SIZES_MULTIMEM.get(self.device_capability, ())"
    )


def test_multicast_patch_is_idempotent() -> None:
    rel = "srt/distributed/device_communicators/torch_symm_mem.py"
    once = symm_mem_gates.relax_multicast_return(fixture("torch_symm_mem-0.5.23"), rel, "TorchSymmMemCommunicator")
    assert symm_mem_gates.relax_multicast_return(once, rel, "TorchSymmMemCommunicator") == once


def test_renamed_multicast_check_is_refused() -> None:
    rel = "srt/distributed/device_communicators/torch_symm_mem.py"
    renamed = fixture("torch_symm_mem-0.5.23").replace("handle.multicast_ptr == 0", "not handle.has_multicast")
    with pytest.raises(Refusal, match="early return not found"):
        symm_mem_gates.relax_multicast_return(renamed, rel, "TorchSymmMemCommunicator")


def test_direct_multimem_lookup_becomes_tolerant_in_0_5_4() -> None:
    rel = "srt/distributed/device_communicators/symm_mem.py"
    patched = symm_mem_gates.tolerate_multimem_lookup(fixture("symm_mem-0.5.4"), rel, "SymmMemCommunicator")
    assert "self._WORLD_SIZES_MULTIMEM[self.device_capability]" not in patched
    assert "self._WORLD_SIZES_MULTIMEM.get(self.device_capability, ())" in patched
    edited = [line for line in patched.splitlines() if "_WORLD_SIZES_MULTIMEM.get(self.device_capability, ())" in line]
    assert edited and all("# sm120kit: a major not listed selects two-shot" in line for line in edited)
    compile(patched, "symm_mem.py", "exec")


def test_runtime_gate_admits_sm120_with_its_flag_and_import() -> None:
    patched = fusion_gates.admit_sm120(fixture("communicator-0.5.9-head"), "srt/layers/communicator.py")
    assert "(_is_sm90_supported or _is_sm100_supported or _is_sm120_supported)" in patched
    assert "_is_sm120_supported = _is_cuda and is_sm120_supported()" in patched
    assert "from sglang.srt.utils import is_sm120_supported" in patched
    compile(patched, "communicator.py", "exec")


def test_backend_gate_of_0_5_23_admits_sm120_through_the_platform() -> None:
    patched = fusion_gates.admit_sm120(
        fixture("flashinfer_comm_fusion-0.5.23-head"), "srt/layers/flashinfer_comm_fusion.py"
    )
    assert "if not (get_platform().is_sm90 or get_platform().is_sm100 or get_platform().is_sm120):" in patched
    assert "is_sm120_supported" not in patched  # the platform object already knows SM120: nothing to import


def test_gate_patch_is_idempotent() -> None:
    once = fusion_gates.admit_sm120(fixture("communicator-0.5.9-head"), "srt/layers/communicator.py")
    assert fusion_gates.admit_sm120(once, "srt/layers/communicator.py") == once


def test_wrapper_gets_mllama4_style_delegation() -> None:
    rel = "srt/models/lightonocr.py"
    patched = eagle.add_delegation(
        fixture("lightonocr-0.5.9"), rel, "LightOnOCRForConditionalGeneration", ("set_eagle3_layers_to_capture",)
    )
    cls = next(n for n in ast.parse(patched).body if isinstance(n, ast.ClassDef))
    method = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "set_eagle3_layers_to_capture")
    assert ast.unparse(method.args) == "self, layer_ids=None"
    assert "self.language_model.set_eagle3_layers_to_capture(layer_ids)" in ast.unparse(method)


def test_delegation_patch_is_idempotent() -> None:
    rel, cls = "srt/models/lightonocr.py", "LightOnOCRForConditionalGeneration"
    once = eagle.add_delegation(fixture("lightonocr-0.5.9"), rel, cls, ("set_eagle3_layers_to_capture",))
    assert eagle.add_delegation(once, rel, cls, ("set_eagle3_layers_to_capture",)) == once


def _mini_tree(root: Path, sizes_text: str) -> Path:
    pkg = root / "sglang"
    (pkg / "srt/distributed/device_communicators").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / SIZES_REL).write_text(sizes_text)
    (pkg / "srt/distributed/device_communicators/torch_symm_mem.py").write_text(fixture("torch_symm_mem-0.5.23"))
    return pkg


def test_patch_refuses_a_release_with_a_renamed_anchor_and_changes_nothing(tmp_path: Path) -> None:
    renamed = fixture("all_reduce_utils-0.5.9").replace("TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES", "SYMM_MEM_SIZES_V2")
    pkg = _mini_tree(tmp_path, renamed)
    before = tree_hashes(tmp_path)
    status, out = run_cli("patch", "--source", str(pkg), "--cc", "12.0", "--json")
    assert status == 2
    assert "all_reduce_utils.py" in out and "ALL_REDUCE_MAX_SIZES" in out
    assert tree_hashes(tmp_path) == before


def test_bad_compute_capability_is_a_usage_error_naming_the_value(tmp_path: Path) -> None:
    pkg = _mini_tree(tmp_path, fixture("all_reduce_utils-0.5.9"))
    status, out = run_cli("scan", "--source", str(pkg), "--cc", "8.6", "--json")
    assert status == 2 and "8.6" in out and "--cc 12.0" in out


def test_missing_source_directory_is_named(tmp_path: Path) -> None:
    status, out = run_cli("scan", "--source", str(tmp_path / "nowhere"), "--json")
    assert status == 2 and "nowhere" in out
