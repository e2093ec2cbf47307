"""Which engine serves the URL, and what it says about itself: one `ServerFacts`, read before any load.

Asked in order, each GET bounded from connect to the last byte (--info-timeout); a 404/501 moves on, a stall or a
refused connection is an HttpError naming the URL:
- SGLang: `/get_server_info`, else `/server_info` (flat keys: `speculative_algorithm`, `speculative_num_steps`),
  and whether `/metrics` answers (`--enable-metrics`).
- llama.cpp: `/props` (`build_info`, `model_path`, `total_slots`) and `/slots` (`speculative: true|false` per slot,
  `params["speculative.types"]`). The draft length is in neither; it is the number of
  `llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position=...}` series in `/metrics` (present once a
  speculative request has finished).
- vLLM: `/version`, and `/metrics` with `vllm:` names.
- every engine: whether `/v1/models` answers (OpenAI-compatible routes), and its first model id.
Unknown stays unknown: `speculative` is None, never False, when the server did not say.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from sm120check.aio import within
from sm120check.bench.http import Connection, Endpoint, HttpError
from sm120check.bench.metrics import MetricsError, Scrape, draft_positions, family_for, parse
from sm120check.sglang.allreduce_backend import Backend, BackendEvidence, combine, from_server_info

_SGLANG_KEYS = (
    "model_path",
    "version",
    "tp_size",
    "speculative_algorithm",
    "speculative_draft_model_path",
    "speculative_num_steps",
    "speculative_eagle_topk",
    "speculative_num_draft_tokens",
    "speculative_adaptive",
    "enable_flashinfer_allreduce_fusion",
    "enable_torch_symm_mem",
    "max_running_requests",
    "sim_model",
)
_MISSING = (404, 405, 501)  # the route is not there: ask the next one


@dataclass(frozen=True)
class ServerFacts:
    """What the server at the URL said about itself; None where it did not say."""

    engine: str = "unknown"  # "sglang" | "vllm" | "llama.cpp" | "unknown"
    model: str = ""
    version: str = ""
    speculative: bool | None = None
    speculative_num_steps: int | None = None  # draft tokens per verify step
    speculative_algorithm: str | None = None  # recorded only when `speculative` is known
    openai_models: bool | None = None  # /v1/models answered (None: not asked)
    first_model_id: str = ""
    has_metrics: bool = False
    sglang_info: bool = False  # /get_server_info or /server_info answered
    accept_length_cumulative: float | None = None  # SGLang avg_spec_accept_length: since server start
    accept_problem: str = ""  # why a reported cumulative accept length is not used
    raw: Mapping[str, object] = field(default_factory=dict)  # the server's own keys, as recorded
    allreduce_backend: str = "unknown"  # sglang/allreduce_backend.py's Backend: pcie-ipc, default, none, unknown
    allreduce_reason: str = ""  # where that came from

    def to_record(self) -> dict[str, object]:
        """`meta.server` of every record: the raw keys plus the normalized ones (`speculative_algorithm` only when
        known, so a reader never takes an unknown for "off")."""
        out: dict[str, object] = dict(self.raw)
        out.update(engine=self.engine, speculative=self.speculative, speculative_num_steps=self.speculative_num_steps)
        if self.speculative is not None or "speculative_algorithm" in self.raw:
            out["speculative_algorithm"] = self.speculative_algorithm
        else:
            out.pop("speculative_algorithm", None)
        if self.version and "version" not in out:
            out["version"] = self.version
        out.update(allreduce_backend=self.allreduce_backend, allreduce_backend_reason=self.allreduce_reason)
        return out

    def with_log(self, log: BackendEvidence) -> ServerFacts:
        """Facts with the backend the server's own log shows, where server_info left it open."""
        if not self.sglang_info:
            return self
        backend, reason = combine((Backend(self.allreduce_backend), self.allreduce_reason), log)
        return replace(self, allreduce_backend=backend.value, allreduce_reason=reason)

    def with_scrape(self, scrape: Scrape) -> ServerFacts:
        """Facts that a later /metrics page can add: the draft length once a speculative request has finished."""
        family = family_for(self.engine)
        if family is None or self.speculative_num_steps is not None:
            return self
        steps = draft_positions(family, scrape)
        if steps is None:
            return self
        speculative = True if self.speculative is None else self.speculative
        return replace(self, speculative_num_steps=steps, speculative=speculative)


