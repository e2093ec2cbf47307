"""`sm120check mock-server`, the documented simulated server (docs/bench.md "The simulated server")."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request

from bench.conftest import SIM_ARGS, start_sim, stop_sim


def test_mock_server_serves_the_model_it_was_given_until_terminated() -> None:
    sim = start_sim("spec", *SIM_ARGS)
    try:
        with urllib.request.urlopen(f"{sim.url}/get_server_info", timeout=10) as reply:
            info = json.load(reply)
    finally:
        stop_sim(sim)
    assert sim.proc.returncode == 0
    assert info["sim_model"] == {
        "mode": "spec",
        "a": 0.01,
        "b": 0.0004,
        "c": 0.013,
        "d": 0.0012,
        "tau": 2.0,
        "max_batch": 4096,
    }
    assert info["sim_stats"]["requests"] == 0
    assert info["speculative_num_steps"] == 3


def test_mock_server_help_lists_the_model_options_and_exit_statuses() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "sm120check", "mock-server", "--help"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0
    assert "--tau" in done.stdout and "exit status:" in done.stdout


def test_mock_server_refuses_a_start_batch_above_max_batch() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "sm120check", "mock-server", "--max-batch", "2", "--start-batch", "3"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "start_batch must be between 1 and max_batch" in done.stderr
