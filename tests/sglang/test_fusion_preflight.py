"""SGLang's own FlashInfer workspace preflight (0.5.13+), run from the release wheels, before and after the patch.

The function under test is SGLang's `_flashinfer_trtllm_workspace_allocation_sizes`, taken from each release's
source and executed with real torch and the real `cuda.bindings.driver` types. The one stand-in is the driver
itself: this machine has no GPU, let alone one without multicast, so `NoMulticastDriver` answers the two driver
queries the function makes, as the lent one-GPU H200 answered them (2 MiB allocation granularity;
`cuMulticastGetGranularity` -> CUDA_ERROR_NOT_SUPPORTED, measured 2026-12-01). The real path runs on the GPU
machine: tests/gpu/sglang_preflight.py and docs/validation/.

The expected sizes come from FlashInfer 0.7.2's own source (its constants, and the `enable_multicast=False`
it passes for the TRT-LLM workspace), not from sm120check.
"""

from __future__ import annotations

import ast
import json
import shutil
from pathlib import Path
from types import ModuleType

import pytest

from lab.sglang_releases import release_dir, run_cli
from lab.wheels import flashinfer_wheel, read_member
from sm120check.sglang import preflight
from sm120check.sglang.errors import Refusal
from sm120check.sglang.textedit import MARK

pytestmark = pytest.mark.slow
torch = pytest.importorskip("torch")
driver = pytest.importorskip("cuda.bindings.driver")

PREFLIGHT_RELEASES = ("0.5.13", "0.5.14", "0.5.16", "0.5.23")
FLASHINFER = "0.7.2"
GRANULARITY = 2 << 20  # what cuMemGetAllocationGranularity returned on the H200 (docs/validation)
MULTICAST_GRANULARITY = 512 << 20  # a multicast-capable box's recommended granularity: must not matter when patched


class NoMulticastDriver(ModuleType):
    """Stand-in for `cuda.bindings.driver` (no GPU here): the real module for every type and enum, and answers for
    the two queries the size function makes, as a driver without multicast gives them."""

    def __init__(self, multicast: bool) -> None:
        super().__init__("cuda.bindings.driver")
        self.multicast = multicast
        self.multicast_queries = 0

    def __getattr__(self, name: str) -> object:
        return getattr(driver, name)

    def cuMemGetAllocationGranularity(self, prop: object, flags: object) -> tuple[object, int]:
        assert isinstance(prop, driver.CUmemAllocationProp)
        return driver.CUresult.CUDA_SUCCESS, GRANULARITY

    def cuMulticastGetGranularity(self, prop: object, flags: object) -> tuple[object, int]:
        assert isinstance(prop, driver.CUmulticastObjectProp)
        self.multicast_queries += 1
        if not self.multicast:
            return driver.CUresult.CUDA_ERROR_NOT_SUPPORTED, 0
        return driver.CUresult.CUDA_SUCCESS, MULTICAST_GRANULARITY


def _function_source(text: str, name: str) -> str:
    node = next(n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef) and n.name == name)
    segment = ast.get_source_segment(text, node)
    assert segment is not None
    return segment


def _release_text(version: str, rel: str) -> str:
    return (release_dir(version) / "sglang" / rel).read_text(encoding="utf-8")


def sizes_function(version: str, fusion_text: str) -> object:
    """SGLang's size function from `fusion_text`, with the release's own ceil_align (srt/utils/common.py)."""
    utils = _release_text(version, "srt/utils/common.py")
    scope: dict[str, object] = {"torch": torch}
    for name in ("ceil_div", "ceil_align"):
        exec(_function_source(utils, name), scope)
    exec(_function_source(fusion_text, preflight.SIZES_FUNCTION), scope)
    return scope[preflight.SIZES_FUNCTION]


def _prop() -> object:
    prop = driver.CUmemAllocationProp()
    prop.requestedHandleTypes = driver.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
    prop.type = driver.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    return prop


def flashinfer_source(rel: str) -> str:
    return read_member(flashinfer_wheel(FLASHINFER), f"flashinfer/{rel}")


def _constant(text: str, name: str) -> int:
    for node in ast.parse(text).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            value = eval(compile(ast.Expression(node.value), name, "eval"), {})
            assert isinstance(value, int)
            return value
    raise AssertionError(f"{name} not found")


@pytest.fixture(scope="module")
def flashinfer_sizes() -> object:
    """FlashInfer 0.7.2's TRT-LLM workspace allocations: SymmDeviceMemory(round_up(size, 16), enable_multicast=False)
    -> round_up(buf_size + SIGNAL_PAD_SIZE, allocation granularity), with the constants from its source."""
    trtllm = flashinfer_source("comm/trtllm_ar.py")
    mnnvl = flashinfer_source("comm/mnnvl.py")
    calls = [
        n
        for n in ast.walk(ast.parse(trtllm))
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "SymmDeviceMemory"
    ]
    assert calls and all(
        any(
            k.arg == "enable_multicast" and isinstance(k.value, ast.Constant) and k.value.value is False
            for k in c.keywords
        )
        for c in calls
    ), "FlashInfer's TRT-LLM workspace is no longer created without multicast"
    max_comm, flags, pad = (
        _constant(trtllm, "MAX_COMM_SIZE"),
        _constant(trtllm, "BarrierFlagCount"),
        _constant(mnnvl, "SIGNAL_PAD_SIZE"),
    )

    def up(value: int, to: int) -> int:
        return (value + to - 1) // to * to

    def sizes(world: int, tokens: int, hidden: int, elem: int) -> list[int]:
        comm = world * tokens * hidden * elem
        logical = (comm, world * flags * 4, min(comm, max_comm) * 3)
        return [up(up(size, 16) + pad, GRANULARITY) for size in logical]

    return sizes


