"""Text positions from `ast` nodes, and insertions at them, so patches anchor on names instead of line numbers."""

from __future__ import annotations

import ast
import io
import tokenize
from dataclasses import dataclass

MARK = "# sm120kit"  # every line sm120check adds or edits carries this, so a reader can find them


@dataclass(frozen=True)
class Insertion:
    offset: int  # character offset into the text
    text: str


class Source:
    """A file's text with conversions from ast (line, UTF-8 byte column) positions to character offsets."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.lines = text.splitlines(keepends=True)
        self._starts: list[int] = []
        total = 0
        for line in self.lines:
            self._starts.append(total)
            total += len(line)
        self._starts.append(total)

    def offset(self, lineno: int, col_bytes: int) -> int:
        line = self.lines[lineno - 1]
        return self._starts[lineno - 1] + len(line.encode("utf-8")[:col_bytes].decode("utf-8"))

    def start(self, node: ast.expr | ast.stmt) -> int:
        return self.offset(node.lineno, node.col_offset)

    def end(self, node: ast.expr | ast.stmt) -> int:
        assert node.end_lineno is not None and node.end_col_offset is not None
        return self.offset(node.end_lineno, node.end_col_offset)

    def segment(self, node: ast.expr | ast.stmt) -> str:
        return self.text[self.start(node) : self.end(node)]

    def line_start(self, lineno: int) -> int:
        return self._starts[lineno - 1]

    def after_line(self, lineno: int) -> int:
        """Offset of the start of the line after `lineno` (end of text for the last line)."""
        return self._starts[lineno]

    def indent_of(self, lineno: int) -> str:
        line = self.lines[lineno - 1]
        return line[: len(line) - len(line.lstrip(" \t"))]

    def newline(self) -> str:
        return "\r\n" if self.lines and self.lines[0].endswith("\r\n") else "\n"


def apply(text: str, insertions: list[Insertion]) -> str:
    """Apply insertions (and nothing else) from the end backwards so earlier offsets stay valid."""
    for ins in sorted(insertions, key=lambda i: i.offset, reverse=True):
        text = text[: ins.offset] + ins.text + text[ins.offset :]
    return text


def replace(text: str, start: int, end: int, new: str) -> str:
    return text[:start] + new + text[end:]


def _unmarkable(text: str) -> set[int]:
    """Lines that cannot take a trailing comment: they have one, end inside a string, or continue with `\\`."""
    out: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            out.add(tok.start[0])
        elif tok.type == tokenize.STRING and tok.end[0] > tok.start[0]:
            out.update(range(tok.start[0], tok.end[0]))
    out.update(i for i, line in enumerate(text.splitlines(), 1) if line.rstrip().endswith("\\"))
    return out


def mark_lines(text: str, linenos: list[int], note: str) -> str:
    """Append `# sm120kit: note` to each of these lines (1-based) of the edited text, where Python allows it."""
    lines = text.splitlines(keepends=True)
    skip = _unmarkable(text)
    for lineno in sorted(set(linenos) - skip):
        line = lines[lineno - 1]
        body = line.rstrip("\r\n")
        lines[lineno - 1] = f"{body}  {MARK}: {note}{line[len(body) :]}"
    return "".join(lines)


def top_level_names(module: ast.Module) -> set[str]:
    """Names a module binds at top level: imports (first component), functions, classes, plain assignments."""
    names: set[str] = set()
    for node in module.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names
