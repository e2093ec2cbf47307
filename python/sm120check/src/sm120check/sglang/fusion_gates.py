"""FlashInfer allreduce-fusion gates: the `sm90 or sm100` conditions that keep fusion off other majors.

Runtime gates decide per batch whether the fused kernel runs; the backend gate (`_resolve_backend`) raises
"requires SM90 or SM10X"; auto-enable gates (server arguments) pick the default. Those are reported, not
patched (on SM120 fusion is something an operator turns on explicitly), except where they admit SM120 through
`is_blackwell_supported()` (0.5.4.post3 to 0.5.7) while FlashInfer has no SM120 kernels: that turns fusion on by
itself and crashes the server at start (sglang#15650), and these releases have no flag to turn it off.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from sm120check.sglang.errors import Refusal
from sm120check.sglang.textedit import MARK, Source, mark_lines, replace, top_level_names
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
class SourceGate:
    """A `sm90 or sm100` condition in SGLang's source that keeps allreduce fusion to the majors it names."""

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


BLACKWELL = "is_blackwell_supported"
SM100_HELPER = "is_sm100_supported"
UTILS_FILES = ("srt/utils/common.py", "srt/utils.py")
FUSION_FLAG = "enable_flashinfer_allreduce_fusion"


def blackwell_majors(tree: SourceTree) -> tuple[int, ...]:
    """The majors `is_blackwell_supported()` admits in this release, read from its definition ([10, 12] up to 0.5.7).

    Both shapes seen: `return (get_device_capability(device)[0] in [10, 12]) and ...` and
    `is_blackwell_supported = ... partial(_check_cuda_device_version, device_capability_majors=[10, 12])`.
    """
    for rel in UTILS_FILES:
        if not tree.exists(rel) or BLACKWELL not in tree.read(rel):
            continue
        for node in tree.parse(rel).body:
            named = (isinstance(node, ast.FunctionDef) and node.name == BLACKWELL) or (
                isinstance(node, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == BLACKWELL for t in node.targets)
            )
            if not named:
                continue
            for sub in ast.walk(node):
                values: list[ast.List | ast.Tuple] = []
                if isinstance(sub, ast.Compare) and any(isinstance(op, ast.In) for op in sub.ops):
                    values = [c for c in sub.comparators if isinstance(c, (ast.List, ast.Tuple))]
                elif isinstance(sub, ast.keyword) and sub.arg == "device_capability_majors":
                    values = [sub.value] if isinstance(sub.value, (ast.List, ast.Tuple)) else []
                for seq in values:
                    majors = [e.value for e in seq.elts if isinstance(e, ast.Constant) and isinstance(e.value, int)]
                    if majors:
                        return tuple(majors)
    return (10, 11, 12)  # the definition moved: assume every Blackwell major, SM120 included


def _is_blackwell_call(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == BLACKWELL
        and not node.args
        and not node.keywords
    )


def _sets_fusion_on(body: list[ast.stmt]) -> bool:
    """`self.enable_flashinfer_allreduce_fusion = True` directly in this block or in a block nested in it."""
    for stmt in body:
        for node in ast.walk(stmt):
            if (
                isinstance(node, ast.Assign)
                and isinstance(node.value, ast.Constant)
                and node.value.value is True
                and any(isinstance(t, ast.Attribute) and t.attr == FUSION_FLAG for t in node.targets)
            ):
                return True
    return False


def _blackwell_term(test: ast.expr) -> ast.expr | None:
    """The capability part of an auto-enable condition that calls is_blackwell_supported(): the `or` holding
    the call when it is one (`is_sm90_supported() or is_blackwell_supported()`), else the call itself."""
    for node in ast.walk(test):
        if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or) and any(map(_is_blackwell_call, node.values)):
            return node
    return next((n for n in ast.walk(test) if isinstance(n, ast.Call) and _is_blackwell_call(n)), None)


def _term_majors(term: ast.expr, blackwell: tuple[int, ...]) -> tuple[int, ...]:
    values = term.values if isinstance(term, ast.BoolOp) else [term]
    majors: list[int] = []
    for v in values:
        majors += list(blackwell) if _is_blackwell_call(v) else [m] if (m := _major(v)) is not None else []
    return tuple(sorted(set(majors)))