CASES = [(2, 2048, 7168, torch.bfloat16, 2), (8, 16384, 7168, torch.bfloat16, 2), (4, 128, 4096, torch.float32, 4)]


@pytest.mark.parametrize("version", PREFLIGHT_RELEASES)
def test_unpatched_preflight_raises_without_multicast(version: str) -> None:
    text = _release_text(version, preflight.PATH)
    fn = sizes_function(version, text)
    stand_in = NoMulticastDriver(multicast=False)
    with pytest.raises(RuntimeError, match="cuMulticastGetGranularity failed"):
        fn(stand_in, _prop(), 2, 2048, 7168, torch.bfloat16)  # type: ignore[operator]
    assert stand_in.multicast_queries == 1
    # ... and SGLang turns that exception into its skip: the warning is in the preflight's except branch.
    assert "Skipping allreduce fusion." in _function_source(text, preflight.PREFLIGHT_FUNCTION)


@pytest.mark.parametrize("version", PREFLIGHT_RELEASES)
@pytest.mark.parametrize("multicast", [False, True], ids=["no-multicast", "multicast"])
def test_patched_preflight_returns_what_flashinfer_allocates(
    version: str, multicast: bool, flashinfer_sizes: object
) -> None:
    patched = preflight.relax(_release_text(version, preflight.PATH), preflight.PATH)
    fn = sizes_function(version, patched)
    for world, tokens, hidden, dtype, elem in CASES:
        stand_in = NoMulticastDriver(multicast=multicast)
        got = fn(stand_in, _prop(), world, tokens, hidden, dtype)  # type: ignore[operator]
        assert got == flashinfer_sizes(world, tokens, hidden, elem)  # type: ignore[operator]
        assert stand_in.multicast_queries == 0


def test_patch_and_revert_of_0_5_23_carry_the_preflight(tmp_path: Path) -> None:
    """Through the CLI: the finding is patchable, the patched file holds relax()'s body, marked, and revert restores."""
    copy = tmp_path / "sglang"
    shutil.copytree(release_dir("0.5.23") / "sglang", copy)
    args = ("--source", str(copy), "--cc", "12.0", "--flashinfer-version", FLASHINFER, "--json")
    scan = json.loads(run_cli("scan", *args)[1])
    finding = next(f for f in scan["findings"] if f["id"] == "fusion-preflight")
    assert not finding["ok"] and finding["patchable"] and "Skipping allreduce fusion" in finding["summary"]
    original = (copy / preflight.PATH).read_text(encoding="utf-8")
    status, out = run_cli("patch", *args)
    assert status == 0, out
    after = (copy / preflight.PATH).read_text(encoding="utf-8")
    relaxed = preflight.relax(original, preflight.PATH)
    assert preflight.relax(relaxed, preflight.PATH) == relaxed  # idempotent
    assert _function_source(after, preflight.SIZES_FUNCTION) == _function_source(relaxed, preflight.SIZES_FUNCTION)
    body = _function_source(after, preflight.SIZES_FUNCTION)
    assert preflight.MULTICAST_QUERY not in body
    node = next(
        n for n in ast.parse(after).body if isinstance(n, ast.FunctionDef) and n.name == preflight.SIZES_FUNCTION
    )
    assert node.end_lineno is not None
    added = after.splitlines()[node.body[1].lineno - 1 : node.end_lineno]  # whole lines after the docstring
    assert added and all(MARK in line for line in added)
    rescan = json.loads(run_cli("scan", *args)[1])
    assert next(f for f in rescan["findings"] if f["id"] == "fusion-preflight")["ok"]
    run_cli("patch", "--revert", "--source", str(copy), "--json")
    assert (copy / preflight.PATH).read_text(encoding="utf-8") == original


@pytest.mark.parametrize(
    ("cc", "flashinfer", "patchable"),
    [("12.0", "0.7.2", True), ("9.0", "0.7.2", True), ("10.0", "0.7.2", False), ("12.0", "0.6.12", False)],
)
def test_preflight_finding_by_backend_and_flashinfer(cc: str, flashinfer: str, patchable: bool) -> None:
    args = ("--source", str(release_dir("0.5.23")), "--cc", cc, "--flashinfer-version", flashinfer, "--json")
    scan = json.loads(run_cli("scan", *args)[1])
    finding = next(f for f in scan["findings"] if f["id"] == "fusion-preflight")
    assert not finding["ok"] and finding["patchable"] is patchable


def test_releases_before_the_preflight_have_no_finding() -> None:
    scan = json.loads(run_cli("scan", "--source", str(release_dir("0.5.10")), "--cc", "12.0", "--json")[1])
    assert scan["workspace_preflight"] is None
    assert not [f for f in scan["findings"] if f["id"] == "fusion-preflight"]


def test_a_preflight_that_queries_multicast_itself_is_refused() -> None:
    text = _release_text("0.5.23", preflight.PATH)
    renamed = text.replace(f"def {preflight.SIZES_FUNCTION}(", "def _other_sizes(").replace(
        f"= {preflight.SIZES_FUNCTION}(", "= _other_sizes("
    )
    inlined = renamed.replace(
        "    allocation_sizes = []\n    try:\n",
        "    allocation_sizes = []\n    cuda_driver.cuMulticastGetGranularity\n    try:\n",
        1,
    ).replace("cuda_driver.cuMulticastGetGranularity\n", "cuda_driver.cuMulticastGetGranularity(None, None)\n", 1)
    with pytest.raises(Refusal, match="queries multicast itself"):
        preflight.scan_text(inlined)
