"""FlashInfer workspace preflight (SGLang 0.5.13+): the multicast query that turns fusion off on every PCIe box.

Before creating FlashInfer's allreduce-fusion workspace, `FlashInferWorkspaceManager.initialize` asks
`_preflight_check_workspace_memory` whether every rank can `cuMemCreate` the workspace. The sizes come from
`_flashinfer_trtllm_workspace_allocation_sizes`, which rounds each buffer to the *multicast* granularity
(`cuMulticastGetGranularity`). Without multicast (PCIe, or NVLS off) that query fails, SGLang logs
"FlashInfer workspace preflight probe failed (...). Skipping allreduce fusion." and serves unfused, although
the TRT-LLM workspace FlashInfer >= 0.6.17 creates never uses multicast: `trtllm_ar.py` builds it from
`SymmDeviceMemory(..., enable_multicast=False)`, and `mnnvl.py` then rounds `buf_size + SIGNAL_PAD_SIZE` to the
allocation granularity only. The patch replaces the size function's body with exactly that computation (upstream
sglang PR #32330 removes the same query); the `cuMemCreate` probe and the cross-rank vote stay as they are.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from sm120check.sglang.errors import Refusal
from sm120check.sglang.textedit import MARK, Source, replace, top_level_names
from sm120check.sglang.tree import SourceTree

PATH = "srt/layers/flashinfer_comm_fusion.py"
SIZES_FUNCTION = "_flashinfer_trtllm_workspace_allocation_sizes"
PREFLIGHT_FUNCTION = "_preflight_check_workspace_memory"
MULTICAST_QUERY = "cuMulticastGetGranularity"
# FlashInfer's TRT-LLM workspace is non-multicast (SymmDeviceMemory(enable_multicast=False)) from this release on.
FLASHINFER_NON_MULTICAST = (0, 6, 17)
# Majors whose `auto` fusion backend is TRT-LLM (SM90, SM120); SM10x resolves to MNNVL, which does use multicast.
TRTLLM_MAJORS = (9, 12)
PARAMETERS = ("cuda_driver", "prop", "world_size", "max_token_num", "hidden_dim", "dtype")


@dataclass(frozen=True)
class PreflightScan:
    path: str
    function: str  # the size function
    queries_multicast: bool  # its sizes depend on cuMulticastGetGranularity, which fails without multicast
    relaxed: bool  # its body is sm120check's (sized as FlashInfer allocates, no multicast query)


def _function(module: ast.Module, name: str) -> ast.FunctionDef | None:
    return next((n for n in module.body if isinstance(n, ast.FunctionDef) and n.name == name), None)


def _calls(node: ast.AST, name: str) -> bool:
    return any(
        isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == name for n in ast.walk(node)
    )


def scan(tree: SourceTree) -> PreflightScan | None:
    """The preflight's shape in this release; None before 0.5.13 (no preflight, nothing queries multicast)."""
    return scan_text(tree.read(PATH)) if tree.exists(PATH) else None


def scan_text(text: str) -> PreflightScan | None:
    module = ast.parse(text)
    preflight = _function(module, PREFLIGHT_FUNCTION)
    if preflight is None:
        return None
    sizes = _function(module, SIZES_FUNCTION)
    if sizes is None:
        if _calls(preflight, MULTICAST_QUERY):
            raise Refusal(PATH, f"def {PREFLIGHT_FUNCTION}", f"queries multicast itself, not through {SIZES_FUNCTION}")
        return PreflightScan(PATH, PREFLIGHT_FUNCTION, False, False)
    if tuple(a.arg for a in sizes.args.args) != PARAMETERS:
        raise Refusal(PATH, f"def {SIZES_FUNCTION}", f"parameters are not ({', '.join(PARAMETERS)})")
    if not {"ceil_align", "torch"} <= top_level_names(module):
        raise Refusal(PATH, f"def {SIZES_FUNCTION}", "ceil_align or torch is no longer imported at module level")
    relaxed = MARK in (ast.get_source_segment(text, sizes) or "")
    return PreflightScan(PATH, SIZES_FUNCTION, _calls(sizes, MULTICAST_QUERY), relaxed)


_BODY = (
    f"{MARK}: sized as FlashInfer >= 0.6.17 allocates its TRT-LLM workspace: trtllm_ar.py uses",
    f"{MARK}: SymmDeviceMemory(enable_multicast=False), which rounds round_up(size, 16) + SIGNAL_PAD_SIZE to the",
    f"{MARK}: allocation granularity and never queries multicast (that query fails on every box without it).",
    f"elem_size = 4 if dtype == torch.float32 else 2  {MARK}",
    f"comm_size = world_size * max_token_num * hidden_dim * elem_size  {MARK}",
    f"max_comm_size = 2147483647 & ~((1 << 21) - 1)  {MARK}: trtllm_ar.MAX_COMM_SIZE",
    f"logical_sizes = (comm_size, world_size * 256 * 4, min(comm_size, max_comm_size) * 3)  {MARK}",
    f"err, alloc_granularity = cuda_driver.cuMemGetAllocationGranularity(  {MARK}",
    f"    prop,  {MARK}",
    f"    cuda_driver.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_RECOMMENDED,  {MARK}",
    f")  {MARK}",
    f"if err != cuda_driver.CUresult.CUDA_SUCCESS:  {MARK}",
    f"    raise RuntimeError(  {MARK}",
    f'        f"cuMemGetAllocationGranularity failed for FlashInfer workspace preflight: {{err}}"  {MARK}',
    f"    )  {MARK}",
    f"signal_pad_size = 2048  {MARK}: mnnvl.SIGNAL_PAD_SIZE",
    f"return [  {MARK}",
    f"    ceil_align(ceil_align(size, 16) + signal_pad_size, alloc_granularity) for size in logical_sizes  {MARK}",
    f"]  {MARK}",
)


def relax(text: str, rel: str) -> str:
    """Replace the size function's body (its docstring kept) with FlashInfer's own, multicast-free sizing."""
    module = ast.parse(text)
    sizes = _function(module, SIZES_FUNCTION)
    if sizes is None:
        raise Refusal(rel, f"def {SIZES_FUNCTION}", "not found")
    if not _calls(sizes, MULTICAST_QUERY):
        return text
    body = sizes.body
    has_doc = isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
    first = body[1] if has_doc and len(body) > 1 else body[0]
    src = Source(text)
    indent = src.indent_of(first.lineno)
    nl = src.newline()
    start = src.line_start(first.lineno)
    end = src.after_line(sizes.end_lineno or sizes.lineno)
    new = "".join(f"{indent}{line}{nl}" for line in _BODY)
    return replace(text, start, end, new)
