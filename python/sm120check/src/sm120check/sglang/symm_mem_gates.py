"""Symmetric-memory all-reduce: the capability maps and the multicast early return.

SGLang keys its symmetric-memory all-reduce sizes by compute-capability major (9, 10) and disables the
communicator whenever the buffer has no multicast address, even for world sizes that run the two-shot
kernel, which needs P2P only. On SM120 (major 12, PCIe, no multicast) both keep it off.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from sm120check.sglang.errors import Refusal
from sm120check.sglang.textedit import MARK, Source, mark_lines, replace
from sm120check.sglang.tree import SourceTree

ALL_REDUCE_UTILS = "srt/distributed/device_communicators/all_reduce_utils.py"
COMMUNICATORS_DIR = "srt/distributed/device_communicators"
SIZES_SUFFIX = "ALL_REDUCE_MAX_SIZES"
MULTIMEM = "_WORLD_SIZES_MULTIMEM"


@dataclass(frozen=True)
class CapabilityMap:
    name: (
        str  # as in the source: "TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES", "TorchSymmMemCommunicator._WORLD_SIZES_MULTIMEM"
    )
    path: str
    kind: str  # "sizes" (may the major use symmetric memory at all) or "multimem" (which world sizes need multicast)
    majors: tuple[int, ...]


@dataclass(frozen=True)
class SymmMemScan:
    maps: tuple[CapabilityMap, ...]
    communicator: str  # class name
    communicator_path: str
    multimem_lookup_tolerant: bool  # `.get(major, ())`, not `[major]` (KeyError for a major missing there)
    multicast_early_return: bool  # present and unconditional: disables even two-shot without multicast
    multicast_relaxed: bool  # present, but only for world sizes that select multimem

    @property
    def sizes_map(self) -> CapabilityMap:
        return next(m for m in self.maps if m.kind == "sizes")

    @property
    def multimem_map(self) -> CapabilityMap:
        return next(m for m in self.maps if m.kind == "multimem")


def _int_keys(node: ast.Dict, path: str, name: str) -> tuple[int, ...]:
    keys: list[int] = []
    for key in node.keys:
        if not (isinstance(key, ast.Constant) and isinstance(key.value, int)):
            raise Refusal(path, name, "a key is not an integer compute-capability major")
        keys.append(key.value)
    return tuple(keys)


def _sizes_maps(module: ast.Module) -> list[tuple[str, ast.Dict]]:
    found = []
    for node in module.body:
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and node.targets[0].id.endswith(SIZES_SUFFIX)
            and isinstance(node.value, ast.Dict)
        ):
            found.append((node.targets[0].id, node.value))
    return found


def _multimem_assign(cls: ast.ClassDef) -> ast.Dict | None:
    for node in cls.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == MULTIMEM for t in node.targets):
            return node.value if isinstance(node.value, ast.Dict) else None
    return None


def _is_multicast_zero(node: ast.expr) -> bool:
    return (
        isinstance(node, ast.Compare)
        and isinstance(node.left, ast.Attribute)
        and node.left.attr == "multicast_ptr"
        and len(node.ops) == 1
        and isinstance(node.ops[0], ast.Eq)
        and isinstance(node.comparators[0], ast.Constant)
        and node.comparators[0].value == 0
    )


def _mentions(node: ast.AST, name: str) -> bool:
    return any(isinstance(n, ast.Attribute) and n.attr == name for n in ast.walk(node))


def _multicast_ifs(cls: ast.ClassDef) -> list[ast.If]:
    return [
        n
        for n in ast.walk(cls)
        if isinstance(n, ast.If)
        and any(isinstance(c, ast.Attribute) and c.attr == "multicast_ptr" for c in ast.walk(n.test))
    ]


def _multimem_subscripts(cls: ast.ClassDef) -> list[ast.Subscript]:
    return [
        n
        for n in ast.walk(cls)
        if isinstance(n, ast.Subscript) and isinstance(n.value, ast.Attribute) and n.value.attr == MULTIMEM
    ]


def _communicator(tree: SourceTree, sizes_name: str) -> tuple[str, ast.ClassDef]:
    """The communicator class that reads the sizes map and owns the multimem list."""
    for rel in tree.files(COMMUNICATORS_DIR):
        if rel == ALL_REDUCE_UTILS or sizes_name not in tree.read(rel):
            continue
        for node in tree.parse(rel).body:
            if isinstance(node, ast.ClassDef) and _multimem_assign(node) is not None:
                return rel, node
    raise Refusal(COMMUNICATORS_DIR, f"class with {MULTIMEM} using {sizes_name}", "no such communicator class found")


def _classify_multicast(rel: str, cls: ast.ClassDef) -> tuple[bool, bool]:
    """(unconditional early return present, relaxed early return present)."""
    anchor = f"{cls.name}: if handle.multicast_ptr == 0"
    unconditional = relaxed = False
    for node in _multicast_ifs(cls):
        if not any(isinstance(n, ast.Return) for n in node.body):
            raise Refusal(rel, anchor, "the multicast check no longer returns early")
        if _is_multicast_zero(node.test):
            unconditional = True
        elif (
            isinstance(node.test, ast.BoolOp)
            and isinstance(node.test.op, ast.And)
            and len(node.test.values) == 2
            and _is_multicast_zero(node.test.values[0])
            and _mentions(node.test.values[1], MULTIMEM)
        ):
            relaxed = True
        else:
            raise Refusal(rel, anchor, f"unrecognised condition `{ast.unparse(node.test)}`")
    return unconditional, relaxed


def scan(tree: SourceTree) -> SymmMemScan:
    if not tree.exists(ALL_REDUCE_UTILS):
        raise Refusal(ALL_REDUCE_UTILS, f"*{SIZES_SUFFIX}", "file not found")
    sizes = _sizes_maps(tree.parse(ALL_REDUCE_UTILS))
    if len(sizes) != 1:
        raise Refusal(ALL_REDUCE_UTILS, f"*{SIZES_SUFFIX}", f"expected one size map, found {len(sizes)}")
    sizes_name, sizes_dict = sizes[0]
    rel, cls = _communicator(tree, sizes_name)
    multimem = _multimem_assign(cls)
    assert multimem is not None
    unconditional, relaxed = _classify_multicast(rel, cls)
    return SymmMemScan(
        maps=(
            CapabilityMap(sizes_name, ALL_REDUCE_UTILS, "sizes", _int_keys(sizes_dict, ALL_REDUCE_UTILS, sizes_name)),
            CapabilityMap(f"{cls.name}.{MULTIMEM}", rel, "multimem", _int_keys(multimem, rel, MULTIMEM)),
        ),
        communicator=cls.name,
        communicator_path=rel,
        multimem_lookup_tolerant=not _multimem_subscripts(cls),
        multicast_early_return=unconditional,
        multicast_relaxed=relaxed,
    )


# --- patches: each takes a file's text and returns the new text; the scan decides which to apply ----------------


def add_size_major(text: str, rel: str, map_name: str, major: int) -> str:
    """Add `major` to the size map, with the sizes of the newest major already there."""
    src = Source(text)
    found = dict(_sizes_maps(ast.parse(text)))
    if map_name not in found:
        raise Refusal(rel, map_name, "size map not found")
    node = found[map_name]
    keys = _int_keys(node, rel, map_name)
    if major in keys:
        return text
    if not keys:
        raise Refusal(rel, map_name, "the size map is empty: nothing to copy sizes from")
    template = node.values[keys.index(max(keys))]
    value = src.segment(template)
    close = src.end(node) - 1  # the closing brace
    line_start = src.line_start(node.end_lineno or node.lineno)
    nl = src.newline()
    if text[line_start:close].strip():
        raise Refusal(rel, map_name, "the closing brace does not stand on its own line")
    indent = src.indent_of(node.values[0].lineno) if node.values else "    "
    entry = (
        f"{indent}{MARK}: compute capability {major} (SM{major}0), sizes as for {max(keys)}{nl}"
        f"{indent}{major}: {value},{nl}"
    )
    last = node.values[-1]
    after_last = src.end(last)
    comma = "" if text[after_last:line_start].lstrip().startswith(",") else ","
    new = replace(text, line_start, line_start, entry)
    return replace(new, after_last, after_last, comma) if comma else new


def tolerate_multimem_lookup(text: str, rel: str, class_name: str) -> str:
    """`self._WORLD_SIZES_MULTIMEM[major]` -> `.get(major, ())`: a major not listed there selects two-shot."""
    src = Source(text)
    cls = _class(ast.parse(text), rel, class_name)
    edits = []
    for sub in _multimem_subscripts(cls):
        edits.append((src.start(sub), src.end(sub), f"{src.segment(sub.value)}.get({src.segment(sub.slice)}, ())"))
    for start, end, new in sorted(edits, reverse=True):
        text = replace(text, start, end, new)
    lines = [sub.lineno for sub in _multimem_subscripts(cls)]
    return mark_lines(text, lines, "a major not listed selects two-shot instead of raising KeyError")


def relax_multicast_return(text: str, rel: str, class_name: str) -> str:
    """Keep the early return only for world sizes that select multimem; two-shot needs P2P, not multicast."""
    src = Source(text)
    cls = _class(ast.parse(text), rel, class_name)
    targets = [n for n in _multicast_ifs(cls) if _is_multicast_zero(n.test)]
    if not targets:
        unconditional, relaxed = _classify_multicast(rel, cls)
        if relaxed and not unconditional:
            return text
        raise Refusal(rel, f"{class_name}: if handle.multicast_ptr == 0", "early return not found")
    assigned = {
        t.attr for n in ast.walk(cls) if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Attribute)
    }
    for needed in ("world_size", "device_capability"):
        if needed not in assigned:
            raise Refusal(rel, f"{class_name}.{needed}", "attribute the relaxed condition reads is never assigned")
    for node in sorted(targets, key=lambda n: n.lineno, reverse=True):
        indent = src.indent_of(node.lineno)
        nl = src.newline()
        new_test = (
            f"{src.segment(node.test)} and ({nl}"
            f"{indent}    {MARK}: without multicast the two-shot kernel still works (it needs P2P only){nl}"
            f"{indent}    self.world_size in self.{MULTIMEM}.get(self.device_capability, ()){nl}"
            f"{indent})"
        )
        text = replace(text, src.start(node.test), src.end(node.test), new_test)
    return text


def _class(module: ast.Module, rel: str, name: str) -> ast.ClassDef:
    for node in module.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    raise Refusal(rel, f"class {name}", "class not found")