class _Missing(HttpError):
    """The route answered 404/405/501."""


MAX_INFO_BYTES = 4 << 20  # a server-info, props or models body (SGLang 0.5.16's /server_info is 35 KiB)


async def bounded_get(conn: Connection, path: str, timeout: float, limit: int = MAX_INFO_BYTES) -> tuple[int, bytes]:
    """GET path, bounded from connect to the last body byte and to `limit` bytes: a stalled server or an endless
    body is an HttpError naming the URL."""

    async def get() -> tuple[int, bytes]:
        response = await conn.request("GET", path)
        body = bytearray()
        async for part in response.iter_body():
            body += part
            if len(body) > limit:
                await conn.close()
                raise HttpError(f"GET {conn.endpoint}{path}: larger than {limit} bytes; not read further")
        return response.status, bytes(body)

    try:
        return await within(get(), timeout)
    except asyncio.TimeoutError:
        await conn.close()
        raise HttpError(
            f"GET {conn.endpoint}{path}: no complete response within {timeout:g} s (the server stalled; "
            "--info-timeout sets the limit)"
        ) from None


async def bounded_get_json(conn: Connection, path: str, timeout: float) -> object:
    status, body = await bounded_get(conn, path, timeout)
    if status in _MISSING:
        raise _Missing(f"GET {conn.endpoint}{path}: HTTP {status}")
    if status != 200:
        raise HttpError(f"GET {conn.endpoint}{path}: HTTP {status}")
    try:
        return json.loads(body)
    except (ValueError, RecursionError):
        raise HttpError(f"GET {conn.endpoint}{path}: response is not JSON: {body[:120]!r}") from None


async def fetch_sglang_info(endpoint: Endpoint, headers: dict[str, str], timeout: float = 30.0) -> dict[str, object]:
    """SGLang's /get_server_info (or /server_info); {} for servers without it."""
    conn = Connection(endpoint, headers, connect_timeout=min(timeout, 10.0))
    try:
        for path in ("/get_server_info", "/server_info"):
            try:
                info = await bounded_get_json(conn, path, timeout)
            except _Missing:
                continue
            if isinstance(info, dict):
                return {str(k): v for k, v in info.items()}
        return {}
    finally:
        await conn.close()


async def scrape_metrics(endpoint: Endpoint, headers: dict[str, str], timeout: float = 30.0) -> Scrape | None:
    """One /metrics page; None when the server has none (404) or it cannot be read (the reason is not fatal)."""
    conn = Connection(endpoint, headers, connect_timeout=min(timeout, 10.0))
    try:
        status, body = await bounded_get(conn, "/metrics", timeout)
    finally:
        await conn.close()
    if status != 200:
        return None
    try:
        return parse(body)
    except MetricsError:
        return None


async def discover(
    endpoint: Endpoint, headers: dict[str, str], timeout: float = 30.0, sglang_info: dict[str, object] | None = None
) -> ServerFacts:
    """Ask the server what it is (see the module docstring); `sglang_info` is /get_server_info when already read."""
    info = sglang_info if sglang_info is not None else await fetch_sglang_info(endpoint, headers, timeout)
    conn = Connection(endpoint, headers, connect_timeout=min(timeout, 10.0))
    try:
        openai, first_id = await _models(conn, timeout)
        if info:
            scrape = await scrape_metrics(endpoint, headers, timeout)  # served with --enable-metrics
            return replace(_sglang(info, openai, first_id), has_metrics=scrape is not None)
        props = await _json_or_none(conn, "/props", timeout)
        if isinstance(props, dict) and ("build_info" in props or "default_generation_settings" in props):
            slots = await _json_or_none(conn, "/slots", timeout)
            scrape = await scrape_metrics(endpoint, headers, timeout)
            return _llamacpp(props, slots, scrape, openai, first_id)
        version = await _json_or_none(conn, "/version", timeout)
        scrape = await scrape_metrics(endpoint, headers, timeout)
        if scrape is not None and scrape.has_prefix("vllm:"):
            return _vllm(version, scrape, openai, first_id)
        return ServerFacts(openai_models=openai, first_model_id=first_id, has_metrics=scrape is not None)
    finally:
        await conn.close()


