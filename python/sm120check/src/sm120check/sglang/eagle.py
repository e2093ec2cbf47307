"""The EAGLE-3 contract: what the speculative workers call on the target model, and which models honour it.

The contract is read from the release's own worker and runner sources, never from a list kept here: calls
on the target model (`...target_worker.model_runner.model.m()`, `target_model.m()` in the speculative
workers; `self.model.m()` and friends under an `if ...eagle...:` in the model runner), minus calls only
made after a `hasattr` probe (optional) and methods every `torch.nn.Module` has.

A wrapper is a registered model that holds a whole inner model (`self.language_model`, `self.llm`,
`self.thinker` or `self.model`) and can only answer the contract by delegating to it. A wrapper's gap is
patched only where that delegation is true: the inner class is resolved from the release's own source, it
has the method (implements or inherits it), and for `set_eagle3_layers_to_capture` the wrapper's forward
runs the inner model's own forward, which is where the captured hidden states come back. Where the inner
class lacks a method the gap is reported as unsupported; where it is chosen at run time, as not checkable.
Neither is ever patched.
"""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TypeGuard

from sm120check.sglang.errors import Refusal
from sm120check.sglang.textedit import MARK, Source, replace
from sm120check.sglang.tree import SourceTree

SPECULATIVE_DIR = "srt/speculative"
RUNNER_FILES = ("srt/model_executor/model_runner.py", "srt/model_executor/cuda_graph_runner.py")
RUNNER_COMPONENTS_DIR = "srt/model_executor/model_runner_components"
MODELS_DIR = "srt/models"
LANGUAGE_MODEL = "language_model"
# Where wrappers keep the whole model they wrap, in the order they are tried.
HELD_ATTRS = (LANGUAGE_MODEL, "llm", "thinker", "model")
# SGLang's names for whole models (a transformer body plus its lm_head and logits processor).
WHOLE_MODEL_SUFFIXES = ("ForCausalLM", "ForConditionalGeneration")
# The contract method whose result only reaches the drafter through the inner model's own forward.
CAPTURE = "set_eagle3_layers_to_capture"
# Verdicts on a wrapper gap.
PATCH, PARTIAL, UNSUPPORTED, RUNTIME = "patch", "partial", "unsupported", "runtime"
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
class InnerModel:
    """One class a wrapper's inner-model attribute can be built from."""

    name: str
    path: str
    lacks: tuple[str, ...]  # contract methods it neither implements nor inherits


@dataclass(frozen=True)
class ModelAudit:
    name: str
    path: str  # where the class is defined
    wrapper: bool  # holds a whole inner model in `attr` (itself or through a base class)
    methods: tuple[
        tuple[str, str], ...
    ]  # (contract method, "implements" | "delegates" | "inherits from X" | "missing")
    unresolved_bases: tuple[str, ...] = ()
    attr: str = ""  # language_model, llm, thinker or model; "" when not a wrapper
    inner: tuple[InnerModel, ...] = ()  # every class `attr` can be built from, resolved statically
    runtime_inner: tuple[str, ...] = ()  # values of `attr` only known at run time ("language_model_cls(...)")
    bypass: str = ""  # how forward skips the inner model's own forward, when it does
    passthrough: tuple[str, ...] = ()  # contract methods answered by calling self.<attr>.<method>(...)
    blocked: str = ""  # why no delegation can be placed without also changing another model

    @property
    def missing(self) -> tuple[str, ...]:
        return tuple(name for name, status in self.methods if status == "missing")

    def lacking(self, methods: tuple[str, ...]) -> tuple[InnerModel, ...]:
        """Inner classes without at least one of `methods`."""
        return tuple(i for i in self.inner if set(i.lacks) & set(methods))

    @property
    def verdict(self) -> str:
        """ "" (no gap), PATCH, PARTIAL (patched; some inner classes lack a method), UNSUPPORTED or RUNTIME."""
        if not (self.wrapper and self.missing):
            return ""
        if self.runtime_inner or not self.inner:
            return RUNTIME
        lacking = self.lacking(self.missing)
        if len(lacking) == len(self.inner) or (self.bypass and CAPTURE in self.missing) or self.blocked:
            return UNSUPPORTED
        return PARTIAL if lacking else PATCH

    @property
    def broken_delegation(self) -> tuple[InnerModel, ...]:
        """Inner classes a delegation already in place (no gap) cannot reach the method on."""
        return self.lacking(self.passthrough) if self.wrapper and not self.missing else ()


@dataclass(frozen=True)
class Delegation:
    """Methods to add to one class, each a direct call on the inner model held in `attr`."""

    path: str
    cls: str
    attr: str
    methods: tuple[str, ...]
    covers: tuple[str, ...]  # the registered models that get the methods from here
    inner: tuple[str, ...]  # the inner classes the calls reach (each has every one of `methods`)


