"""Fixtures for the bench tests: simulated servers in child processes and a way to run the subcommands."""

from __future__ import annotations

import argparse
import importlib
import re
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

# Parameters of the simulated servers: crossover (tau*a - c)/(d - tau*b) = (20 - 13)/(1.2 - 0.8) = 17.5
SIM_ARGS = ["--a-ms", "10", "--b-ms", "0.4", "--c-ms", "13", "--d-ms", "1.2", "--tau", "2"]
TRUE_CROSSOVER = 17.5


@pytest.fixture(autouse=True)
def _records_beside_the_test(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """`bench` without --out keeps its records in the current directory: a test's go to a temporary one."""
    monkeypatch.chdir(tmp_path_factory.mktemp("cwd"))


@dataclass
class Sim:
    url: str
    proc: subprocess.Popen[str]


SESSION_MAX_S = 3600  # a session-wide server outlasts one xdist worker's share of a loaded suite run


def start_sim(mode: str, *extra: str, max_seconds: int = 600) -> Sim:
    cmd = [sys.executable, "-m", "sm120check", "mock-server", "--mode", mode, "--port", "0"]
    cmd += ["--max-seconds", str(max_seconds)]
    proc = subprocess.Popen([*cmd, *extra], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    match = re.search(r"http://127\.0\.0\.1:\d+", line)
    if not match:
        proc.kill()
        raise RuntimeError(f"simulated server did not start: {line!r}")
    # whatever it writes later is read away: a pipe left full would block the server in its write
    threading.Thread(target=proc.stdout.read, daemon=True).start()
    return Sim(match.group(0), proc)


def stop_sim(sim: Sim) -> None:
    sim.proc.terminate()
    try:
        sim.proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        sim.proc.kill()
        sim.proc.wait(timeout=10)


@pytest.fixture(scope="session")
def sim_factory() -> Iterator[Callable[..., Sim]]:
    started: list[Sim] = []

    def make(mode: str, *extra: str) -> Sim:
        sim = start_sim(mode, *extra, max_seconds=SESSION_MAX_S)
        started.append(sim)
        return sim

    yield make
    for sim in started:
        stop_sim(sim)


@pytest.fixture(scope="session")
def session_sims() -> dict[str, Sim]:
    return {}


def live_sim(sims: dict[str, Sim], make: Callable[..., Sim], mode: str) -> Sim:
    """The session's `mode` server, started again when it has exited (its --max-seconds ran out in a long run, or
    it crashed): one test's dead server is not every later test's."""
    sim = sims.get(mode)
    if sim is None or sim.proc.poll() is not None:
        sim = sims[mode] = make(mode, *SIM_ARGS)
    return sim


@pytest.fixture
def plain_sim(session_sims: dict[str, Sim], sim_factory: Callable[..., Sim]) -> Sim:
    return live_sim(session_sims, sim_factory, "plain")


@pytest.fixture
def spec_sim(session_sims: dict[str, Sim], sim_factory: Callable[..., Sim]) -> Sim:
    return live_sim(session_sims, sim_factory, "spec")


def run_subcommand(*argv: str) -> int:
    """Run `sm120check <argv>` through the subcommand's own register hook (as cli.py dispatches it)."""
    module = {"bench": "sm120check.bench.cli", "crossover": "sm120check.bench.crossover_cli"}[argv[0]]
    parser = argparse.ArgumentParser(prog="sm120check")
    importlib.import_module(module).register(parser.add_subparsers())
    args = parser.parse_args(list(argv))
    code: int = args.handler(args)
    return code
