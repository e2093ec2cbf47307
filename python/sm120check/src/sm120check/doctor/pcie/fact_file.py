"""The `pcie_p2p` role's fact file, /var/lib/sm120kit/pcie-p2p.json: what it changed and whether a reboot is due.

Schema 1, exactly these keys (the role writes it, the doctor reads it; no other key is allowed):
    {"schema": 1, "reboot_required": bool, "changes": [str, ...], "kernel_params": [str, ...],
     "acs_bridges": [str, ...], "written_at": "ISO-8601"}
The contract is pcie_p2p.schema.json, shipped beside this module: `read` validates with it (strict_schema.py, the
standard library only), and the tests validate the role's rendered file and hostile files against the same schema
with the `jsonschema` package. Read strictly: bounded, a regular file only, JSON, the schema, then a `written_at`
that is a real time; an error names the file and the field. A missing file is not an error: the node was not
provisioned by pcie_p2p.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from sm120check import strict_schema
from sm120check.bounded import Unreadable, read_text

DEFAULT_PATH = Path("/var/lib/sm120kit/pcie-p2p.json")
SCHEMA = 1
SCHEMA_FILE = "pcie_p2p.schema.json"
MAX_BYTES = 64 << 10
KEYS = ("schema", "reboot_required", "changes", "kernel_params", "acs_bridges", "written_at")


class FactError(ValueError):
    """The fact file does not fit schema 1 (the message names the field)."""


@functools.cache
def schema() -> Mapping[str, object]:
    """pcie_p2p.schema.json as shipped in this package."""
    loaded: dict[str, object] = json.loads(resources.files(__package__).joinpath(SCHEMA_FILE).read_text("utf-8"))
    return loaded


def validate(data: object) -> None:
    """Raise FactError naming the first field of `data` that breaks pcie_p2p.schema.json."""
    if isinstance(data, dict) and "schema" in data and not (type(data["schema"]) is int and data["schema"] == SCHEMA):
        shown = json.dumps(data["schema"])[:64]
        raise FactError(f"field `schema` is {shown}, this doctor reads schema {SCHEMA} (rerun the pcie_p2p role)")
    if not isinstance(data, dict):
        raise FactError(f"the document is a JSON {_json_kind(data)}, not an object")
    try:
        strict_schema.validate(strict_schema.Schema(SCHEMA_FILE, SCHEMA, schema()), data)
    except strict_schema.SchemaViolation as exc:
        raise FactError(str(exc)) from None
    written = str(data["written_at"])
    if not _iso8601(written):
        raise FactError(f"field `written_at` is not a real time: {written!r}")


def _json_kind(data: object) -> str:
    kinds = {list: "list", str: "string", bool: "boolean", int: "number", float: "number", type(None): "null"}
    return kinds.get(type(data), type(data).__name__)


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
        validate(data)
        assert isinstance(data, dict)  # validate() checked it, and every field below
        return cls(
            bool(data["reboot_required"]),
            tuple(data["changes"]),
            tuple(data["kernel_params"]),
            tuple(data["acs_bridges"]),
            str(data["written_at"]),
        )


def _iso8601(text: str) -> bool:
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


class _Duplicate(Exception):
    pass


def _unique(pairs: list[tuple[str, object]]) -> dict[str, object]:
    """A JSON object whose keys are each given once (a second value would silently win)."""
    out: dict[str, object] = {}
    for key, value in pairs:
        if key in out:
            raise _Duplicate(json.dumps(key[:80]))
        out[key] = value
    return out


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
        data = json.loads(text, object_pairs_hook=_unique)
    except _Duplicate as exc:
        return FactRead(str(path), error=f"{path}: key {exc} appears twice; rerun the pcie_p2p role"[:300])
    except (ValueError, RecursionError) as exc:  # ValueError: JSONDecodeError, an integer over 4300 digits
        return FactRead(str(path), error=f"{path}: not JSON ({exc})"[:300])
    try:
        return FactRead(str(path), PcieP2pFact.from_json(data))
    except FactError as exc:
        return FactRead(str(path), error=f"{path}: {exc}")
