"""Did the started server run what its launch asked for? Verdicts from the server's log and its /server_info.

SGLang degrades quietly: it logs a warning and carries on when the FlashInfer workspace preflight fails, when torch
symmetric memory turns itself off, when adaptive speculation cannot run, and its server-argument rules switch CUDA
graphs or fusion off before the model loads. This module holds the table of those log lines (taken from the
releases' own source: tests/sglang/test_launch_verify.py checks every row against the releases it names), reads the
typed parts of a /server_info document, and judges each expectation ok, degraded or unknown with the evidence and
the fix. Pure logic: reading files, the journal and HTTP is in launch_cli.py.
"""

from __future__ import annotations

import json
import math
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum

from sm120check.doctor import remedies

SCHEMA = "sm120check.verify-launch/1"
MAX_SERVER_INFO_BYTES = 8 << 20  # a 0.5.23 /server_info is ~40 KiB; anything near this is not a server_info
MAX_LINE_CHARS = 64 << 10  # longer log lines are cut (the server_args line of 0.5.23 is ~25 KiB)
EVIDENCE_CHARS = 400
TABLE_RELEASES = ("0.5.9", "0.5.23")  # the releases the table was read from and is tested against (first, last)


class Expectation(str, Enum):
    FUSION = "fusion"
    SYMM_MEM = "symm-mem"
    SPECULATIVE = "speculative"
    ADAPTIVE = "adaptive"
    CUDA_GRAPH = "cuda-graph"


class Verdict(str, Enum):
    OK = "ok"
    DEGRADED = "degraded"
    UNKNOWN = "unknown"


class Sign(str, Enum):
    DEGRADED = "degraded"  # the feature is off or broken
    CONFIRMED = "confirmed"  # the feature ran
    NOTED = "noted"  # consistent with the request, proves nothing alone (a flag the server accepted)
    START = "start"  # the server (re)started here: earlier lines belong to an earlier run
    READY = "ready"  # the server finished its startup (every startup line is before this one)


class LaunchError(ValueError):
    """An input (launch command, server_info, expectation list) that cannot be used; the message names it."""


# --- the log table -------------------------------------------------------------------------------------------------

_PATCH = (
    f"run `sm120check sglang patch` (role sglang_sm120: `{remedies.tags('sglang_sm120')}`), then restart the server"
)
_SCAN = "run `sm120check sglang scan` to see what keeps this SGLang off SM120"
_FUSION_DOCTOR = "`sm120check doctor --level 3 --select allreduce_fusion` runs the same fusion path outside SGLang"


@dataclass(frozen=True)
class LogPattern:
    """One line SGLang prints: what it means for which expectation, where it lives, and the fix."""

    id: str
    expectation: Expectation | None  # None for START
    sign: Sign
    regex: str  # searched in each line; named groups are reported as details
    meaning: str
    seen: tuple[str, str]  # first and last release (of those read) whose source prints it
    files: tuple[str, ...]  # where it lives in those releases, relative to the sglang package
    fix: str = ""

    @property
    def first(self) -> str:
        return self.seen[0]

    @property
    def last(self) -> str:
        return self.seen[1]

    @property
    def compiled(self) -> re.Pattern[str]:
        return re.compile(self.regex)  # the re module caches it


_FUSION_FILE = ("srt/layers/flashinfer_comm_fusion.py",)
_SYMM_FILE = ("srt/distributed/device_communicators/torch_symm_mem.py",)
_ARGS_FILES = (
    "srt/server_args.py",
    "srt/arg_groups/overrides.py",
    "srt/arg_groups/attention_hook.py",
    "srt/arg_groups/moe_hook.py",
)

