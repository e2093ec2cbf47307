"""The EAGLE-3 contract: what the speculative workers call on the target model, and which models honour it.

The contract is read from the release's own worker and runner sources, never from a list kept here: calls
on the target model (`...target_worker.model_runner.model.m()`, `target_model.m()` in the speculative
workers; `self.model.m()` and friends under an `if ...eagle...:` in the model runner), minus calls only
made after a `hasattr` probe (optional) and methods every `torch.nn.Module` has.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from sm120check.sglang.errors import Refusal
from sm120check.sglang.textedit import MARK, Source, replace
from sm120check.sglang.tree import SourceTree

SPECULATIVE_DIR = "srt/speculative"
RUNNER_FILES = ("srt/model_executor/model_runner.py", "srt/model_executor/cuda_graph_runner.py")
RUNNER_COMPONENTS_DIR = "srt/model_executor/model_runner_components"
MODELS_DIR = "srt/models"
LANGUAGE_MODEL = "language_model"
# torch.nn.Module's own API: every model has it through nn.Module, so it is never part of the gap.
NN_MODULE_METHODS = frozenset(
    {"named_modules", "modules", "parameters", "named_parameters", "buffers", "named_buffers", "children"}
    | {"named_children", "state_dict", "load_state_dict", "to", "eval", "train", "forward", "apply", "cuda", "cpu"}
    | {"register_forward_hook", "register_forward_pre_hook", "half", "float", "type", "zero_grad", "__call__"}
)


@dataclass(frozen=True)
class ContractMethod:
    name: str
    called_in: tuple[str, ...]  # "path::function" of every call site found


@dataclass(frozen=True)
class ModelAudit:
    name: str
    path: str  # where the class is defined
    wrapper: bool  # holds self.language_model (itself or through a base class)
    methods: tuple[
        tuple[str, str], ...
    ]  # (contract method, "implements" | "delegates" | "inherits from X" | "missing")
    unresolved_bases: tuple[str, ...] = ()

    @property
    def missing(self) -> tuple[str, ...]:
        return tuple(name for name, status in self.methods if status == "missing")


@dataclass(frozen=True)
class EagleScan:
    contract: tuple[ContractMethod, ...]
    sources: tuple[str, ...]  # files the contract was derived from
    models: tuple[ModelAudit, ...]

    @property
    def wrapper_gaps(self) -> tuple[ModelAudit, ...]:
        return tuple(m for m in self.models if m.wrapper and m.missing)


# --- the contract --------------------------------------------------------------------------------------------------


def _contract_sources(tree: SourceTree) -> tuple[list[str], list[str]]:
    """(speculative worker files, runner files) that exist in this release."""
    workers = [rel for rel in tree.files(SPECULATIVE_DIR) if "eagle" in rel.rsplit("/", 1)[-1]]
    seen = set(workers)
    for rel in list(workers):  # one hop: speculative helpers the workers import
        for node in ast.walk(tree.parse(rel)):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("sglang.srt.speculative."):
                path = tree.module_path(node.module)
                if path and path not in seen:
                    seen.add(path)
                    workers.append(path)
    runners = [rel for rel in RUNNER_FILES if tree.exists(rel)]
    if (tree.root / RUNNER_COMPONENTS_DIR).is_dir():
        runners += tree.files(RUNNER_COMPONENTS_DIR)
    return sorted(workers), runners


def _is_target(receiver: ast.expr, runner: bool) -> bool:
    text = ast.unparse(receiver)
    if runner:
        return text in ("self.model", "self.model_runner.model", "model", "model_runner.model")
    return text.endswith("target_worker.model_runner.model") or text == "target_model"


def _probed(test: ast.expr) -> set[tuple[str, str]]:
    """(receiver, name) pairs a condition checks with hasattr: calls in its body are optional."""
    return {
        (ast.unparse(n.args[0]), n.args[1].value)
        for n in ast.walk(test)
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Name)
        and n.func.id == "hasattr"
        and len(n.args) == 2
        and isinstance(n.args[1], ast.Constant)
        and isinstance(n.args[1].value, str)
    }


def _calls(module: ast.Module, rel: str, runner: bool) -> list[tuple[str, str]]:
    """(method, "rel::function") for required calls on the target model in one file."""
    found: list[tuple[str, str]] = []

    def visit(node: ast.AST, function: str, probed: frozenset[tuple[str, str]], eagle: bool) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            function = node.name
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and (eagle or not runner):
            receiver, name = node.func.value, node.func.attr
            if _is_target(receiver, runner) and (ast.unparse(receiver), name) not in probed:
                found.append((name, f"{rel}::{function}"))
        if isinstance(node, ast.If):
            visit(node.test, function, probed, eagle)
            child: ast.AST
            inner_eagle = eagle or "eagle" in ast.unparse(node.test).lower()
            for child in node.body:
                visit(child, function, probed | _probed(node.test), inner_eagle)
            for child in node.orelse:
                visit(child, function, probed, eagle)
            return
        for child in ast.iter_child_nodes(node):
            visit(child, function, probed, eagle)

    visit(module, "<module>", frozenset(), False)
    return found


def derive_contract(tree: SourceTree) -> tuple[tuple[ContractMethod, ...], tuple[str, ...]]:
    workers, runners = _contract_sources(tree)
    sites: dict[str, list[str]] = {}
    for rel, runner in [(w, False) for w in workers] + [(r, True) for r in runners]:
        for name, site in _calls(tree.parse(rel), rel, runner):
            if name not in NN_MODULE_METHODS:
                sites.setdefault(name, []).append(site)
    if not sites:
        raise Refusal(
            SPECULATIVE_DIR, "calls on the target model", f"none found in {len(workers) + len(runners)} files"
        )
    contract = tuple(ContractMethod(name, tuple(dict.fromkeys(s))) for name, s in sorted(sites.items()))
    return contract, tuple(workers + runners)


# --- the models ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Class:
    rel: str
    node: ast.ClassDef


class _Index:
    """Classes of the models package, resolved through `from sglang.srt.models... import X` chains on demand."""

    def __init__(self, tree: SourceTree) -> None:
        self.tree = tree
        self._found: dict[tuple[str, str], _Class | None] = {}
        self._bases: dict[int, list[tuple[str, _Class | None]]] = {}

    def _path(self, dotted: str) -> str | None:
        path = self.tree.module_path(dotted)
        return path if path and path.startswith(MODELS_DIR + "/") else None

    def lookup(self, rel: str, name: str, depth: int = 0) -> _Class | None:
        key = (rel, name)
        if key not in self._found:
            self._found[key] = None  # guards import cycles
            self._found[key] = self._lookup(rel, name, depth) if depth <= 10 else None
        return self._found[key]

    def _lookup(self, rel: str, name: str, depth: int) -> _Class | None:
        module = self.tree.parse(rel)
        head, _, rest = name.partition(".")
        for node in module.body:
            if isinstance(node, ast.ClassDef) and node.name == name:
                return _Class(rel, node)
        for node in module.body:
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    if (alias.asname or alias.name) != head:
                        continue
                    if rest:  # `from sglang.srt.models import llama` then `llama.LlamaForCausalLM`
                        path = self._path(f"{node.module}.{alias.name}")
                        return self.lookup(path, rest, depth + 1) if path else None
                    path = self._path(node.module)
                    return self.lookup(path, alias.name, depth + 1) if path else None
            if (
                isinstance(node, ast.Assign)
                and isinstance(node.value, ast.Name)
                and not rest
                and any(isinstance(t, ast.Name) and t.id == name for t in node.targets)
            ):
                return self.lookup(rel, node.value.id, depth + 1)
        return None

    def bases(self, cls: _Class) -> list[tuple[str, _Class | None]]:
        if id(cls.node) not in self._bases:
            texts = [ast.unparse(b) for b in cls.node.bases]
            self._bases[id(cls.node)] = [(t, self.lookup(cls.rel, t)) for t in texts]
        return self._bases[id(cls.node)]


def _methods(cls: ast.ClassDef) -> dict[str, ast.AST]:
    out: dict[str, ast.AST] = {}
    for node in cls.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out[node.name] = node
        elif isinstance(node, ast.Assign):
            out.update({t.id: node for t in node.targets if isinstance(t, ast.Name)})
    return out


def _uses_language_model(node: ast.AST) -> bool:
    return any(
        isinstance(n, ast.Attribute)
        and n.attr == LANGUAGE_MODEL
        and isinstance(n.value, ast.Name)
        and n.value.id == "self"
        for n in ast.walk(node)
    )


def _assigns_language_model(cls: ast.ClassDef) -> bool:
    for node in ast.walk(cls):
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        for t in targets:
            if isinstance(t, ast.Attribute) and t.attr == LANGUAGE_MODEL and ast.unparse(t.value) == "self":
                return True
    return False


def _wrapper_ancestor(index: _Index, cls: _Class) -> _Class:
    """The topmost class up the first wrapper-base chain: delegating there fixes every subclass at once."""
    seen = {id(cls.node)}
    while True:
        up = next((b for _, b in index.bases(cls) if b is not None and _is_wrapper(index, b)), None)
        if up is None or id(up.node) in seen:
            return cls
        seen.add(id(up.node))
        cls = up


def delegation_targets(tree: SourceTree, found: EagleScan) -> dict[tuple[str, str], tuple[str, ...]]:
    """(file, class) -> contract methods to add there, for every wrapper gap, placed as high up as possible."""
    index = _Index(tree)
    targets: dict[tuple[str, str], list[str]] = {}
    for gap in found.wrapper_gaps:
        cls = index.lookup(gap.path, gap.name)
        if cls is None:
            raise Refusal(gap.path, f"class {gap.name}", "class not found at module level")
        for method in gap.missing:
            top = _wrapper_ancestor(index, cls)
            names = targets.setdefault((top.rel, top.node.name), [])
            if method not in names:
                names.append(method)
    return {key: tuple(names) for key, names in sorted(targets.items())}


def _status(index: _Index, cls: _Class, method: str, seen: frozenset[int] = frozenset()) -> str:
    own = _methods(cls.node)
    if method in own:
        return "delegates" if _uses_language_model(own[method]) else "implements"
    if "__getattr__" in own:
        return "delegates (__getattr__)"
    for text, base in index.bases(cls):
        if (
            base is not None
            and id(base.node) not in seen
            and _status(index, base, method, seen | {id(cls.node)}) != "missing"
        ):
            return f"inherits from {text}"
    return "missing"


def _is_wrapper(index: _Index, cls: _Class, depth: int = 0) -> bool:
    if _assigns_language_model(cls.node):
        return True
    return depth < 10 and any(b is not None and _is_wrapper(index, b, depth + 1) for _, b in index.bases(cls))


def _unresolved(index: _Index, cls: _Class, depth: int = 0) -> list[str]:
    out: list[str] = []
    for text, base in index.bases(cls):
        if base is None:
            if text.split(".")[-1] not in ("Module", "object", "Generic", "ABC", "Protocol"):
                out.append(text)
        elif depth < 10:
            out += _unresolved(index, base, depth + 1)
    return out


def _entry_names(node: ast.expr) -> list[str]:
    if isinstance(node, (ast.Name, ast.Attribute)):
        return [ast.unparse(node)]
    if isinstance(node, (ast.List, ast.Tuple)):
        return [n for elt in node.elts for n in _entry_names(elt)]
    if isinstance(node, ast.BinOp):
        return _entry_names(node.left) + _entry_names(node.right)
    if isinstance(node, ast.IfExp):
        return _entry_names(node.body) + _entry_names(node.orelse)
    return []


def entry_classes(tree: SourceTree) -> list[tuple[str, str]]:
    """(module path, class name) for every `EntryClass` registration under srt/models."""
    out: list[tuple[str, str]] = []
    for rel in tree.files(MODELS_DIR):
        if "EntryClass" not in tree.read(rel):
            continue
        for node in tree.parse(rel).body:
            value = None
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(isinstance(t, ast.Name) and t.id == "EntryClass" for t in targets):
                    value = node.value
            if value is not None:
                out += [(rel, name) for name in _entry_names(value)]
    return out


def audit_models(tree: SourceTree, contract: tuple[ContractMethod, ...]) -> tuple[ModelAudit, ...]:
    index = _Index(tree)
    audits: dict[tuple[str, str], ModelAudit] = {}
    entries = entry_classes(tree)
    if not entries:
        raise Refusal(MODELS_DIR, "EntryClass", "no model registrations found")
    for rel, name in entries:
        cls = index.lookup(rel, name)
        if cls is None:
            continue  # registered under a name defined at run time; nothing to read
        key = (cls.rel, cls.node.name)
        if key in audits:
            continue
        statuses = tuple((m.name, _status(index, cls, m.name)) for m in contract)
        audits[key] = ModelAudit(
            cls.node.name, cls.rel, _is_wrapper(index, cls), statuses, tuple(dict.fromkeys(_unresolved(index, cls)))
        )
    return tuple(sorted(audits.values(), key=lambda a: (a.name, a.path)))


def scan(tree: SourceTree) -> EagleScan:
    contract, sources = derive_contract(tree)
    return EagleScan(contract, sources, audit_models(tree, contract))


# --- patch: delegation methods, in the shape mllama4.py uses -------------------------------------------------------

_TEMPLATES = {
    "set_eagle3_layers_to_capture": (
        "def set_eagle3_layers_to_capture(self, layer_ids=None):",
        '    if hasattr(self.language_model, "set_eagle3_layers_to_capture"):',
        "        self.language_model.set_eagle3_layers_to_capture(layer_ids)",
    ),
    "get_embed_and_head": (
        "def get_embed_and_head(self):",
        '    if hasattr(self.language_model, "get_embed_and_head"):',
        "        return self.language_model.get_embed_and_head()",
        "    return self.language_model.get_embed(), self.language_model.lm_head.weight",
    ),
}


def _template(method: str) -> tuple[str, ...]:
    return _TEMPLATES.get(
        method,
        (f"def {method}(self, *args, **kwargs):", f"    return self.language_model.{method}(*args, **kwargs)"),
    )


def add_delegation(text: str, rel: str, class_name: str, methods: tuple[str, ...]) -> str:
    """Append delegation methods for `methods` the class does not define yet to the end of its body."""
    module = ast.parse(text)
    cls = next((n for n in module.body if isinstance(n, ast.ClassDef) and n.name == class_name), None)
    if cls is None:
        raise Refusal(rel, f"class {class_name}", "class not found at module level")
    if not _assigns_language_model(cls) and not any(isinstance(b, ast.Name) for b in cls.bases):
        raise Refusal(rel, f"class {class_name}", f"does not hold self.{LANGUAGE_MODEL}")
    todo = [m for m in methods if m not in _methods(cls)]
    if not todo:
        return text
    src = Source(text)
    nl = src.newline()
    indent = src.indent_of(cls.body[0].lineno)
    lines = [f"{MARK}: EAGLE-3 delegation to the language model, as in mllama4.py"]
    for i, method in enumerate(todo):
        lines += ([""] if i else []) + list(_template(method))
    block = nl + "".join(f"{indent}{line}{nl}" if line else nl for line in lines)
    at = src.after_line(cls.end_lineno or cls.lineno)
    lead = nl if at == len(text) and not text.endswith(("\n", "\r")) else ""
    return replace(text, at, at, lead + block)
