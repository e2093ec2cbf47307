"""Node report files for the fleet reader tests: a real doctor report, variants of it, and a run directory."""

from __future__ import annotations

import json
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "fleet" / "fixtures"
REAL = (FIXTURES / "vm-level2.json").read_text(encoding="utf-8")  # a real `sm120check doctor --json` report


def write_nodes(run: Path, files: dict[str, str]) -> Path:
    """`run/nodes/<host>.json` for each host, as `sm120check fleet collect` lays them out."""
    nodes = run / "nodes"
    nodes.mkdir(parents=True)
    for host, text in files.items():
        (nodes / f"{host}.json").write_text(text, encoding="utf-8")
    return run


def real_with(**changes: object) -> str:
    """The real report with top-level fields replaced."""
    return json.dumps(json.loads(REAL) | changes)
