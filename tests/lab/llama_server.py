"""Start and stop llama.cpp's `llama-server` on 127.0.0.1, and read the truth from it: its log and `/metrics`.

Servers are real-engine.md's BASE and SPEC (the same plus a draft model, `--spec-type draft-simple`, 8 draft
tokens). The log is captured to a file with `--log-timestamps`; the truth rebuilt from it follows real-engine.md
"How truth was measured": per request launch, prompt eval, eval, draft acceptance and release on the server's clock,
assigned to levels by order and count (the bench sends C x warm-up + N requests per level, in order), and each
level's steady window rebuilt on the server's clock (last warm-up release to the first release after the last
launch, each request's tokens spread evenly over its decode interval).
"""

from __future__ import annotations

import contextlib
import math
import re
import socket
import statistics
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from .gguf_models import ModelPair
from .llamacpp import LlamaServerBuild

DRAFT_MAX = 8
HEALTH_TIMEOUT_S = 120.0
HTTP_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 15.0


class ServerError(Exception):
    """llama-server did not start or answer; the message carries its log tail."""


@dataclass
class LlamaServer:
    url: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    speculative: bool
    started_at: float  # time.time() just before the process started (its log clock starts then)

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_text().splitlines()[-lines:])
        except OSError:
            return "(no log)"


def server_argv(build: LlamaServerBuild, models: ModelPair, port: int, speculative: bool) -> list[str]:
    argv = [str(build.binary), "-m", str(models.target), "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--parallel", "16", "-c", "8192", "--metrics", "-t", "1", "--no-webui", "-a", "target"]
    argv += ["--log-timestamps"]
    if speculative:
        argv += ["-md", str(models.draft), "--spec-type", "draft-simple"]
        argv += ["--spec-draft-n-max", str(DRAFT_MAX), "--spec-draft-n-min", "0"]
    return argv


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def http_get(url: str, timeout: float = HTTP_TIMEOUT_S) -> tuple[int, bytes]:
    """GET url, bounded; (status, body), status 0 when nothing answered."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return int(response.status), bytes(response.read())
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read()
    except (urllib.error.URLError, OSError):
        return 0, b""


def start_server(
    build: LlamaServerBuild, models: ModelPair, log_path: Path, speculative: bool, timeout: float = HEALTH_TIMEOUT_S
) -> LlamaServer:
    """Start llama-server and wait (bounded) until /health answers 200 (it answers 503 while loading)."""
    for _attempt in range(3):  # a free port can be taken between the probe and the bind
        port = _free_port()
        log_path.parent.mkdir(parents=True, exist_ok=True)
        started = time.time()
        with log_path.open("wb") as log:
            proc = subprocess.Popen(server_argv(build, models, port, speculative), stdout=log, stderr=subprocess.STDOUT)
        server = LlamaServer(f"http://127.0.0.1:{port}", proc, log_path, speculative, started)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and proc.poll() is None:
            status, _ = http_get(server.url + "/health", timeout=2.0)
            if status == 200:
                return server
            time.sleep(0.2)
        if proc.poll() is None:
            stop_server(server)
            raise ServerError(f"llama-server on {server.url} not healthy within {timeout:g} s\n{server.log_tail()}")
        if "bind" not in server.log_text() and "address already in use" not in server.log_text().lower():
            raise ServerError(f"llama-server exited {proc.returncode} during start\n{server.log_tail()}")
    raise ServerError(f"llama-server could not bind a port in three tries\n{server.log_tail()}")


def stop_server(server: LlamaServer) -> None:
    """Terminate the process we started (by its pid), wait bounded, then kill."""
    if server.proc.poll() is not None:
        return
    server.proc.terminate()
    try:
        server.proc.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        server.proc.wait(timeout=STOP_TIMEOUT_S)


@contextlib.contextmanager
def running_server(
    build: LlamaServerBuild, models: ModelPair, log_path: Path, speculative: bool
) -> Iterator[LlamaServer]:
    server = start_server(build, models, log_path, speculative)
    try:
        yield server
    finally:
        stop_server(server)


# --- /metrics ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Metrics:
    """One scrape of /metrics: sample name (with labels, e.g. `x{position="0"}`) -> value."""

    values: Mapping[str, float]

    def get(self, name: str) -> float:
        """A llamacpp: sample by its short name (`tokens_predicted_total`); NaN when absent."""
        return self.values.get(f"llamacpp:{name}", math.nan)

    def labelled(self, name: str) -> dict[str, float]:
        prefix = f"llamacpp:{name}{{"
        return {k: v for k, v in self.values.items() if k.startswith(prefix)}


def parse_metrics(text: str) -> Metrics:
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            values[f"{sample.name}{{{labels}}}" if labels else sample.name] = float(sample.value)
    return Metrics(values)


def scrape(server: LlamaServer) -> Metrics:
    status, body = http_get(server.url + "/metrics")
    if status != 200:
        raise ServerError(f"GET {server.url}/metrics gave HTTP {status}\n{server.log_tail()}")
    return parse_metrics(body.decode())


def wait_idle(server: LlamaServer, timeout: float = 10.0) -> Metrics:
    """/metrics once nothing is processing (counters are updated at release), bounded."""
    deadline = time.monotonic() + timeout
    metrics = scrape(server)
    while metrics.get("requests_processing") > 0 and time.monotonic() < deadline:
        time.sleep(0.1)
        metrics = scrape(server)
    return metrics


# --- the log -------------------------------------------------------------------------------------------------------

_STAMP = (
    r"(?P<m>\d+)\.(?P<s>\d{2})\.(?P<ms>\d{3})\.(?P<us>\d{3}) I slot +\w+: id +(?P<slot>\d+) \| task (?P<task>\d+) \| "
)
_LAUNCH = re.compile(_STAMP + r"processing task")
_PROMPT = re.compile(_STAMP + r"prompt eval time = +(?P<ms_>[\d.]+) ms / +(?P<n>\d+) tokens")
_EVAL = re.compile(_STAMP + r" +eval time = +(?P<ms_>[\d.]+) ms / +(?P<n>\d+) tokens")
_DRAFT = re.compile(
    _STAMP + r"draft acceptance = [\d.]+ \( *(?P<a>\d+) accepted / *(?P<g>\d+) generated\), mean len = +(?P<len>[\d.]+)"
)
_RELEASE = re.compile(_STAMP + r"stop processing: n_tokens = (?P<n>\d+)")


def _seconds(m: re.Match[str]) -> float:
    return int(m["m"]) * 60 + int(m["s"]) + int(m["ms"]) / 1e3 + int(m["us"]) / 1e6


@dataclass
class LogRequest:
    """One request as the server logged it; times in seconds on the server's log clock."""

    task: int
    slot: int
    launch: float
    release: float = math.nan
    prompt_ms: float = math.nan
    prompt_n: int = 0  # prompt tokens computed (not from the cache)
    eval_ms: float = math.nan
    eval_n: int = 0  # output tokens
    n_tokens: int = 0  # in the slot at release: prompt + output - 1
    draft_accepted: int = 0
    draft_generated: int = 0
    mean_len: float | None = None  # tokens per verify step (1 + accepted / steps); None without drafts

    @property
    def decode_start(self) -> float:
        return self.launch + self.prompt_ms / 1e3

    @property
    def prompt_tokens(self) -> int:
        return self.n_tokens - self.eval_n + 1

    @property
    def cached_prompt_tokens(self) -> int:
        return max(self.prompt_tokens - self.prompt_n, 0)

    @property
    def verify_steps(self) -> float:
        if self.mean_len is not None and self.mean_len > 1.0:
            return self.draft_accepted / (self.mean_len - 1.0)
        return float(max(self.eval_n - 1, 0))