@dataclass(frozen=True)
class EagleScan:
    contract: tuple[ContractMethod, ...]
    sources: tuple[str, ...]  # files the contract was derived from
    models: tuple[ModelAudit, ...]
    targets: tuple[Delegation, ...] = ()  # where the patch adds delegation methods

    @property
    def wrapper_gaps(self) -> tuple[ModelAudit, ...]:
        """Gaps the patch closes with a true delegation (PATCH and PARTIAL)."""
        return tuple(m for m in self.models if m.verdict in (PATCH, PARTIAL))

    @property
    def unsupported(self) -> tuple[ModelAudit, ...]:
        """Wrappers whose inner model cannot answer the contract: EAGLE-3 is not supported for them."""
        return tuple(m for m in self.models if m.verdict == UNSUPPORTED)

    @property
    def runtime_inner(self) -> tuple[ModelAudit, ...]:
        """Wrapper gaps that cannot be checked: the inner class is chosen at run time."""
        return tuple(m for m in self.models if m.verdict == RUNTIME)

    @property
    def partial(self) -> tuple[ModelAudit, ...]:
        """Wrappers (no gap) whose delegation some of their possible inner classes cannot answer."""
        return tuple(m for m in self.models if m.broken_delegation)


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

    @property
    def key(self) -> tuple[str, str]:
        return (self.rel, self.node.name)


def _statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """A module's top-level statements, including those inside top-level `if` and `try` blocks."""
    for node in body:
        yield node
        if isinstance(node, ast.If):
            yield from _statements(node.body)
            yield from _statements(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, *(h.body for h in node.handlers), node.orelse, node.finalbody):
                yield from _statements(block)


def _package(rel: str) -> list[str]:
    """ "srt/models/llama.py" -> ["sglang", "srt", "models"]: the package a module's relative imports start in."""
    return ["sglang", *rel.removesuffix(".py").split("/")][:-1]


class _Index:
    """Classes of the SGLang tree, resolved through imports (absolute, relative, module aliases) on demand."""

    def __init__(self, tree: SourceTree) -> None:
        self.tree = tree
        self._found: dict[tuple[str, str], _Class | None] = {}
        self._bases: dict[int, list[tuple[str, _Class | None]]] = {}
        self._ancestors: dict[int, list[_Class]] = {}
        self._assigned: dict[int, dict[str, _Assigned]] = {}

    def _path(self, dotted: str) -> str | None:
        path = self.tree.module_path(dotted)
        return path if path and path.startswith("srt/") else None

    def lookup(self, rel: str, name: str, depth: int = 0) -> _Class | None:
        key = (rel, name)
        if key not in self._found:
            self._found[key] = None  # guards import cycles
            self._found[key] = self._lookup(rel, name, depth) if depth <= 10 else None
        return self._found[key]

    def imported(self, rel: str, node: ast.ImportFrom | ast.Import, name: str, depth: int = 0) -> _Class | None:
        """The class `name` (maybe dotted: `llama.LlamaForCausalLM`) names through one import statement in `rel`."""
        head, _, rest = name.partition(".")
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname == head and rest:  # import sglang.srt.models.llama as llama
                    path = self._path(alias.name)
                    return self.lookup(path, rest, depth + 1) if path else None
                if alias.asname is None and name.startswith(alias.name + "."):  # import sglang.srt.models.llama
                    module, _, attr = name.rpartition(".")
                    path = self._path(module)
                    return self.lookup(path, attr, depth + 1) if path and module == alias.name else None
            return None
        if node.level:
            base = _package(rel)  # `from .x import Y` starts in rel's package, `from ..x` one above
            module = ".".join(base[: len(base) - node.level + 1] + ([node.module] if node.module else []))
        else:
            module = node.module or ""
        for alias in node.names:
            if (alias.asname or alias.name) != head:
                continue
            if rest:  # `from sglang.srt.models import llama` then `llama.LlamaForCausalLM`
                path = self._path(f"{module}.{alias.name}")
                return self.lookup(path, rest, depth + 1) if path else None
            path = self._path(module)
            return self.lookup(path, alias.name, depth + 1) if path else None
        return None

    def _binds(self, node: ast.stmt, head: str) -> bool:
        if isinstance(node, ast.ImportFrom):
            return any((a.asname or a.name) == head for a in node.names)
        if isinstance(node, ast.Import):
            return any((a.asname or a.name.partition(".")[0]) == head for a in node.names)
        return False

    def _lookup(self, rel: str, name: str, depth: int) -> _Class | None:
        module = self.tree.parse(rel)
        head, _, rest = name.partition(".")
        statements = list(_statements(module.body))
        for node in statements:
            if isinstance(node, ast.ClassDef) and node.name == name:
                return _Class(rel, node)
        for node in statements:
            if isinstance(node, (ast.ImportFrom, ast.Import)) and self._binds(node, head):
                found = self.imported(rel, node, name, depth)
                if found is not None:
                    return found
            if (
                isinstance(node, ast.Assign)
                and isinstance(node.value, (ast.Name, ast.Attribute))
                and not rest
                and any(isinstance(t, ast.Name) and t.id == name for t in node.targets)
            ):  # `Alias = LlamaForCausalLM` or `Alias = llama.LlamaForCausalLM`
                return self.lookup(rel, ast.unparse(node.value), depth + 1)
        return None

    def assigned(self, rel: str, name: str) -> list[ast.expr]:
        """Values bound to a module-level name by assignment (a dict of classes, say)."""
        return _bound(_statements(self.tree.parse(rel).body), name)

    def bases(self, cls: _Class) -> list[tuple[str, _Class | None]]:
        if id(cls.node) not in self._bases:
            texts = [ast.unparse(b) for b in cls.node.bases]
            self._bases[id(cls.node)] = [(t, self.lookup(cls.rel, t)) for t in texts]
        return self._bases[id(cls.node)]

    def ancestors(self, cls: _Class) -> list[_Class]:
        """Every resolved class `cls` inherits from, depth first, left to right, without repeats."""
        if id(cls.node) not in self._ancestors:
            self._ancestors[id(cls.node)] = []  # guards cycles
            out: list[_Class] = []
            for _, base in self.bases(cls):
                if base is not None:
                    out += [base, *self.ancestors(base)]
            self._ancestors[id(cls.node)] = list({id(c.node): c for c in out}.values())
        return self._ancestors[id(cls.node)]

    def mro(self, cls: _Class) -> list[_Class]:
        return [cls, *self.ancestors(cls)]

    def assignments(self, cls: _Class, attr: str) -> _Assigned:
        if id(cls.node) not in self._assigned:
            self._assigned[id(cls.node)] = _self_assignments(cls.node)
        return self._assigned[id(cls.node)].get(attr, [])


