"""Which server answered: the identity a server gives of itself, read at the start and the end of every level.

SGLang's /server_info (or /get_server_info) carries its launch arguments, its version and `random_seed`, which it
draws at every start unless --random-seed was given: two starts of one launch command differ there. llama.cpp's
/props carries its build, model path and slot count. A `pid` or `start_time`, where a server gives one, is kept too.
A sweep whose server changed between or during levels measured two servers: the bench flags it and `crossover`
refuses it.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypeGuard

from sm120check.bench.engines import bounded_get
from sm120check.bench.http import Connection, Endpoint, HttpError
from sm120check.bench.records import LevelSummary, RecordError

MAX_VALUE_CHARS = 300
CHANGED = "server_changed"  # level flag: the identity changed during this level or since the previous level's end
SWEEP_CHANGED = "sweep_server_changed"  # level flag: the server is not the one this sweep started with
META = "server_identity"  # the record's {"start": identity|null, "end": identity|null}

# What names one server start: start markers first, then the launch (the order a message shows them in)
SGLANG_KEYS = (
    "pid",
    "start_time",
    "random_seed",
    "version",
    "model_path",
    "served_model_name",
    "tp_size",
    "port",
    "speculative_algorithm",
    "speculative_draft_model_path",
    "speculative_num_steps",
    "speculative_num_draft_tokens",
    "speculative_adaptive",
    "disable_cuda_graph",
    "max_running_requests",
    "max_total_num_tokens",
)
LLAMACPP_KEYS = ("pid", "start_time", "build_info", "model_path", "model_alias", "total_slots")
_ROUTES = {"sglang": ("/server_info", "/get_server_info"), "llama.cpp": ("/props",)}
_KEYS = {"sglang": SGLANG_KEYS, "llama.cpp": LLAMACPP_KEYS}

Scalar = str | int | float | bool | None


@dataclass(frozen=True)
class ServerIdentity:
    """What a server said about itself that names one start of it: (key, value) pairs of scalars, in key order."""

    engine: str
    fields: tuple[tuple[str, Scalar], ...]

    def to_json(self) -> dict[str, object]:
        return {"engine": self.engine, "fields": dict(self.fields)}

    @classmethod
    def from_json(cls, data: object, where: str) -> ServerIdentity:
        """Strict: a record from elsewhere gets a RecordError naming the field."""
        if not isinstance(data, Mapping) or not isinstance(data.get("engine"), str):
            raise RecordError(f"{where}: a server identity must be an object with an engine name, not {data!r:.80}")
        engine = str(data["engine"])
        if engine not in _KEYS:
            raise RecordError(f"{where}: server identity engine {engine!r:.40} is none of {', '.join(_KEYS)}")
        fields = data.get("fields")
        if not isinstance(fields, Mapping):
            raise RecordError(f"{where}: server identity fields must be an object, not {fields!r:.80}")
        known = _KEYS[engine]
        for key, value in fields.items():
            if key not in known or not _scalar(value):
                raise RecordError(f"{where}: server identity field {key!r:.40}={value!r:.60} is not one it records")
        return cls(engine, tuple((k, fields[k]) for k in known if k in fields))

    def changes(self, other: ServerIdentity) -> tuple[str, ...]:
        """The keys whose values differ (a key one side lacks counts), the engine first."""
        if self.engine != other.engine:
            return ("engine",)
        mine, theirs = dict(self.fields), dict(other.fields)
        return tuple(k for k in _KEYS[self.engine] if (k in mine or k in theirs) and mine.get(k) != theirs.get(k))

    def describe(self, keys: Sequence[str] = ()) -> str:
        """One line: the engine and the named keys (every key when none are named)."""
        shown = [(k, v) for k, v in self.fields if not keys or k in keys]
        missing = [k for k in keys if k not in dict(self.fields) and k != "engine"]
        parts = [f"{k}={json.dumps(v)}" for k, v in shown] + [f"{k} absent" for k in missing]
        return f"{self.engine} " + (", ".join(parts) or "(no fields)")


def _scalar(value: object) -> TypeGuard[Scalar]:
    if isinstance(value, float):
        return math.isfinite(value)
    return value is None or isinstance(value, (str, int, bool))


def identity_from(engine: str, info: Mapping[str, object]) -> ServerIdentity | None:
    """The identity in a server's self-description (None when the engine gives none, or the answer names nothing)."""
    keys = _KEYS.get(engine)
    if keys is None:
        return None
    fields: list[tuple[str, Scalar]] = []
    for key in keys:
        value = info.get(key)
        if key in info and _scalar(value):
            fields.append((key, value[:MAX_VALUE_CHARS] if isinstance(value, str) else value))
    return ServerIdentity(engine, tuple(fields)) if fields else None


