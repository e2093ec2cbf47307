"""docs/architecture.md kept true: every import in the package, read with `ast`, goes down the rooms, never up; no
check module imports another check module; the doctor's plumbing names no family.

An import under `if TYPE_CHECKING:` is a type annotation, not a dependency, and is not counted.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "python" / "sm120check" / "src" / "sm120check"

# The doctor's check families: one folder each (docs/architecture.md). The catalogue lists them.
FAMILIES = frozenset(
    {
        "preflight",
        "cuda_toolkit",
        "cuda_env",
        "python_stack",
        "pcie_p2p",
        "sglang_sm120",
        "flashinfer_jit",
        "comm",
        "node_health",
        "sm120check",
    }
)
# The one module of a family another family reads, and why (not a check module: the rule on checks still holds).
SHARED_FAMILY_MODULES = {
    ("comm", "sm120check.doctor.node_health.verdicts"): "the peer-copy floors are the host-copy floors of a PCIe link",
}
# The rooms from the bottom up, and the rooms each may import besides its own (docs/architecture.md draws them).
BASE = "base"  # versions, bounded, aio, safetext, strict_schema, exitcodes, findings, argtypes, console, manifest
PLUMBING = "doctor plumbing"  # child, facts, model, runner, report, document, remedies, probecheck, gpu/, pcie/, ...
FAMILY = "family"  # doctor/<family>/: one room per family, beside each other (see SHARED_FAMILY_MODULES)
DOCTOR_CLI = "doctor top"  # the catalogue and the doctor's CLI: the only doctor modules that name the families
MAY_IMPORT: dict[str, frozenset[str]] = {
    BASE: frozenset(),
    PLUMBING: frozenset({BASE}),
    "jitcache": frozenset({BASE}),
    "stack": frozenset({BASE}),
    "sglang": frozenset({BASE, "jitcache", PLUMBING}),  # the patcher reads the doctor's remedy table
    FAMILY: frozenset({BASE, PLUMBING, "jitcache", "sglang"}),
    "bench": frozenset({BASE, "sglang"}),
    DOCTOR_CLI: frozenset({BASE, PLUMBING, FAMILY}),
    "fleet": frozenset({BASE, PLUMBING}),  # the fleet reads the doctor's reports, never runs a check
    "soak": frozenset({BASE, PLUMBING, FAMILY, "bench", "fleet"}),
    "cli": frozenset({BASE, PLUMBING, FAMILY, DOCTOR_CLI, "jitcache", "stack", "sglang", "bench", "fleet", "soak"}),
}
DOCTOR_TOP = frozenset({"catalogue", "cli", "__main__"})


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def room(module: str) -> tuple[str, str]:
    """(rank key, room name): the room name tells two families apart."""
    parts = module.split(".")
    if len(parts) == 1 or parts[1] in ("versions", "bounded", "safetext", "strict_schema", "exitcodes", "findings"):
        return BASE, BASE
    if parts[1] in ("aio", "argtypes", "console", "manifest", "__version__"):
        return BASE, BASE
    if parts[1] in ("cli", "__main__"):
        return "cli", "cli"
    if parts[1] != "doctor":
        return parts[1], parts[1]
    if len(parts) == 2:
        return PLUMBING, PLUMBING
    if parts[2] in FAMILIES:
        return FAMILY, parts[2]
    if parts[2] in DOCTOR_TOP:
        return DOCTOR_CLI, DOCTOR_CLI
    return PLUMBING, PLUMBING


def _type_checking_only(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return True
    return False


def imports(path: Path) -> Iterator[tuple[int, str]]:
    """(line, imported module) for every sm120check import in `path`, lazy ones inside functions included;
    `from a.b import c` yields a.b.c when c is a module, else a.b."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    parents = {child: parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)}
    for node in ast.walk(tree):
        if _type_checking_only(node, parents):
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "sm120check":
                    yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "sm120check":
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                yield node.lineno, full if resolves(full) else node.module


def resolves(module: str) -> bool:
    path = PACKAGE.parent.joinpath(*module.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


SOURCES = sorted(PACKAGE.rglob("*.py"))
EDGES = [(module_name(p), line, target) for p in SOURCES for line, target in imports(p)]


def is_check_module(module: str) -> bool:
    path = PACKAGE.parent.joinpath(*module.split(".")).with_suffix(".py")
    if room(module)[0] != FAMILY or not path.is_file():
        return False
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return any(
        isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "CHECKS" for t in node.targets)
        for node in tree.body
    )


def test_the_package_has_the_rooms_the_architecture_names() -> None:
    doctor = PACKAGE / "doctor"
    assert {p.name for p in doctor.iterdir() if (p / "__init__.py").is_file()} == FAMILIES | {"gpu", "pcie"}
    assert all(any(is_check_module(module_name(p)) for p in (doctor / f).glob("*.py")) for f in FAMILIES)
    assert not list((PACKAGE / "comm").glob("*.py"))


def test_no_check_module_imports_another_check_module() -> None:
    found = [
        f"{importer}:{line} imports {target}"
        for importer, line, target in EDGES
        if is_check_module(importer) and is_check_module(target) and target != importer
    ]
    assert not found, "\n".join(found)


def test_a_family_imports_no_other_family_but_the_listed_shared_modules() -> None:
    found = []
    for importer, line, target in EDGES:
        (kind, mine), (target_kind, theirs) = room(importer), room(target)
        if kind == target_kind == FAMILY and mine != theirs and (mine, target) not in SHARED_FAMILY_MODULES:
            found.append(f"{importer}:{line} imports {target}")
    assert not found, "\n".join(found)


def upward(importer: str, target: str) -> bool:
    kind, target_kind = room(importer)[0], room(target)[0]
    return kind != target_kind and target_kind not in MAY_IMPORT[kind]


def test_every_import_goes_down_the_rooms() -> None:
    found = [
        f"{importer}:{line} ({room(importer)[1]}) imports {target} ({room(target)[1]}), not a room below it"
        for importer, line, target in EDGES
        if upward(importer, target)
    ]
    assert not found, "\n".join(found)


@pytest.mark.parametrize(
    ("importer", "target"),
    [
        ("sm120check.doctor.report", "sm120check.doctor.comm.collectives"),  # the report importing a check
        ("sm120check.doctor.runner", "sm120check.doctor.node_health.health"),  # plumbing naming a family
        ("sm120check.doctor.facts", "sm120check.fleet.collect"),  # the doctor importing the fleet
        ("sm120check.doctor.comm.peer", "sm120check.bench.cli"),  # a check importing bench
        ("sm120check.jitcache.modules", "sm120check.doctor.probecheck"),  # jitcache importing the doctor
    ],
)
def test_the_rule_catches_an_upward_import(importer: str, target: str) -> None:
    assert upward(importer, target)


def test_the_rule_catches_a_check_importing_a_check() -> None:
    assert is_check_module("sm120check.doctor.comm.peer") and is_check_module("sm120check.doctor.pcie_p2p.fabric")
    assert not is_check_module("sm120check.doctor.comm.peer_stress_payload")
    assert room("sm120check.doctor.pcie_p2p.nccl_pairs") != room("sm120check.doctor.comm.pairs")
