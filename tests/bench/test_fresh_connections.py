"""`bench --fresh-connections`: a new connection for every request, counted by the simulated server (which connections
carried a generate request), against one keep-alive connection per worker without it; the closed loop through the
CLI, the open loop through its level runner."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from bench.conftest import Sim, run_subcommand
from sm120check.bench.apis import Api, RequestSpec
from sm120check.bench.arrivals import Arrivals
from sm120check.bench.http import Endpoint
from sm120check.bench.openloop import OpenLoopStats, RatePlan, run_rate_level
from sm120check.bench.records import read_jsonl

FAST = ("--a-ms", "2", "--b-ms", "0.1", "--c-ms", "2", "--d-ms", "0.1")
SWEEP = ("--concurrency", "4", "--requests-per-level", "12", "--warmup", "1", "--input-len", "4", "--output-len", "8")


def generation_connections(sim: Sim) -> tuple[int, int]:
    """The simulated server's generate requests and the connections that carried them."""
    with urllib.request.urlopen(f"{sim.url}/get_server_info", timeout=30) as resp:
        stats = json.load(resp)["sim_stats"]
    return int(stats["requests"]), int(stats["generation_connections"])


@pytest.mark.timeout(300)
@pytest.mark.parametrize("fresh", [False, True])
def test_the_closed_loop_opens_a_connection_per_request_only_when_asked(
    sim_factory: Callable[..., Sim], tmp_path: Path, fresh: bool
) -> None:
    sim = sim_factory("plain", *FAST)  # a server of its own: its counters are this sweep's
    out = tmp_path / "sweep.jsonl"
    flag = ["--fresh-connections"] if fresh else []
    assert run_subcommand("bench", "--url", sim.url, *SWEEP, "--quiet", "--pause", "0", *flag, "--out", str(out)) == 0
    requests, connections = generation_connections(sim)
    assert requests == 12 + 4  # the measured requests and one warm-up a worker
    # keep-alive: each of the 4 workers keeps its one connection for the level; fresh: one a request
    assert connections == (requests if fresh else 4)
    (record,) = read_jsonl(out)
    assert record.meta["args"]["fresh_connections"] is fresh  # type: ignore[index]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("fresh", [False, True])
def test_the_open_loop_reuses_idle_connections_unless_asked_for_fresh_ones(
    sim_factory: Callable[..., Sim], fresh: bool
) -> None:
    sim = sim_factory("plain", *FAST)
    plan = RatePlan(
        Arrivals(200.0, 1.0, seed=3), requests=20, warmup=2, request_timeout=60, level_timeout=120,
        fresh_connections=fresh,
    )  # fmt: skip
    stats = OpenLoopStats()
    records, _, _, timed_out = asyncio.run(
        run_rate_level(Endpoint.parse(sim.url), Api.SGLANG, plan, lambda i: RequestSpec("hi", 8), stats=stats)
    )
    assert not timed_out and not any(r.error for r in records)
    requests, connections = generation_connections(sim)
    assert requests == stats.arrivals
    if fresh:
        assert connections == requests
    else:  # an idle connection is taken again: at most as many as were ever in flight at once
        assert connections <= stats.peak_in_flight < requests


FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "bench"
BASE, SPEC = (FIXTURES / f"h200-sglang-0.5.16-{name}.jsonl" for name in ("base", "spec"))


def with_fresh_connections(src: Path, dest: Path) -> Path:
    """`src`'s records as a bench run with --fresh-connections would have recorded them."""
    rows = [json.loads(line) for line in src.read_text(encoding="utf-8").splitlines() if line.strip()]
    for row in rows:
        row["args"]["fresh_connections"] = True
    dest.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return dest


def connection_warnings(capsys: pytest.CaptureFixture[str], base: Path, spec: Path) -> list[str]:
    assert run_subcommand("crossover", str(base), str(spec), "--format", "json") == 0
    return [w for w in json.loads(capsys.readouterr().out)["warnings"] if "connections" in w]


def test_crossover_warns_when_the_two_sweeps_used_different_connections(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fresh_spec = with_fresh_connections(SPEC, tmp_path / "spec-fresh.jsonl")
    (warning,) = connection_warnings(capsys, BASE, fresh_spec)
    assert warning.startswith(f"{BASE} was measured with keep-alive connections and {fresh_spec} with fresh")
    assert "--fresh-connections" in warning
    # the same way on both sides, keep-alive (records older than the flag) or fresh: nothing said
    assert connection_warnings(capsys, BASE, SPEC) == []
    fresh_base = with_fresh_connections(BASE, tmp_path / "base-fresh.jsonl")
    assert connection_warnings(capsys, fresh_base, fresh_spec) == []
