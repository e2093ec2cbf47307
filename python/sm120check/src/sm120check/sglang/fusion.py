"""FlashInfer allreduce-fusion gates: the `sm90 or sm100` conditions that keep fusion off other majors.

Runtime gates decide per batch whether the fused kernel runs; the backend gate (`_resolve_backend`) raises
"requires SM90 or SM10X"; auto-enable gates (server arguments) only pick the default and are reported, not
patched: on SM120 fusion is something an operator turns on explicitly.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from sm120check.sglang.errors import Refusal
from sm120check.sglang.textedit import MARK, Source, replace
from sm120check.sglang.tree import SourceTree

GATE_FILES: dict[str, str] = {
    "srt/layers/communicator.py": "runtime",
    "srt/layers/layer_boundary/residual/add_norm.py": "runtime",
    "srt/layers/flashinfer_comm_fusion.py": "backend",
}
AUTO_ENABLE_FILES = ("srt/server_args.py", "srt/arg_groups")
# Functions that held a gate in every release seen; finding one without a recognisable gate means a new shape.
GATE_FUNCTIONS = frozenset({"apply_flashinfer_allreduce_fusion", "flashinfer_ar_fusion_applies", "_resolve_backend"})
SM120_VAR = "_is_sm120_supported"
SM120_HELPER = "is_sm120_supported"

_NAME = re.compile(r"_?is_sm(\d+)_supported")
_ATTR = re.compile(r"is_sm(\d+)")


@dataclass(frozen=True)
class FusionGate:
    path: str
    function: str
    kind: str  # "runtime", "backend" or "auto-enable"
    expression: str
    majors: tuple[int, ...]  # compute-capability majors the gate admits


def _major(node: ast.expr) -> int | None:
    """9 for `_is_sm90_supported`, `is_sm90_supported()`, `get_platform().is_sm90`; None for anything else."""
    text = None
    if isinstance(node, ast.Name):
        text = _NAME.fullmatch(node.id)
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.args and not node.keywords:
        text = _NAME.fullmatch(node.func.id)
    elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Call):
        text = _ATTR.fullmatch(node.attr)
    return int(text.group(1)) // 10 if text else None


def _is_gate(node: ast.AST) -> bool:
    if not (isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or)):
        return False
    majors = [_major(v) for v in node.values]
    return None not in majors and {9, 10} <= set(majors)  # type: ignore[operator]


def _nodes_with_function(module: ast.AST) -> list[tuple[str, ast.AST]]:
    """Every node with the name of the innermost function around it ("<module>" outside any)."""
    out: list[tuple[str, ast.AST]] = []

    def visit(node: ast.AST, function: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else function
            out.append((inner, child))
            visit(child, inner)

    visit(module, "<module>")
    return out


def _gates_in(module: ast.AST) -> list[tuple[str, ast.BoolOp]]:
    """(enclosing function, gate) pairs; `_mnnvl_supported`-style helpers pick a backend, they do not gate."""
    return [
        (function, node)
        for function, node in _nodes_with_function(module)
        if isinstance(node, ast.BoolOp) and _is_gate(node) and "mnnvl" not in function
    ]


def _majors(gate: ast.BoolOp) -> tuple[int, ...]:
    return tuple(m for m in (_major(v) for v in gate.values) if m is not None)


def _auto_enable_gates(tree: SourceTree) -> list[FusionGate]:
    files = [AUTO_ENABLE_FILES[0]] if tree.exists(AUTO_ENABLE_FILES[0]) else []
    if (tree.root / AUTO_ENABLE_FILES[1]).is_dir():
        files += tree.files(AUTO_ENABLE_FILES[1])
    gates = []
    for rel in files:
        if "allreduce_fusion" not in tree.read(rel):
            continue
        for function, node in _nodes_with_function(tree.parse(rel)):
            if isinstance(node, ast.If) and "allreduce_fusion" in ast.unparse(node.test).lower():
                for _, gate in _gates_in(node.test):
                    gates.append(FusionGate(rel, function, "auto-enable", ast.unparse(gate), _majors(gate)))
    return gates


def scan(tree: SourceTree) -> tuple[FusionGate, ...]:
    gates: list[FusionGate] = []
    for rel, kind in GATE_FILES.items():
        if not tree.exists(rel):
            continue
        module = tree.parse(rel)
        found = _gates_in(module)
        for function, gate in found:
            gates.append(FusionGate(rel, function, kind, ast.unparse(gate), _majors(gate)))
        gated = {function for function, _ in found}
        for node in ast.walk(module):
            if isinstance(node, ast.FunctionDef) and node.name in GATE_FUNCTIONS and node.name not in gated:
                raise Refusal(rel, f"def {node.name}", "no `sm90 or sm100` condition found in it any more")
    return (*gates, *_auto_enable_gates(tree))


# --- patch ---------------------------------------------------------------------------------------------------------


def _sm120_form(segment: str, rel: str) -> str:
    new = re.sub(r"\.is_sm100\b", ".is_sm120", segment.replace("is_sm100_supported", "is_sm120_supported"))
    if new == segment:
        raise Refusal(rel, segment, "cannot derive the SM120 form of this SM100 condition")
    return new


def _top_level_names(module: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in module.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


def _loads(module: ast.Module, name: str) -> bool:
    return any(isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load) for n in ast.walk(module))


def admit_sm120(text: str, rel: str) -> str:
    """Add `or <sm120 form>` to every runtime/backend gate of the file, with whatever that form needs defined."""
    src = Source(text)
    module = ast.parse(text)
    edits = []
    for _function, gate in _gates_in(module):
        if 12 in {_major(v) for v in gate.values}:
            continue
        sm100 = next(v for v in gate.values if _major(v) == 10)
        edits.append((src.end(gate.values[-1]), f" or {_sm120_form(src.segment(sm100), rel)}"))
    for offset, new in sorted(edits, reverse=True):
        text = replace(text, offset, offset, new)
    text = _define_sm120_var(text, rel)
    return _import_sm120_helper(text, rel)


def _define_sm120_var(text: str, rel: str) -> str:
    module = ast.parse(text)
    if not _loads(module, SM120_VAR) or SM120_VAR in _top_level_names(module):
        return text
    src = Source(text)
    for node in module.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "_is_sm100_supported" for t in node.targets
        ):
            value = _sm120_form(src.segment(node.value), rel)
            at = src.after_line(node.end_lineno or node.lineno)
            nl = src.newline()
            line = f"{SM120_VAR} = {value}  {MARK}: FlashInfer >= 0.6.17 builds its fusion kernels for SM120{nl}"
            return replace(text, at, at, line)
    raise Refusal(rel, "_is_sm100_supported = ...", "module-level SM100 flag not found, so no place for the SM120 one")


def _import_sm120_helper(text: str, rel: str) -> str:
    module = ast.parse(text)
    if not _loads(module, SM120_HELPER) or SM120_HELPER in _top_level_names(module):
        return text
    imports = [n for n in module.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    if not imports:
        raise Refusal(rel, "import", "no top-level import to place the SM120 helper import after")
    src = Source(text)
    at = src.after_line(imports[-1].end_lineno or imports[-1].lineno)
    return replace(text, at, at, f"from sglang.srt.utils import {SM120_HELPER}  {MARK}{src.newline()}")
