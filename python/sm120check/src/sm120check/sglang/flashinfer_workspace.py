"""FlashInfer's TRT-LLM workspace constants, read from the FlashInfer installed beside SGLang, held against the ones
the preflight patch (preflight.py) sizes with.

The patch replaces SGLang's multicast-rounded sizes with FlashInfer's own computation: three buffers rounded to 16
bytes, plus `mnnvl.SIGNAL_PAD_SIZE`, rounded to the allocation granularity, the lamport buffer capped at
`trtllm_ar.MAX_COMM_SIZE`, the flag buffer `BarrierFlagCount` ints per rank, all from
`SymmDeviceMemory(..., enable_multicast=False)`. The files are read as text (ast), never imported: importing
FlashInfer needs torch and a GPU. A FlashInfer whose constants differ is not patched; one newer than the newest
release checked, or one that cannot be found, is patched with the constants below and a warning that says so.
"""

from __future__ import annotations

import ast
import importlib.util
from dataclasses import dataclass, fields
from pathlib import Path

from sm120check import bounded
from sm120check.jitcache.flashinfer_release import parse_version

MNNVL = "comm/mnnvl.py"
TRTLLM_AR = "comm/trtllm_ar.py"
WORKSPACE_FUNCTION = "trtllm_create_ipc_workspace_for_all_reduce_fusion"
# The releases whose files were read and found to match WRITTEN_FOR (tests/sglang/test_flashinfer_workspace.py
# reads the real wheels).
CHECKED = ("0.7.2", "0.7.4")
NEWEST_CHECKED = CHECKED[-1]
MAX_BYTES = 4 << 20  # each file read (comm/mnnvl.py is about 40 KiB)


@dataclass(frozen=True)
class WorkspaceConstants:
    signal_pad_size: int  # mnnvl.SIGNAL_PAD_SIZE
    max_comm_size: int  # trtllm_ar.MAX_COMM_SIZE
    barrier_flag_count: int  # trtllm_ar.BarrierFlagCount (flag buffer: world_size * it * 4 bytes)
    enable_multicast: bool  # the SymmDeviceMemory(enable_multicast=...) the TRT-LLM workspace is created with


WRITTEN_FOR = WorkspaceConstants(
    signal_pad_size=2048, max_comm_size=2147483647 & ~((1 << 21) - 1), barrier_flag_count=256, enable_multicast=False
)


class UnreadableFlashInfer(ValueError):
    """A FlashInfer file lacks a constant the patch relies on: the message names the file and the constant."""


def _constant(module: ast.Module, name: str, rel: str) -> int:
    """The value `name` holds once the module ran: its last module-level assignment, with any augmented ones
    (`X *= 2`) after it applied, as Python leaves it."""
    value: int | None = None
    seen = False
    for node in module.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            expr: ast.expr | None = node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name:
            expr = node.value
        elif isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name) and node.target.id == name:
            expr = ast.BinOp(ast.Constant(value), node.op, node.value) if value is not None else None
        else:
            continue
        seen = True
        value = _evaluate(expr) if expr is not None else None
        if value is None:
            try:
                shown = ast.unparse(node)[:120]
            except ValueError:  # an integer too long to print
                shown = f"a literal of {len(hex(getattr(expr, 'value', 0)))} hex digits"
            raise UnreadableFlashInfer(f"{rel}: {name} is not an integer expression ({shown})")
    if not seen or value is None:
        raise UnreadableFlashInfer(f"{rel}: no module-level {name}")
    return value


_LIMIT = 1 << 64  # FlashInfer's constants are sizes and counts; anything past this is not one


def _evaluate(node: ast.expr) -> int | None:
    """Integer literals and the operators FlashInfer's constants use (&, ~, <<, -, +, *, |), within +-2**64."""
    value = _operate(node)
    return value if value is not None and -_LIMIT <= value <= _LIMIT else None


def _operate(node: ast.expr) -> int | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Invert):
        inner = _evaluate(node.operand)
        return None if inner is None else ~inner
    if isinstance(node, ast.BinOp):
        left, right = _evaluate(node.left), _evaluate(node.right)
        if left is None or right is None:
            return None
        ops = {ast.BitAnd: left & right, ast.BitOr: left | right, ast.Sub: left - right, ast.Add: left + right,
               ast.Mult: left * right}  # fmt: skip
        if isinstance(node.op, ast.LShift):
            return left << right if 0 <= right < 64 else None
        return next((v for op, v in ops.items() if isinstance(node.op, op)), None)
    return None


def _workspace_multicast(module: ast.Module, rel: str) -> bool:
    function = next((n for n in module.body if isinstance(n, ast.FunctionDef) and n.name == WORKSPACE_FUNCTION), None)
    if function is None:
        raise UnreadableFlashInfer(f"{rel}: no {WORKSPACE_FUNCTION}")
    for node in ast.walk(function):
        if (
            isinstance(node, ast.Call)
            and getattr(node.func, "id", getattr(node.func, "attr", "")) == "SymmDeviceMemory"
        ):
            keyword = next((k for k in node.keywords if k.arg == "enable_multicast"), None)
            if keyword is None:
                return True  # SymmDeviceMemory's default is enable_multicast=True
            if isinstance(keyword.value, ast.Constant) and isinstance(keyword.value.value, bool):
                return keyword.value.value
            raise UnreadableFlashInfer(f"{rel}: enable_multicast={ast.unparse(keyword.value)} is not a constant")
    raise UnreadableFlashInfer(f"{rel}: {WORKSPACE_FUNCTION} creates no SymmDeviceMemory")


