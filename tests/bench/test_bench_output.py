"""What `sm120check bench` prints and keeps, read as a user reads it: the records' file named on stderr, the table's
latency columns, open-loop rows by the rate asked for, and the progress lines."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from bench.conftest import SIM_ARGS, Sim, run_subcommand
from sm120check.bench.cli import local_gpus
from sm120check.bench.http import Endpoint
from sm120check.bench.records import read_jsonl

FAST = ["--output-len", "8", "--input-len", "8", "--pause", "0"]


def test_without_out_the_records_go_to_a_named_file_said_on_stderr(
    plain_sim: Sim, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        run_subcommand("bench", "--url", plain_sim.url, "--concurrency", "1,2", "--requests-per-level", "4", *FAST) == 0
    )
    (written,) = Path.cwd().glob("bench-*.jsonl")  # the test's own current directory (conftest)
    assert re.fullmatch(r"bench-\d{8}T\d{6}\.jsonl", written.name)
    assert [r.concurrency for r in read_jsonl(written)] == [1, 2]
    assert f"sm120check bench: 2 level record(s) appended to {written.name}\n" in capsys.readouterr().err


def test_the_table_shows_ttft_and_tpot_percentiles_in_ms(plain_sim: Sim, capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        run_subcommand("bench", "--url", plain_sim.url, "--concurrency", "1", "--requests-per-level", "4", *FAST) == 0
    )
    header, _, row = capsys.readouterr().out.splitlines()
    assert header == (
        "| Concurrency | Throughput (tok/s) | Per-Req (tok/s) | Avg Latency (s) "
        "| TTFT p50/p99 (ms) | TPOT p50/p99 (ms) |"
    )
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[0] == "1"
    for cell in cells[4:]:  # "12.3 / 15.0": p50 then p99, milliseconds (the simulated step is about 10 ms)
        p50, p99 = (float(v) for v in cell.split(" / "))
        assert 0 < p50 <= p99 < 10_000


def test_open_loop_rows_name_the_requested_rate_and_goodput(
    sim_factory: object, capsys: pytest.CaptureFixture[str]
) -> None:
    sim: Sim = sim_factory("plain", *SIM_ARGS)  # type: ignore[operator]
    argv = ["--url", sim.url, "--request-rate", "5,40", "--requests-per-level", "6", "--slo", "e2e=30", *FAST]
    assert run_subcommand("bench", *argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("| Rate (req/s) | Throughput (tok/s) |") and lines[0].endswith("| Goodput (req/s) |")
    assert [line.split("|")[1].strip() for line in lines[2:]] == ["5", "40"]
    assert all(re.search(r"\| \d+\.\d\d \((\d+)/\1 met\) \|$", line) for line in lines[2:]), lines  # all met e2e=30


def test_progress_says_level_k_of_n_and_the_time_left(plain_sim: Sim, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--url", plain_sim.url, "--concurrency", "1,2,3", "--requests-per-level", "3", *FAST]
    assert run_subcommand("bench", *argv) == 0
    err = capsys.readouterr().err
    assert "level 1 of 3, C=1: 3 measured requests" in err and "level 3 of 3, C=3:" in err
    assert re.search(r"  2 level\(s\) left, about \d+ s \(a guess from the levels so far\)", err), err
    assert "  1 level(s) left" in err and "0 level(s) left" not in err


def test_a_dead_server_is_exit_2_and_leaves_no_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_subcommand("bench", "--url", "http://127.0.0.1:9", "--concurrency", "1") == 2
    assert "is the server up? check http://127.0.0.1:9/health" in capsys.readouterr().err
    assert not list(Path.cwd().glob("bench-*.jsonl"))


def _fake_nvidia_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text("#!/bin/sh\nprintf 'NVIDIA RTX PRO 6000 Blackwell Server Edition\\n%.0s' 1 2\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{smi.parent}:{os.environ['PATH']}")


def test_records_name_the_gpus_of_a_server_on_this_host(
    plain_sim: Sim, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # what crossover's plot title names (model, engine, GPU, date): the bench is the only one that can see the GPU
    _fake_nvidia_smi(tmp_path, monkeypatch)
    out = tmp_path / "sweep.jsonl"
    argv = ["--url", plain_sim.url, "--concurrency", "1", "--requests-per-level", "4", *FAST, "--out", str(out)]
    assert run_subcommand("bench", *argv) == 0
    (record,) = read_jsonl(out)
    client = record.meta["client"]
    assert isinstance(client, dict) and client["gpus"] == ["NVIDIA RTX PRO 6000 Blackwell Server Edition"] * 2


def test_a_remote_server_gets_no_gpu_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_nvidia_smi(tmp_path, monkeypatch)
    assert local_gpus(Endpoint.parse("http://10.0.0.7:30000")) == {}
    assert local_gpus(Endpoint.parse("http://localhost:30000")) == {
        "gpus": ["NVIDIA RTX PRO 6000 Blackwell Server Edition"] * 2
    }
