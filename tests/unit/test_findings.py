"""The findings table (findings.json) loads strictly, its records exist, every cited id is in it, and no docstring,
string or comment in the package carries a run journal (a date, a GPU beside a number, a record path, an issue
number, "one run", a path outside the repository): those belong in the table and in docs/validation/."""

from __future__ import annotations

import ast
import io
import json
import re
import tokenize
from pathlib import Path
from typing import Any

import pytest

from sm120check import findings

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "python/sm120check/src/sm120check"
CITED = re.compile(r"\bfinding ([a-z0-9]+(?:-[a-z0-9]+)+)")

JOURNAL = {
    "a date": re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b(?! \d\d:\d\d)"),  # a log line's timestamp is not a journal
    "a validation record path": re.compile(r"docs/validation/"),
    "an H100/H200 beside a number": re.compile(
        r"\b\d+ ?x ?H[12]00\b|\bH[12]00\b[^.\n]{0,20}?\d|\d[^.\n]{0,20}?\bH[12]00\b|\bthe H[12]00\b"
    ),
    '"one run"': re.compile(r"\bone run\b(?=[,;)])", re.IGNORECASE),  # "(one run, ...)"; not "one run's report"
    "an issue number": re.compile(r"(?<![\w&])(?<!PR )#\d+\b|\bissue #?\d+", re.IGNORECASE),  # upstream PRs cited
    "a path outside the repository": re.compile(r"\.\./shared|/work/"),
    '"Met real hardware"': re.compile(r"\bmet real hardware\b", re.IGNORECASE),
}

OWN = ("findings.py",)  # the table's reader names the record folder it checks


def _sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _texts(path: Path) -> list[tuple[int, str]]:
    """Every string literal (docstrings included) and comment of a module, with its line."""
    source = path.read_text(encoding="utf-8")
    texts = [
        (node.lineno, node.value)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    ]
    texts += [
        (token.start[0], token.string)
        for token in tokenize.generate_tokens(io.StringIO(source).readline)
        if token.type == tokenize.COMMENT
    ]
    return texts


def journal_hits(path: Path) -> list[tuple[int, str, str]]:
    """(line, what kind of journal, the text that matched) for each string or comment of `path` that carries one."""
    hits = []
    for line, text in _texts(path):
        for what, pattern in JOURNAL.items():
            found = pattern.search(text)
            if found:
                hits.append((line, what, found.group(0)))
    return hits


def test_findings_table_loads_strictly() -> None:
    table = findings.table()
    assert table, "findings.json is empty"
    for finding_id, finding in table.items():
        assert finding.id == finding_id
        assert findings.get(finding_id) is finding


def test_every_finding_record_exists_in_the_repository() -> None:
    missing = [f"{f.id}: {f.record}" for f in findings.table().values() if not (ROOT / f.record).is_dir()]
    assert not missing, missing


def test_findings_table_ships_in_the_wheel() -> None:
    pyproject = (ROOT / "python/sm120check/pyproject.toml").read_text(encoding="utf-8")
    assert '"findings.json"' in pyproject


def test_every_cited_finding_exists() -> None:
    table = findings.table()
    unknown = [
        f"{path.relative_to(PACKAGE)}: finding {name}"
        for path in _sources()
        for name in CITED.findall(path.read_text(encoding="utf-8"))
        if name not in table
    ]
    assert not unknown, unknown


def test_no_run_journal_in_the_package() -> None:
    hits = [
        f"{path.relative_to(PACKAGE)}:{line}: {what} ({text!r})"
        for path in _sources()
        if not str(path.relative_to(PACKAGE)).startswith(OWN)
        for line, what, text in journal_hits(path)
    ]
    assert not hits, "cite a finding id instead (findings.json, docs/findings.md):\n" + "\n".join(hits)


def test_journal_scanner_catches_each_kind(tmp_path: Path) -> None:
    module = tmp_path / "journal.py"
    module.write_text(
        '"""Measured on one H200 on 2026-12-02 (one run, docs/validation/x)."""\n'
        "NOTE = 'see issue 33 and #33, notes in ../shared/notes.md; Met real hardware: none'\n"
        "# 2x H100, 16 cores\n",
        encoding="utf-8",
    )
    assert {what for _, what, _ in journal_hits(module)} == set(JOURNAL)


def test_journal_scanner_passes_ordinary_text(tmp_path: Path) -> None:
    module = tmp_path / "plain.py"
    module.write_text(
        '"""Two levels of one run (run_id) differ; see finding sglang-zero-step-verify-cost."""\n'
        "LINE = '[2026-12-01 22:10:40] Decode batch, #running-req: 8'  # a server's own log line\n"
        "FIX = 'until TensorRT-LLM PR #16888 lands (sglang#15650)'\n",
        encoding="utf-8",
    )
    assert journal_hits(module) == []


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda f: f.update(extra=1), "unknown keys ['extra']"),
        (lambda f: f.pop("record"), "missing keys ['record']"),
        (lambda f: f.update(record="../notes.md"), "record must be a path under docs/validation/"),
        (lambda f: f.update(id="Not_Kebab"), "id must be kebab-case"),
        (lambda f: f.update(numbers={"x": "6 %"}), "numbers must map names to numbers"),
        (lambda f: f.update(versions={"sglang": 16}), "versions must map names to release strings"),
    ],
)
def test_malformed_finding_is_refused_with_its_field(change: Any, message: str) -> None:
    entry: dict[str, Any] = {
        "id": "demo-claim",
        "claim": "a claim",
        "numbers": {"x": 1},
        "versions": {},
        "machine": "1x GPU",
        "record": "docs/validation/demo",
    }
    change(entry)
    with pytest.raises(findings.FindingsError, match=re.escape(message)):
        findings.parse({"findings": [entry]})


def test_duplicate_finding_id_is_refused() -> None:
    document = json.loads((PACKAGE / "findings.json").read_text(encoding="utf-8"))
    first = document["findings"][0]
    with pytest.raises(findings.FindingsError, match=f"finding {first['id']}: duplicate id"):
        findings.parse({"findings": [first, dict(first)]})


def test_findings_file_with_other_top_level_keys_is_refused() -> None:
    with pytest.raises(findings.FindingsError, match='one key, "findings"'):
        findings.parse({"findings": [], "notes": "x"})
