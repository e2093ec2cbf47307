"""Every remedy the doctor prints is a value from one table, doctor/remedies.py, and every playbook remedy in that
table names tags that site.yml's plays and roles have.

The first rule is read from the source with `ast`: each `remedy=` keyword, and the remedy argument of a call to
anything whose signature or fields have a `remedy` (Result, a check module's `_result` / `_fail` / Choice),
must be a reference into the table: `remedies.NAME`, a call `remedies.function(...)`, a name imported from it, or a
variable whose every assignment is one of those. A string written in the check itself (literal, f-string, "x" +
remedies.Y) fails the test, naming the file, line and expression. Reading `.remedy` off a typed object passes only
where PASS_THROUGH lists it.
"""

from __future__ import annotations

import ast
import inspect
import re
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import pytest
import yaml

from sm120check.doctor import remedies
from sm120check.doctor.catalogue import all_checks

ROOT = Path(__file__).resolve().parents[3]
DOCTOR = ROOT / "python" / "sm120check" / "src" / "sm120check" / "doctor"
# What the rule judges: every check module, and the node-health verdicts.
JUDGED = (
    *sorted({Path(sys.modules[type(check).__module__].__file__ or "") for check in all_checks()}),
    DOCTOR / "node_health" / "verdicts.py",
    DOCTOR / "probecheck.py",
    DOCTOR / "runner.py",
    DOCTOR / "stackenv.py",
)
# Where remedy-taking callables are defined besides the judged modules (Result's fields).
SIGNATURES = (DOCTOR / "model.py",)
REMEDIES_MODULE = "sm120check.doctor.remedies"
# `<object>.remedy` read back from a typed object that got its remedy where it was built, per (file, expression).
PASS_THROUGH: Mapping[tuple[str, str], str] = {
    ("probecheck.py", "prior.remedy"): "a prerequisite's Result: its own check built it (and is judged here)",
    ("probecheck.py", "self.remedy"): "a ProbeCheck's declared remedy: the ClassVar each check sets from remedies.py",
    ("runner.py", "prior.remedy"): "a prerequisite's Result, passed to the check that skips for it",
    ("collectives.py", "gate.remedy"): "flashinfer_release.FusionGate: the FlashInfer upgrade its gate names",
    ("sglang_comm.py", "c.remedy"): "a Choice: its remedy is judged at each Choice(...) call",
    ("health.py", "verdict.remedy"): "a health verdict: judged at each Result(...) call in node_health/verdicts.py",
}

# The table's names: its strings and the functions it defines (not what it imports).
TABLE_STRINGS = frozenset(k for k, v in vars(remedies).items() if isinstance(v, str) and not k.startswith("_"))
TABLE_FUNCTIONS = frozenset(
    k for k, v in vars(remedies).items() if inspect.isfunction(v) and v.__module__ == REMEDIES_MODULE
)


@dataclass
class Module:
    """One parsed module: where `remedies` is bound, names imported from it, and its scopes' assignments."""

    name: str
    tree: ast.Module
    module_aliases: set[str] = field(default_factory=set)  # `from sm120check.doctor import remedies [as r]`
    imported: dict[str, str] = field(default_factory=dict)  # local name -> table name
    parents: dict[ast.AST, ast.AST] = field(default_factory=dict)


def remedy_positions(trees: Sequence[ast.Module]) -> dict[str, int | None]:
    """Callable name -> positional index of its `remedy` (None: keyword only), for every function with a
    `remedy` parameter and every class with a `remedy` field in `trees`."""
    found: dict[str, int | None] = {}
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                positional = [a.arg for a in (*node.args.posonlyargs, *node.args.args)]
                if "remedy" in positional:
                    found[node.name] = positional.index("remedy")
                elif "remedy" in (a.arg for a in node.args.kwonlyargs):
                    found[node.name] = None
            elif isinstance(node, ast.ClassDef):
                fields = [
                    s.target.id
                    for s in node.body
                    if isinstance(s, ast.AnnAssign)
                    and isinstance(s.target, ast.Name)
                    and "ClassVar" not in ast.unparse(s.annotation)
                ]
                if "remedy" in fields:
                    found[node.name] = fields.index("remedy")
    return found


