"""The `pcie_p2p` role's fact file, /var/lib/sm120kit/pcie-p2p.json: what it changed and whether a reboot is due.

Schema 1, exactly these keys (the role writes it, the doctor reads it; no other key is allowed):
    {"schema": 1, "reboot_required": bool, "changes": [str, ...], "kernel_params": [str, ...],
     "acs_bridges": [str, ...], "written_at": "ISO-8601"}
Read strictly: bounded, a regular file only, JSON, every field of its type; an error names the file and the field.
A missing file is not an error: the node was not provisioned by pcie_p2p.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from dataclasses import dataclass
from pathlib import Path

from sm120check.bounded import Unreadable, read_text

DEFAULT_PATH = Path("/var/lib/sm120kit/pcie-p2p.json")
SCHEMA = 1
MAX_BYTES = 64 << 10
MAX_ITEMS = 256
MAX_ITEM_CHARS = 512
KEYS = ("schema", "reboot_required", "changes", "kernel_params", "acs_bridges", "written_at")


class FactError(ValueError):
    """The fact file does not fit schema 1 (the message names the field)."""


@dataclass(frozen=True)
class PcieP2pFact:
    reboot_required: bool
    changes: tuple[str, ...]
    kernel_params: tuple[str, ...]
    acs_bridges: tuple[str, ...]
    written_at: str

    def to_json(self) -> dict[str, object]:
        return {
            "schema": SCHEMA,
            "reboot_required": self.reboot_required,
            "changes": list(self.changes),
            "kernel_params": list(self.kernel_params),
            "acs_bridges": list(self.acs_bridges),
            "written_at": self.written_at,
        }

    @classmethod
    def from_json(cls, data: object) -> PcieP2pFact:
        if not isinstance(data, dict):
            raise FactError(f"the document is a JSON {type(data).__name__}, not an object")
        unknown = sorted(str(k) for k in data if k not in KEYS)
        if unknown:
            raise FactError(f"unknown field(s) {', '.join(unknown)}")
        missing = [k for k in KEYS if k not in data]
        if missing:
            raise FactError(f"field {missing[0]} is missing")
        schema = data["schema"]
        if type(schema) is not int or schema != SCHEMA:
            raise FactError(f"field schema is {schema!r}, this doctor reads schema {SCHEMA}")
        if type(data["reboot_required"]) is not bool:
            raise FactError("field reboot_required is not a boolean")
        written = data["written_at"]
        if not isinstance(written, str) or not _iso8601(written):
            raise FactError(f"field written_at is not an ISO-8601 time: {str(written)[:64]!r}")
        return cls(
            data["reboot_required"],
            _strings(data, "changes"),
            _strings(data, "kernel_params"),
            _strings(data, "acs_bridges"),
            written,
        )


def _strings(data: dict[str, object], key: str) -> tuple[str, ...]:
    value = data[key]
    if not isinstance(value, list):
        raise FactError(f"field {key} is not a list")
    if len(value) > MAX_ITEMS:
        raise FactError(f"field {key} has more than {MAX_ITEMS} items")
    for index, item in enumerate(value):
        if not isinstance(item, str):
            raise FactError(f"field {key}[{index}] is not a string")
        if len(item) > MAX_ITEM_CHARS:
            raise FactError(f"field {key}[{index}] is longer than {MAX_ITEM_CHARS} characters")
    return tuple(value)


def _iso8601(text: str) -> bool:
    if len(text) > 40:
        return False
    try:
        dt.datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith("Z") else text)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class FactRead:
    """The fact file as read: `fact` when valid; `missing` when there is none (not provisioned by pcie_p2p);
    else `error` naming the file and the field."""

    path: str
    fact: PcieP2pFact | None = None
    missing: bool = False
    error: str = ""

    def to_json(self) -> dict[str, object]:
        return {
            "path": self.path,
            "fact": self.fact.to_json() if self.fact else None,
            "missing": self.missing,
            "error": self.error,
        }


def read(path: Path = DEFAULT_PATH) -> FactRead:
    try:
        os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return FactRead(str(path), missing=True)
    except OSError as exc:
        return FactRead(str(path), error=f"{path}: {exc.strerror or exc}")
    try:
        text = read_text(path, MAX_BYTES)
    except Unreadable as exc:
        return FactRead(str(path), error=str(exc))
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        return FactRead(str(path), error=f"{path}: not JSON ({exc})"[:300])
    try:
        return FactRead(str(path), PcieP2pFact.from_json(data))
    except FactError as exc:
        return FactRead(str(path), error=f"{path}: {exc}")
