"""A level's accepted length from the server's /metrics counters, differenced around the level, where no response
says it per request (vLLM): the "after" scrape waits for the in-flight gauge to reach 0, so the level's last
releases are counted, and a counter that went down is a warning, not a value."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from bench.conftest import run_subcommand
from lab.loopback import QuietHandler, serve, sse, url
from sm120check.bench.records import read_jsonl

DRAFT = 3  # tokens drafted per verify step
STEPS = 4  # verify steps per request: 8 output tokens, 2 per step (1 accepted per draft of 3)


@dataclass
class VllmState:
    """A vLLM stand-in's counters: a finished request is 'running' for `lag` more /metrics scrapes before its
    counts move (as an engine that updates its counters at release, a moment after the last byte)."""

    lag: int = 0
    drafts: int = 0
    accepted: int = 0
    pending: int = 0  # finished, not yet released
    pending_scrapes: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    bad_line: bool = False

    def metrics(self) -> bytes:
        with self.lock:
            if self.pending and self.pending_scrapes <= 0:
                self.drafts += STEPS * self.pending
                self.accepted += STEPS * self.pending  # one accepted token per verify step
                self.pending = 0
            running = 1 if self.pending else 0
            self.pending_scrapes -= 1
            lines = [
                "# TYPE vllm:num_requests_running gauge",
                f'vllm:num_requests_running{{engine="0"}} {running}',
                f'vllm:spec_decode_num_drafts_total{{engine="0"}} {self.drafts}',
                f'vllm:spec_decode_num_accepted_tokens_total{{engine="0"}} {self.accepted}',
                f'vllm:spec_decode_num_draft_tokens_total{{engine="0"}} {self.drafts * DRAFT}',
            ]
            lines += [f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{position="{i}"}} 0' for i in range(DRAFT)]
            if self.bad_line:
                lines.append("vllm:broken{")
        return ("\n".join(lines) + "\n").encode()

    def release(self) -> None:
        with self.lock:
            self.pending += 1
            self.pending_scrapes = self.lag


@contextlib.contextmanager
def vllm_server(state: VllmState) -> Iterator[str]:
    class Handler(QuietHandler):
        def do_GET(self) -> None:
            if self.path == "/version":
                self.send(200, "application/json", b'{"version": "0.11.0"}')
            elif self.path == "/v1/models":
                self.send(200, "application/json", b'{"data": [{"id": "m"}]}')
            elif self.path == "/metrics":
                self.send(200, "text/plain; version=0.0.4", state.metrics())
            else:
                self.send(404, "application/json", b'{"detail": "Not Found"}')

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
            assert "cache_prompt" not in body  # vLLM rejects keys it does not know
            events = [
                {"choices": [{"index": 0, "delta": {"content": " tok tok"}}], "usage": {"completion_tokens": 2 * k}}
                for k in range(1, STEPS + 1)
            ]
            events.append({"choices": [], "usage": {"completion_tokens": 2 * STEPS, "prompt_tokens": 5}})
            self.send(200, "text/event-stream", sse(events))
            state.release()

    with serve(Handler) as server:
        yield url(server)


def bench(address: str, out: Path) -> int:
    return run_subcommand(
        "bench", "--url", address, "--api", "openai-chat", "--concurrency", "1,2", "--requests-per-level", "3",
        "--output-len", "8", "--pause", "0", "--quiet", "--info-timeout", "5", "--out", str(out),
    )  # fmt: skip


def test_vllm_level_accept_length_is_the_counters_growth_over_the_level(tmp_path: Path) -> None:
    state = VllmState(lag=3)
    out = tmp_path / "r.jsonl"
    with vllm_server(state) as address:
        assert bench(address, out) == 0
    records = read_jsonl(out)
    for r, requests in zip(records, (1 + 3, 2 + 3), strict=True):  # warm-up requests are in the level's counts
        assert r.accept_source == "metrics:vllm:spec_decode_num_accepted_tokens_total/vllm:spec_decode_num_drafts_total"
        assert r.accept_length == 2.0
        delta = r.meta["metrics_delta"]
        assert isinstance(delta, dict) and delta["drafts"] == STEPS * requests  # the last releases are in
        server = r.meta["server"]
        assert isinstance(server, dict) and server["engine"] == "vllm" and server["speculative_num_steps"] == DRAFT


def test_a_metrics_line_that_is_not_a_sample_is_a_warning(tmp_path: Path) -> None:
    state = VllmState(bad_line=True)
    out = tmp_path / "r.jsonl"
    with vllm_server(state) as address:
        assert bench(address, out) == 0
    r = read_jsonl(out)[0]
    assert r.accept_length == 2.0
    assert any("/metrics: 1 line(s) that are not samples were skipped" in w for w in r.warnings)
