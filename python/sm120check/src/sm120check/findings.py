"""The findings table: each measured claim the code relies on, once, with its numbers, versions, machine and record.

The claims live in findings.json (package data); a message or docstring cites one as "see finding <id>", and a number
printed to users is formatted from the finding's `numbers`. docs/findings.md explains how to add one.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from types import MappingProxyType
from typing import Any

FIELDS = ("id", "claim", "numbers", "versions", "machine", "record")
RECORD_PREFIX = "docs/validation/"


class FindingsError(ValueError):
    """findings.json is malformed (the message names the entry and the field)."""


@dataclass(frozen=True)
class Finding:
    id: str  # short kebab-case name, cited as "finding <id>"
    claim: str  # what was measured, in one or a few sentences
    numbers: Mapping[str, Any]  # the figures code formats from: name -> number or list of numbers
    versions: Mapping[str, str]  # the software measured: name -> release
    machine: str  # what it ran on, as the record names it
    record: str  # the docs/validation/ record that holds the run

    def cite(self) -> str:
        """`finding <id>, <record>`: the citation a message carries."""
        return f"finding {self.id}, {self.record}"


def _number(value: object) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, (int, float)):
        return True
    return isinstance(value, list) and bool(value) and all(_number(v) and not isinstance(v, list) for v in value)


def parse(document: object) -> dict[str, Finding]:
    """The findings of a decoded findings.json, by id; FindingsError on anything unexpected."""
    if not isinstance(document, dict) or set(document) != {"findings"} or not isinstance(document["findings"], list):
        raise FindingsError('findings.json: expected an object with one key, "findings", holding a list')
    table: dict[str, Finding] = {}
    for index, entry in enumerate(document["findings"]):
        where = f"findings.json entry {index}"
        if not isinstance(entry, dict):
            raise FindingsError(f"{where}: not an object")
        if isinstance(entry.get("id"), str):
            where = f"finding {entry['id']}"
        unknown = sorted(set(entry) - set(FIELDS))
        missing = [f for f in FIELDS if f not in entry]
        if unknown or missing:
            raise FindingsError(f"{where}: unknown keys {unknown}, missing keys {missing}")
        for name in ("id", "claim", "machine", "record"):
            if not isinstance(entry[name], str) or not entry[name].strip():
                raise FindingsError(f"{where}: {name} must be a non-empty string")
        if not all(part.isalnum() and part == part.lower() for part in entry["id"].split("-")):
            raise FindingsError(f"{where}: id must be kebab-case (lower-case words joined by '-')")
        if not entry["record"].startswith(RECORD_PREFIX):
            raise FindingsError(f"{where}: record must be a path under {RECORD_PREFIX}")
        numbers, versions = entry["numbers"], entry["versions"]
        if not isinstance(numbers, dict) or not all(_number(v) for v in numbers.values()):
            raise FindingsError(f"{where}: numbers must map names to numbers or lists of numbers")
        if not isinstance(versions, dict) or not all(isinstance(v, str) for v in versions.values()):
            raise FindingsError(f"{where}: versions must map names to release strings")
        if entry["id"] in table:
            raise FindingsError(f"{where}: duplicate id")
        table[entry["id"]] = Finding(
            entry["id"],
            entry["claim"],
            MappingProxyType(dict(numbers)),
            MappingProxyType(dict(versions)),
            entry["machine"],
            entry["record"],
        )
    return table


@cache
def table() -> Mapping[str, Finding]:
    """Every finding in the packaged findings.json, by id (read once)."""
    text = resources.files("sm120check").joinpath("findings.json").read_text(encoding="utf-8")
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        raise FindingsError(f"findings.json: not JSON: {error}") from error
    return MappingProxyType(parse(document))


def get(finding_id: str) -> Finding:
    """The finding `finding_id`; KeyError naming it when the table has no such finding."""
    try:
        return table()[finding_id]
    except KeyError:
        raise KeyError(f"no finding {finding_id!r} in findings.json") from None
