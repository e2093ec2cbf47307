"""`sm120check sglang port-owner` on real listeners here: the unit's properties come from a stand-in `systemctl`
(systemd does not run on this machine); the sockets, processes and /proc are real."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LISTEN = (
    "import socket, sys, time\n"
    "family = socket.AF_INET6 if ':' in sys.argv[1] else socket.AF_INET\n"
    "s = socket.socket(family)\n"
    "s.bind((sys.argv[1], 0))\n"
    "s.listen()\n"
    "print(s.getsockname()[1], flush=True)\n"
    "time.sleep(300)\n"
)


def listen(address: str) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen([sys.executable, "-c", LISTEN, address], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    return proc, int(proc.stdout.readline())


@pytest.fixture
def stray() -> Iterator[tuple[subprocess.Popen[str], int]]:
    proc, port = listen("127.0.0.1")
    yield proc, port
    proc.kill()
    proc.wait(timeout=10)


def port_owner(tmp: Path, *args: str, main_pid: int = 0) -> tuple[int, dict[str, object], str]:
    """Run the command with a stand-in systemctl first on PATH that reports the unit's MainPID."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    stand_in = bin_dir / "systemctl"
    stand_in.write_text(
        f"#!/bin/sh\nprintf 'MainPID={main_pid}\\nControlGroup=/system.slice/sglang-server.service\\n"
        "ActiveState=activating\\n'\n"
    )
    stand_in.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    env["PYTHONPATH"] = f"{ROOT / 'python' / 'sm120check' / 'src'}:{env.get('PYTHONPATH', '')}"
    cmd = [sys.executable, "-m", "sm120check", "sglang", "port-owner", "--json", *args]
    run = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60, check=False)
    doc = json.loads(run.stdout) if run.stdout.strip().startswith("{") else {}
    return run.returncode, doc, run.stderr


def test_a_unit_without_a_process_while_another_answers_names_both(
    tmp_path: Path, stray: tuple[subprocess.Popen[str], int]
) -> None:
    proc, port = stray
    code, doc, _ = port_owner(tmp_path, "--port", str(port), "--unit", "sglang-server", "--serving")
    assert code == 1
    problem = str(doc["problem"])
    assert problem.startswith("unit sglang-server is not running (unit sglang-server (MainPID 0, activating")
    assert f"while pid {proc.pid} (" in problem and f"listening on 127.0.0.1:{port} answers on port {port}" in problem
    assert "Fix: read the server's log" in problem


def test_a_free_port_passes_before_the_start_and_fails_after_the_wait(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: nothing listens there
    unit = ["--port", str(port), "--unit", "sglang-server"]
    code, doc, _ = port_owner(tmp_path, *unit, "--before-start", main_pid=os.getpid())
    assert (code, doc["summary"]) == (0, f"port {port} is free")
    code, doc, _ = port_owner(tmp_path, *unit, "--serving", main_pid=os.getpid())
    assert code == 1 and f"port {port} is answered by nothing, not by unit sglang-server" in str(doc["problem"])


def test_an_ipv6_listener_is_found_and_named(tmp_path: Path) -> None:
    if not socket.has_ipv6 or not Path("/proc/net/tcp6").exists():
        pytest.skip("no IPv6 on this machine")
    try:
        proc, port = listen("::1")
    except ValueError:
        pytest.skip("::1 cannot be bound here")
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    try:
        code, doc, _ = port_owner(tmp_path, "--port", str(port), "--pid", str(other.pid), "--before-start")
        assert code == 1, doc
        listeners = doc["listeners"]
        assert isinstance(listeners, list) and listeners[0]["address"] == "::1" and listeners[0]["pid"] == proc.pid
        assert f"held by pid {proc.pid} (" in str(doc["problem"]) and f"listening on ::1:{port}" in str(doc["problem"])
        code, doc, _ = port_owner(tmp_path, "--port", str(port), "--pid", str(os.getpid()), "--before-start")
        assert code == 0 and doc["summary"] == f"port {port} is held by process {os.getpid()} and its children"
    finally:
        for child in (proc, other):
            child.kill()
            child.wait(timeout=10)


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--port", "0", "--pid", "1", "--serving"], "'0' is out of range"),
        (["--port", "80", "--unit", "a b", "--serving"], "'a b' is not a systemd unit name"),
    ],
)
def test_bad_arguments_exit_2_naming_the_value(tmp_path: Path, args: list[str], said: str) -> None:
    code, _, err = port_owner(tmp_path, *args)
    assert code == 2 and said in err