LOG_PATTERNS: tuple[LogPattern, ...] = (
    LogPattern(
        id="server-start",
        expectation=None,
        sign=Sign.START,
        regex=r"\bserver_args=",
        meaning="the launcher logged its arguments: a new server run starts at this line",
        seen=("0.5.9", "0.5.23"),
        files=("srt/entrypoints/engine.py",),
    ),
    LogPattern(
        id="server-ready",
        expectation=None,
        sign=Sign.READY,
        regex=r"The server is fired up and ready to roll!",
        meaning="the warmup request passed: the startup of this run is complete",
        seen=("0.5.9", "0.5.23"),
        files=("srt/entrypoints/http_server.py",),
    ),
    LogPattern(
        id="fusion-preflight-probe",
        expectation=Expectation.FUSION,
        sign=Sign.DEGRADED,
        regex=r"FlashInfer workspace preflight probe failed \((?P<error>.*)\)\. Skipping allreduce fusion\.",
        meaning="the workspace preflight (multicast granularity, cuMemCreate probe) raised on this rank: no fusion",
        seen=("0.5.13", "0.5.23"),
        files=_FUSION_FILE,
        fix=f"the preflight asks for multicast granularity, which PCIe GPUs without multicast refuse: {_PATCH}. "
        f"{_FUSION_DOCTOR}",
    ),
    LogPattern(
        id="fusion-preflight-vote",
        expectation=Expectation.FUSION,
        sign=Sign.DEGRADED,
        regex=r"FlashInfer workspace preflight: cuMemCreate probe failed on at least one rank\. Skipping allreduce",
        meaning="the ranks voted: one rank's preflight failed, so every rank skips fusion",
        seen=("0.5.13", "0.5.23"),
        files=_FUSION_FILE,
        fix="the rank whose probe failed logged 'FlashInfer workspace preflight probe failed (...)' with the reason; "
        f"if it is the multicast query: {_PATCH}",
    ),
    LogPattern(
        id="fusion-workspace-failed",
        expectation=Expectation.FUSION,
        sign=Sign.DEGRADED,
        regex=r"Failed to initialize FlashInfer workspace(?: \(backend=[^)]*\))?: (?P<error>.*)\. "
        r"Disabling flashinfer allreduce fusion permanently",
        meaning="FlashInfer raised while creating the allreduce workspace; fusion is off for the life of the server",
        seen=("0.5.10", "0.5.23"),
        files=_FUSION_FILE,
        fix=f"the error is in the line; {_FUSION_DOCTOR} and shows the kernel or IPC failure; SM120 needs "
        f"FlashInfer >= 0.6.17 ({remedies.PYTHON_STACK})",
    ),
    LogPattern(
        id="fusion-disabled-globally",
        expectation=Expectation.FUSION,
        sign=Sign.DEGRADED,
        regex=r"FlashInfer allreduce fusion disabled globally because workspace initialization failed",
        meaning="another rank failed to create its workspace, so all ranks turned fusion off",
        seen=("0.5.13", "0.5.23"),
        files=_FUSION_FILE,
        fix="the failing rank logged 'Failed to initialize FlashInfer workspace' or a preflight line with the reason",
    ),
    LogPattern(
        id="fusion-api-missing",
        expectation=Expectation.FUSION,
        sign=Sign.DEGRADED,
        regex=r"flashinfer\.comm (?:unified allreduce_fusion API |allreduce_fusion API |)is not available",
        meaning="the installed FlashInfer lacks the flashinfer.comm allreduce-fusion API: SGLang uses plain allreduce",
        seen=("0.5.9", "0.5.23"),
        files=_FUSION_FILE,
        fix=f"install the FlashInfer the stack pins ({remedies.PYTHON_STACK}); SM120 needs >= 0.6.17",
    ),
    LogPattern(
        id="fusion-comm-missing",
        expectation=Expectation.FUSION,
        sign=Sign.DEGRADED,
        regex=r"FlashInfer comm not available, skipping workspace initialization",
        meaning="flashinfer.comm did not import, so no fusion workspace was created",
        seen=("0.5.9", "0.5.23"),
        files=_FUSION_FILE,
        fix=f"install the FlashInfer the stack pins ({remedies.PYTHON_STACK}); SM120 needs >= 0.6.17",
    ),
    LogPattern(
        id="fusion-backend-gate",
        expectation=Expectation.FUSION,
        sign=Sign.DEGRADED,
        regex=r"FlashInfer allreduce fusion requires SM90 or SM10X NVIDIA GPUs",
        meaning="the fusion backend resolver refuses GPUs other than SM90/SM10X (the server stops)",
        seen=("0.5.14", "0.5.23"),
        files=_FUSION_FILE,
        fix=f"{_PATCH}; or leave fusion off (sglang_server_allreduce_fusion: off)",
    ),
    LogPattern(
        id="fusion-deterministic",
        expectation=Expectation.FUSION,
        sign=Sign.DEGRADED,
        regex=r"Disable --(?:enable-flashinfer-allreduce-fusion|flashinfer-allreduce-fusion-backend) "
        r"because deterministic inference is enabled",
        meaning="deterministic inference switched fusion off in the server-argument rules",
        seen=("0.5.13", "0.5.23"),
        files=_ARGS_FILES,
        fix="drop --enable-deterministic-inference, or leave fusion off (sglang_server_allreduce_fusion: off)",
    ),
    LogPattern(
        id="fusion-workspace-initialized",
        expectation=Expectation.FUSION,
        sign=Sign.CONFIRMED,
        regex=r"FlashInfer (?:AllReduce Fusion enabled and )?workspace initialized",
        meaning="the fusion workspace exists: the fused allreduce + RMSNorm path runs",
        seen=("0.5.9", "0.5.23"),
        files=_FUSION_FILE,
    ),
    LogPattern(
        id="symm-mem-capability",
        expectation=Expectation.SYMM_MEM,
        sign=Sign.DEGRADED,
        regex=r"TorchSymmMemCommunicator: Device capability (?P<major>\S+) not supported, communicator is not",
        meaning="SGLang's symmetric-memory size map has no entry for this compute-capability major: it is off",
        seen=("0.5.9", "0.5.23"),
        files=_SYMM_FILE,
        fix=f"{_SCAN} (capability maps); {_PATCH}",
    ),
    LogPattern(
        id="symm-mem-world-size",
        expectation=Expectation.SYMM_MEM,
        sign=Sign.DEGRADED,
        regex=r"TorchSymmMemCommunicator: World size (?P<world_size>\S+) not supported, communicator is not",
        meaning="the size map has no entry for this TP size: the communicator is off",
        seen=("0.5.9", "0.5.23"),
        files=_SYMM_FILE,
        fix=f"{_SCAN} (it lists the world sizes of the map); use a TP size it covers, or sglang_server_symm_mem: off",
    ),
    LogPattern(
        id="symm-mem-multicast",
        expectation=Expectation.SYMM_MEM,
        sign=Sign.DEGRADED,
        regex=r"TorchSymmMemCommunicator: torch symmetric memory multicast operations are not supported",
        meaning="the rendezvous gave no multicast address (PCIe): the communicator turned itself off, two-shot too",
        seen=("0.5.9", "0.5.23"),
        files=_SYMM_FILE,
        fix=f"{_SCAN} (multicast early return); {_PATCH}: the patch keeps two-shot, which needs P2P only",
    ),
    LogPattern(
        id="adaptive-disabled",
        expectation=Expectation.ADAPTIVE,
        sign=Sign.DEGRADED,
        regex=r"speculative_adaptive disabled: (?P<reason>.*)\. Falling back to static speculative params",
        meaning="the server-argument rules found adaptive speculation unsupported: static steps run",
        seen=("0.5.13", "0.5.23"),
        files=("srt/arg_groups/speculative_hook.py",),
        fix="the reason is in the line: adaptive needs --speculative-algorithm EAGLE or EAGLE3, "
        "--speculative-eagle-topk 1, no attention DP, no two-batch overlap, no multi-layer EAGLE; change that, "
        "or drop sglang_server_speculative_adaptive_config",
    ),
    LogPattern(
        id="adaptive-initialized",
        expectation=Expectation.ADAPTIVE,
        sign=Sign.CONFIRMED,
        regex=r"AdaptiveSpeculativeParams initialized: steps=(?P<steps>\S+), candidate_steps=(?P<candidates>.*)",
        meaning="the adaptive step controller was built with these candidates",
        seen=("0.5.13", "0.5.23"),
        files=("srt/speculative/adaptive_spec_params.py",),
    ),
    LogPattern(
        id="speculative-draft-graph",
        expectation=Expectation.SPECULATIVE,
        sign=Sign.CONFIRMED,
        regex=r"Capture draft (?:decode )?(?i:cuda graph) end\.",
        meaning="the draft model's CUDA graphs were captured: the speculative worker is up",
        seen=("0.5.9", "0.5.23"),
        files=("srt/speculative/eagle_worker.py", "srt/speculative/eagle_worker_v2.py"),
    ),
    LogPattern(
        id="cuda-graph-disabled",
        expectation=Expectation.CUDA_GRAPH,
        sign=Sign.DEGRADED,
        regex=r"(?i:cuda graph) is disabled because (?P<reason>.*)",
        meaning="the server-argument rules turned CUDA graphs off: decode runs eagerly (speculation pays far less)",
        seen=("0.5.9", "0.5.23"),
        files=_ARGS_FILES,
        fix="the line names the option that turned graphs off (attention backend, deepep normal mode, "
        "--enable-mis): change it",
    ),
    LogPattern(
        id="cuda-graph-capture-failed",
        expectation=Expectation.CUDA_GRAPH,
        sign=Sign.DEGRADED,
        regex=r"Capture cuda graph failed: (?P<error>.*)",
        meaning="capturing the decode CUDA graphs raised (the server stops)",
        seen=("0.5.9", "0.5.23"),
        files=("srt/model_executor/cuda_graph_runner.py", "srt/model_executor/runner/decode_cuda_graph_runner.py"),
        fix="the traceback above the line says where; lower --cuda-graph-max-bs or --mem-fraction-static, or "
        "launch with --disable-cuda-graph to confirm the rest works",
    ),
    LogPattern(
        id="cuda-graph-captured",
        expectation=Expectation.CUDA_GRAPH,
        sign=Sign.CONFIRMED,
        regex=r"Capture (?:target (?:decode|verify) )?(?i:cuda graph) end\.",
        meaning="the target model's decode (or verify) CUDA graphs were captured",
        seen=("0.5.9", "0.5.23"),
        files=(
            "srt/model_executor/model_runner.py",
            "srt/model_executor/model_runner_components/cuda_graph_setup.py",
        ),
    ),
)


