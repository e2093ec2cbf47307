"""The typed parts of an SGLang /server_info document that the verify-launch verdicts read."""

from __future__ import annotations

import json
import math
import shlex
from collections.abc import Mapping
from dataclasses import dataclass

from sm120check.sglang.launch_terms import LaunchError, printable

MAX_SERVER_INFO_BYTES = 8 << 20  # a 0.5.23 /server_info is ~40 KiB; anything near this is not a server_info


@dataclass(frozen=True)
class ServerInfo:
    """The parts of a /server_info document the verdicts read; `present` names the fields it carried."""

    present: frozenset[str]
    version: str | None = None
    speculative_algorithm: str | None = None
    speculative_adaptive: bool | None = None
    enable_torch_symm_mem: bool | None = None
    fusion_backend: str | None = None  # flashinfer_allreduce_fusion_backend (0.5.14+)
    enable_fusion: bool | None = None  # enable_flashinfer_allreduce_fusion (before 0.5.14, resolved later)
    enforce_disable_fusion: bool | None = None
    disable_cuda_graph: bool | None = None
    disable_decode_cuda_graph: bool | None = None
    decode_graph_backend: str | None = None  # cuda_graph_config.decode.backend (0.5.14+)
    launch_command: str | None = None
    max_running_requests: int | None = None  # what the server runs at once (SGLang sets 48 for speculation)
    accept_length: float | None = None  # internal_states[0].avg_spec_accept_length
    graph_memory_gb: float | None = None  # internal_states[0].memory_usage.graph (a number, or per phase)


def _where(name: str) -> str:
    return f"server_info field {name!r}"


def _type_name(value: object) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number"
    )


def _bool(doc: Mapping[str, object], name: str) -> bool | None:
    value = doc.get(name)
    if value is None:
        return None
    if not isinstance(value, bool):
        raise LaunchError(f"{_where(name)} is {_type_name(value)} ({_short(value)}), expected true or false")
    return value


def _str(doc: Mapping[str, object], name: str, label: str = "") -> str | None:
    value = doc.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        where = _where(label or name)
        raise LaunchError(f"{where} is {_type_name(value)} ({_short(value)}), expected a string or null")
    return value


def _number(value: object, name: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise LaunchError(f"{_where(name)} is {_type_name(value)} ({_short(value)}), expected a finite number")
    return float(value)


def _count(doc: Mapping[str, object], name: str) -> int | None:
    value = doc.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise LaunchError(f"{_where(name)} is {_type_name(value)} ({_short(value)}), expected a whole number >= 1")
    return value


def _short(value: object) -> str:
    text = json.dumps(value, default=str)
    return printable(text[:60] + ("..." if len(text) > 60 else ""))


def _graph_memory(usage: object) -> float | None:
    name = "internal_states[0].memory_usage"
    if usage is None:
        return None
    if not isinstance(usage, dict):
        raise LaunchError(f"{_where(name)} is {_type_name(usage)}, expected an object")
    graph = usage.get("graph")
    if isinstance(graph, dict):
        return sum(_number(v, f"{name}.graph.{k}") or 0.0 for k, v in graph.items())
    return _number(graph, f"{name}.graph")


def parse_server_info(raw: bytes | str) -> ServerInfo:
    """Read a /server_info body; anything that is not the document SGLang writes raises LaunchError."""
    if len(raw) > MAX_SERVER_INFO_BYTES:
        raise LaunchError(f"server_info is {len(raw)} bytes, more than the {MAX_SERVER_INFO_BYTES} accepted")
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise LaunchError(f"server_info is not JSON ({printable(reason)[:120]})") from None
    if not isinstance(doc, dict):
        raise LaunchError(f"server_info is {_type_name(doc)}, expected an object with the server arguments")
    states = doc.get("internal_states")
    first: Mapping[str, object] = {}
    if states is not None:
        if not isinstance(states, list) or not all(isinstance(s, dict) for s in states):
            raise LaunchError(f"{_where('internal_states')} is {_type_name(states)}, expected an array of objects")
        first = states[0] if states else {}
    graph_config = doc.get("cuda_graph_config")
    decode_backend = None
    if isinstance(graph_config, dict) and isinstance(graph_config.get("decode"), dict):
        decode_backend = _str(graph_config["decode"], "backend", "cuda_graph_config.decode.backend")
    elif graph_config is not None and not isinstance(graph_config, dict):
        raise LaunchError(f"{_where('cuda_graph_config')} is {_type_name(graph_config)}, expected an object or null")
    return ServerInfo(
        present=frozenset(doc),
        version=_str(doc, "version"),
        speculative_algorithm=_str(doc, "speculative_algorithm"),
        speculative_adaptive=_bool(doc, "speculative_adaptive"),
        enable_torch_symm_mem=_bool(doc, "enable_torch_symm_mem"),
        fusion_backend=_str(doc, "flashinfer_allreduce_fusion_backend"),
        enable_fusion=_bool(doc, "enable_flashinfer_allreduce_fusion"),
        enforce_disable_fusion=_bool(doc, "enforce_disable_flashinfer_allreduce_fusion"),
        disable_cuda_graph=_bool(doc, "disable_cuda_graph"),
        disable_decode_cuda_graph=_bool(doc, "disable_decode_cuda_graph"),
        decode_graph_backend=decode_backend,
        launch_command=_launch_command(doc.get("launch_command")),
        max_running_requests=_count(doc, "max_running_requests"),
        accept_length=_number(first.get("avg_spec_accept_length"), "internal_states[0].avg_spec_accept_length"),
        graph_memory_gb=_graph_memory(first.get("memory_usage")),
    )


def _launch_command(value: object) -> str | None:
    """0.5.22+ publishes what the launcher was given: a command string or an argv list."""
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return shlex.join(value)
    raise LaunchError(f"{_where('launch_command')} is {_type_name(value)}, expected a string or an array of strings")
