"""SGLang's accept length through its OpenAI API, whose responses carry no `spec_verify_ct`: the level's value is
the growth of SGLang's own counters over the level, generation tokens / verify calls (bench/metrics.py SPEC_FAMILIES),
and the draft_not_accepted flag and crossover's refusal then work on OpenAI-API sweeps too.

The stand-in's /metrics is rendered by the real prometheus_client with SGLang 0.5.16's names, label names and types
(sglang/srt/observability/metrics_collector.py: TokenizerMetricsCollector's Counters `sglang:generation_tokens_total`
and `sglang:spec_verify_calls_total` with labels model_name and engine_type, incremented in
observe_one_finished_request, the verify counter only when spec_verify_ct > 0; SchedulerMetricsCollector's Gauge
`sglang:num_running_reqs` with model_name, engine_type, tp_rank, pp_rank, moe_ep_rank, here two DP ranks). It is
rendered single-process (`generate_latest`), where SGLang renders through prometheus_client's multiprocess collector:
the same samples, plus `_created` ones the bench does not read.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, generate_latest

from bench.conftest import run_subcommand
from lab.loopback import QuietHandler, serve, sse, url
from sm120check.bench.metrics import AcceptRatio, family_for, forward_seconds, parse, spec_delta
from sm120check.bench.records import LevelSummary, read_jsonl
from sm120check.bench.speculation import FLAG

OUTPUT = 64  # tokens per request, in 8 chunks of 8
GOOD_VERIFY = 16  # verify calls per request of a draft that is accepted: 4 tokens per verify step
BAD_VERIFY = OUTPUT - 1  # every draft token rejected: the prefill's token, then one per verify step (1.016)
TOKENIZER_LABELS = {"model_name": "m", "engine_type": "unified"}
SOURCE = "metrics:sglang:generation_tokens_total/sglang:spec_verify_calls_total"


class SglangCounters:
    """SGLang 0.5.16's three metrics the bench reads, in their own registry (a restart is a new one)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        labels = list(TOKENIZER_LABELS)
        self.generation_tokens_total = Counter(
            "sglang:generation_tokens_total", "Number of generation tokens processed.", labels, registry=self.registry
        )
        self.spec_verify_calls_total = Counter(
            "sglang:spec_verify_calls_total",
            "Number of speculative decoding verification calls.",
            labels,
            registry=self.registry,
        )
        self.num_running_reqs = Gauge(
            "sglang:num_running_reqs",
            "The number of running requests.",
            [*labels, "tp_rank", "pp_rank", "moe_ep_rank", "dp_rank"],
            registry=self.registry,
        )
        # SchedulerMetricsCollector's Counter, incremented by utils/device_timer.py's reporter (metrics_reporter.py)
        # with the GPU seconds of each forward when SGLANG_ENABLE_METRICS_DEVICE_TIMER=1
        self.forward_execution_seconds_total = Counter(
            "sglang:forward_execution_seconds_total",
            "Total time that GPU is busy executing model forward passes. Refer to ForwardMode for category labels.",
            [*labels, "tp_rank", "pp_rank", "moe_ep_rank", "dp_rank", "category"],
            registry=self.registry,
        )
        for dp in ("0", "1"):
            self.running(dp).set(0)

    def forward(self, dp: str, category: str, seconds: float) -> None:
        ranks = {"tp_rank": "0", "pp_rank": "0", "moe_ep_rank": "0", "dp_rank": dp}
        self.forward_execution_seconds_total.labels(**TOKENIZER_LABELS, **ranks, category=category).inc(seconds)

    def running(self, dp: str) -> Gauge:
        return self.num_running_reqs.labels(**TOKENIZER_LABELS, tp_rank="0", pp_rank="0", moe_ep_rank="0", dp_rank=dp)

    def observe_one_finished_request(self, generation_tokens: int, spec_verify_ct: int) -> None:
        self.generation_tokens_total.labels(**TOKENIZER_LABELS).inc(generation_tokens)
        if spec_verify_ct > 0:
            self.spec_verify_calls_total.labels(**TOKENIZER_LABELS).inc(spec_verify_ct)


