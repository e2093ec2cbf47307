"""Log lines and server_info documents made from a real SGLang release's own source.

`log_formats` reads the format strings of the release's logger calls (`logger.warning("... %s ...", x)`,
`logger.info(f"... {x} ...")`, `log_info_on_rank0(logger, "...")`) and of its `raise X("...")` sites with `ast`;
`render` fills their placeholders with sample values, giving the line the server would print. `server_args_fields`
reads the names of the ServerArgs fields (a dataclass in srt/server_args.py up to 0.5.21, msgspec namespaces in
srt/arg_groups/fields/ from 0.5.22), the keys /server_info carries at its top level.
"""

from __future__ import annotations

import ast
import re
import string
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

LOG_METHODS = frozenset(
    {"debug", "info", "warning", "warn", "error", "exception", "critical", "warning_once", "info_once"}
)
RANK0_HELPERS = frozenset({"log_info_on_rank0", "log_warning_on_rank0"})
_PERCENT = re.compile(r"%(?:\([^)]*\))?[-+ #0]*(?:\*|\d+)?(?:\.(?:\*|\d+))?[diouxXeEfFgGcrsa%]")
# How SGLang prints a record: configure_logger's "[%(asctime)s{prefix}] %(message)s", prefix " TP0" on a rank.
LOG_PREFIX = "[2026-12-01 10:00:00 TP0] "


@dataclass(frozen=True)
class Placeholder:
    expr: str  # the f-string expression or str.format field, "" for a %-conversion


@dataclass(frozen=True)
class LogFormat:
    path: str  # relative to the release's sglang/ directory
    line: int
    parts: tuple[str | Placeholder, ...]

    @property
    def text(self) -> str:
        return "".join(p if isinstance(p, str) else "{}" for p in self.parts)


def _percent_parts(text: str) -> list[str | Placeholder]:
    parts: list[str | Placeholder] = []
    pos = 0
    for m in _PERCENT.finditer(text):
        parts.append(text[pos : m.start()])
        parts.append("%" if m.group() == "%%" else Placeholder(""))
        pos = m.end()
    parts.append(text[pos:])
    return parts


def _parts(node: ast.expr, percent: bool) -> list[str | Placeholder] | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return _percent_parts(node.value) if percent else [node.value]
    if isinstance(node, ast.JoinedStr):
        out: list[str | Placeholder] = []
        for value in node.values:
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                out.append(value.value)
            elif isinstance(value, ast.FormattedValue):
                out.append(Placeholder(ast.unparse(value.value)))
        return out
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _parts(node.left, percent), _parts(node.right, percent)
        return None if left is None or right is None else left + right
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "format"
        and isinstance(node.func.value, ast.Constant)
        and isinstance(node.func.value.value, str)
    ):
        fields: list[str | Placeholder] = []
        for literal, name, _spec, _conv in string.Formatter().parse(node.func.value.value):
            fields.append(literal)
            if name is not None:
                fields.append(Placeholder(name))
        return fields
    return None


def _message_arg(node: ast.AST) -> tuple[ast.expr, bool] | None:
    """The message expression of a logger call or a raise, and whether it is %-formatted."""
    if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and node.exc.args:
        return node.exc.args[0], False
    if not isinstance(node, ast.Call) or not node.args:
        return None
    func = node.func
    if isinstance(func, ast.Attribute) and func.attr in LOG_METHODS:
        return node.args[0], len(node.args) > 1
    if isinstance(func, ast.Name) and func.id in RANK0_HELPERS and len(node.args) > 1:
        return node.args[1], False
    return None


def log_formats(release: Path, paths: Iterable[str]) -> list[LogFormat]:
    """The message formats of every logger call and raise in the given files (those that exist) of a release."""
    found: list[LogFormat] = []
    for rel in paths:
        source = release / "sglang" / rel
        if not source.is_file():
            continue
        for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
            message = _message_arg(node)
            if message is None:
                continue
            parts = _parts(*message)
            if parts:
                found.append(LogFormat(rel, getattr(node, "lineno", 0), tuple(p for p in parts if p != "")))
    return found


def render(fmt: LogFormat, samples: Mapping[str, str] | None = None, default: str = "7") -> str:
    """The message with each placeholder replaced by its sample (by expression text) or `default`."""
    samples = samples or {}
    return "".join(p if isinstance(p, str) else samples.get(p.expr, default) for p in fmt.parts)


def find_format(release: Path, paths: Iterable[str], contains: str) -> LogFormat:
    """The one format in those files whose literal text contains `contains` (a test fixture helper)."""
    hits = [f for f in log_formats(release, paths) if contains in f.text]
    if not hits:
        raise AssertionError(f"no log format containing {contains!r} in {release.name}: {list(paths)}")
    return hits[0]


def _annotated_names(cls: ast.ClassDef) -> list[str]:
    return [s.target.id for s in cls.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)]


def server_args_fields(release: Path) -> frozenset[str]:
    """The ServerArgs field names of a release (the top-level keys of its /server_info)."""
    srt = release / "sglang" / "srt"
    module = ast.parse((srt / "server_args.py").read_text(encoding="utf-8"))
    classes = {n.name: n for n in ast.walk(module) if isinstance(n, ast.ClassDef)}
    names = _annotated_names(classes["ServerArgs"]) if "ServerArgs" in classes else []
    if names:
        return frozenset(n for n in names if not n.startswith("_"))
    wanted: list[str] = []
    for node in ast.walk(module):
        if (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "_INPUT_NAMESPACES" for t in node.targets)
            and isinstance(node.value, ast.List)
        ):
            wanted = [e.id for e in node.value.elts if isinstance(e, ast.Name)]
    if not wanted:
        raise AssertionError(f"{release.name}: ServerArgs has no fields and no _INPUT_NAMESPACES")
    fields: set[str] = set()
    for path in sorted((srt / "arg_groups" / "fields").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and node.name in wanted:
                fields.update(n for n in _annotated_names(node) if not n.startswith("_"))
    return frozenset(fields)