def parse(path: Path, source: str | None = None) -> Module:
    tree = ast.parse(source if source is not None else path.read_text(), filename=str(path))
    module = Module(path.name, tree)
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            module.parents[child] = node
        if isinstance(node, ast.ImportFrom) and node.module == "sm120check.doctor":
            module.module_aliases |= {a.asname or a.name for a in node.names if a.name == "remedies"}
        elif isinstance(node, ast.ImportFrom) and node.module == REMEDIES_MODULE:
            module.imported.update({a.asname or a.name: a.name for a in node.names})
    return module


def _scope(module: Module, node: ast.AST) -> ast.AST:
    """The innermost function around `node`, else the module."""
    current = module.parents.get(node)
    while current is not None and not isinstance(current, ast.FunctionDef | ast.AsyncFunctionDef):
        current = module.parents.get(current)
    return current if current is not None else module.tree


def _assigned(scope: ast.AST, name: str) -> list[ast.expr]:
    """Every value assigned to `name` in `scope` (not in functions nested in it)."""
    values: list[ast.expr] = []
    pending = list(ast.iter_child_nodes(scope))
    while pending:
        node = pending.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda):
            continue
        targets = node.targets if isinstance(node, ast.Assign) else []
        if isinstance(node, ast.AnnAssign | ast.NamedExpr):
            targets = [node.target]
        value = getattr(node, "value", None)
        if isinstance(value, ast.expr) and any(isinstance(t, ast.Name) and t.id == name for t in targets):
            values.append(value)
        pending.extend(ast.iter_child_nodes(node))
    return values


def _parameters(scope: ast.AST) -> set[str]:
    if not isinstance(scope, ast.FunctionDef | ast.AsyncFunctionDef):
        return set()
    a = scope.args
    return {p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs)}


def problem(module: Module, expr: ast.expr, at: ast.AST, seen: frozenset[str] = frozenset()) -> str:
    """Why `expr` (a remedy value used at `at`) is not a reference into the table; "" when it is."""
    shown = ast.unparse(expr)
    if isinstance(expr, ast.Constant) and expr.value == "":
        return ""  # no remedy
    if isinstance(expr, ast.IfExp):
        return problem(module, expr.body, at, seen) or problem(module, expr.orelse, at, seen)
    if isinstance(expr, ast.BoolOp):
        return next((p for v in expr.values if (p := problem(module, v, at, seen))), "")
    if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name) and expr.value.id in module.module_aliases:
        return "" if expr.attr in TABLE_STRINGS else f"{shown}: no string {expr.attr} in remedies.py"
    if isinstance(expr, ast.Call):
        func = expr.func
        if (
            isinstance(func, ast.Attribute)
            and isinstance(func.value, ast.Name)
            and func.value.id in module.module_aliases
        ):
            return "" if func.attr in TABLE_FUNCTIONS else f"{shown}: no function {func.attr} in remedies.py"
        if isinstance(func, ast.Name) and module.imported.get(func.id) in TABLE_FUNCTIONS:
            return ""
        return f"{shown}: a call of something not defined in remedies.py"
    if isinstance(expr, ast.Attribute) and expr.attr == "remedy":
        return "" if (module.name, shown) in PASS_THROUGH else f"{shown}: a pass-through not listed in PASS_THROUGH"
    if isinstance(expr, ast.Name):
        if module.imported.get(expr.id) in TABLE_STRINGS:
            return ""
        scope = _scope(module, at)
        if expr.id == "remedy" and expr.id in _parameters(scope):
            return ""  # a `remedy` parameter: each call of that function is judged at the call
        if expr.id in seen:
            return f"{shown}: assigned from itself"
        values = _assigned(scope, expr.id) or _assigned(module.tree, expr.id)
        if not values:
            return f"{shown}: a name not traced to remedies.py"
        return next((f"{shown} = {p[:160]}" for v in values if (p := problem(module, v, v, seen | {expr.id}))), "")
    return f"{shown}: written in the check, not a name from remedies.py"


