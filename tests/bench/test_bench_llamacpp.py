"""`bench` against the llama.cpp stand-in (simserver --flavour llamacpp, event shapes of real-engine.md) and small
loopback servers: the defects found against a real llama-server (real-engine.md "Defects and gaps"), each fixed."""

from __future__ import annotations

import contextlib
import json
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from bench.conftest import SIM_ARGS, Sim, run_subcommand
from lab.loopback import QuietHandler, serve, url
from sm120check.bench.cli import default_requests
from sm120check.bench.closedloop import RequestRecord, summarize
from sm120check.bench.records import LevelSummary, RecordError, read_jsonl


@pytest.fixture(scope="module")
def llama_spec(sim_factory: Callable[..., Sim]) -> Sim:
    return sim_factory("spec", *SIM_ARGS, "--flavour", "llamacpp", "--num-steps", "4")


@pytest.fixture(scope="module")
def llama_plain(sim_factory: Callable[..., Sim]) -> Sim:
    return sim_factory("plain", *SIM_ARGS, "--flavour", "llamacpp")


def bench(address: str, out: Path, *extra: str) -> int:
    return run_subcommand(
        "bench", "--url", address, "--quiet", "--output-len", "16", "--input-len", "8", "--pause", "0",
        "--info-timeout", "5", "--request-timeout", "30", "--level-timeout", "60", "--out", str(out), *extra,
    )  # fmt: skip


@pytest.mark.parametrize("api", ["openai-completions", "openai-chat"])
def test_each_llamacpp_event_carries_one_token_so_ttft_is_the_first_token(
    llama_plain: Sim, tmp_path: Path, api: str
) -> None:
    # defect 1: the completions total went to the final event, so TTFT read as E2E and TPOT as 0
    out = tmp_path / "r.jsonl"
    assert bench(llama_plain.url, out, "--api", api, "--concurrency", "2", "--requests-per-level", "6") == 0
    (r,) = read_jsonl(out)
    assert r.token_source == "usage-per-event"
    assert r.ttft_s is not None and r.e2e_s is not None and r.tpot_s is not None
    # no clock: with all tokens on the final event there would be no gap between token-carrying chunks at all;
    # one token per event gives up to 15 gaps per measured request
    assert r.itl_s is not None and r.ttft_s.n <= r.itl_s.n <= 15 * r.ttft_s.n
    assert r.tpot_s.p50 > 0
    rows = [row for row in r.per_request if not row.warmup]
    assert len(rows) == 6 and all(row.output_tokens == 16 and row.error == "" for row in rows)
    assert all(row.prompt_tokens is not None and row.cached_prompt_tokens == 0 for row in rows)