def parse_log(text: str) -> list[LogRequest]:
    """Every finished request of a llama-server log (with --log-timestamps), in launch order."""
    open_: dict[int, LogRequest] = {}
    done: list[LogRequest] = []
    for line in text.splitlines():
        if m := _LAUNCH.search(line):
            open_[int(m["task"])] = LogRequest(int(m["task"]), int(m["slot"]), _seconds(m))
        elif (m := _PROMPT.search(line)) and (r := open_.get(int(m["task"]))):
            r.prompt_ms, r.prompt_n = float(m["ms_"]), int(m["n"])
        elif (m := _EVAL.search(line)) and (r := open_.get(int(m["task"]))):
            r.eval_ms, r.eval_n = float(m["ms_"]), int(m["n"])
        elif (m := _DRAFT.search(line)) and (r := open_.get(int(m["task"]))):
            r.draft_accepted, r.draft_generated, r.mean_len = int(m["a"]), int(m["g"]), float(m["len"])
        elif (m := _RELEASE.search(line)) and (r := open_.pop(int(m["task"]), None)):
            r.release, r.n_tokens = _seconds(m), int(m["n"])
            done.append(r)
    return sorted(done, key=lambda r: (r.launch, r.task))


# --- truth per level -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LevelTruth:
    """A level as the server saw it."""

    concurrency: int
    requests: tuple[LogRequest, ...] = field(repr=False)
    window_s: float  # the bench's steady window rebuilt on the server's clock
    window_tokens: float
    tok_s: float  # window_tokens / window_s
    level_tok_s: float  # all tokens over first launch to last release
    prompt_s_p50: float  # the server's prompt time (its TTFT without queueing)
    ttft_s_p50: float  # queueing (closed-loop arrival rebuilt from release order) + prompt time
    e2e_s_mean: float  # launch to release
    output_tokens: tuple[int, ...]  # per request, warm-up included, in launch order
    accept_length: float | None  # tokens per verify step; None when nothing was drafted
    prompt_tokens: int
    cached_prompt_tokens: int