# What a complete startup log means when neither a confirming nor a degrading line appears (and server_info confirms
# nothing either): the workspace or controller was never built. Symmetric memory prints no confirmation, so there the
# absence of its disable lines is the confirmation.
_NEVER_RAN: Mapping[Expectation, tuple[str, str]] = {
    Expectation.FUSION: (
        "no FlashInfer workspace was initialized in a complete startup: the fused path never ran (a runtime gate "
        "keeps this GPU or this model out)",
        f"{_SCAN} (fusion gates); {_PATCH}",
    ),
    Expectation.ADAPTIVE: (
        "no 'AdaptiveSpeculativeParams initialized' line in a complete startup: adaptive steps are off",
        "check that --speculative-adaptive-config names a readable JSON file and that SGLang is 0.5.13 or newer",
    ),
}
_SILENT_WHEN_ON = "no TorchSymmMemCommunicator line in a complete startup: the communicator kept itself on"


# --- what the launch asked for -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LaunchRequest:
    expected: tuple[Expectation, ...]
    origin: str  # "--expect", "--launch-command FILE", "server_info launch_command"
    speculative_algorithm: str | None = None
    fusion_backend: str | None = None  # the value given, "legacy flag" for --enable-flashinfer-allreduce-fusion


def parse_expect(text: str) -> tuple[Expectation, ...]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    known = {e.value: e for e in Expectation}
    bad = [n for n in names if n not in known]
    if bad or not names:
        raise LaunchError(
            f"--expect {text!r}: unknown expectation {', '.join(map(repr, bad)) or '(empty)'}; "
            f"choose from {','.join(known)}"
        )
    return tuple(dict.fromkeys(known[n] for n in names))


