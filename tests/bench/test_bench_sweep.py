"""`sm120check bench` against the simulated server: records, token counts, accepted length, clear failures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.conftest import Sim, run_subcommand
from sm120check.bench.records import read_jsonl


def bench(sim: Sim, out: Path, *extra: str) -> int:
    return run_subcommand(
        "bench", "--url", sim.url, "--quiet", "--output-len", "16", "--input-len", "8", "--out", str(out), *extra
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
        assert r.per_request_tok_s.mean == pytest.approx(16 / r.e2e_s.mean, rel=0.05)
        assert r.meta["server"]["speculative_algorithm"] == "EAGLE3"  # type: ignore[index]
        assert r.accept_length == pytest.approx(2.0, abs=0.05)
    sources = {r.accept_source for r in records}
    assert sources == ({"meta_info.spec_verify_ct"} if api == "sglang" else {"get_server_info"})


def test_single_stream_throughput_matches_the_servers_step_time(plain_sim: Sim, tmp_path: Path) -> None:
    out = tmp_path / "base.jsonl"
    assert bench(plain_sim, out, "--concurrency", "1", "--requests-per-level", "6") == 0
    (record,) = read_jsonl(out)
    # plain step at batch 1: a + b = 10.4 ms per token
    assert record.throughput_tok_s == pytest.approx(1 / 0.0104, rel=0.08)
    assert record.client_wait_s is not None and record.client_wait_s.p50 < 0.01


def test_record_carries_the_arguments_and_server_info(spec_sim: Sim, tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    assert bench(spec_sim, out, "--concurrency", "3", "--duration", "0.3") == 0
    data = json.loads(out.read_text().splitlines()[0])
    assert data["args"]["duration"] == 0.3 and data["args"]["concurrency"] == [3]
    assert data["server"]["speculative_num_steps"] == 3
    assert data["schema"] == "sm120check.bench/1" and data["window_valid"] is True


def test_unreachable_server_fails_with_a_hint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = run_subcommand("bench", "--url", "http://127.0.0.1:9", "--concurrency", "1", "--out", str(tmp_path / "x"))
    assert code == 1
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
