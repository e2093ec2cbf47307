#!/usr/bin/env python3
"""List the tests that cannot fail: `def test_*` functions in tests/**/test_*.py that check nothing.

A test checks something when its body (nested functions and lambdas included) has an `assert`, a `raise
AssertionError`, a `pytest.raises` / `pytest.fail` / `pytest.warns` / `pytest.deprecated_call`, a mock's `.assert_*()`
call, or calls a helper that does. Helpers are resolved statically (stdlib `ast`, nothing is imported): functions and
classes of the same module (a method called on `self`/`cls` in a test class too), and names imported from modules under
tests/ (`from lab.podman import node_exec`, `from doctor_helpers import doctor`, `import comm_answers`, relative
imports); a class counts as its `__init__`. A helper checks something by the same rule, transitively. Calls that cannot
be resolved this way (methods of fixtures or of returned objects, library functions) count as checking nothing:
whatever they assert, the test itself must say what a user would see. Fixtures the test requests are not counted
either: a fixture that asserts its setup does not check what the test is named for.

Each test listed is fixed, or named in ALLOWED below with the reason. Exit status 1 when any test is listed.

    python scripts/test_asserts.py [TESTS_DIR]      (default: the tests/ beside this script's folder)
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# "path relative to the tests dir::test name" -> why the test may stand without an assertion of its own.
ALLOWED: dict[str, str] = {}

PYTEST_CHECKS = {"raises", "fail", "warns", "deprecated_call"}

FunctionNode = ast.FunctionDef | ast.AsyncFunctionDef


@dataclass(frozen=True)
class Finding:
    path: str  # relative to the tests dir
    line: int
    name: str

    @property
    def key(self) -> str:
        return f"{self.path}::{self.name}"


@dataclass
class Module:
    path: Path
    tree: ast.Module
    functions: dict[str, FunctionNode] = field(default_factory=dict)  # top level, and "Class.method"
    classes: set[str] = field(default_factory=set)
    imports: dict[str, tuple[Path, str]] = field(default_factory=dict)  # local name -> (module file, name there or "")


class Index:
    """The modules under one tests dir, parsed once, with their functions and the names they import from each other."""

    def __init__(self, tests: Path) -> None:
        self.tests = tests
        self.modules: dict[Path, Module] = {}
        self._memo: dict[tuple[Path, str], bool] = {}

    def module(self, path: Path) -> Module:
        path = path.resolve()
        if path not in self.modules:
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            mod = Module(path, tree)
            self.modules[path] = mod  # before the imports: a cycle of imports must find it
            for node in tree.body:
                if isinstance(node, FunctionNode):
                    mod.functions[node.name] = node
                elif isinstance(node, ast.ClassDef):
                    mod.classes.add(node.name)
                    for item in node.body:
                        if isinstance(item, FunctionNode):
                            mod.functions[f"{node.name}.{item.name}"] = item
            for found in ast.walk(tree):
                if isinstance(found, ast.ImportFrom):
                    source = self._resolve(path, found.module or "", found.level)
                    for alias in found.names:
                        if source is not None:
                            mod.imports[alias.asname or alias.name] = (source, alias.name)
                        else:  # `from pkg import submodule`
                            dotted = f"{found.module}.{alias.name}" if found.module else alias.name
                            sub = self._resolve(path, dotted, found.level)
                            if sub is not None:
                                mod.imports[alias.asname or alias.name] = (sub, "")
                elif isinstance(found, ast.Import):
                    for alias in found.names:
                        target = self._resolve(path, alias.name, 0)
                        if target is not None:
                            mod.imports[alias.asname or alias.name.split(".")[0]] = (target, "")
        return self.modules[path]

    def _resolve(self, importer: Path, dotted: str, level: int) -> Path | None:
        """The file under the tests dir that `dotted` names from `importer` (pytest puts a test's folder on sys.path,
        and the tests dir holds the packages `lab` and `bench`); None for anything else (libraries, the package)."""
        parts = [p for p in dotted.split(".") if p]
        if level:
            bases = [importer.parent.parents[level - 2] if level > 1 else importer.parent]
        else:
            bases = [importer.parent, self.tests]
        for base in bases:
            for candidate in (base.joinpath(*parts).with_suffix(".py"), base.joinpath(*parts, "__init__.py")):
                if parts and candidate.is_file() and candidate.resolve().is_relative_to(self.tests.resolve()):
                    return candidate.resolve()
        return None

    def checks(self, path: Path, name: str, depth: int = 0) -> bool:
        """Whether function `name` of module `path` checks something, itself or through a helper it calls."""
        key = (path.resolve(), name)
        if key in self._memo:
            return self._memo[key]
        self._memo[key] = False  # a recursion back here adds nothing
        mod = self.module(path)
        node = mod.functions.get(name)
        result = node is not None and depth < 50 and self._body_checks(mod, node, name.partition(".")[0], depth)
        self._memo[key] = result
        return result

    def _body_checks(self, mod: Module, func: FunctionNode, owner: str, depth: int) -> bool:
        for node in _walk_body(func):
            if isinstance(node, ast.Assert) or (isinstance(node, ast.Raise) and _raises_assertion(node)):
                return True
            if isinstance(node, ast.Call) and (
                _is_pytest_check(node.func) or self._calls_checking_helper(mod, node.func, owner, depth)
            ):
                return True
            if isinstance(node, ast.With | ast.AsyncWith) and any(
                isinstance(item.context_expr, ast.Call) and _is_pytest_check(item.context_expr.func)
                for item in node.items
            ):
                return True
        return False

    def _calls_checking_helper(self, mod: Module, func: ast.expr, owner: str, depth: int) -> bool:
        if isinstance(func, ast.Attribute) and func.attr.startswith("assert_"):
            return True  # unittest.mock's assert_called_once_with and friends
        for path, name in self._targets(mod, func, owner):
            target = self.module(path)
            if name in target.classes:
                name = f"{name}.__init__"
            if self.checks(path, name, depth + 1):
                return True
        return False

    def _targets(self, mod: Module, func: ast.expr, owner: str) -> Iterator[tuple[Path, str]]:
        if isinstance(func, ast.Name):
            if func.id in mod.functions or func.id in mod.classes:
                yield mod.path, func.id
            elif func.id in mod.imports:
                path, name = mod.imports[func.id]
                if name:
                    yield from self._follow(path, name)
        elif isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            base = func.value.id
            if base in ("self", "cls") and owner:
                yield mod.path, f"{owner}.{func.attr}"
            elif base in mod.classes:
                yield mod.path, f"{base}.{func.attr}"
            elif base in mod.imports:
                path, name = mod.imports[base]
                if not name:  # an imported module: module.function
                    yield from self._follow(path, func.attr)
                else:  # an imported class: Class.method
                    yield path, f"{name}.{func.attr}"

    def _follow(self, path: Path, name: str, hops: int = 0) -> Iterator[tuple[Path, str]]:
        """`name` in module `path`, following re-exports (`from lab.podman import X` in a package's module)."""
        target = self.module(path)
        if name in target.functions or name in target.classes:
            yield path, name
        elif name in target.imports and hops < 10:
            source, there = target.imports[name]
            if there:
                yield from self._follow(source, there, hops + 1)


def _walk_body(func: FunctionNode) -> Iterator[ast.AST]:
    """Every node of the body (decorators and defaults excluded; nested functions and lambdas included)."""
    for statement in func.body:
        yield from ast.walk(statement)


def _raises_assertion(node: ast.Raise) -> bool:
    exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
    return isinstance(exc, ast.Name) and exc.id == "AssertionError"


def _is_pytest_check(func: ast.expr) -> bool:
    return (
        isinstance(func, ast.Attribute)
        and func.attr in PYTEST_CHECKS
        and isinstance(func.value, ast.Name)
        and func.value.id == "pytest"
    )


def _tests_of(tree: ast.Module) -> Iterator[tuple[str, str, FunctionNode]]:
    """(owner class or "", key in Module.functions, node) for each collected test function of a module."""
    for node in tree.body:
        if isinstance(node, FunctionNode) and node.name.startswith("test"):
            yield "", node.name, node
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            for item in node.body:
                if isinstance(item, FunctionNode) and item.name.startswith("test"):
                    yield node.name, f"{node.name}.{item.name}", item


def find_unchecked(tests: Path, allowed: Mapping[str, str] = ALLOWED) -> list[Finding]:
    """The tests under `tests` (test_*.py, recursively) that check nothing, less those in `allowed`."""
    index = Index(tests)
    found: list[Finding] = []
    for path in sorted(tests.rglob("test_*.py")):
        if any(part.startswith(".") or part == "__pycache__" for part in path.relative_to(tests).parts):
            continue
        mod = index.module(path)
        for owner, key, node in _tests_of(mod.tree):
            if index._body_checks(mod, node, owner, 0):
                continue
            finding = Finding(path.relative_to(tests).as_posix(), node.lineno, key.replace(".", "::"))
            if finding.key not in allowed:
                found.append(finding)
    return found


def stale_allowances(tests: Path, allowed: Mapping[str, str] = ALLOWED) -> list[str]:
    """Entries of `allowed` naming no test that still checks nothing (fixed, renamed or removed): drop them."""
    listed = {f.key for f in find_unchecked(tests, {})}
    return sorted(key for key in allowed if key not in listed)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tests", nargs="?", type=Path, default=ROOT / "tests", help="the tests dir (default: tests/)")
    args = parser.parse_args(argv)
    tests: Path = args.tests
    found = find_unchecked(tests)
    for finding in found:
        print(f"{tests / finding.path}:{finding.line}: {finding.name} checks nothing (no assert, pytest.raises/fail/"
              "warns, or call into a helper that asserts): assert what a user would see, or name it in "
              "scripts/test_asserts.py ALLOWED with the reason")  # fmt: skip
    stale = stale_allowances(tests) if tests.resolve() == (ROOT / "tests").resolve() else []
    for key in stale:
        print(f"scripts/test_asserts.py ALLOWED: {key} names no test that checks nothing any more: remove the entry")
    if found or stale:
        print(f"{len(found)} test(s) check nothing, {len(stale)} stale allow-list entr(ies)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