def _options(argv: Sequence[str]) -> dict[str, str]:
    """`--name value` / `--name=value` / `--flag` -> {name: value or ""}; the last occurrence wins."""
    found: dict[str, str] = {}
    for i, token in enumerate(argv):
        if not token.startswith("--"):
            continue
        name, eq, value = token.partition("=")
        if not eq:
            following = argv[i + 1] if i + 1 < len(argv) else ""
            value = "" if following.startswith("--") else following
        found[name] = value
    return found


def request_from_argv(argv: Sequence[str], origin: str) -> LaunchRequest:
    """What an SGLang launch command line asks for."""
    if not any("sglang" in token for token in argv[:4]):
        raise LaunchError(f"{origin}: {shlex.join(argv[:4])!r}... does not launch SGLang")
    opts = _options(argv)
    algorithm = opts.get("--speculative-algorithm") or None
    if algorithm is not None and algorithm.lower() == "none":
        algorithm = None
    backend = opts.get("--flashinfer-allreduce-fusion-backend") or None
    if backend is None and "--enable-flashinfer-allreduce-fusion" in opts:
        backend = "legacy flag"
    if "--enforce-disable-flashinfer-allreduce-fusion" in opts:
        backend = None
    graphs_off = (
        "--disable-cuda-graph" in opts
        or "--disable-decode-cuda-graph" in opts
        or opts.get("--cuda-graph-backend-decode") == "disabled"
    )
    expected = [Expectation.CUDA_GRAPH] if not graphs_off else []
    if algorithm:
        expected.append(Expectation.SPECULATIVE)
        if "--speculative-adaptive" in opts:
            expected.append(Expectation.ADAPTIVE)
    if backend:
        expected.append(Expectation.FUSION)
    if "--enable-torch-symm-mem" in opts:
        expected.append(Expectation.SYMM_MEM)
    return LaunchRequest(tuple(expected), origin, algorithm, backend)