def _auto_enable_gates(tree: SourceTree) -> list[SourceGate]:
    files = [AUTO_ENABLE_FILES[0]] if tree.exists(AUTO_ENABLE_FILES[0]) else []
    if (tree.root / AUTO_ENABLE_FILES[1]).is_dir():
        files += tree.files(AUTO_ENABLE_FILES[1])
    gates = []
    blackwell: tuple[int, ...] | None = None
    for rel in files:
        if "allreduce_fusion" not in tree.read(rel):
            continue
        for function, node in _nodes_with_function(tree.parse(rel)):
            if not isinstance(node, ast.If):
                continue
            if "allreduce_fusion" in ast.unparse(node.test).lower():
                for _, gate in _gates_in(node.test):
                    gates.append(SourceGate(rel, function, "auto-enable", ast.unparse(gate), _majors(gate)))
            term = _blackwell_term(node.test)
            if term is not None and _sets_fusion_on(node.body):  # 0.5.4.post3 to 0.5.7: SM120 admitted
                blackwell = blackwell_majors(tree) if blackwell is None else blackwell
                gates.append(SourceGate(rel, function, "auto-enable", ast.unparse(term), _term_majors(term, blackwell)))
    return gates


def restrict_auto_enable(text: str, rel: str) -> str:
    """Turn `is_blackwell_supported()` into `is_sm100_supported()` in every auto-enable condition of the file, so
    SGLang no longer turns fusion on for SM120 by itself where FlashInfer has no SM120 kernels (sglang#15650)."""
    src = Source(text)
    module = ast.parse(text)
    calls: list[ast.expr] = []
    for _function, node in _nodes_with_function(module):
        if isinstance(node, ast.If) and _sets_fusion_on(node.body) and _blackwell_term(node.test) is not None:
            calls += [n for n in ast.walk(node.test) if isinstance(n, ast.Call) and _is_blackwell_call(n)]
    lines = sorted({c.lineno for c in calls})
    for call in sorted(calls, key=src.start, reverse=True):
        text = replace(text, src.start(call), src.end(call), f"{SM100_HELPER}()")
    text = mark_lines(text, lines, "FlashInfer has no SM120 fusion kernels here (sglang#15650)")
    return import_helper(text, rel, SM100_HELPER)


def scan(tree: SourceTree) -> tuple[SourceGate, ...]:
    gates: list[SourceGate] = []
    for rel, kind in GATE_FILES.items():
        if not tree.exists(rel):
            continue
        module = tree.parse(rel)
        found = _gates_in(module)
        for function, gate in found:
            gates.append(SourceGate(rel, function, kind, ast.unparse(gate), _majors(gate)))
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


def _loads(module: ast.Module, name: str) -> bool:
    return any(isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load) for n in ast.walk(module))


def admit_sm120(text: str, rel: str) -> str:
    """Add `or <sm120 form>` to every runtime/backend gate of the file, with whatever that form needs defined."""
    src = Source(text)
    module = ast.parse(text)
    edits = []
    edited: list[int] = []
    for _function, gate in _gates_in(module):
        if 12 in {_major(v) for v in gate.values}:
            continue
        sm100 = next(v for v in gate.values if _major(v) == 10)
        edits.append((src.end(gate.values[-1]), f" or {_sm120_form(src.segment(sm100), rel)}"))
        edited.append(gate.values[-1].end_lineno or gate.lineno)
    for offset, new in sorted(edits, reverse=True):
        text = replace(text, offset, offset, new)
    text = mark_lines(text, edited, "admits SM120 (FlashInfer >= 0.6.17 builds its fusion kernels for it)")
    text = _define_sm120_var(text, rel)
    return _import_sm120_helper(text, rel)


def _define_sm120_var(text: str, rel: str) -> str:
    module = ast.parse(text)
    if not _loads(module, SM120_VAR) or SM120_VAR in top_level_names(module):
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
    return import_helper(text, rel, SM120_HELPER)


def import_helper(text: str, rel: str, helper: str) -> str:
    """`from sglang.srt.utils import <helper>` after the last top-level import, when the file uses it undefined."""
    module = ast.parse(text)
    if not _loads(module, helper) or helper in top_level_names(module):
        return text
    imports = [n for n in module.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    if not imports:
        raise Refusal(rel, "import", f"no top-level import to place the {helper} import after")
    src = Source(text)
    at = src.after_line(imports[-1].end_lineno or imports[-1].lineno)
    return replace(text, at, at, f"from sglang.srt.utils import {helper}  {MARK}{src.newline()}")