def _methods(cls: ast.ClassDef) -> dict[str, ast.AST]:
    out: dict[str, ast.AST] = {}
    for node in cls.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out[node.name] = node
        elif isinstance(node, ast.Assign):
            out.update({t.id: node for t in node.targets if isinstance(t, ast.Name)})
    return out


def _method(index: _Index, cls: _Class, name: str) -> tuple[_Class, ast.FunctionDef | ast.AsyncFunctionDef] | None:
    """Where `cls` gets a method from, as Python finds it (near enough: depth first through the bases)."""
    for owner in index.mro(cls):
        node = _methods(owner.node).get(name)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return owner, node
        if node is not None:
            return None  # bound some other way (an alias, a lambda): not a function we can read
    return None


def _is_self_attr(node: ast.AST, attr: str | None = None) -> TypeGuard[ast.Attribute]:
    return (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
        and (attr is None or node.attr == attr)
    )


def _uses_held(node: ast.AST) -> bool:
    # self.model is left out: every plain causal LM reaches its own transformer body through it.
    return any(_is_self_attr(n) and n.attr in (LANGUAGE_MODEL, "llm", "thinker") for n in ast.walk(node))


_Assigned = list[tuple[ast.FunctionDef | ast.AsyncFunctionDef, ast.expr]]


def _self_assignments(cls: ast.ClassDef) -> dict[str, _Assigned]:
    """attr -> (method, value) of every `self.<attr> = value` in the methods of one class."""
    out: dict[str, _Assigned] = {}
    for fn in cls.body:
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            targets: list[ast.expr] = []
            value: ast.expr | None = None
            if isinstance(node, ast.Assign):
                targets, value = node.targets, node.value
            elif isinstance(node, ast.AnnAssign):
                targets, value = [node.target], node.value
            for t in targets:
                if value is not None and _is_self_attr(t):
                    out.setdefault(t.attr, []).append((fn, value))
    return out


def _assignments(cls: ast.ClassDef, attr: str) -> _Assigned:
    return _self_assignments(cls).get(attr, [])


# --- what an inner-model attribute holds --------------------------------------------------------------------------


@dataclass(frozen=True)
class _Scope:
    rel: str  # the module the code is in
    fn: ast.FunctionDef | ast.AsyncFunctionDef | None  # the function it is in
    concrete: _Class  # the class `self` is an instance of