def request_from_command(text: str, origin: str) -> LaunchRequest:
    """The launch-command.txt the sglang_server role writes: one shell-quoted command line."""
    try:
        argv = shlex.split(text.replace("\\\n", " "), comments=True)
    except ValueError as exc:
        raise LaunchError(f"{origin}: not a shell command line ({exc})") from None
    if not argv:
        raise LaunchError(f"{origin}: empty: no launch command in it")
    return request_from_argv(argv, origin)


# --- /server_info --------------------------------------------------------------------------------------------------


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


# --- the log -------------------------------------------------------------------------------------------------------


def printable(text: str) -> str:
    """Text safe to print: control characters (terminal escapes from a hostile log) shown as escapes."""
    return "".join(c if c.isprintable() or c == "\t" else f"\\x{ord(c):02x}" for c in text)


@dataclass(frozen=True)
class LogMatch:
    pattern: LogPattern
    line: int  # 1-based, in what was read
    text: str
    count: int  # lines matching it since the last start
    details: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class LogScan:
    source: str  # "--log FILE" or "journal of unit NAME"
    lines: int
    truncated: bool  # the read cap cut the beginning off
    start_line: int | None  # the last server-start line; matches are from there on
    starts: int
    ready: bool  # the ready line follows the last start
    matches: tuple[LogMatch, ...]

    @property
    def covers_start(self) -> bool:
        return self.start_line is not None

    def complete(self, server_up: bool) -> bool:
        """The log holds every startup line of this run: its start, and its end (the ready line, or a server that
        answered /server_info before the log was read: it serves only after its startup)."""
        return self.covers_start and (self.ready or server_up)


def scan_log(lines: Iterable[str], source: str, truncated: bool = False) -> LogScan:
    """Match every table pattern against the log; only lines after the last server start count."""
    start = next(p for p in LOG_PATTERNS if p.sign is Sign.START)
    ready_line = next(p for p in LOG_PATTERNS if p.sign is Sign.READY)
    patterns = [p for p in LOG_PATTERNS if p.expectation is not None]
    first: dict[str, LogMatch] = {}
    counts: dict[str, int] = {}
    start_line: int | None = None
    starts = 0
    ready = False
    number = 0
    for number, raw in enumerate(lines, 1):
        line = raw[:MAX_LINE_CHARS]
        if start.compiled.search(line):
            if start_line is None or first or ready:  # the offline Engine logs its arguments twice in a row
                starts += 1
            start_line, ready = number, False
            first.clear()
            counts.clear()
            continue
        if ready_line.compiled.search(line):
            ready = True
            continue
        for pattern in patterns:
            m = pattern.compiled.search(line)
            if m is None:
                continue
            counts[pattern.id] = counts.get(pattern.id, 0) + 1
            if pattern.id not in first:
                details = {k: printable(v)[:200] for k, v in m.groupdict().items() if v is not None}
                first[pattern.id] = LogMatch(pattern, number, printable(line.strip())[:EVIDENCE_CHARS], 0, details)
    matches = tuple(
        LogMatch(m.pattern, m.line, m.text, counts[m.pattern.id], m.details)
        for m in sorted(first.values(), key=lambda m: m.line)
    )
    return LogScan(source, number, truncated, start_line, starts, ready, matches)


# --- verdicts ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Evidence:
    source: str  # "log" or "server_info"
    sign: Sign
    text: str  # the log line or "server_args.field=value"
    fix: str = ""
    pattern: str = ""  # the table row id, for log evidence
    line: int | None = None
    count: int = 1


