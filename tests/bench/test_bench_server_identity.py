"""The bench records which server answered at the start and the end of every level, flags a sweep whose server
changed (two real simulated servers swapped behind one port between levels), and `crossover` refuses that sweep."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from bench.conftest import SIM_ARGS, Sim, live_sim, run_subcommand, start_sim, stop_sim
from sm120check.bench.identity import CHANGED, SWEEP_CHANGED, LevelIdentity
from sm120check.bench.records import read_jsonl

ROOT = Path(__file__).resolve().parents[2]
BENCH = ["--output-len", "16", "--input-len", "8", "--requests-per-level", "4", "--info-timeout", "10"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def swapped_sweep(out: Path) -> tuple[int, str, int, int]:
    """`sm120check bench` at C=1,2 against a simulated server that is stopped after C=1 and replaced, on the same
    port and with the same arguments, by a second one (a restart). Returns the bench's exit status, its stderr and
    the two servers' random_seed."""
    port = free_port()
    first = start_sim("plain", *SIM_ARGS, "--port", str(port))
    second: Sim | None = None
    seeds: list[int] = []
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'python' / 'sm120check' / 'src'}:{os.environ.get('PYTHONPATH', '')}"}
    cmd = [sys.executable, "-m", "sm120check", "bench", "--url", first.url, "--concurrency", "1,2", *BENCH]
    # the pause between levels is the window the swap happens in; the bench never waits longer than that
    cmd += ["--pause", "30", "--level-timeout", "60", "--out", str(out)]
    bench = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    killer = threading.Timer(150, bench.kill)  # a bound on the whole sweep, not a timing assertion
    killer.start()
    lines: list[str] = []
    try:
        assert bench.stderr is not None
        seeds.append(server_seed(first))
        for line in bench.stderr:
            lines.append(line)
            if second is None and re.match(r"C=1: [\d.]+ tok/s", line):
                stop_sim(first)
                second = start_sim("plain", *SIM_ARGS, "--port", str(port))
                seeds.append(server_seed(second))
        status = bench.wait(timeout=30)
    finally:
        killer.cancel()
        if bench.poll() is None:
            bench.kill()
            bench.wait(timeout=10)
        for sim in (first, second):
            if sim is not None and sim.proc.poll() is None:
                stop_sim(sim)
    assert second is not None, "".join(lines)
    return status, "".join(lines), seeds[0], seeds[1]


def server_seed(sim: Sim) -> int:
    import urllib.request

    with urllib.request.urlopen(f"{sim.url}/server_info", timeout=10) as response:
        return int(json.loads(response.read())["random_seed"])


@pytest.fixture(scope="module")
def swapped(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int, str, int, int]:
    out = tmp_path_factory.mktemp("swap") / "base.jsonl"
    status, err, before, after = swapped_sweep(out)
    return out, status, err, before, after


def test_a_server_swapped_between_levels_flags_the_level_and_fails_the_bench(
    swapped: tuple[Path, int, str, int, int],
) -> None:
    out, status, err, before, after = swapped
    assert before != after
    assert status == 1, err
    assert "changed during the sweep (first at C=2" in err and "crossover` refuses them" in err
    first, second = read_jsonl(out)
    assert CHANGED not in first.flags and SWEEP_CHANGED not in first.flags
    assert CHANGED in second.flags and SWEEP_CHANGED in second.flags
    ids = [LevelIdentity.of(r, "record") for r in (first, second)]
    assert ids[0] is not None and ids[1] is not None
    assert ids[0].start == ids[0].end and dict(ids[0].start.fields)["random_seed"] == before  # type: ignore[union-attr]
    assert ids[1].start is not None and dict(ids[1].start.fields)["random_seed"] == after
    (warning,) = [w for w in second.warnings if w.startswith("the server changed")]
    assert warning == (
        f"the server changed between the previous level's end and this level's start: sglang random_seed={before} "
        f"-> sglang random_seed={after}"
    )


