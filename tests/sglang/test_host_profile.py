"""tests/lab/host_profile.py on real processes: /proc CPU shares per thread, SGLang's process titles, and the real
py-spy's stacks of a running Python process (the envelope's host phase runs the same calls on the GPU machine)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from lab import host_profile

# A parent titled like SGLang's children are (argv[0] via exec -a), with one child that spins in a named function
# and one that sleeps; each prints its pid.
FAMILY = r"""
import os, subprocess, sys, time
spin = "import time\ndef spin_here():\n    t = time.time()\n    while time.time() - t < 60:\n        sum(range(500))\n"
spin += "spin_here()\n"
sleep = "import time; time.sleep(60)"
titled = 'exec -a "sglang::{}" {} -c "$0"'
kids = [
    subprocess.Popen(["bash", "-c", titled.format("scheduler_TP0", sys.executable), spin]),
    subprocess.Popen(["bash", "-c", titled.format("detokenizer", sys.executable), sleep]),
]
print(os.getpid(), *(k.pid for k in kids), flush=True)
time.sleep(60)
"""


@pytest.fixture
def family() -> Iterator[tuple[int, int, int]]:
    proc = subprocess.Popen([sys.executable, "-c", FAMILY], stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert proc.stdout is not None
        root, spinner, sleeper = map(int, proc.stdout.readline().split())
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:  # until both children have exec'd into their titles
            roles = host_profile.processes(root)
            if roles.get(spinner) == "scheduler_TP0" and roles.get(sleeper) == "detokenizer":
                break
            time.sleep(0.1)
        yield root, spinner, sleeper
    finally:
        subprocess.run(["pkill", "-KILL", "-s", str(proc.pid)], check=False)  # the session this test started
        proc.wait(timeout=10)


def test_processes_names_the_root_and_sglangs_titled_children(family: tuple[int, int, int]) -> None:
    root, spinner, sleeper = family
    found = host_profile.processes(root)
    assert found[root] == "main"
    assert found[spinner] == "scheduler_TP0"
    assert found[sleeper] == "detokenizer"


def test_processes_of_a_pid_that_is_gone_is_empty() -> None:
    proc = subprocess.Popen(["true"])
    proc.wait()
    assert host_profile.processes(proc.pid) == {}


def test_cpu_shares_tell_the_spinning_process_from_the_sleeping_one(family: tuple[int, int, int]) -> None:
    _root, spinner, sleeper = family
    shares = {c.pid: c for c in host_profile.cpu_shares({spinner: "scheduler", sleeper: "detokenizer"}, 1.5)}
    assert shares[spinner].share > 0 and shares[spinner].share > shares[sleeper].share
    assert shares[sleeper].share < 0.05, shares[sleeper]
    assert shares[spinner].busiest_share == max(shares[spinner].threads.values())


def test_cpu_shares_refuse_an_unbounded_window() -> None:
    with pytest.raises(ValueError, match="seconds=0"):
        host_profile.cpu_shares({1: "init"}, 0)
    with pytest.raises(ValueError, match="seconds=3600"):
        host_profile.cpu_shares({1: "init"}, 3600)


def test_summarize_shares_per_thread_and_the_top_frames() -> None:
    text = (
        "thread (11): MainThread;<module> (/x/sglang/srt/managers/tokenizer_manager.py:10);"
        "handle_loop (/x/sglang/srt/managers/tokenizer_manager.py:20);dumps (/usr/lib/json/__init__.py:231) 150\n"
        "thread (11): MainThread;<module> (/x/sglang/srt/managers/tokenizer_manager.py:10);"
        "handle_loop (/x/sglang/srt/managers/tokenizer_manager.py:21) 50\n"
        "thread (12): Thread-1;run (threading.py:982) 20\n"
        "not a stack line\n"
    )
    got = host_profile.summarize(text, seconds=2.0, rate=100)  # 200 samples a thread
    assert got["samples"] == 220 and got["skipped_lines"] == 1
    assert got["threads"] == {"thread (11): MainThread": 1.0, "thread (12): Thread-1": 0.1}
    assert got["own"][0] == ["dumps (json/__init__.py)", 0.75]
    assert ["handle_loop (managers/tokenizer_manager.py)", 0.25] in got["own"]  # lines of one function merge
    assert got["inclusive"][0] == ["<module> (managers/tokenizer_manager.py)", 1.0]


def test_summarize_refuses_an_empty_window() -> None:
    with pytest.raises(ValueError, match="seconds=0"):
        host_profile.summarize("", seconds=0)


def test_pyspy_is_installed_for_the_tests() -> None:
    assert host_profile.pyspy_binary() is not None, "py-spy is missing: make dev installs it (requirements-dev.txt)"


def test_profile_finds_the_spinning_function_with_the_real_pyspy(family: tuple[int, int, int], tmp_path: Path) -> None:
    root, spinner, sleeper = family
    got = {p.pid: p for p in host_profile.profile(host_profile.processes(root), 2.0, tmp_path)}
    spin = got[spinner]
    assert spin.stacks_error == "", spin.stacks_error
    assert spin.stacks is not None and spin.stacks["samples"] > 0
    assert spin.stacks["own"][0][0].startswith("spin_here (") or any(
        name.startswith("spin_here (") for name, _ in spin.stacks["inclusive"]
    ), spin.stacks
    assert (tmp_path / spin.stacks_file).is_file()
    assert got[root].role == "main" and got[sleeper].role == "detokenizer"
    assert host_profile.as_json(list(got.values()))[0]["cpu"]["pid"] in got


def test_the_stack_keeps_pyspy_where_the_profile_looks_for_it() -> None:
    path = Path(__file__).resolve().parents[2] / "scripts" / "device" / "sglang_stack.py"
    spec = importlib.util.spec_from_file_location("sglang_stack", path)
    assert spec is not None and spec.loader is not None
    stack = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, stack)  # its dataclasses look their module up there
    spec.loader.exec_module(stack)
    assert stack.KEEP_DIR == host_profile.KEEP_DIR and "py-spy" in stack.KEEP_BIN
    assert any(pin.startswith("py-spy==") for pin in stack.PINS)


def test_buckets_share_the_samples_by_the_first_rule_a_stack_matches() -> None:
    metrics = "MultiProcessCollector.collect (prometheus_client/multiprocess.py:9)"
    handle = "TokenizerManager._handle_batch_output (tokenizer_manager.py:2)"
    unpickle = "_AsyncSocket._deserialize.<locals>._chain (zmq/_future.py:360);rebuild (msgspec/_utils.py:471)"
    text = "\n".join([
        f"thread (1): MainThread;Runner.run (asyncio/runners.py:118);{metrics};{handle} 3",
        f"thread (1): MainThread;{unpickle} 5",
        "thread (1): MainThread;Runner.run (asyncio/runners.py:118) 2",
        "not a py-spy line",
    ])  # fmt: skip
    shares = host_profile.buckets(text)
    assert shares["/metrics page"] == 0.3  # the first rule wins over the later one the stack also matches
    assert shares["unpickling the detokenizer's output"] == 0.5
    assert shares["other"] == 0.2
    assert shares["handling the output per request"] == 0.0
    assert host_profile.buckets("") == dict.fromkeys(shares, 0.0)