def read(mnnvl_text: str, trtllm_ar_text: str) -> WorkspaceConstants:
    """The constants in FlashInfer's comm/mnnvl.py and comm/trtllm_ar.py (their text)."""
    mnnvl, trtllm = ast.parse(mnnvl_text), ast.parse(trtllm_ar_text)
    return WorkspaceConstants(
        signal_pad_size=_constant(mnnvl, "SIGNAL_PAD_SIZE", MNNVL),
        max_comm_size=_constant(trtllm, "MAX_COMM_SIZE", TRTLLM_AR),
        barrier_flag_count=_constant(trtllm, "BarrierFlagCount", TRTLLM_AR),
        enable_multicast=_workspace_multicast(trtllm, TRTLLM_AR),
    )


def locate(sglang_root: Path | None) -> Path | None:
    """The `flashinfer` package directory: beside the SGLang tree (its site-packages), else the importable one."""
    if sglang_root is not None and (sglang_root.parent / "flashinfer" / MNNVL).is_file():
        return sglang_root.parent / "flashinfer"
    try:
        spec = importlib.util.find_spec("flashinfer")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        if (Path(location) / MNNVL).is_file():
            return Path(location)
    return None


@dataclass(frozen=True)
class ConstantsCheck:
    """What the patch found in FlashInfer: its constants, where, what differs, and what to warn about."""

    version: str | None
    where: str  # the package directory read, or "" when none was found
    constants: WorkspaceConstants | None
    differences: tuple[str, ...]  # "SIGNAL_PAD_SIZE is 4096 (the patch sizes with 2048)"
    warnings: tuple[str, ...]

    @property
    def agrees(self) -> bool:
        return not self.differences


_NAMES = {
    "signal_pad_size": "mnnvl.SIGNAL_PAD_SIZE",
    "max_comm_size": "trtllm_ar.MAX_COMM_SIZE",
    "barrier_flag_count": "trtllm_ar.BarrierFlagCount",
    "enable_multicast": f"{WORKSPACE_FUNCTION}'s SymmDeviceMemory(enable_multicast=...)",
}


def check(package: Path | None, version: str | None) -> ConstantsCheck:
    """Read FlashInfer's constants at `package` (None: not found) and hold them against WRITTEN_FOR."""
    written = f"FlashInfer {', '.join(CHECKED)}"
    if package is None:
        return ConstantsCheck(
            version,
            "",
            None,
            (),
            (f"FlashInfer's files were not found: the preflight patch sizes with the constants of {written}",),
        )
    try:
        found = read(bounded.read_text(package / MNNVL, MAX_BYTES), bounded.read_text(package / TRTLLM_AR, MAX_BYTES))
    except bounded.Unreadable as exc:
        return ConstantsCheck(version, str(package), None, (f"{exc}; reinstall FlashInfer",), ())
    except UnreadableFlashInfer as exc:
        return ConstantsCheck(version, str(package), None, (str(exc),), ())
    except (SyntaxError, ValueError) as exc:  # ValueError: NUL bytes in the source
        return ConstantsCheck(version, str(package), None, (f"{package}: not Python FlashInfer ships: {exc}",), ())
    except (RecursionError, MemoryError):
        return ConstantsCheck(version, str(package), None, (f"{package}: an expression nested too deeply",), ())
    differences = tuple(
        f"{_NAMES[f.name]} is {getattr(found, f.name)} (the patch sizes with {getattr(WRITTEN_FOR, f.name)})"
        for f in fields(WorkspaceConstants)
        if getattr(found, f.name) != getattr(WRITTEN_FOR, f.name)
    )
    warnings: tuple[str, ...] = ()
    if version is not None and _newer(version):
        warnings = (
            f"FlashInfer {version} is newer than {NEWEST_CHECKED}, the newest release the preflight patch was checked "
            f"against; its workspace constants {'match' if not differences else 'differ'} ({package})",
        )
    return ConstantsCheck(version, str(package), found, differences, warnings)


def _newer(version: str) -> bool:
    try:
        return parse_version(version) > parse_version(NEWEST_CHECKED)
    except ValueError:
        return False


def describe(result: ConstantsCheck) -> str:
    """One line for the scan's report."""
    if result.constants is None and not result.differences:
        return result.warnings[0]
    if result.differences:
        return (
            f"FlashInfer {result.version or '?'} ({result.where}) differs from what the preflight patch was written "
            f"for: {'; '.join(result.differences)}"
        )
    line = (
        f"FlashInfer {result.version or '?'} workspace constants read from {result.where} match the preflight "
        f"patch's (SIGNAL_PAD_SIZE {WRITTEN_FOR.signal_pad_size}, MAX_COMM_SIZE {WRITTEN_FOR.max_comm_size}, "
        f"BarrierFlagCount {WRITTEN_FOR.barrier_flag_count}, enable_multicast=False)"
    )
    return line + "".join(f"; warning: {w}" for w in result.warnings)