@dataclass(frozen=True)
class ExpectationVerdict:
    expectation: Expectation
    verdict: Verdict
    summary: str
    evidence: tuple[Evidence, ...]
    fix: str = ""

    @property
    def line(self) -> str:
        """The verdict in one line, with the reason and the fix when degraded (a play's report and failure)."""
        return f"{self.verdict.value} {self.expectation.value}: {self.summary}" + (
            f". Fix: {self.fix}" if self.fix else ""
        )


@dataclass(frozen=True)
class LaunchReport:
    request: LaunchRequest
    verdicts: tuple[ExpectationVerdict, ...]
    version: str | None
    version_origin: str
    url: str | None
    log: LogScan | None
    log_complete: bool  # the log holds every startup line of the judged run
    info: ServerInfo | None
    notes: tuple[str, ...] = ()

    @property
    def degraded(self) -> tuple[ExpectationVerdict, ...]:
        return tuple(v for v in self.verdicts if v.verdict is Verdict.DEGRADED)

    @property
    def unknown(self) -> tuple[ExpectationVerdict, ...]:
        return tuple(v for v in self.verdicts if v.verdict is Verdict.UNKNOWN)


def _field(name: str, value: object) -> str:
    return f"server_args.{name}={json.dumps(value)}"


def _info_evidence(e: Expectation, info: ServerInfo, request: LaunchRequest) -> list[Evidence]:
    judges = {
        Expectation.SPECULATIVE: lambda: _speculative_evidence(info, request),
        Expectation.ADAPTIVE: lambda: _adaptive_evidence(info),
        Expectation.SYMM_MEM: lambda: _symm_evidence(info),
        Expectation.FUSION: lambda: _fusion_evidence(info),
        Expectation.CUDA_GRAPH: lambda: _graph_evidence(info),
    }
    return judges[e]()


def _speculative_evidence(info: ServerInfo, request: LaunchRequest) -> list[Evidence]:
    if "speculative_algorithm" not in info.present:
        return []
    if info.speculative_algorithm is None:
        fix = (
            f"the server runs without speculation although the launch asked for {request.speculative_algorithm}: "
            "restart the unit so it runs the rendered launch command, and check the draft model path"
        )
        return [Evidence("server_info", Sign.DEGRADED, _field("speculative_algorithm", None), fix)]
    accept = "" if info.accept_length is None else f"; avg_spec_accept_length {info.accept_length:.2f}"
    return [
        Evidence("server_info", Sign.CONFIRMED, _field("speculative_algorithm", info.speculative_algorithm) + accept)
    ]


def _adaptive_evidence(info: ServerInfo) -> list[Evidence]:
    if info.speculative_adaptive is None:
        return []
    if info.speculative_adaptive:  # the server-argument rules clear it where adaptive cannot run
        return [Evidence("server_info", Sign.CONFIRMED, _field("speculative_adaptive", True))]
    fix = "SGLang turned adaptive speculation off; its 'speculative_adaptive disabled: ...' log line says why"
    return [Evidence("server_info", Sign.DEGRADED, _field("speculative_adaptive", False), fix)]


def _symm_evidence(info: ServerInfo) -> list[Evidence]:
    if info.enable_torch_symm_mem is None:
        return []
    if info.enable_torch_symm_mem:  # the communicator may still turn itself off: only the log says
        return [Evidence("server_info", Sign.NOTED, _field("enable_torch_symm_mem", True))]
    fix = "the server was not started with --enable-torch-symm-mem: restart the unit so it runs the rendered command"
    return [Evidence("server_info", Sign.DEGRADED, _field("enable_torch_symm_mem", False), fix)]


def _graph_evidence(info: ServerInfo) -> list[Evidence]:
    off = [
        _field(name, True)
        for name, value in (
            ("disable_cuda_graph", info.disable_cuda_graph),
            ("disable_decode_cuda_graph", info.disable_decode_cuda_graph),
        )
        if value
    ]
    if info.decode_graph_backend == "disabled":
        off.append('server_args.cuda_graph_config.decode.backend="disabled"')
    if off:
        fix = (
            "SGLang disabled the decode CUDA graphs; its 'Cuda graph is disabled because ...' log line names the "
            "option (with no such line, an override or a model rule set it)"
        )
        return [Evidence("server_info", Sign.DEGRADED, "; ".join(off), fix)]
    if info.graph_memory_gb:
        text = f"internal_states[0].memory_usage.graph={info.graph_memory_gb:.2f} GB"
        return [Evidence("server_info", Sign.CONFIRMED, text)]
    if info.disable_cuda_graph is False:  # a failed capture stops the server: a live one with graphs on captured them
        return [Evidence("server_info", Sign.CONFIRMED, _field("disable_cuda_graph", False))]
    return []