_Found = tuple[list[_Class], list[str]]  # (classes, values only known at run time)


def _merge(parts: list[_Found]) -> _Found:
    return [c for p in parts for c in p[0]], [r for p in parts for r in p[1]]


def _text(node: ast.AST) -> str:
    text = f"{ast.unparse(node.func)}(...)" if isinstance(node, ast.Call) and node.args + node.keywords else ""
    text = text or ast.unparse(node)
    return text if len(text) <= 80 else text[:77] + "..."


def _params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    a = fn.args
    names = [*a.posonlyargs, *a.args, *a.kwonlyargs, *([a.vararg] if a.vararg else []), *([a.kwarg] if a.kwarg else [])]
    return {n.arg for n in names} - {"self"}


def _bound(nodes: Iterable[ast.AST], name: str) -> list[ast.expr]:
    """Values assigned to the plain name `name` by any of `nodes`."""
    out: list[ast.expr] = []
    for node in nodes:
        targets: list[ast.expr] = []
        value: ast.expr | None = None
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, (ast.AnnAssign, ast.NamedExpr)):
            targets, value = [node.target], node.value
        if value is not None and any(isinstance(t, ast.Name) and t.id == name for t in targets):
            out.append(value)
    return out


def _local_values(fn: ast.FunctionDef | ast.AsyncFunctionDef, name: str) -> list[ast.expr]:
    return _bound(ast.walk(fn), name)


def _local_import(index: _Index, scope: _Scope, name: str) -> _Class | None:
    if scope.fn is None:
        return None
    for node in ast.walk(scope.fn):
        if isinstance(node, (ast.ImportFrom, ast.Import)):
            found = index.imported(scope.rel, node, name)
            if found is not None:
                return found
    return None


def _returns(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.expr]:
    out: list[ast.expr] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
                continue
            if isinstance(child, ast.Return) and child.value is not None:
                out.append(child.value)
            visit(child)

    visit(fn)
    return out


def _classes(index: _Index, expr: ast.expr, scope: _Scope, depth: int) -> _Found:
    """The classes an expression that names a class can stand for."""
    if depth > 8:
        return [], [_text(expr)]
    if isinstance(expr, ast.Constant) and expr.value is None:
        return [], []
    if isinstance(expr, ast.IfExp):
        return _merge([_classes(index, e, scope, depth + 1) for e in (expr.body, expr.orelse)])
    if isinstance(expr, ast.BoolOp):
        return _merge([_classes(index, e, scope, depth + 1) for e in expr.values])
    if isinstance(expr, ast.Name):
        if scope.fn is not None:
            if expr.id in _params(scope.fn):
                return [], [f"{expr.id} (an argument of {scope.fn.name})"]
            values = _local_values(scope.fn, expr.id)
            if values:  # `language_model_cls = self._get_sgl_model_cls(...)`: say which name it was
                classes, runtime = _merge([_classes(index, v, scope, depth + 1) for v in values])
                return classes, [r if " = " in r else f"{expr.id} = {r}" for r in runtime]
            found = _local_import(index, scope, expr.id)
            if found is not None:
                return [found], []
        cls = index.lookup(scope.rel, expr.id)
        return ([cls], []) if cls is not None else ([], [_text(expr)])
    if isinstance(expr, ast.Attribute) and not _is_self_attr(expr):
        cls = index.lookup(scope.rel, ast.unparse(expr))
        return ([cls], []) if cls is not None else ([], [_text(expr)])
    table: ast.expr | None = None
    if isinstance(expr, ast.Subscript):  # {"a": A, "b": B}[kind] or MODELS[kind]
        table = expr.value
    elif isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and expr.func.attr == "get":
        table = expr.func.value  # MODELS.get(kind)
    if table is not None:
        dicts = [table] if isinstance(table, ast.Dict) else []
        if isinstance(table, ast.Name):
            local = _local_values(scope.fn, table.id) if scope.fn is not None else []
            dicts = [d for d in (local or index.assigned(scope.rel, table.id)) if isinstance(d, ast.Dict)]
        if dicts:
            return _merge([_classes(index, v, scope, depth + 1) for d in dicts for v in d.values])
    return [], [_text(expr)]


