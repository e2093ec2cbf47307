"""`bench` against servers that die or stall (reliability probe 3, defects 1, 3, 5, 16: BH12, BH13, BH15, BL5-BL7):
a TCP reset mid-stream is that request's failure and the level is kept; a level where no request finished is a
failure, never exit 0; a /metrics stall or a server death as a level ends keeps the level's record, flagged; a
window never grows against a server that fails every request."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bench.conftest import run_subcommand
from bench.hostile_server import Hostile, hostile_server
from sm120check.bench.closedloop import LevelPlan, RequestRecord, _extended_deadline, _LevelState


def _bench(url: str, out: Path, *argv: str) -> int:
    return run_subcommand(
        "bench", "--url", url, "--warmup", "0", "--output-len", "4", "--pause", "0", "--quiet", "--info-timeout", "2",
        "--request-timeout", "20", "--out", str(out), *argv,
    )  # fmt: skip


def _records(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]


@pytest.mark.timeout(60)
def test_a_reset_mid_stream_is_each_requests_failure_and_the_level_is_kept(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "o.jsonl"
    with hostile_server(Hostile(generate="reset")) as server:  # was a ConnectionResetError traceback, no o.jsonl
        code = _bench(server.url, out, "--concurrency", "1", "--requests-per-level", "4")
    err = capsys.readouterr().err
    assert code == 1
    assert "Traceback" not in err and "4 requests failed" in err
    [record] = _records(out)
    assert record["requests"] == 4 and record["errors"] == 4
    assert record["error_samples"] == ["connection reset by the server while the response was streaming"]
    assert "no_numbers" in record["flags"]


@pytest.mark.timeout(60)
def test_a_level_where_no_request_finished_is_a_failure(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "o.jsonl"
    with hostile_server(Hostile(generate="stall")) as server:  # was exit 0 with requests 0 and no flag
        code = _bench(server.url, out, "--concurrency", "2", "--requests-per-level", "4", "--level-timeout", "2")
    err = capsys.readouterr().err
    assert code == 1
    assert "C=2: no measured request could be counted" in err
    [record] = _records(out)
    assert record["requests"] == 0 and record["flags"] == ["no_numbers"]
    assert any(
        w.startswith("no measured request finished at C=2 (2 still running when the level ended at --level-timeout)")
        for w in record["warnings"]
    )
    assert not any("warm-up" in w for w in record["warnings"])


@pytest.mark.timeout(60)
@pytest.mark.parametrize("level_timeout", ["0.05", "1e-9"])
def test_a_level_timeout_shorter_than_any_request_is_a_failure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], level_timeout: str
) -> None:
    out = tmp_path / "o.jsonl"
    with hostile_server(Hostile(delay=0.5)) as server:  # a healthy server; was exit 0 with requests 0 (probe 3 BL6)
        code = _bench(
            server.url, out, "--concurrency", "1", "--requests-per-level", "4", "--level-timeout", level_timeout
        )
    err = capsys.readouterr().err
    assert code == 1 and "C=1: no measured request could be counted" in err
    [record] = _records(out)
    assert record["requests"] == 0 and record["flags"] == ["no_numbers"]


@pytest.mark.timeout(60)
def test_a_metrics_stall_as_the_level_ends_keeps_the_level(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "o.jsonl"
    with hostile_server(Hostile(metrics_ok=4)) as server:  # was "no complete response within", rc 1, no o.jsonl
        code = _bench(server.url, out, "--concurrency", "2,4", "--duration", "2", "--info-timeout", "1")
    err = capsys.readouterr().err
    assert code == 1
    assert f"stopped after C=2: GET {server.url}/metrics" in err
    assert f"1 level(s) finished before it stopped; their records are in {out}" in err
    [record] = _records(out)  # C=4 never ran
    assert record["concurrency"] == 2 and record["errors"] == 0 and record["requests"] > 0
    assert "server_lost_after_level" in record["flags"]
    assert any(w.startswith("/metrics after the level: GET") for w in record["warnings"])


@pytest.mark.timeout(60)
def test_a_server_that_dies_as_the_level_ends_keeps_what_it_measured(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "o.jsonl"
    with hostile_server(Hostile(die_after=3)) as server:
        code = _bench(server.url, out, "--concurrency", "1,2", "--requests-per-level", "4")
    err = capsys.readouterr().err
    assert code == 1
    assert "Traceback" not in err and "stopped after C=1" in err
    [record] = _records(out)
    assert record["requests"] == 4 and record["errors"] == 1  # the three answered requests are measured
    assert record["output_tokens"] == 9
    assert "server_lost_after_level" in record["flags"]


@pytest.mark.timeout(60)
def test_min_lifetimes_does_not_stretch_a_window_of_failing_requests(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "o.jsonl"
    state = Hostile(generate="fail")
    with hostile_server(state) as server:  # was a 17 s window and 15 000 requests for --duration 2
        code = _bench(server.url, out, "--concurrency", "1", "--duration", "1", "--min-lifetimes", "20")
    capsys.readouterr()
    assert code == 1
    [record] = _records(out)
    assert "no_numbers" in record["flags"]
    # the rule that kept the window from stretching, checked without a clock: every request failed, so no later end
    failed = RequestRecord(False, 0.1, 0.1, 0.2, error="HTTP 500")
    level = _LevelState(None, 0, started=0.0, t0=0.0, deadline=1.0, records=[failed])
    assert _extended_deadline(LevelPlan(1, duration=1.0, min_lifetimes=20), level) is None


@pytest.mark.timeout(60)
def test_min_lifetimes_capped_by_the_level_timeout_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "o.jsonl"
    with hostile_server(Hostile(delay=0.05)) as server:  # was silent (probe 3 BL8)
        code = _bench(
            server.url,
            out,
            "--concurrency",
            "1",
            "--duration",
            "1",
            "--min-lifetimes",
            "1000",
            "--level-timeout",
            "3",
        )
    capsys.readouterr()
    assert code == 0
    [record] = _records(out)
    assert any(
        w.startswith("the steady window at C=1 spans ") and "short of --min-lifetimes 1000: --level-timeout 3 s" in w
        for w in record["warnings"]
    )


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("counter", "said"),
    [
        (lambda n: "NaN", "the server's own sglang:generation_tokens_total read nan during the level"),
        (lambda n: "+Inf", "the server's own sglang:generation_tokens_total read inf during the level"),
        (lambda n: str(10**6 - n), "the server's own sglang:generation_tokens_total went back from"),
        (lambda n: "5", "the server's own sglang:generation_tokens_total did not grow over the steady window"),
    ],
)
def test_a_lying_metrics_counter_is_said_not_recorded_silently(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], counter: Callable[[int], str], said: str
) -> None:
    out = tmp_path / "o.jsonl"
    with hostile_server(Hostile(counter=counter)) as server:  # was null or 0.0 with no warning (probe 3 BH1-BH3, BH8)
        code = _bench(server.url, out, "--concurrency", "1", "--duration", "1")
    capsys.readouterr()
    assert code == 0
    [record] = _records(out)
    assert any(w.startswith(said) for w in record["warnings"]), record["warnings"]


@pytest.mark.timeout(60)
def test_a_status_line_past_the_readers_limit_is_each_requests_failure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "o.jsonl"
    with hostile_server(Hostile(generate="long-status")) as server:  # was a ValueError from the worker
        code = _bench(server.url, out, "--concurrency", "1", "--requests-per-level", "2")
    assert code == 1 and "Traceback" not in capsys.readouterr().err
    [record] = _records(out)
    assert record["error_samples"] == ["POST /generate: the response's status line is longer than 1 MiB"]


def test_a_worker_backs_off_after_failures_never_past_the_window() -> None:
    from sm120check.bench.closedloop import BACKOFF_FIRST_S, BACKOFF_MAX_S, back_off

    pauses = [back_off(n, None, 0.0) for n in range(1, 10)]
    assert pauses[0] == BACKOFF_FIRST_S and pauses == sorted(pauses) and max(pauses) == BACKOFF_MAX_S
    assert back_off(10**6, None, 0.0) == BACKOFF_MAX_S  # no overflow after a long outage
    assert back_off(5, deadline=10.0, now=9.9) == pytest.approx(0.1)  # the window's end bounds it
    assert back_off(5, deadline=10.0, now=11.0) == 0.0


@pytest.mark.timeout(60)
def test_a_server_failing_every_request_is_not_hammered(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A dead or failing server answers at once; the closed loop once sent thousands of requests a second at it
    (15 000 in 2 s) until the window closed. Each worker now pauses after a failure, doubling to a second."""
    out = tmp_path / "o.jsonl"
    with hostile_server(Hostile(generate="fail")) as server:
        code = _bench(server.url, out, "--concurrency", "2", "--duration", "2")
    capsys.readouterr()
    assert code == 1
    [record] = _records(out)
    assert "no_numbers" in record["flags"] and record["errors"] >= 2
    assert record["errors"] < 100, record["errors"]  # 2 workers over 2 s: about 12 with the pauses