def remedy_arguments(module: Module, positions: Mapping[str, int | None]) -> Iterator[tuple[ast.expr, ast.AST]]:
    """Every value given as a remedy in `module`: call arguments, and defaults of `remedy` parameters."""
    for node in ast.walk(module.tree):
        if isinstance(node, ast.Call):
            func = node.func
            callee = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            keyword = next((k.value for k in node.keywords if k.arg == "remedy"), None)
            index = positions.get(callee)
            if keyword is not None:
                yield keyword, node
            elif (
                index is not None
                and index < len(node.args)
                and not any(isinstance(a, ast.Starred) for a in node.args[: index + 1])
            ):
                yield node.args[index], node
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            a = node.args
            positional = [*a.posonlyargs, *a.args]
            with_default = positional[len(positional) - len(a.defaults) :]
            defaults = {p.arg: d for p, d in zip(with_default, a.defaults, strict=True)}
            defaults |= {p.arg: d for p, d in zip(a.kwonlyargs, a.kw_defaults, strict=True) if d is not None}
            if "remedy" in defaults:
                yield defaults["remedy"], node


def violations(modules: Sequence[Module], positions: Mapping[str, int | None]) -> list[str]:
    found: list[tuple[str, int, str]] = []
    for module in modules:
        local = {**positions, **remedy_positions([module.tree])}
        for value, at in remedy_arguments(module, local):
            if why := problem(module, value, at):
                found.append((module.name, value.lineno, why))
    return [f"{name}:{line}: {why}" for name, line, why in sorted(found)]


def judged() -> tuple[list[Module], dict[str, int | None]]:
    modules = [parse(path) for path in JUDGED]
    trees = [m.tree for m in modules] + [ast.parse(p.read_text()) for p in SIGNATURES]
    return modules, remedy_positions(trees)


def test_every_remedy_of_the_checks_and_health_verdicts_is_a_name_from_remedies_py() -> None:
    modules, positions = judged()
    assert {"Result"} <= positions.keys(), "Result lost its remedy field"
    found = violations(modules, positions)
    assert not found, "remedies not taken from doctor/remedies.py (name them there):\n" + "\n".join(found)


def test_every_pass_through_is_still_used() -> None:
    """A PASS_THROUGH entry whose expression is gone would let a later one through unseen: keep the list exact."""
    modules, positions = judged()
    used = {
        (module.name, ast.unparse(node))
        for module in modules
        for value, _ in remedy_arguments(module, {**positions, **remedy_positions([module.tree])})
        for node in ast.walk(value)
        if isinstance(node, ast.Attribute) and node.attr == "remedy"
    }
    assert set(PASS_THROUGH) <= used, set(PASS_THROUGH) - used


CHECK_HEAD = """
from sm120check.doctor import remedies
from sm120check.doctor.remedies import CUDA_ENV, cuda_home
from sm120check.doctor.model import Result, Status
"""


@pytest.mark.parametrize(
    "body",
    [
        'Result("x", Status.FAIL, "s", remedy="apt install g++")',
        'Result("x", Status.FAIL, "s", "details", "apt install g++")',
        'Result("x", Status.FAIL, "s", remedy=f"{remedies.CUDA_ENV} (CUDA_HOME={home})")',
        'Result("x", Status.FAIL, "s", remedy="run: " + remedies.CUDA_ENV)',
        'Result("x", Status.FAIL, "s", remedy=remedies.NO_SUCH_REMEDY)',
        'Result("x", Status.FAIL, "s", remedy=remedies.CUDA_ENV if ok else "see the log")',
        'Result("x", Status.FAIL, "s", remedy=other.remedy)',
        'FIX = "reboot"\nResult("x", Status.FAIL, "s", remedy=FIX)',
        'def _fail(summary, remedy=""):\n    return Result("x", Status.FAIL, summary, remedy=remedy)\n'
        '_fail("s", "reboot")',
    ],
)
def test_an_inline_remedy_fails_the_rule(body: str) -> None:
    module = parse(Path("inline.py"), CHECK_HEAD + body)
    positions = {**judged()[1], **remedy_positions([module.tree])}
    assert violations([module], positions), body