def _instances(index: _Index, expr: ast.expr, scope: _Scope, depth: int = 0) -> _Found:
    """The classes of the object an expression builds: `X(...)`, `A(...) if c else B(...)`, a factory method."""
    if depth > 8:
        return [], [_text(expr)]
    if isinstance(expr, ast.Constant) and expr.value is None:
        return [], []  # `self.language_model = None` before the real assignment
    if isinstance(expr, ast.IfExp):
        return _merge([_instances(index, e, scope, depth + 1) for e in (expr.body, expr.orelse)])
    if isinstance(expr, ast.BoolOp):
        return _merge([_instances(index, e, scope, depth + 1) for e in expr.values])
    if isinstance(expr, ast.Call):
        func = expr.func
        if _is_self_attr(func):
            found = _method(index, scope.concrete, func.attr)
            if found is None:
                return [], [_text(expr)]
            owner, fn = found  # a factory such as MiniCPM's init_llm: the classes it returns
            inner = _Scope(owner.rel, fn, scope.concrete)
            returns = _returns(fn)
            return _merge([_instances(index, r, inner, depth + 1) for r in returns]) if returns else ([], [_text(expr)])
        return _classes(index, func, scope, depth + 1)
    if isinstance(expr, ast.Name) and scope.fn is not None and expr.id not in _params(scope.fn):
        values = _local_values(scope.fn, expr.id)  # `llm = Qwen2ForCausalLM(...)` then `self.llm = llm`
        if values:
            return _merge([_instances(index, v, scope, depth + 1) for v in values])
    return [], [_text(expr)]


def _held(index: _Index, cls: _Class, attr: str) -> tuple[bool, _Found]:
    """(assigned anywhere, what it holds) for self.<attr>, from the nearest class up the bases that assigns it."""
    for owner in index.mro(cls):
        assignments = index.assignments(owner, attr)
        if assignments:
            found = _merge([_instances(index, v, _Scope(owner.rel, fn, cls)) for fn, v in assignments])
            unique = list({c.key: c for c in found[0]}.values())
            return True, (unique, list(dict.fromkeys(found[1])))
    return False, ([], [])


def _whole_model(cls: _Class, attr: str, registered: set[tuple[str, str]]) -> bool:
    """Whether a class held in self.<attr> is a whole model a wrapper delegates to, not a transformer body.

    self.language_model is always the wrapped model. self.model is the transformer body in every plain causal LM
    (LlamaForCausalLM.model is a LlamaModel), so there only a whole model that SGLang also serves on its own (a
    registered EntryClass named *ForCausalLM or *ForConditionalGeneration) counts: DeepseekOCRForCausalLM,
    DotsOCRForCausalLM and BailingMM*NativeForConditionalGeneration hold one. That leaves out every transformer
    body (never registered, or registered as an embedding model under a *Model name) and the MTP draft modules
    that hold an unregistered *ForCausalLM in self.model, which are no EAGLE-3 target. self.llm and self.thinker
    never hold a body: there a registered class or a whole-model name is enough (Qwen3-Omni's thinker is not
    registered itself).
    """
    if attr == LANGUAGE_MODEL:
        return True
    whole = cls.node.name.endswith(WHOLE_MODEL_SUFFIXES)
    return whole and cls.key in registered if attr == "model" else whole or cls.key in registered


# --- the forward route ---------------------------------------------------------------------------------------------


def _runs(fn: ast.AST, attr: str) -> bool:
    """Whether code calls self.<attr> (or its forward) or hands self.<attr> itself to a call."""
    for node in ast.walk(fn):
        if isinstance(node, ast.Call):
            if _is_self_attr(node.func, attr):
                return True
            if (
                isinstance(node.func, ast.Attribute)
                and node.func.attr == "forward"
                and _is_self_attr(node.func.value, attr)
            ):
                return True
            if any(_is_self_attr(a, attr) for a in [*node.args, *(k.value for k in node.keywords)]):
                return True
    return False


def _bypass(index: _Index, cls: _Class, attr: str) -> str:
    """How the wrapper's forward skips the inner model's own forward, or "" when it runs it.

    The inner model's set_eagle3_layers_to_capture makes its forward return the captured hidden states with the
    logits. A wrapper whose forward runs only the inner transformer body (`language_model=self.llm.model`) and
    its own logits processor never hands them on: delegating the capture there would break the forward.
    """
    for owner in index.mro(cls):  # Qwen3-Omni: `self.forward = self.thinker.forward`
        for _, value in index.assignments(owner, "forward"):
            if any(_is_self_attr(n, attr) for n in ast.walk(value)):
                return ""
    found = _method(index, cls, "forward")
    if found is None:
        return f"no forward found that runs self.{attr}"
    todo: list[ast.AST] = [found[1]]
    seen: set[int] = set()
    while todo:  # forward and the methods of self it calls, a few levels down
        fn = todo.pop()
        if id(fn) in seen or len(seen) > 12:
            continue
        seen.add(id(fn))
        if _runs(fn, attr):
            return ""
        for node in ast.walk(fn):
            if isinstance(node, ast.Call) and _is_self_attr(node.func):
                callee = _method(index, cls, node.func.attr)
                if callee is not None:
                    todo.append(callee[1])
    parts = sorted(
        (n.lineno, n.col_offset, ast.unparse(n))
        for n in ast.walk(found[1])
        if isinstance(n, ast.Attribute) and _is_self_attr(n.value, attr) and n.attr != "config"
    )
    body = " and ".join(dict.fromkeys(text for *_, text in parts))
    return f"its forward runs {body}, not self.{attr}" if body else f"its forward never runs self.{attr}"