async def _json_or_none(conn: Connection, path: str, timeout: float) -> object:
    try:
        return await bounded_get_json(conn, path, timeout)
    except _Missing:
        return None
    except HttpError as exc:
        if "stalled" in str(exc) or "cannot connect" in str(exc):
            raise
        return None  # an error status or a body that is not JSON: this route says nothing


async def _models(conn: Connection, timeout: float) -> tuple[bool, str]:
    data = await _json_or_none(conn, "/v1/models", timeout)
    if not isinstance(data, dict):
        return False, ""
    models = data.get("data")
    if isinstance(models, list) and models and isinstance(models[0], dict) and "id" in models[0]:
        return True, str(models[0]["id"])
    return True, ""


def _sglang(info: dict[str, object], openai: bool, first_id: str) -> ServerFacts:
    raw = {k: info[k] for k in _SGLANG_KEYS if k in info}
    algo = info.get("speculative_algorithm")
    steps = info.get("speculative_num_steps")
    speculative: bool | None = None
    if "speculative_algorithm" in info:
        speculative = algo is not None and str(algo).upper() not in ("", "NONE")
    accept, problem = cumulative_accept(info)
    backend, reason = from_server_info(info)
    return ServerFacts(
        engine="sglang",
        model=str(info.get("model_path", "")),
        version=str(info.get("version", "")),
        speculative=speculative,
        speculative_num_steps=_whole(steps) if speculative is not False else None,
        speculative_algorithm=str(algo) if speculative else None,
        openai_models=openai,
        first_model_id=first_id,
        sglang_info=True,
        accept_length_cumulative=accept,
        accept_problem=problem,
        raw=raw,
        allreduce_backend=backend.value,
        allreduce_reason=reason,
    )


def _llamacpp(props: dict[str, object], slots: object, scrape: Scrape | None, openai: bool, first: str) -> ServerFacts:
    raw: dict[str, object] = {k: props[k] for k in ("model_path", "build_info", "total_slots") if k in props}
    speculative: bool | None = None
    types = ""
    if isinstance(slots, list) and slots and isinstance(slots[0], dict):
        flag = slots[0].get("speculative")
        speculative = flag if isinstance(flag, bool) else None
        params = slots[0].get("params")
        if isinstance(params, dict) and isinstance(params.get("speculative.types"), str):
            types = str(params["speculative.types"])
            raw["speculative.types"] = types
    used = [t for t in types.split(",") if t.strip() and t.strip() != "none"]
    facts = ServerFacts(
        engine="llama.cpp",
        model=str(props.get("model_alias") or props.get("model_path") or ""),
        version=str(props.get("build_info", "")),
        speculative=speculative,
        speculative_algorithm=(",".join(used) or "draft") if speculative else None,
        openai_models=openai,
        first_model_id=first,
        has_metrics=scrape is not None,
        raw=raw,
    )
    return facts.with_scrape(scrape) if scrape is not None else facts


def _vllm(version: object, scrape: Scrape, openai: bool, first_id: str) -> ServerFacts:
    text = str(version.get("version", "")) if isinstance(version, dict) else ""
    family = family_for("vllm")
    assert family is not None
    speculative = True if scrape.value(family.steps) is not None else None
    facts = ServerFacts(
        engine="vllm",
        model=first_id,
        version=text,
        speculative=speculative,
        speculative_algorithm="vllm" if speculative else None,
        openai_models=openai,
        first_model_id=first_id,
        has_metrics=True,
        raw={"version": text} if text else {},
    )
    return facts.with_scrape(scrape)


def _whole(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def cumulative_accept(info: Mapping[str, object]) -> tuple[float | None, str]:
    """avg_spec_accept_length as /get_server_info reports it (since server start), and why it cannot be used."""
    states = info.get("internal_states")
    candidates: list[object] = []
    if isinstance(states, list) and states and isinstance(states[0], dict):
        candidates.append(states[0].get("avg_spec_accept_length"))
    candidates.append(info.get("avg_spec_accept_length"))
    problem = ""
    for value in candidates:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if not math.isfinite(value) or value < 0:
            problem = problem or f"the server reported avg_spec_accept_length {value}, which cannot be true"
            continue
        if value > 0:
            return float(value), problem
    return None, problem