async def fetch_identity(
    endpoint: Endpoint, headers: Mapping[str, str], engine: str, timeout: float
) -> ServerIdentity | None:
    """GET the engine's self-description, bounded in time (connect to last byte) and in bytes; None for an engine
    that gives none or a route it does not have. A stall or a refused connection is an HttpError."""
    routes = _ROUTES.get(engine, ())
    conn = Connection(endpoint, dict(headers), connect_timeout=min(timeout, 10.0))
    try:
        for path in routes:
            status, body = await bounded_get(conn, path, timeout)
            if status in (404, 405, 501):
                continue
            if status != 200:
                raise HttpError(f"GET {endpoint}{path}: HTTP {status} (the server's identity)")
            try:
                data = json.loads(body)
            except (ValueError, RecursionError):
                raise HttpError(f"GET {endpoint}{path}: not JSON: {body[:120]!r}") from None
            return identity_from(engine, data) if isinstance(data, dict) else None
        return None
    finally:
        await conn.close()


@dataclass(frozen=True)
class LevelIdentity:
    """The server's identity at a level's start and end, as the record keeps it."""

    start: ServerIdentity | None
    end: ServerIdentity | None

    def to_json(self) -> dict[str, object]:
        return {
            "start": None if self.start is None else self.start.to_json(),
            "end": None if self.end is None else self.end.to_json(),
        }

    @classmethod
    def of(cls, record: LevelSummary, where: str) -> LevelIdentity | None:
        """The identity a record carries (None for records written before it was recorded)."""
        raw = record.meta.get(META)
        if raw is None:
            return None
        if not isinstance(raw, Mapping):
            raise RecordError(f"{where}: field {META!r} must be an object with start and end, not {raw!r:.80}")
        start, end = raw.get("start"), raw.get("end")
        return cls(
            None if start is None else ServerIdentity.from_json(start, f"{where}: {META}.start"),
            None if end is None else ServerIdentity.from_json(end, f"{where}: {META}.end"),
        )


def change_message(before: ServerIdentity, after: ServerIdentity, where: str) -> str:
    """One line naming both identities by the keys that differ."""
    keys = before.changes(after)
    return f"the server changed {where}: {before.describe(keys)} -> {after.describe(keys)}"


def level_name(record: LevelSummary) -> str:
    return (
        f"rate {record.request_rate:g}/s"
        if record.mode == "open" and record.request_rate
        else f"C={record.concurrency}"
    )


def refuse_changed_server(records: Sequence[LevelSummary], name: str) -> None:
    """Raise RecordError naming the level and both identities when a sweep's server changed: a level the bench
    flagged, or two levels of one run (run_id) whose identities differ."""
    first: dict[str, ServerIdentity] = {}  # run_id -> the identity its first level saw
    for index, record in enumerate(records, 1):
        where = f"{name} record {index} ({level_name(record)})"
        identity = LevelIdentity.of(record, where)
        flagged = CHANGED in record.flags or SWEEP_CHANGED in record.flags
        seen = [i for i in (identity.start, identity.end) if i is not None] if identity else []
        if record.run_id in first:
            seen.insert(0, first[record.run_id])
        elif seen:
            first[record.run_id] = seen[0]
        if flagged:
            warning = next((w for w in record.warnings if w.startswith("the server changed")), "")
            raise RecordError(
                f"{where}: the bench flagged a server change ({warning or 'flag ' + CHANGED}); measure the sweep "
                "again against one server"
            )
        for a, b in itertools.pairwise(seen):
            if a.changes(b):
                level = f"at {level_name(record)} (record {index}) of {name}"
                raise RecordError(
                    f"{change_message(a, b, level)}; its numbers mix two servers: measure the sweep again against "
                    "one server (stop whatever else holds the port)"
                )