def _fusion_evidence(info: ServerInfo) -> list[Evidence]:
    fix = (
        "server-argument rules turned fusion off (look for 'Disable --flashinfer-allreduce-fusion-backend because' "
        "in the log), or the unit does not run the rendered launch command"
    )
    if info.enforce_disable_fusion:
        return [
            Evidence("server_info", Sign.DEGRADED, _field("enforce_disable_flashinfer_allreduce_fusion", True), fix)
        ]
    if "flashinfer_allreduce_fusion_backend" in info.present:
        if info.fusion_backend is None and not info.enable_fusion:
            return [Evidence("server_info", Sign.DEGRADED, _field("flashinfer_allreduce_fusion_backend", None), fix)]
        return [Evidence("server_info", Sign.NOTED, _field("flashinfer_allreduce_fusion_backend", info.fusion_backend))]
    if info.enable_fusion is not None:
        # before 0.5.14 the flag is the request; the server-argument rules can clear it
        sign = Sign.NOTED if info.enable_fusion else Sign.DEGRADED
        return [Evidence("server_info", sign, _field("enable_flashinfer_allreduce_fusion", info.enable_fusion), fix)]
    return []


def _log_evidence(e: Expectation, log: LogScan) -> list[Evidence]:
    return [
        Evidence("log", m.pattern.sign, m.text, m.pattern.fix, m.pattern.id, m.line, m.count)
        for m in log.matches
        if m.pattern.expectation is e
    ]


def _silence(e: Expectation, evidence: Sequence[Evidence], complete: bool) -> list[Evidence]:
    """What the absence of every line means in a complete startup log, where nothing else decided."""
    if not complete or any(x.sign in (Sign.DEGRADED, Sign.CONFIRMED) for x in evidence):
        return []
    if e in _NEVER_RAN:
        summary, fix = _NEVER_RAN[e]
        return [Evidence("log", Sign.DEGRADED, summary, fix, f"{e.value}-never-ran")]
    if e is Expectation.SYMM_MEM:
        return [Evidence("log", Sign.CONFIRMED, _SILENT_WHEN_ON, "", "symm-mem-silent")]
    return []


def _unknown_reason(info: ServerInfo | None, log: LogScan | None) -> str:
    missing = [] if info is not None else ["no server_info (pass --url)"]
    if log is None:
        missing.append("no log (pass --log FILE or --journal-unit NAME)")
    elif not log.covers_start:
        cut = "the read cut off its start" if log.truncated else "no 'server_args=' line: log level above info?"
        missing.append(f"the log does not cover this run's startup ({cut})")
    elif not log.complete(info is not None):
        missing.append("the log ends before the server was ready (no 'fired up and ready to roll' line)")
    else:
        missing.append("no line of the log table for it")
    return "no evidence: " + "; ".join(missing)


def _summary(e: Expectation, verdict: Verdict, evidence: Sequence[Evidence]) -> str:
    if verdict is Verdict.UNKNOWN:
        return ""
    sign = Sign.DEGRADED if verdict is Verdict.DEGRADED else Sign.CONFIRMED
    chosen = next(x for x in evidence if x.sign is sign)
    where = f" (log line {chosen.line}, {chosen.count}x)" if chosen.line is not None else ""
    return f"{chosen.text}{where}"