@pytest.mark.parametrize(
    "body",
    [
        'Result("x", Status.FAIL, "s", remedy=remedies.CUDA_ENV)',
        'Result("x", Status.FAIL, "s", remedy=remedies.cuda_home(home))',
        'Result("x", Status.FAIL, "s", remedy=CUDA_ENV or cuda_home(home))',
        'fix = remedies.CUDA_ENV if ok else remedies.NCCL\nResult("x", Status.FAIL, "s", remedy=fix)',
        'def _fail(summary, remedy=""):\n    return Result("x", Status.FAIL, summary, remedy=remedy)\n'
        '_fail("s", remedies.CUDA_TOOLKIT)',
    ],
)
def test_a_reference_into_the_table_passes_the_rule(body: str) -> None:
    module = parse(Path("inline.py"), CHECK_HEAD + body)
    positions = {**judged()[1], **remedy_positions([module.tree])}
    assert not violations([module], positions), violations([module], positions)


def _yaml(path: Path) -> object:
    return yaml.safe_load(path.read_text())


def _tags_in(document: object) -> Iterator[str]:
    """Every tag named anywhere in a play or task file (`tags:` of plays, roles, blocks, tasks, `apply:`)."""
    if isinstance(document, dict):
        for key, value in document.items():
            if key == "tags":
                yield from ([value] if isinstance(value, str) else cast(list[str], value))
            else:
                yield from _tags_in(value)
    elif isinstance(document, list):
        for item in document:
            yield from _tags_in(item)


def site_tags() -> set[str]:
    """The tags `ansible-playbook site.yml --tags X` can select: site.yml's plays, their roles' task files."""
    found: set[str] = set()
    plays: list[Path] = [ROOT / "site.yml"]
    while plays:
        path = plays.pop()
        for play in cast(list[dict[str, object]], _yaml(path)):
            found |= set(_tags_in(play))
            if isinstance(imported := play.get("ansible.builtin.import_playbook"), str):
                plays.append(path.parent / imported)
            for role in cast(list[object], play.get("roles", [])):
                name = role if isinstance(role, str) else cast(dict[str, str], role)["role"]
                for task_file in sorted((ROOT / "roles" / name / "tasks").rglob("*.yml")):
                    found |= set(_tags_in(_yaml(task_file)))
    return found - {"always", "never"}


def table_texts() -> list[str]:
    """Every remedy text of the table: its strings' values and each string literal written in remedies.py."""
    source = Path(remedies.__file__).read_text()
    literals = [
        n.value for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Constant) and isinstance(n.value, str)
    ]
    return [str(getattr(remedies, name)) for name in sorted(TABLE_STRINGS)] + literals


def named_tags() -> dict[str, set[str]]:
    """Tag -> the table texts naming it: `--tags a,b`, `tags("a")` calls in remedies.py, `(role r, tag t)`."""
    named: dict[str, set[str]] = {}
    source = Path(remedies.__file__).read_text()
    calls = [
        cast(str, n.args[0].value)
        for n in ast.walk(ast.parse(source))
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Name)
        and n.func.id == "tags"
        and n.args
        and isinstance(n.args[0], ast.Constant)
    ]
    for tag in calls:
        named.setdefault(tag, set()).add(f'tags("{tag}")')
    for text in table_texts():
        for group in re.findall(r"--tags ([a-z0-9_]+(?:,[a-z0-9_]+)*)", text):
            for tag in group.split(","):
                named.setdefault(tag, set()).add(text)
        for _, tag in re.findall(r"\(role ([a-z0-9_]+), tag ([a-z0-9_]+)", text):
            named.setdefault(tag, set()).add(text)
    return named


def test_every_playbook_remedy_names_tags_that_site_yml_has() -> None:
    available = site_tags()
    named = named_tags()
    assert {"cuda_toolkit", "cuda_env", "python_stack", "nccl", "sm120check", "sglang_sm120_configure"} <= named.keys()
    unknown = {tag: sorted(texts) for tag, texts in named.items() if tag not in available}
    assert not unknown, (
        f"remedies name tags no play or role of site.yml has (tags there: {sorted(available)}): {unknown}"
    )


def test_every_role_a_remedy_names_exists() -> None:
    roles = {path.name for path in (ROOT / "roles").iterdir() if path.is_dir()}
    named = {role for text in table_texts() for role in re.findall(r"\(role ([a-z0-9_]+), tag", text)}
    assert named and named <= roles, named - roles


def test_the_playbook_remedies_run_site_yml_at_the_repository_root() -> None:
    assert remedies.PLAYBOOK == "ansible-playbook site.yml" and (ROOT / "site.yml").is_file()