@dataclass
class SglangState:
    """A stand-in SGLang server: `verify` calls per request (0: a base server); the release numbered `restart_at`
    lands in a fresh registry (the server restarted)."""

    verify: int
    restart_at: int = 0
    timed: bool = False  # SGLANG_ENABLE_METRICS_DEVICE_TIMER=1: GPU seconds per forward kind
    released: int = 0
    counters: SglangCounters = field(default_factory=SglangCounters)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def info(self) -> bytes:
        spec = self.verify > 0
        info = {
            "model_path": "m",
            "version": "0.5.16",
            "speculative_algorithm": "EAGLE3" if spec else None,
            "speculative_num_steps": 3 if spec else None,
        }
        return json.dumps(info).encode()

    def start(self, dp: str) -> None:
        with self.lock:
            self.counters.running(dp).inc()

    def release(self, dp: str) -> None:
        with self.lock:
            self.released += 1
            if self.released == self.restart_at:
                self.counters = SglangCounters()
            else:
                self.counters.running(dp).dec()
            self.counters.observe_one_finished_request(OUTPUT, self.verify)
            if self.timed:  # a request's forwards: its prefill, then its decode (or verify) steps; DP rank 1 is
                for rank, share in (("0", 1.0), ("1", 0.5)):  # given half of rank 0's time
                    self.counters.forward(rank, "extend", 0.001 * share)
                    self.counters.forward(rank, "target_verify" if self.verify else "decode", 0.002 * OUTPUT * share)

    def metrics(self) -> bytes:
        with self.lock:
            return generate_latest(self.counters.registry)