def judge(
    request: LaunchRequest,
    info: ServerInfo | None,
    log: LogScan | None,
    version: str | None = None,
    version_origin: str = "",
    url: str | None = None,
) -> LaunchReport:
    verdicts: list[ExpectationVerdict] = []
    complete = log is not None and log.complete(info is not None)
    for e in request.expected:
        evidence = (_info_evidence(e, info, request) if info else []) + (_log_evidence(e, log) if log else [])
        evidence += _silence(e, evidence, complete)
        signs = {x.sign for x in evidence}
        if Sign.DEGRADED in signs:
            verdict = Verdict.DEGRADED
        elif Sign.CONFIRMED in signs:
            verdict = Verdict.OK
        else:
            verdict = Verdict.UNKNOWN
        summary = _summary(e, verdict, evidence)
        fix = next((x.fix for x in evidence if x.sign is Sign.DEGRADED and x.fix), "")
        if verdict is Verdict.UNKNOWN:
            noted = "; ".join(x.text for x in evidence if x.sign is Sign.NOTED)
            summary = (f"{noted}, but " if noted else "") + _unknown_reason(info, log)
        verdicts.append(ExpectationVerdict(e, verdict, summary, tuple(evidence), fix))
    notes = []
    parsed, newest = parse_version(version), parse_version(TABLE_RELEASES[1])
    if parsed and newest and parsed > newest:
        notes.append(
            f"SGLang {version} is newer than the releases the log table was read from "
            f"({TABLE_RELEASES[0]}..{TABLE_RELEASES[1]}): a changed message reads as unknown, not degraded"
        )
    if log is not None and log.starts > 1:
        notes.append(f"the log holds {log.starts} server starts; only the last (line {log.start_line}) is judged")
    return LaunchReport(request, tuple(verdicts), version, version_origin, url, log, complete, info, tuple(notes))


def parse_version(text: str | None) -> tuple[int, ...] | None:
    m = re.match(r"(\d+(?:\.\d+)*)", text or "")
    return tuple(int(x) for x in m.group(1).split(".")) if m else None


# --- output --------------------------------------------------------------------------------------------------------


def exit_code(report: LaunchReport, strict: bool = False) -> int:
    if report.degraded or (strict and report.unknown):
        return 1
    return 0


def to_dict(report: LaunchReport) -> dict[str, object]:
    log = report.log
    return {
        "schema": SCHEMA,
        "sglang_version": report.version,
        "version_origin": report.version_origin,
        "url": report.url,
        "expected": [e.value for e in report.request.expected],
        "expected_origin": report.request.origin,
        "log": None
        if log is None
        else {
            "source": log.source,
            "lines": log.lines,
            "truncated": log.truncated,
            "start_line": log.start_line,
            "starts": log.starts,
            "ready": log.ready,
            "complete": report.log_complete,
        },
        "verdicts": [
            {
                "expectation": v.expectation.value,
                "verdict": v.verdict.value,
                "summary": v.summary,
                "fix": v.fix,
                "evidence": [
                    {
                        "source": x.source,
                        "sign": x.sign.value,
                        "text": x.text,
                        "pattern": x.pattern,
                        "line": x.line,
                        "count": x.count,
                        "fix": x.fix,
                    }
                    for x in v.evidence
                ],
            }
            for v in report.verdicts
        ],
        "lines": [v.line for v in report.verdicts],
        "degraded": [v.expectation.value for v in report.degraded],
        "unknown": [v.expectation.value for v in report.unknown],
        "problems": [v.line for v in report.degraded],
        "data": {
            "avg_spec_accept_length": report.info.accept_length if report.info else None,
            "graph_memory_gb": report.info.graph_memory_gb if report.info else None,
        },
        "notes": list(report.notes),
    }


def render(report: LaunchReport) -> str:
    version = f"SGLang {report.version} ({report.version_origin})" if report.version else "SGLang (version unknown)"
    where = [version]
    if report.url:
        where.append(f"at {report.url}")
    if report.log:
        start = f"this run from line {report.log.start_line}" if report.log.start_line else "no server start seen"
        where.append(f"log: {report.log.source}, {report.log.lines} lines, {start}")
    lines = [
        "; ".join(where),
        f"expected ({report.request.origin}): {', '.join(e.value for e in report.request.expected)}",
    ]
    for v in report.verdicts:
        lines.append(f"  {v.verdict.value:<9} {v.expectation.value:<12} {v.summary}")
        if v.fix:
            lines.append(f"  {'':<9} {'':<12} fix: {v.fix}")
    lines.extend(f"note: {n}" for n in report.notes)
    if report.degraded:
        names = ", ".join(v.expectation.value for v in report.degraded)
        lines.append(f"{len(report.degraded)} of {len(report.verdicts)} degraded: {names}")
    elif report.unknown:
        lines.append(f"nothing degraded; unknown: {', '.join(v.expectation.value for v in report.unknown)}")
    else:
        lines.append("the server runs what the launch asked for")
    return "\n".join(lines)