def _passes_through(fn: ast.AST, attr: str, method: str) -> bool:
    return any(
        isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and n.func.attr == method
        and _is_self_attr(n.func.value, attr)
        for n in ast.walk(fn)
    )


# --- the audit -----------------------------------------------------------------------------------------------------


def _status(
    index: _Index, cls: _Class, method: str, seen: frozenset[int] = frozenset(), added: frozenset[int] = frozenset()
) -> str:
    """How `cls` answers `method`; classes in `added` count as defining it (a planned delegation)."""
    own = _methods(cls.node)
    if method in own:
        return "delegates" if _uses_held(own[method]) else "implements"
    if id(cls.node) in added:
        return "delegates"
    if "__getattr__" in own:
        return "delegates (__getattr__)"
    for text, base in index.bases(cls):
        if (
            base is not None
            and id(base.node) not in seen
            and _status(index, base, method, seen | {id(cls.node)}, added) != "missing"
        ):
            return f"inherits from {text}"
    return "missing"


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


def _audit(
    index: _Index, cls: _Class, contract: tuple[ContractMethod, ...], registered: set[tuple[str, str]]
) -> ModelAudit:
    statuses = tuple((m.name, _status(index, cls, m.name)) for m in contract)
    audit = ModelAudit(cls.node.name, cls.rel, False, statuses, tuple(dict.fromkeys(_unresolved(index, cls))))
    for attr in HELD_ATTRS:
        assigned, (classes, runtime) = _held(index, cls, attr)
        if not assigned:
            continue
        if attr != LANGUAGE_MODEL and not any(_whole_model(c, attr, registered) for c in classes):
            continue  # a transformer body, or nothing we can tell is a model
        names = [m.name for m in contract]
        inner = tuple(
            InnerModel(c.node.name, c.rel, tuple(m for m in names if _status(index, c, m) == "missing"))
            for c in classes
        )
        passthrough = []
        for name, status in statuses:
            provider = _method(index, cls, name) if status != "missing" else None
            if provider is not None and _passes_through(provider[1], attr, name):
                passthrough.append(name)
        missing = audit.missing
        bypass = _bypass(index, cls, attr) if CAPTURE in missing else ""
        return dataclasses.replace(
            audit,
            wrapper=True,
            attr=attr,
            inner=inner,
            runtime_inner=tuple(runtime),
            bypass=bypass,
            passthrough=tuple(passthrough),
        )
    return audit


def _place(
    index: _Index,
    audits: dict[tuple[str, str], ModelAudit],
    classes: dict[tuple[str, str], _Class],
    names: list[str],
) -> tuple[tuple[Delegation, ...], dict[tuple[str, str], str]]:
    """Where to add each delegation, and the gaps no delegation can close without changing another model.

    A method goes on the topmost patchable gap: its patchable subclasses (same attribute) inherit it. Before
    that is accepted, every registered model is checked with the planned methods in place: none that had the
    method may get it from somewhere else, and none that lacked it may get it unless it is a patchable gap
    itself (an unsupported subclass keeps SGLang's clear startup error).
    """
    above = {key: {a.key for a in index.ancestors(cls)} for key, cls in classes.items()}
    blocked: dict[tuple[str, str], str] = {}
    while True:
        patchable = {k: a for k, a in audits.items() if a.verdict in (PATCH, PARTIAL) and k not in blocked}
        plan: dict[str, list[tuple[str, str]]] = {}
        newly: dict[tuple[str, str], str] = {}
        for method in names:
            gaps = {k for k, a in patchable.items() if method in a.missing}
            tops = sorted(k for k in gaps if not any(u in gaps and audits[u].attr == audits[k].attr for u in above[k]))
            plan[method] = tops
            added = frozenset(id(classes[k].node) for k in tops)
            for key, cls in classes.items():
                reached = [t for t in tops if t == key or t in above[key]]
                if not reached:
                    continue
                before = _status(index, cls, method)
                if before == "missing" and key not in gaps:
                    why = "which lacks it and cannot take a delegation"
                elif before != "missing" and _status(index, cls, method, added=added) != before:
                    why = f"which already has it ({before}) and would get it from there instead"
                else:
                    continue
                for t in reached:
                    newly.setdefault(t, f"a {method} delegation on {t[1]} would also reach {key[1]}, {why}")
        if not newly:
            break
        blocked.update(newly)
    targets: dict[tuple[str, str], list[str]] = {}
    for method in names:
        for k in plan[method]:
            targets.setdefault(k, []).append(method)
    out = []
    for k, methods in sorted(targets.items()):
        covered = [
            a
            for key, a in patchable.items()
            if (key == k or k in above[key]) and a.attr == audits[k].attr and set(a.missing) & set(methods)
        ]
        inner = [i.name for a in covered for i in a.inner if not set(i.lacks) & set(methods)]
        out.append(
            Delegation(
                k[0],
                k[1],
                audits[k].attr,
                tuple(methods),
                tuple(sorted(a.name for a in covered)),
                tuple(dict.fromkeys(inner)),
            )
        )
    return tuple(out), blocked