def split_levels(requests: Sequence[LogRequest], counts: Sequence[int]) -> list[list[LogRequest]]:
    """The log's requests cut into levels of `counts` requests each, in launch order."""
    if sum(counts) != len(requests):
        raise ValueError(
            f"the server log has {len(requests)} finished requests, the records account for {sum(counts)} "
            f"({' + '.join(map(str, counts))}); was the server used by something else?"
        )
    out, i = [], 0
    for n in counts:
        out.append(list(requests[i : i + n]))
        i += n
    return out


def level_truth(concurrency: int, requests: Sequence[LogRequest], warmup: int) -> LevelTruth:
    """Rebuild a closed-loop level from its log requests (`warmup` per worker came first)."""
    if not requests:
        raise ValueError(f"C={concurrency}: no requests in the server log")
    n_warm = concurrency * warmup
    warm, measured = requests[:n_warm], requests[n_warm:]
    opens = max((r.release for r in warm), default=requests[0].launch)
    last_launch = max(r.launch for r in measured) if measured else requests[-1].launch
    closes = min((r.release for r in requests if r.release >= last_launch), default=requests[-1].release)
    tokens = 0.0
    for r in requests:
        span = r.release - r.decode_start
        if span <= 0:
            continue
        overlap = max(0.0, min(r.release, closes) - max(r.decode_start, opens))
        tokens += r.eval_n * overlap / span
    window = closes - opens
    first, last = requests[0].launch, max(r.release for r in requests)
    # Closed loop: after the first C launches, each request was sent when an earlier one was released.
    releases = sorted(r.release for r in requests)
    ttft = []
    for j, r in enumerate(requests):
        arrival = requests[0].launch if j < concurrency else releases[j - concurrency]
        ttft.append(max(r.launch - arrival, 0.0) + r.prompt_ms / 1e3)
    drafted = [r for r in requests if r.mean_len is not None]
    accept = None
    if drafted:
        steps = sum(r.verify_steps for r in drafted)
        accept = 1.0 + sum(r.draft_accepted for r in drafted) / steps if steps else None
    return LevelTruth(
        concurrency=concurrency,
        requests=tuple(requests),
        window_s=window,
        window_tokens=tokens,
        tok_s=tokens / window if window > 0 else math.nan,
        level_tok_s=sum(r.eval_n for r in requests) / (last - first) if last > first else math.nan,
        prompt_s_p50=statistics.median(r.prompt_ms / 1e3 for r in measured or requests),
        ttft_s_p50=statistics.median(ttft[n_warm:] or ttft),
        e2e_s_mean=statistics.fmean(r.release - r.launch for r in measured or requests),
        output_tokens=tuple(r.eval_n for r in requests),
        accept_length=accept,
        prompt_tokens=sum(r.prompt_tokens for r in requests),
        cached_prompt_tokens=sum(r.cached_prompt_tokens for r in requests),
    )


def split_by_time(
    requests: Sequence[LogRequest], spans: Sequence[tuple[float, float]], clock_start: float
) -> list[list[LogRequest]]:
    """The log's requests cut into levels by the levels' wall-clock (start, end) epochs, as the bench records them;
    `clock_start` is the epoch at which the server's log clock read 0 (its process start)."""
    out: list[list[LogRequest]] = [[] for _ in spans]
    for r in requests:
        at = clock_start + r.launch
        # nearest span: the launch falls inside one, give or take the start-up skew of the two clocks
        distance = [max(start - at, at - end, 0.0) for start, end in spans]
        out[distance.index(min(distance))].append(r)
    return out


def level_spans(records: Sequence[Mapping[str, object]]) -> list[tuple[float, float]] | None:
    """The levels' wall-clock (start, end) epochs from the records; None when a record lacks them."""
    spans = []
    for r in records:
        start, end = r.get("level_started_epoch"), r.get("level_ended_epoch")
        if not isinstance(start, (int, float)) or not isinstance(end, (int, float)):
            return None
        spans.append((float(start), float(end)))
    return spans


def sweep_truth(
    log_text: str,
    levels: Sequence[int],
    measured: Sequence[int],
    warmup: int,
    skip: int = 0,
    spans: Sequence[tuple[float, float]] | None = None,
    clock_start: float | None = None,
) -> list[LevelTruth]:
    """Truth for a sweep's levels from the server log: `measured[i]` requests after `warmup` per worker at
    `levels[i]`; `skip` earlier requests (other sweeps on the same server) come first. With the levels' wall-clock
    `spans` (and the log clock's start), the cut by order and count is checked against the cut by time."""
    requests = parse_log(log_text)[skip:]
    counts = [c * warmup + n for c, n in zip(levels, measured, strict=True)]
    requests = requests[: sum(counts)] if len(requests) > sum(counts) else requests
    by_count = split_levels(requests, counts)
    if spans is not None and clock_start is not None:
        by_time = split_by_time(requests, spans, clock_start)
        if [len(x) for x in by_time] != counts:
            raise ValueError(
                f"levels cut by the records' start/end times hold {[len(x) for x in by_time]} requests, by the "
                f"records' counts {counts}: the bench's level boundaries and the server's log disagree"
            )
    return [level_truth(c, reqs, warmup) for c, reqs in zip(levels, by_count, strict=True)]
