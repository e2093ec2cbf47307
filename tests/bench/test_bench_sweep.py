"""`sm120check bench` against the simulated server: records, token counts, accepted length, clear failures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.conftest import Sim, run_subcommand
from sm120check.bench.cli import switch_meta
from sm120check.bench.closedloop import RequestRecord, summarize
from sm120check.bench.records import read_jsonl
from sm120check.bench.simserver import SimModel
from sm120check.sglang import plain_decode


def bench(sim: Sim, out: Path, *extra: str) -> int:
    return run_subcommand(
        "bench",
        "--url",
        sim.url,
        "--quiet",
        "--output-len",
        "16",
        "--input-len",
        "8",
        "--pause",
        "0",
        "--out",
        str(out),
        *extra,
    )


@pytest.mark.parametrize("api", ["sglang", "openai-completions", "openai-chat"])
def test_each_api_appends_one_record_per_level_with_every_token_counted(
    spec_sim: Sim, tmp_path: Path, api: str
) -> None:
    out = tmp_path / "spec.jsonl"
    assert (
        bench(spec_sim, out, "--api", api, "--concurrency", "1,2", "--requests-per-level", "4", "--label", "spec") == 0
    )
    records = read_jsonl(out)
    assert [r.concurrency for r in records] == [1, 2]
    for r in records:
        assert r.label == "spec" and r.errors == 0 and r.requests == 4
        # 16 tokens per request at tau = 2: 8 chunks of 2 tokens; counted per chunk this would be half
        assert r.tpot_s is not None and r.e2e_s is not None and r.ttft_s is not None and r.itl_s is not None
        assert r.per_request_tok_s is not None
        # each request's rate is its 16 tokens over its own latency, so their mean is at least 16 over the mean
        # latency (equal when all latencies are equal); counted per chunk it would be about half of that
        assert r.per_request_tok_s.n == r.e2e_s.n
        assert r.per_request_tok_s.mean >= 16 / r.e2e_s.mean * (1 - 1e-4)  # records keep 6 decimals
        assert r.meta["server"]["speculative_algorithm"] == "EAGLE3"  # type: ignore[index]
        # SGLang's avg_spec_accept_length counts since server start: recorded as such, never a level's value
        assert r.meta["server_accept_length_cumulative"] == pytest.approx(2.0, abs=0.05)
        if api == "sglang":
            assert r.accept_length == pytest.approx(2.0, abs=0.05)
        else:  # the OpenAI responses carry no per-request acceptance and SGLang has no level counters
            assert r.accept_length is None
    sources = {r.accept_source for r in records}
    assert sources == ({"meta_info.spec_verify_ct"} if api == "sglang" else {""})


def test_single_stream_throughput_is_the_servers_step_rate(plain_sim: Sim, tmp_path: Path) -> None:
    # the reduction, exactly: one stream whose tokens arrive every plain step at batch 1 (a + b = 10.4 ms), as the
    # simulated server's model schedules them, gives 1 / 10.4 ms. (Live, the rate is wall-clock sleeps measured on
    # a shared machine: how close a live run comes to it is `make bench`'s job, benchmarks/bench_client.py.)
    step = SimModel("plain", a=0.010, b=0.0004).step_time(1)
    records, t = [], 100.0
    for i in range(7):
        chunks = tuple((t + k * step, 1) for k in range(1, 17))
        records.append(RequestRecord(i == 0, t, t, chunks[-1][0], chunks[0][0], chunks))
        t = chunks[-1][0]
    summary = summarize(1, records, records[0].end, records[-1].end)
    assert summary.window_valid and summary.requests == 6 and summary.errors == 0
    assert summary.throughput_tok_s == pytest.approx(1 / 0.0104, rel=1e-9)
    assert summary.e2e_s is not None and summary.e2e_s.p50 == pytest.approx(16 * step, rel=1e-9)

    # and live: the same numbers are there, finite, from what the client received
    out = tmp_path / "base.jsonl"
    assert bench(plain_sim, out, "--concurrency", "1", "--requests-per-level", "6") == 0
    (record,) = read_jsonl(out)
    assert record.errors == 0 and record.requests == 6 and record.window_valid
    assert 0 < record.output_tokens <= 6 * 16 and record.window_s > 0 and record.throughput_tok_s > 0
    assert record.client_wait_s is not None and record.client_wait_s.n > 0 and record.client_wait_s.p50 >= 0


def test_record_carries_the_arguments_and_server_info(spec_sim: Sim, tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    assert bench(spec_sim, out, "--concurrency", "3", "--duration", "0.3") == 0
    data = json.loads(out.read_text().splitlines()[0])
    assert data["args"]["duration"] == 0.3 and data["args"]["concurrency"] == [3]
    assert data["server"]["speculative_num_steps"] == 3
    assert data["schema"] == "sm120check.bench/1" and data["window_valid"] is True


def test_unreachable_server_is_exit_2_with_a_hint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Nothing measured: the bench could not do its job (exitcodes.Exit.USAGE), as docs/bench.md's exit table says.
    code = run_subcommand("bench", "--url", "http://127.0.0.1:9", "--concurrency", "1", "--out", str(tmp_path / "x"))
    assert code == 2
    err = capsys.readouterr().err
    assert "cannot connect to http://127.0.0.1:9" in err and "/health" in err
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("levels", ["0,2", "1,x", ","])
def test_bad_concurrency_list_is_a_usage_error(levels: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        run_subcommand("bench", "--url", "http://127.0.0.1:9", "--concurrency", levels)
    assert exc.value.code == 2
    assert "--concurrency" in capsys.readouterr().err


def test_bad_url_names_the_value_and_the_fix(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_subcommand("bench", "--url", "127.0.0.1:30000") == 2
    assert "give one like http://127.0.0.1:30000" in capsys.readouterr().err


SWITCH_LOG = Path(__file__).resolve().parents[1] / "sglang" / "fixtures" / "h100-switch-0.5.16.log"


def test_server_log_gives_each_level_the_switchs_batches(spec_sim: Sim, tmp_path: Path) -> None:
    """--server-log: the level's plain and speculative decode batches per batch size, the growth of the patch's
    cumulative counts (the real H100 server's lines) between the level's start and end."""
    log = tmp_path / "server.log"
    lines = SWITCH_LOG.read_text().splitlines(keepends=True)
    counts = [i for i, line in enumerate(lines) if "sm120kit plain decode batches:" in line]
    log.write_text("".join(lines[: counts[-2] + 1]))  # the second-last count line only, before the level
    out = tmp_path / "r.jsonl"
    assert bench(spec_sim, out, "--concurrency", "2", "--duration", "0.3", "--server-log", str(log)) == 0
    first = json.loads(out.read_text().splitlines()[0])
    assert first["plain_decode_batches"] == {"plain": {}, "speculative": {}}  # no line came during the level

    before = plain_decode.counts(lines[: counts[-2] + 1])
    after = plain_decode.counts(lines)
    assert before is not None and after is not None
    grew = switch_meta(before, after)["plain_decode_batches"]
    assert isinstance(grew, dict)
    assert sum(grew["plain"].values()) + sum(grew["speculative"].values()) == 200  # one count line apart
    assert switch_meta(None, None) == {}


def test_without_server_log_no_switch_field(spec_sim: Sim, tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    assert bench(spec_sim, out, "--concurrency", "2", "--duration", "0.3") == 0
    assert "plain_decode_batches" not in json.loads(out.read_text().splitlines()[0])


def test_output_len_spread_draws_the_same_lengths_for_every_server() -> None:
    from sm120check.bench.prompts import output_len

    assert {output_len(128, 0.0, 7, 30, i) for i in range(50)} == {128}
    drawn = [output_len(128, 0.5, 7, 30, i) for i in range(2000)]
    assert min(drawn) >= 64 and max(drawn) <= 192 and len(set(drawn)) > 100
    assert sum(drawn) / len(drawn) == pytest.approx(128, rel=0.03)  # the mean stays --output-len
    assert drawn == [output_len(128, 0.5, 7, 30, i) for i in range(2000)]  # the next server is asked the same
    assert drawn != [output_len(128, 0.5, 8, 30, i) for i in range(2000)]  # another --seed, other draws
    assert output_len(1, 0.9, 0, 1, 0) >= 1


@pytest.mark.parametrize("bad", ["1", "-0.1", "nan", "half"])
def test_output_len_spread_out_of_range_is_a_usage_error(bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as raised:
        run_subcommand("bench", "--url", "http://127.0.0.1:9", "--output-len-spread", bad)
    assert raised.value.code == 2
    err = capsys.readouterr().err
    assert "--output-len-spread" in err and repr(bad) in err and "less than 1" in err


def test_a_sweep_with_spread_lengths_counts_each_requests_own_length(plain_sim: Sim, tmp_path: Path) -> None:
    out = tmp_path / "spread.jsonl"
    code = bench(plain_sim, out, "--concurrency", "2", "--requests-per-level", "8", "--output-len-spread", "0.5")
    assert code == 0
    (record,) = read_jsonl(out)
    # each request's tokens are checked against its own asked length (closedloop's anomaly), none exceeded it
    assert record.errors == 0 and record.requests == 8
    assert not [w for w in record.warnings if "--output-len" in w], record.warnings
    assert json.loads(out.read_text())["args"]["output_len_spread"] == 0.5  # the record says how it was asked