def audit_models(
    tree: SourceTree, contract: tuple[ContractMethod, ...]
) -> tuple[tuple[ModelAudit, ...], tuple[Delegation, ...]]:
    index = _Index(tree)
    entries = entry_classes(tree)
    if not entries:
        raise Refusal(MODELS_DIR, "EntryClass", "no model registrations found")
    classes: dict[tuple[str, str], _Class] = {}
    for rel, name in entries:
        cls = index.lookup(rel, name)
        if cls is not None:  # else registered under a name defined at run time; nothing to read
            classes.setdefault(cls.key, cls)
    registered = set(classes)
    audits = {key: _audit(index, cls, contract, registered) for key, cls in classes.items()}
    targets, blocked = _place(index, audits, classes, [m.name for m in contract])
    for key, why in blocked.items():
        audits[key] = dataclasses.replace(audits[key], blocked=why)
    return tuple(sorted(audits.values(), key=lambda a: (a.name, a.path))), targets


def scan(tree: SourceTree) -> EagleScan:
    contract, sources = derive_contract(tree)
    models, targets = audit_models(tree, contract)
    return EagleScan(contract, sources, models, targets)


# --- findings and JSON ---------------------------------------------------------------------------------------------


def _names(items: tuple[str, ...] | list[str]) -> str:
    return ", ".join(items)


def _lacks(inner: tuple[InnerModel, ...], methods: tuple[str, ...]) -> str:
    """ "inner A has no m; inner B has no m, n" for the methods each of them lacks."""
    return "; ".join(f"inner {i.name} has no {_names([m for m in methods if m in i.lacks])}" for i in inner)


def summary(audit: ModelAudit) -> str:
    """One line on a wrapper gap (or a delegation that cannot always work), in the words the scan prints."""
    held, missing, verdict = f"self.{audit.attr}", audit.missing, audit.verdict
    inner = f"{held} ({_names([i.name for i in audit.inner])})"
    if verdict == PATCH:
        who = "the inner model has" if len(audit.inner) == 1 else "every one of them has"
        return (
            f"{audit.name} holds {inner} but lacks {_names(missing)} (EAGLE-3 target crashes); {who} "
            f"{'it' if len(missing) == 1 else 'them'}: the patch delegates to {held}"
        )
    if verdict == PARTIAL:
        lacking = audit.lacking(missing)
        good = [i.name for i in audit.inner if i not in lacking]
        return (
            f"{audit.name} holds {inner} but lacks {_names(missing)} (EAGLE-3 target crashes); the patch delegates to "
            f"{_names(good)}, but {_lacks(lacking, missing)}: with that inner model EAGLE-3 stays unsupported "
            "(AttributeError naming it)"
        )
    if verdict == RUNTIME:
        values = _names(audit.runtime_inner) or "nothing this scan can resolve"
        return (
            f"{audit.name} lacks {_names(missing)}; cannot check: inner class chosen at run time ({held} from "
            f"{values}), not patched"
        )
    if verdict == UNSUPPORTED:
        if audit.blocked:
            return f"EAGLE-3 not patched for {audit.name} (lacks {_names(missing)}): {audit.blocked}"
        if len(audit.lacking(missing)) == len(audit.inner):
            why = _lacks(audit.inner, missing)
        else:
            why = f"{audit.bypass}, so the hidden states {held} would capture never reach the drafter"
        return f"EAGLE-3 not supported for {audit.name}: {why}; not patched"
    lacking = audit.broken_delegation
    good = [i.name for i in audit.inner if i not in lacking]
    return (
        f"{audit.name} delegates {_names(audit.passthrough)} to {held}: EAGLE-3 works with {_names(good) or 'none'}; "
        f"{_lacks(lacking, audit.passthrough)} (AttributeError naming it when {audit.name} holds it)"
    )