def events(path: str, verify: int) -> list[dict[str, object]]:
    chunks = range(1, OUTPUT // 8 + 1)
    if path == "/generate":  # SGLang's native API: cumulative text, meta_info with spec_verify_ct
        return [
            {"text": " tok" * 8 * k, "meta_info": {"completion_tokens": 8 * k, "spec_verify_ct": verify * k // 8}}
            for k in chunks
        ]
    key = "delta" if path == "/v1/chat/completions" else "text"
    piece: object = {"content": " tok" * 8} if key == "delta" else " tok" * 8
    out: list[dict[str, object]] = [
        {"choices": [{"index": 0, key: piece}], "usage": {"completion_tokens": 8 * k}} for k in chunks
    ]
    out.append({"choices": [], "usage": {"completion_tokens": OUTPUT, "prompt_tokens": 5}})
    return out


@contextlib.contextmanager
def sglang_server(state: SglangState) -> Iterator[str]:
    class Handler(QuietHandler):
        def do_GET(self) -> None:
            if self.path in ("/get_server_info", "/server_info"):
                self.send(200, "application/json", state.info())
            elif self.path == "/v1/models":
                self.send(200, "application/json", b'{"data": [{"id": "m"}]}')
            elif self.path == "/metrics":
                self.send(200, CONTENT_TYPE_LATEST, state.metrics())
            else:
                self.send(404, "application/json", b'{"detail": "Not Found"}')

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
            assert "cache_prompt" not in body  # SGLang refuses keys it does not know
            dp = str(self.client_address[1] % 2)
            state.start(dp)
            self.send(200, "text/event-stream", sse(events(self.path, state.verify)))
            state.release(dp)  # after the last byte, as SGLang releases after its last output

    with serve(Handler) as server:
        yield url(server)


def bench(address: str, api: str, out: Path, label: str = "spec") -> list[LevelSummary]:
    code = run_subcommand(
        "bench", "--url", address, "--api", api, "--concurrency", "1,2", "--requests-per-level", "3",
        "--output-len", str(OUTPUT), "--pause", "0", "--quiet", "--info-timeout", "5", "--label", label,
        "--out", str(out),
    )  # fmt: skip
    assert code == 0
    return read_jsonl(out)


@pytest.mark.parametrize("api", ["openai-completions", "openai-chat"])
def test_openai_api_accept_length_is_generation_tokens_over_verify_calls(tmp_path: Path, api: str) -> None:
    with sglang_server(SglangState(verify=GOOD_VERIFY)) as address:
        records = bench(address, api, tmp_path / "r.jsonl")
    assert len(records) == 2
    for r in records:  # the first level starts on a fresh server, whose labelled counters have no sample yet
        assert r.accept_source == SOURCE
        assert r.accept_length == OUTPUT / GOOD_VERIFY
        delta = r.meta["metrics_delta"]
        assert isinstance(delta, dict)
        assert delta["generation_tokens"] == OUTPUT * delta["verify_calls"] / GOOD_VERIFY
        assert delta["ratio"] == AcceptRatio.TOKENS_PER_STEP.value
        assert FLAG not in r.flags


def test_native_api_keeps_the_per_request_spec_verify_ct(tmp_path: Path) -> None:
    with sglang_server(SglangState(verify=GOOD_VERIFY)) as address:
        records = bench(address, "sglang", tmp_path / "r.jsonl")
    for r in records:
        assert r.accept_source == "meta_info.spec_verify_ct" and r.accept_length == OUTPUT / GOOD_VERIFY
        delta = r.meta["metrics_delta"]
        assert isinstance(delta, dict) and delta["accept_length"] == OUTPUT / GOOD_VERIFY  # recorded beside it


def test_a_base_server_has_no_accept_length_and_is_not_called_speculative(tmp_path: Path) -> None:
    with sglang_server(SglangState(verify=0)) as address:
        records = bench(address, "openai-chat", tmp_path / "r.jsonl", label="base")
    for r in records:
        assert r.accept_length is None and r.accept_source == ""
        assert "metrics_delta" not in r.meta and FLAG not in r.flags
        server = r.meta["server"]
        assert isinstance(server, dict) and server["engine"] == "sglang" and server["speculative"] is False


@pytest.mark.parametrize("verify", [0, GOOD_VERIFY])
def test_each_level_keeps_the_gpu_seconds_per_forward_kind(tmp_path: Path, verify: int) -> None:
    """With SGLang's device timer the level records its GPU-busy seconds per forward kind (the busiest DP rank's):
    a base server's decode, a speculative one's verify; a server without the timer records none."""
    with sglang_server(SglangState(verify=verify, timed=True)) as address:
        records = bench(address, "openai-completions", tmp_path / "r.jsonl")
    kind, per_request = "target_verify" if verify else "decode", 0.002 * OUTPUT
    for r in records:
        busy = r.meta["server_forward_seconds"]
        assert isinstance(busy, dict) and set(busy) == {"extend", kind}, busy
        # rank 0's growth (whole requests, warm-up included), not the sum with rank 1's half
        requests = busy[kind] / per_request
        assert requests >= r.requests and abs(requests - round(requests)) < 1e-6, busy
        assert abs(busy["extend"] - 0.001 * round(requests)) < 1e-9, busy
    with sglang_server(SglangState(verify=verify)) as address:
        plain = bench(address, "openai-completions", tmp_path / "plain.jsonl")
    assert all("server_forward_seconds" not in r.meta for r in plain)


def test_a_forward_counter_that_went_down_is_a_problem_not_a_value() -> None:
    before, after = SglangCounters(), SglangCounters()
    before.forward("0", "decode", 5.0)
    after.forward("0", "decode", 1.0)
    busy, problem = forward_seconds(parse(generate_latest(before.registry)), parse(generate_latest(after.registry)))
    assert busy is None and "went down" in problem and "decode" in problem
    assert forward_seconds(parse(b""), parse(generate_latest(after.registry))) == ({"decode": 1.0}, "")
    assert forward_seconds(parse(b""), parse(b"")) == (None, "")


def test_a_verify_counter_that_did_not_grow_gives_no_accept_length() -> None:
    family = family_for("sglang")
    assert family is not None
    counters = SglangCounters()
    counters.observe_one_finished_request(OUTPUT, GOOD_VERIFY)
    before = parse(generate_latest(counters.registry))
    counters.observe_one_finished_request(OUTPUT, 0)  # a request that was not speculative
    after = parse(generate_latest(counters.registry))
    assert after.value(family.tokens) == 2 * OUTPUT and after.value(family.steps) == GOOD_VERIFY
    delta = spec_delta(family, before, after)
    assert delta.spec is None and delta.problems == ()


def test_counters_that_went_down_are_a_warning_not_a_value(tmp_path: Path) -> None:
    state = SglangState(verify=GOOD_VERIFY, restart_at=9)  # the last release of C=2 (4 + 5 requests)
    with sglang_server(state) as address:
        one, two = bench(address, "openai-completions", tmp_path / "r.jsonl")
    assert state.released == 9
    assert one.accept_length == OUTPUT / GOOD_VERIFY
    assert two.accept_length is None and "metrics_delta" not in two.meta
    assert any("sglang:generation_tokens_total or sglang:spec_verify_calls_total went down" in w for w in two.warnings)


def test_an_unaccepted_draft_through_the_openai_api_is_flagged_and_crossover_refuses_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with sglang_server(SglangState(verify=BAD_VERIFY)) as address:
        one, two = bench(address, "openai-completions", tmp_path / "spec.jsonl")
    assert one.accept_source == SOURCE and one.accept_length == round(OUTPUT / BAD_VERIFY, 4)  # records keep 4 places
    assert FLAG in one.flags and any("sglang#21272" in w for w in one.warnings)
    assert FLAG not in two.flags  # only concurrency 1 decides
    with sglang_server(SglangState(verify=0)) as address:
        bench(address, "openai-completions", tmp_path / "base.jsonl", label="base")
    code = run_subcommand("crossover", str(tmp_path / "base.jsonl"), str(tmp_path / "spec.jsonl"))
    assert code == 2
    err = capsys.readouterr().err
    assert "not a speculative sweep" in err and "sglang#21272" in err