def crossover(base: Path, spec: Path) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        status = run_subcommand("crossover", str(base), str(spec))
    return status, err.getvalue()


@pytest.fixture(scope="module")
def base_sweep(
    session_sims: dict[str, Sim], sim_factory: Callable[..., Sim], tmp_path_factory: pytest.TempPathFactory
) -> Path:
    out = tmp_path_factory.mktemp("base") / "base.jsonl"
    url = live_sim(session_sims, sim_factory, "plain").url
    args = ["--url", url, "--concurrency", "1,2", "--quiet", "--pause", "0", *BENCH, "--out", str(out)]
    assert run_subcommand("bench", *args) == 0
    return out


@pytest.fixture(scope="module")
def spec_sweep(
    session_sims: dict[str, Sim], sim_factory: Callable[..., Sim], tmp_path_factory: pytest.TempPathFactory
) -> Path:
    out = tmp_path_factory.mktemp("spec") / "spec.jsonl"
    url = live_sim(session_sims, sim_factory, "spec").url
    args = ["--url", url, "--concurrency", "1,2", "--quiet", "--pause", "0", *BENCH, "--out", str(out)]
    assert run_subcommand("bench", *args) == 0
    return out


def test_one_server_sweep_records_the_same_identity_at_every_edge(spec_sweep: Path) -> None:
    records = read_jsonl(spec_sweep)
    ids = {json.dumps(LevelIdentity.of(r, "record").to_json(), sort_keys=True) for r in records}  # type: ignore[union-attr]
    assert len(ids) == 1
    (level,) = [LevelIdentity.of(records[0], "record")]
    assert level is not None and level.start == level.end and level.start is not None
    assert dict(level.start.fields)["speculative_algorithm"] == "EAGLE3"
    assert not {CHANGED, SWEEP_CHANGED} & {f for r in records for f in r.flags}


def test_crossover_refuses_the_swapped_sweep_naming_the_level_and_both_servers(
    swapped: tuple[Path, int, str, int, int], spec_sweep: Path
) -> None:
    out, _, _, before, after = swapped
    status, err = crossover(out, spec_sweep)
    assert status == 2
    assert "record 2 (C=2): the bench flagged a server change (the server changed" in err
    assert f"random_seed={before} -> sglang random_seed={after}" in err


def test_crossover_refuses_levels_of_one_run_from_two_servers_even_unflagged(
    swapped: tuple[Path, int, str, int, int], spec_sweep: Path, tmp_path: Path
) -> None:
    """A file whose flags were dropped (hand-edited, or joined from two runs under one run_id) still names both."""
    out, _, _, before, after = swapped
    unflagged = tmp_path / "unflagged.jsonl"
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    for row in rows:
        row["flags"] = [f for f in row["flags"] if f not in (CHANGED, SWEEP_CHANGED)]
    unflagged.write_text("".join(json.dumps(row) + "\n" for row in rows))
    status, err = crossover(unflagged, spec_sweep)
    assert status == 2
    assert f"the server changed at C=2 (record 2) of {unflagged}: sglang random_seed={before} -> " in err
    assert f"random_seed={after}; its numbers mix two servers" in err


@pytest.mark.parametrize(
    ("identity", "said"),
    [
        ("not an object", "must be an object with start and end"),
        ({"start": {"engine": "sglang", "fields": {"pid": [1]}}, "end": None}, "'pid'=[1] is not one it records"),
        ({"start": {"engine": "vllm", "fields": {}}, "end": None}, "engine 'vllm' is none of"),
    ],
)
def test_crossover_refuses_a_malformed_identity_naming_the_field(
    base_sweep: Path, spec_sweep: Path, tmp_path: Path, identity: object, said: str
) -> None:
    rows = [json.loads(line) for line in spec_sweep.read_text().splitlines()]
    rows[0]["server_identity"] = identity
    bad = tmp_path / "bad.jsonl"
    bad.write_text("".join(json.dumps(row) + "\n" for row in rows))
    status, err = crossover(base_sweep, bad)
    assert status == 2 and said in err