def findings(found: EagleScan) -> list[tuple[str, bool, bool, str, str]]:
    """(id, ok, patchable, summary, path) of every EAGLE-3 finding, for the report."""
    prefix = {PATCH: "eagle3", PARTIAL: "eagle3", UNSUPPORTED: "eagle3-unsupported", RUNTIME: "eagle3-runtime"}
    out = []
    for m in found.models:
        if m.verdict:
            out.append((f"{prefix[m.verdict]}:{m.name}", False, m.verdict in (PATCH, PARTIAL), summary(m), m.path))
        elif m.broken_delegation:
            out.append((f"eagle3-partial:{m.name}", False, False, summary(m), m.path))
    return out


def to_dict(found: EagleScan) -> dict[str, object]:
    def lacks(inner: tuple[InnerModel, ...]) -> dict[str, list[str]]:
        return {i.name: list(i.lacks) for i in inner}

    def base(m: ModelAudit) -> dict[str, object]:
        return {"class": m.name, "path": m.path, "attr": m.attr, "inner": [i.name for i in m.inner]}

    return {
        "contract": [dataclasses.asdict(c) for c in found.contract],
        "sources": list(found.sources),
        "models": len(found.models),
        "wrappers": sum(m.wrapper for m in found.models),
        "wrapper_gaps": [
            {**base(m), "missing": list(m.missing), "inner_lacking": lacks(m.lacking(m.missing))}
            for m in found.wrapper_gaps
        ],
        "unsupported": [
            {**base(m), "missing": list(m.missing), "lacks": lacks(m.lacking(m.missing)), "reason": summary(m)}
            for m in found.unsupported
        ],
        "runtime_inner": [
            {**base(m), "missing": list(m.missing), "values": list(m.runtime_inner)} for m in found.runtime_inner
        ],
        "partial": [
            {**base(m), "delegates": list(m.passthrough), "lacks": lacks(m.broken_delegation)} for m in found.partial
        ],
        "delegations": [dataclasses.asdict(d) for d in found.targets],
        "model_status": {m.name: dict(m.methods) for m in found.models},
    }


# --- patch: delegation methods that call the inner model directly --------------------------------------------------

# No hasattr guard (mllama4.py has one): a guard turns a missing method into a silent no-op, or into a fallback
# that fails later. The scan only plans these where the inner class has the method; should it still lack one at
# run time, the call raises AttributeError naming the inner class, as upstream's own kimi_k25.py does.
_TEMPLATES = {
    "set_eagle3_layers_to_capture": (
        "def set_eagle3_layers_to_capture(self, layer_ids=None):",
        "    return self.{attr}.set_eagle3_layers_to_capture(layer_ids)",
    ),
    "get_embed_and_head": (
        "def get_embed_and_head(self):",
        "    return self.{attr}.get_embed_and_head()",
    ),
}


def _template(method: str, attr: str) -> tuple[str, ...]:
    lines = _TEMPLATES.get(
        method, (f"def {method}(self, *args, **kwargs):", f"    return self.{{attr}}.{method}(*args, **kwargs)")
    )
    return tuple(f"{line.format(attr=attr)}  {MARK}" for line in lines)


def add_delegation(
    text: str,
    rel: str,
    class_name: str,
    methods: tuple[str, ...],
    attr: str = LANGUAGE_MODEL,
    inner: tuple[str, ...] = (),
) -> str:
    """Append methods that call self.<attr>.<method> for `methods` the class does not define yet."""
    module = ast.parse(text)
    cls = next((n for n in module.body if isinstance(n, ast.ClassDef) and n.name == class_name), None)
    if cls is None:
        raise Refusal(rel, f"class {class_name}", "class not found at module level")
    if not _assignments(cls, attr) and not any(isinstance(b, ast.Name) for b in cls.bases):
        raise Refusal(rel, f"class {class_name}", f"does not hold self.{attr}")
    todo = [m for m in methods if m not in _methods(cls)]
    if not todo:
        return text
    src = Source(text)
    nl = src.newline()
    indent = src.indent_of(cls.body[0].lineno)
    held = f"self.{attr}" + (f" ({', '.join(inner)})" if inner else "")
    lines = [f"{MARK}: EAGLE-3 delegation to {held}, which has these methods"]
    for i, method in enumerate(todo):
        lines += ([""] if i else []) + list(_template(method, attr))
    block = nl + "".join(f"{indent}{line}{nl}" if line else nl for line in lines)
    at = src.after_line(cls.end_lineno or cls.lineno)
    lead = nl if at == len(text) and not text.endswith(("\n", "\r")) else ""
    return replace(text, at, at, lead + block)