def test_llamacpp_accept_length_is_the_levels_counters_with_timings_beside(llama_spec: Sim, tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    assert bench(llama_spec.url, out, "--api", "openai-chat", "--concurrency", "1,2", "--requests-per-level", "4") == 0
    records = read_jsonl(out)
    for r in records:
        # llama.cpp's own tokens per verify step (1 + accepted / drafts), differenced over the level
        assert r.accept_source == (
            "metrics:llamacpp:spec_decode_num_accepted_tokens_total/llamacpp:spec_decode_num_drafts_total"
        )
        assert r.accept_length == pytest.approx(2.0, abs=0.3)  # tau 2: each verify step gives 2 tokens on average
        assert r.meta["accept_length_timings"] == pytest.approx(2.0, abs=0.3)  # the per-request estimate
        assert sum(n for _, n in r.accept_hist) == r.requests
        server = r.meta["server"]
        assert isinstance(server, dict)
        assert server["engine"] == "llama.cpp" and server["speculative"] is True
        assert server["speculative_num_steps"] == 4  # from the per-position series once requests were released
    assert records[0].meta["server_accept_length_cumulative"] is None  # no /get_server_info on llama.cpp


def test_without_metrics_llamacpp_accept_length_comes_from_each_requests_timings(
    sim_factory: Callable[..., Sim], tmp_path: Path
) -> None:
    sim = sim_factory("spec", *SIM_ARGS, "--flavour", "llamacpp", "--no-metrics")
    out = tmp_path / "r.jsonl"
    assert bench(sim.url, out, "--api", "openai-completions", "--concurrency", "1", "--requests-per-level", "4") == 0
    (r,) = read_jsonl(out)
    assert r.accept_source == "timings.draft_n_accepted" and r.accept_length == pytest.approx(2.0, abs=0.3)
    assert all(row.accept_length is not None for row in r.per_request)
    server = r.meta["server"]
    assert isinstance(server, dict) and server["speculative"] is True and server["speculative_num_steps"] is None


def test_prompts_are_unique_per_run_and_level_and_not_cached(llama_plain: Sim, tmp_path: Path) -> None:
    # defect 3: every level and every run re-sent the same prompts, and the server's prompt cache answered them
    out = tmp_path / "r.jsonl"
    for _ in range(2):
        assert (
            bench(llama_plain.url, out, "--concurrency", "1,2", "--requests-per-level", "4", "--api", "openai-chat")
            == 0
        )
    records = read_jsonl(out)
    assert len(records) == 4
    for r in records:
        assert r.cached_prompt_fraction == 0.0 and not any("prompt cache" in w for w in r.warnings)
        assert r.meta["prompts"] == {"unique": True, "cache_prompt": False, "source": "synthetic"}


def test_reused_prompts_show_up_as_cache_hits_with_a_warning(llama_plain: Sim, tmp_path: Path) -> None:
    prompts = tmp_path / "p.txt"
    prompts.write_text("the same question about batching and memory bandwidth on a busy server\n")
    out = tmp_path / "r.jsonl"
    args = ("--concurrency", "1", "--requests-per-level", "4", "--api", "openai-completions")
    assert bench(llama_plain.url, out, *args, "--prompt-file", str(prompts), "--allow-prompt-reuse") == 0
    (r,) = read_jsonl(out)
    assert r.meta["prompts"] == {"unique": False, "cache_prompt": None, "source": "file:p.txt"}
    assert r.cached_prompt_fraction is not None and r.cached_prompt_fraction > 0.5
    assert any("came from the server's prompt cache" in w for w in r.warnings)
    # the same file without --allow-prompt-reuse: each prompt is tagged first, so nothing comes from the cache
    assert bench(llama_plain.url, out, *args, "--prompt-file", str(prompts)) == 0
    assert read_jsonl(out)[-1].cached_prompt_fraction == 0.0


def test_sglang_generate_never_gets_cache_prompt(spec_sim: Sim, tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"  # the SGLang simulator refuses /generate bodies with cache_prompt, as SGLang does
    assert bench(spec_sim.url, out, "--concurrency", "1", "--requests-per-level", "2") == 0
    (r,) = read_jsonl(out)
    assert r.errors == 0 and r.meta["prompts"] == {"unique": True, "cache_prompt": None, "source": "synthetic"}


def test_sglang_api_against_llamacpp_is_named_before_any_load(
    sim_factory: Callable[..., Sim], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sim = sim_factory("plain", *SIM_ARGS, "--flavour", "llamacpp")
    assert bench(sim.url, tmp_path / "r.jsonl", "--concurrency", "1", "--requests-per-level", "2") == 2
    err = capsys.readouterr().err
    assert (
        f"the server at {sim.url} is not SGLang" in err and "use --api openai-chat or --api openai-completions" in err
    )
    assert not (tmp_path / "r.jsonl").exists()
    with urllib.request.urlopen(f"{sim.url}/metrics", timeout=10) as response:  # a fresh server: nothing generated
        assert "llamacpp:tokens_predicted_total 0\n" in response.read().decode()


@contextlib.contextmanager
def info_only_server(generate_status: int = 404) -> Iterator[str]:
    """/get_server_info answers, /v1/... is 404, POST /generate answers `generate_status`."""

    class Handler(QuietHandler):
        def do_GET(self) -> None:
            if self.path == "/get_server_info":
                self.send(200, "application/json", b'{"version": "x"}')
            else:
                self.send(404, "application/json", b"{}")

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send(generate_status, "application/json", b'{"error": "the model is not loaded"}')

    with serve(Handler) as server:
        yield url(server)


def test_openai_api_against_a_server_without_v1_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with info_only_server() as address:
        code = bench(address, tmp_path / "r.jsonl", "--api", "openai-chat", "--concurrency", "1")
    assert code == 2
    assert "no OpenAI routes (GET /v1/models is 404)" in capsys.readouterr().err


def test_a_level_where_every_request_failed_says_so(tmp_path: Path) -> None:
    # defect 8: the warning said "raise --requests-per-level" when every request had failed
    out = tmp_path / "r.jsonl"
    with info_only_server(500) as address:
        assert bench(address, out, "--concurrency", "1", "--requests-per-level", "3", "--warmup", "0") == 1
    (r,) = read_jsonl(out)
    assert r.errors == 3
    assert any(w.startswith("every measured request at C=1 failed") and "HTTP 500" in w for w in r.warnings)
    assert not any("raise --requests-per-level" in w for w in r.warnings)


def test_levels_are_paused_and_stamped_with_wall_clock_times(llama_plain: Sim, tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    extra = ("--concurrency", "1,2", "--requests-per-level", "2", "--api", "openai-chat", "--pause", "0.5")
    assert (
        run_subcommand("bench", "--url", llama_plain.url, "--quiet", "--output-len", "4", "--out", str(out), *extra)
        == 0
    )
    first, second = (json.loads(line) for line in out.read_text().splitlines())
    assert first["pause_s"] == 0.5 and first["args"]["pause"] == 0.5
    assert first["level_started_epoch"] <= first["level_ended_epoch"] <= second["level_started_epoch"] - 0.5
    assert first["level_started_at"].endswith("+00:00")


def test_duration_cuts_on_a_final_usage_engine_are_estimated_per_event(llama_plain: Sim, tmp_path: Path) -> None:
    # defect 10d: requests cut at a --duration window's end counted nothing when usage came only at the end (the
    # open loop cuts its tail requests there; the closed loop drains them, below)
    out = tmp_path / "r.jsonl"
    extra = ("--request-rate", "40", "--duration", "0.4", "--api", "openai-completions", "--output-len", "64")
    assert run_subcommand("bench", "--url", llama_plain.url, "--quiet", "--out", str(out), *extra) == 0
    (r,) = read_jsonl(out)
    assert "cut_tokens_estimated" in r.flags and r.output_tokens > 0
    assert any(row.cut for row in r.per_request)


def test_a_closed_loop_duration_drains_its_requests_so_the_servers_count_is_the_benchs(
    llama_plain: Sim, tmp_path: Path
) -> None:
    """At the window's end no worker sends again and the requests in flight finish (outside the window): every
    request has all its tokens, as the server counts them, and none runs on into the next level (a real SGLang
    server kept generating cancelled streams: docs/validation/2026-12-02-h200-sglang-server)."""
    out = tmp_path / "r.jsonl"
    extra = ("--concurrency", "2,3", "--duration", "0.4", "--api", "openai-completions", "--output-len", "64")
    assert run_subcommand("bench", "--url", llama_plain.url, "--quiet", "--out", str(out), *extra) == 0
    for r in read_jsonl(out):
        assert r.per_request and not any(row.cut for row in r.per_request), r.per_request
        assert {row.output_tokens for row in r.per_request} == {64}
        assert not {"cut_tokens_estimated", "cut_tokens_uncounted"} & set(r.flags), r.flags
        assert 0 < r.output_tokens < 64 * len(r.per_request)  # the window holds some, not all, of them


def test_min_lifetimes_extends_a_short_duration_window_until_it_spans_them(llama_plain: Sim, tmp_path: Path) -> None:
    """0.2 s of window is a few lifetimes of a 24-token request; --min-lifetimes 12 holds the window open until it
    spans 12 (the bench's own lifetimes figure says so: not 11.x, the margin above the done requests' mean), and it
    is refused without a closed-loop --duration."""
    out = tmp_path / "r.jsonl"
    extra = (
        "--concurrency",
        "2",
        "--duration",
        "0.2",
        "--min-lifetimes",
        "12",
        "--output-len",
        "24",
        "--api",
        "openai-chat",
    )
    assert run_subcommand("bench", "--url", llama_plain.url, "--quiet", "--out", str(out), *extra) == 0
    (r,) = read_jsonl(out)
    assert r.window_lifetimes is not None and r.window_lifetimes >= 12, (r.window_lifetimes, r.window_s)
    assert run_subcommand("bench", "--url", llama_plain.url, "--quiet", "--min-lifetimes", "12") == 2


def test_the_default_request_count_gives_four_per_worker() -> None:
    # defect 9: 2 per worker left the slope off by up to 11 %
    assert [default_requests(c) for c in (1, 8, 16, 64)] == [32, 32, 64, 256]


def staircase(rounds: int, c: int = 4, tokens: int = 8, step: float = 0.01) -> list[RequestRecord]:
    """`rounds` lockstep rounds of `c` requests, one token per step; the first round is warm-up."""
    records = []
    for k in range(rounds):
        start = k * tokens * step
        chunks = tuple((start + (j + 1) * step, 1) for j in range(tokens))
        records += [RequestRecord(k == 0, start, start, chunks[-1][0], chunks[0][0], chunks) for _ in range(c)]
    return records


def test_a_short_window_warns_and_records_its_uncertainty() -> None:
    records = staircase(3)
    s = summarize(4, records, records[0].end, records[-1].end)
    assert s.window_lifetimes is not None and s.window_lifetimes < 4
    assert any("request lifetimes" in w for w in s.warnings)
    assert s.throughput_halves_rel_diff is not None and s.throughput_halves_rel_diff < 0.2
    long = staircase(12)
    s = summarize(4, long, long[3].end, long[-1].end)
    assert not any("request lifetimes" in w for w in s.warnings)


def test_per_request_rows_round_trip_and_hostile_rows_are_refused() -> None:
    records = staircase(3)
    s = summarize(4, records, records[0].end, records[-1].end)
    assert len(s.per_request) == 12 and sum(row.warmup for row in s.per_request) == 4
    back = LevelSummary.from_json(json.loads(s.to_jsonl_line()), "x")
    assert [(r.output_tokens, r.warmup, r.in_window) for r in back.per_request] == [
        (r.output_tokens, r.warmup, r.in_window) for r in s.per_request
    ]
    assert [r.e2e_s for r in back.per_request] == pytest.approx([r.e2e_s for r in s.per_request], abs=1e-6)
    data = json.loads(s.to_jsonl_line())
    data["per_request"][1]["output_tokens"] = "16"
    with pytest.raises(RecordError, match=r"per_request\[1\].*'output_tokens'"):
        LevelSummary.from_json(data, "x")
    data["per_request"] = {"not": "a list"}
    with pytest.raises(RecordError, match="'per_request' must be a list"):
        LevelSummary.from_json(data, "x")


def test_old_records_without_the_new_fields_still_load() -> None:
    old = {"schema": "sm120check.bench/1", "concurrency": 2, "throughput_tok_s": 10.0, "accept_length": 2.0}
    r = LevelSummary.from_json(old, "old")
    assert r.per_request == () and r.accept_hist == () and r.throughput_halves_rel_diff is None
