"""`bench` against a server that lies (reliability probe item 14: B24, B14, B9): cumulative token counts that go
backwards or beyond --output-len, a negative spec_verify_ct and a non-finite accept length are flagged in the
record and left out of the numbers; the JSONL stays strict JSON; --temperature and --concurrency are range-checked
at parse time."""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.conftest import run_subcommand
from lab.loopback import QuietHandler, serve, sse, url
from sm120check.bench.records import LevelSummary


def _strict(text: str) -> object:
    def refuse(name: str) -> object:
        raise ValueError(f"not strict JSON: {name}")

    return json.loads(text, parse_constant=refuse)


@contextlib.contextmanager
def lying_server(counts: list[int], meta: dict[str, object] | None = None, info: str = "{}") -> Iterator[str]:
    """/generate streams SGLang events with the given cumulative completion_tokens (plus `meta` in the last one);
    /get_server_info answers the raw text `info` (which may hold NaN or Infinity)."""

    class Handler(QuietHandler):
        def do_GET(self) -> None:
            if self.path in ("/get_server_info", "/server_info"):
                self.send(200, "application/json", info.encode())
            else:
                self.send(404, "application/json", b"{}")

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            events: list[dict[str, object]] = [
                {"text": " tok" * (i + 1), "meta_info": {"completion_tokens": n, "finish_reason": None}}
                for i, n in enumerate(counts)
            ]
            last = events[-1]["meta_info"]
            assert isinstance(last, dict)
            last.update(meta or {}, finish_reason={"type": "length"})
            self.send(200, "text/event-stream", sse(events))

    with serve(Handler) as server:
        yield url(server)


def bench(url: str, out: Path, *extra: str, code: int = 0) -> dict[str, Any]:
    got = run_subcommand(
        "bench", "--url", url, "--concurrency", "1", "--requests-per-level", "2", "--warmup", "0",
        "--output-len", "16", "--quiet", "--info-timeout", "2", "--request-timeout", "10", "--level-timeout", "20",
        "--out", str(out), *extra,
    )  # fmt: skip
    assert got == code
    lines = out.read_text().splitlines()
    assert len(lines) == 1
    data = _strict(lines[0])
    assert isinstance(data, dict)
    return data


@pytest.mark.timeout(60)
def test_counts_that_go_backwards_or_explode_are_flagged_and_not_counted(tmp_path: Path) -> None:
    with lying_server([5, 3, -100, 10**12]) as url:
        record = bench(url, tmp_path / "r.jsonl", code=1)  # no request could be counted: no success
    assert record["flags"] == ["untrusted_token_counts", "no_numbers"]
    assert any("cannot be true" in str(w) for w in record["warnings"])
    # probe 2, B24: the warning said "every measured request ... failed (0 of 2; first error: none)"
    assert (
        "no measured request at C=1 can be trusted (2 of 2 reported token counts that cannot be true); the level "
        "has no numbers" in record["warnings"]
    )
    assert not any("failed" in str(w) for w in record["warnings"])
    assert record["throughput_tok_s"] == 0 and record["output_tokens"] == 0


@pytest.mark.timeout(60)
def test_tokens_above_output_len_are_flagged(tmp_path: Path) -> None:
    with lying_server([1, 2, 50]) as url:
        record = bench(url, tmp_path / "r.jsonl", code=1)
    assert "untrusted_token_counts" in record["flags"]
    assert any("--output-len" in str(w) for w in record["warnings"])
    assert record["output_tokens"] == 0


@pytest.mark.timeout(60)
def test_a_negative_spec_verify_ct_gives_no_negative_accept_length(tmp_path: Path) -> None:
    with lying_server([2, 4, 6], {"spec_verify_ct": -1}) as url:
        record = bench(url, tmp_path / "r.jsonl", code=1)
    assert record["accept_length"] is None
    assert "untrusted_token_counts" in record["flags"]


@pytest.mark.timeout(60)
def test_honest_counts_carry_no_flag(tmp_path: Path) -> None:
    with lying_server([2, 4, 6], {"spec_verify_ct": 3}) as url:
        record = bench(url, tmp_path / "r.jsonl")
    assert record["flags"] == [] and record["accept_length"] == 2.0 and record["output_tokens"] > 0


@pytest.mark.timeout(60)
def test_non_finite_server_values_become_null_with_a_flag(tmp_path: Path) -> None:
    info = '{"version": "liar", "speculative_num_steps": NaN, "tp_size": Infinity, "avg_spec_accept_length": Infinity}'
    with lying_server([2, 4, 6], info=info) as url:
        record = bench(url, tmp_path / "r.jsonl")
    assert record["accept_length"] is None and record["server_accept_length_cumulative"] is None
    server = record["server"]
    assert isinstance(server, dict) and server["tp_size"] is None and server["speculative_num_steps"] is None
    flags = record["flags"]
    assert isinstance(flags, list)
    assert "untrusted_server_accept_length" in flags and "non_finite:server.tp_size" in flags


def test_a_non_finite_measurement_is_written_as_null() -> None:
    line = LevelSummary(concurrency=1, throughput_tok_s=math.inf, window_s=math.nan, output_tokens=1, requests=1,
                        errors=0).to_jsonl_line()  # fmt: skip
    data = _strict(line)
    assert isinstance(data, dict) and data["throughput_tok_s"] is None and data["window_s"] is None
    assert data["flags"] == ["non_finite:throughput_tok_s", "non_finite:window_s"]


@pytest.mark.parametrize(
    "argv", [["--temperature", "nan"], ["--temperature", "inf"], ["--temperature", "-1"], ["--concurrency", "1,100000"]]
)
def test_unsafe_options_are_refused_at_parse_time(
    argv: list[str], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    with pytest.raises(SystemExit) as exc:
        run_subcommand("bench", "--url", "http://127.0.0.1:9", "--out", str(tmp_path / "r.jsonl"), *argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert argv[0] in err
    assert not (tmp_path / "r.jsonl").exists()
