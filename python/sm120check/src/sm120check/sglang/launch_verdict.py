"""Did the started server run what its launch asked for? Each expectation judged ok, degraded or unknown from the
/server_info fields and the startup log lines, with the evidence and the fix."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from sm120check import versions
from sm120check.sglang.allreduce_backend import BackendEvidence
from sm120check.sglang.http_workers import HttpWorkers
from sm120check.sglang.launch_patterns import NEVER_RAN, SILENT_WHEN_ON, TABLE_RELEASES
from sm120check.sglang.launch_request import LaunchRequest
from sm120check.sglang.launch_terms import RAISE_RUNNING_CAP, SPECULATIVE_RUNNING_DEFAULT, Expectation, Sign
from sm120check.sglang.plain_decode import SwitchEvidence
from sm120check.sglang.server_info import ServerInfo
from sm120check.sglang.startup_log import LogScan


class Verdict(str, Enum):
    OK = "ok"
    DEGRADED = "degraded"
    UNKNOWN = "unknown"


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
    failed_start: str = ""  # this run could not bind its port: whatever answers at the URL is another process
    switch: SwitchEvidence | None = None  # the speculation switch's batches, where the log has them
    switch_problem: str = ""  # the switch's batches against the launch's threshold (--plain-decode-min-bs)
    allreduce: BackendEvidence | None = None  # the all-reduce backend the log shows (None: no log read)
    http_workers: HttpWorkers | None = None  # the HTTP processes, where the run launched more than one

    @property
    def http_workers_problem(self) -> str:
        return self.http_workers.problem if self.http_workers else ""

    @property
    def failed(self) -> bool:
        return bool(self.degraded or self.failed_start or self.switch_problem or self.http_workers_problem)

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
        asked = request.speculative_algorithm or f"speculation ({request.origin})"  # --expect names no algorithm
        fix = (
            f"the server runs without speculation although the launch asked for {asked}: "
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
    if e in NEVER_RAN:
        summary, fix = NEVER_RAN[e]
        return [Evidence("log", Sign.DEGRADED, summary, fix, f"{e.value}-never-ran")]
    if e is Expectation.SYMM_MEM:
        return [Evidence("log", Sign.CONFIRMED, SILENT_WHEN_ON, "", "symm-mem-silent")]
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


def running_cap_note(request: LaunchRequest, info: ServerInfo) -> str:
    """What the server's running-request cap means for the launch ("" when nothing): SGLang's speculative default
    that the launch did not choose, or a cap other than the one asked for."""
    cap = info.max_running_requests
    if cap is None:
        return ""
    asked = request.max_running_requests
    if asked is not None:
        if not (asked.strip().isdigit() and int(asked) == cap):
            return (
                f"the launch asked for --max-running-requests {asked}, the server runs at most {cap} requests at "
                "once (server_args.max_running_requests)"
            )
        return ""
    if info.speculative_algorithm and cap == SPECULATIVE_RUNNING_DEFAULT:
        return f"the server runs at most {cap} requests at once: {RAISE_RUNNING_CAP}; requests above it queue"
    return ""


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
    parsed, newest = versions.parse_or_none(version), versions.parse_or_none(TABLE_RELEASES[1])
    if parsed and newest and parsed > newest:
        notes.append(
            f"SGLang {version} is newer than the releases the log table was read from "
            f"({TABLE_RELEASES[0]}..{TABLE_RELEASES[1]}): a changed message reads as unknown, not degraded"
        )
    if info is not None and (note := running_cap_note(request, info)):
        notes.append(note)
    if log is not None and log.starts > 1:
        notes.append(f"the log holds {log.starts} server starts; only the last (line {log.start_line}) is judged")
    failed = bind_failure(log, url) if log is not None else ""
    return LaunchReport(
        request, tuple(verdicts), version, version_origin, url, log, complete, info, tuple(notes), failed
    )


def bind_failure(log: LogScan, url: str | None) -> str:
    """What a bind error in this run's log means ("" without one): the server never served, even where SGLang went
    on to print that it was ready (its warmup reached the process that holds the port)."""
    if log.bind_error_line is None:
        return ""
    where = f"; the server_info read from {url} is that other process's" if url else ""
    return (
        f"failed start: this run's HTTP server could not bind its port (log line {log.bind_error_line}: "
        f"{log.bind_error}): another process holds it, and this server exited or never served{where}. Fix: stop the "
        "process that listens on the port (`ss -ltnp` names its pid), then start the server again"
    )
