"""The GPU harness (tests/lab/sglang_gpu.py `start`) on real processes here: it refuses a port another process holds
before it starts anything, takes healthy only from its own child, fails naming both when its server exits while
another answers, and records its servers in the state file until they are stopped (tests/lab/server_pids.py)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from lab import server_pids, sglang_gpu
from sm120check.sglang import port_owner

# A stray server: listens on 127.0.0.1 and answers every GET with 200
SERVER = """
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""
# A launch that starts a server in its own session and exits: the server outlives it (issue #39's stale server)
ORPHANING = """
import socket, subprocess, sys, time
server = subprocess.Popen([sys.executable, sys.argv[1], sys.argv[2]], start_new_session=True)
open(sys.argv[3], "w").write(str(server.pid))
for _ in range(300):
    try:
        socket.create_connection(("127.0.0.1", int(sys.argv[2])), timeout=1).close()
        break
    except OSError:
        time.sleep(0.1)
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_listening(port: int) -> None:
    for _ in range(300):  # bounded: 30 s
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port}")


@pytest.fixture(autouse=True)
def state_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(server_pids, "STATE", tmp_path / "servers.json")
    monkeypatch.setattr(sglang_gpu, "OUT", tmp_path)
    return tmp_path / "servers.json"


def launch_file(tmp: Path, argv: list[str]) -> Path:
    launch = tmp / "launch.txt"
    launch.write_text(" ".join(argv) + "\n")
    launch.with_suffix(".env").write_text("")
    return launch


def wait_for(port: int) -> dict[str, object]:
    return {"health_url": f"http://127.0.0.1:{port}/health", "retries": 10, "delay": 3}


@pytest.fixture
def stray(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    port = free_port()
    (tmp_path / "server.py").write_text(SERVER)
    proc = subprocess.Popen([sys.executable, str(tmp_path / "server.py"), str(port)])
    try:
        wait_listening(port)
        yield proc, port
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_a_port_held_by_another_process_fails_before_the_server_starts(
    tmp_path: Path, stray: tuple[subprocess.Popen[bytes], int]
) -> None:
    proc, port = stray
    marker = tmp_path / "launched"
    launch = launch_file(tmp_path, [sys.executable, "-c", f"open('{marker}','w')"])
    with pytest.raises(pytest.fail.Exception) as failed:
        next(sglang_gpu.start("base", launch, wait_for(port)))
    message = str(failed.value)
    assert f"port {port} is held by pid {proc.pid} (" in message and "server.py" in message
    assert "not by no process yet: the base server could not bind it" in message
    assert f"Fix: stop it (`kill {proc.pid}`" in message
    assert not marker.exists()  # the launch never ran


def test_a_gpu_still_holding_other_processes_fails_before_the_server_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process the GPU still lists (another call's server, or a dead one whose memory the driver holds) is waited
    for, bounded, then named: a server started beside it would load short of memory."""
    marker = tmp_path / "launched"
    launch = launch_file(tmp_path, [sys.executable, "-c", f"open('{marker}','w')"])
    (tmp_path / "pids.txt").write_text("4242\n")
    monkeypatch.setenv("PATH", f"{fake_nvidia_smi(tmp_path, 10**6)}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(server_pids, "GPU_RELEASE_WAIT_S", 1.0)
    with pytest.raises(pytest.fail.Exception) as failed:
        next(sglang_gpu.start("base", launch, wait_for(free_port())))
    message = str(failed.value)
    assert "the base server was not started: the GPU still lists pids [4242] after 1 s" in message, message
    assert "nvidia-smi --query-compute-apps=pid,used_memory --format=csv" in message
    assert not marker.exists()  # the launch never ran


def test_a_gpu_that_releases_its_memory_in_time_lets_the_server_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = free_port()
    (tmp_path / "server.py").write_text(SERVER)
    launch = launch_file(tmp_path, [sys.executable, str(tmp_path / "server.py"), str(port)])
    (tmp_path / "pids.txt").write_text("4242\n")
    monkeypatch.setenv("PATH", f"{fake_nvidia_smi(tmp_path, 3)}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(server_pids, "GPU_RELEASE_WAIT_S", 30.0)
    servers = sglang_gpu.start("base", launch, wait_for(port))
    server = next(servers)
    try:
        assert server.proc.poll() is None and (tmp_path / "calls").read_text().count("x") >= 4
    finally:
        servers.close()
    assert server.proc.poll() is not None


def test_the_harness_takes_healthy_from_its_own_server_and_records_it_until_stopped(
    tmp_path: Path, state_file: Path
) -> None:
    port = free_port()
    (tmp_path / "server.py").write_text(SERVER)
    launch = launch_file(tmp_path, [sys.executable, str(tmp_path / "server.py"), str(port)])
    servers = sglang_gpu.start("base", launch, wait_for(port))
    server = next(servers)
    pid = server.proc.pid
    (recorded,) = server_pids.recorded()
    assert recorded.pid == pid and recorded.by[0] == os.getpid()
    assert server_pids.stop_recorded() == []  # its harness (this process) runs: left to it
    servers.close()
    assert server.proc.poll() is not None
    assert server_pids.recorded() == [] and state_file.exists()


def test_a_server_that_exits_while_another_answers_fails_naming_both(tmp_path: Path) -> None:
    port = free_port()
    (tmp_path / "server.py").write_text(SERVER)
    (tmp_path / "orphaning.py").write_text(ORPHANING)
    pid_file = tmp_path / "orphan.pid"
    launch = launch_file(
        tmp_path,
        [sys.executable, str(tmp_path / "orphaning.py"), str(tmp_path / "server.py"), str(port), str(pid_file)],
    )
    try:
        with pytest.raises(pytest.fail.Exception) as failed:
            next(sglang_gpu.start("spec", launch, wait_for(port)))
    finally:
        if pid_file.exists():
            orphan = int(pid_file.read_text())
            with contextlib.suppress(ProcessLookupError):
                os.kill(orphan, 9)
    message = str(failed.value)
    assert f"port {port}" in message and f"pid {orphan} (" in message and "server.py" in message
    assert "the spec server (pid " in message and "exited 0 while" in message


# --- no server outlives its call (tests/lab/server_pids.py, scripts/device/sglang-server.sh) ----------------------

HARNESS = """
import subprocess, sys, time
from lab import server_pids
argv = [sys.executable, "-c", "import time; time.sleep(300)"]
server = subprocess.Popen(argv, start_new_session=True)
server_pids.record(server.pid, argv)
print(server.pid, flush=True)
time.sleep(300)
"""


def alive(pid: int) -> bool:
    now = server_pids.describe(pid)
    return now is not None and not server_pids._zombie(pid)


def test_a_killed_harness_leaves_its_server_to_the_next_stop(tmp_path: Path, state_file: Path) -> None:
    env = {**os.environ, "SM120KIT_SERVER_STATE": str(state_file), "PYTHONPATH": os.pathsep.join(sys.path)}
    harness = subprocess.Popen([sys.executable, "-c", HARNESS], stdout=subprocess.PIPE, text=True, env=env)
    assert harness.stdout is not None
    server = int(harness.stdout.readline())
    try:
        assert server_pids.stop_recorded() == []  # its harness still runs: not ours to stop
        assert alive(server)
        harness.kill()  # as GPU_TIMEOUT's kill leaves it: no finally ran
        harness.wait(timeout=10)
        (line,) = server_pids.stop_recorded()
        assert line.startswith(f"stopped pid {server} and its process group, its harness (pid {harness.pid}) is gone; ")
        assert not alive(server) and server_pids.recorded() == []
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server, 9)


def fake_nvidia_smi(tmp_path: Path, listed_calls: int) -> Path:
    """A stand-in for nvidia-smi (no GPU here): `--query-compute-apps=pid` lists the pids in tmp_path/pids.txt for its
    first `listed_calls` calls, then none, as the driver does while it tears down a dead server's context."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    script = bindir / "nvidia-smi"
    calls = tmp_path / "calls"
    script.write_text(
        "#!/bin/sh\n"
        f"echo x >> {calls}\n"
        f'[ "$(wc -l < {calls})" -le {listed_calls} ] && cat {tmp_path / "pids.txt"}\n'
        "exit 0\n"
    )
    script.chmod(0o755)
    return bindir


@pytest.mark.parametrize(("listed_calls", "said"), [(3, "its GPU memory released after"), (10**6, "still lists")])
def test_the_stop_waits_for_the_gpu_to_release_the_servers_memory(
    tmp_path: Path, state_file: Path, monkeypatch: pytest.MonkeyPatch, listed_calls: int, said: str
) -> None:
    """The killed server's processes can stay listed by the GPU for seconds after they exit, holding its memory: the
    stop waits until they are gone (bounded), or says the next server may start short of memory."""
    env = {**os.environ, "SM120KIT_SERVER_STATE": str(state_file), "PYTHONPATH": os.pathsep.join(sys.path)}
    harness = subprocess.Popen([sys.executable, "-c", HARNESS], stdout=subprocess.PIPE, text=True, env=env)
    assert harness.stdout is not None
    server = int(harness.stdout.readline())
    try:
        (tmp_path / "pids.txt").write_text(f"{server}\n")
        monkeypatch.setenv("PATH", f"{fake_nvidia_smi(tmp_path, listed_calls)}{os.pathsep}{os.environ['PATH']}")
        monkeypatch.setattr(server_pids, "GPU_RELEASE_WAIT_S", 2.0)
        harness.kill()
        harness.wait(timeout=10)
        (line,) = server_pids.stop_recorded()
        assert said in line, line
        if listed_calls > 3:
            assert f"the GPU still lists pids [{server}] after 2 s: the next server may start short of memory" in line
        assert not alive(server)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server, 9)


def test_a_recorded_pid_that_now_runs_another_command_is_left_alone(tmp_path: Path) -> None:
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    try:
        now = server_pids.describe(other.pid)
        assert now is not None
        # the entry a reused pid would leave: same pid, another server's command line
        with server_pids._locked() as entries:
            entries.append(server_pids.Started(other.pid, now.start_ticks, ("python", "-m", "sglang.launch_server")))
        (line,) = server_pids.stop_recorded()
        assert line.startswith(f"pid {other.pid} now runs another process (") and line.endswith("left alone")
        assert other.poll() is None
    finally:
        other.kill()
        other.wait(timeout=10)


HELD = """
import json, os, time
from pathlib import Path
import pytest
from lab import sglang_gpu
pytestmark = pytest.mark.gpu
def test_holds_its_server_until_killed():
    wait = json.loads(os.environ["WAIT"])
    for server in sglang_gpu.start("held", Path(os.environ["LAUNCH"]), wait):
        Path(os.environ["PID_FILE"]).write_text(str(server.proc.pid))
        time.sleep(300)
"""


def script_env(tmp_path: Path, state_file: Path, timeout: int) -> tuple[dict[str, str], Path]:
    """The environment of scripts/device/sglang-server.sh gputests running one test that holds a server."""
    port = free_port()
    (tmp_path / "server.py").write_text(SERVER)
    (tmp_path / "test_held.py").write_text(HELD)
    launch = launch_file(tmp_path, [sys.executable, str(tmp_path / "server.py"), str(port)])
    pid_file, out = tmp_path / "server.pid", tmp_path / "out"
    out.mkdir()
    env = {
        **os.environ,
        "VENV": str(Path(sys.executable).parent.parent),
        "OUT": str(out),
        "GPU_TESTS": str(tmp_path / "test_held.py"),
        "GPU_TIMEOUT": str(timeout),
        "SM120KIT_SERVER_STATE": str(state_file),
        "LAUNCH": str(launch),
        "WAIT": json.dumps(wait_for(port)),
        "PID_FILE": str(pid_file),
    }
    return env, pid_file


SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "device" / "sglang-server.sh"


def test_the_gpu_script_stops_the_server_of_a_pytest_its_timeout_killed(tmp_path: Path, state_file: Path) -> None:
    """scripts/device/sglang-server.sh gputests with a GPU_TIMEOUT that kills pytest while its server runs."""
    env, pid_file = script_env(tmp_path, state_file, 20)
    run = subprocess.run(["bash", str(SCRIPT), "gputests"], capture_output=True, text=True, env=env, timeout=120)
    assert pid_file.exists(), run.stdout + run.stderr
    server = int(pid_file.read_text())
    try:
        assert "pytest stopped by GPU_TIMEOUT=20" in run.stdout, run.stdout
        assert f"server_pids: stopped pid {server} and its process group, its harness (pid " in run.stdout
        assert not alive(server)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server, 9)


def test_the_gpu_script_stopped_by_a_signal_stops_pytest_and_its_server(tmp_path: Path, state_file: Path) -> None:
    env, pid_file = script_env(tmp_path, state_file, 300)
    script = subprocess.Popen(["bash", str(SCRIPT), "gputests"], stdout=subprocess.PIPE, text=True, env=env)
    try:
        for _ in range(600):  # bounded: 60 s for pytest to start its server
            if pid_file.exists() and pid_file.read_text():
                break
            time.sleep(0.1)
        server = int(pid_file.read_text())
        script.terminate()
        out, _ = script.communicate(timeout=120)
        assert script.returncode == 143
        assert "stopped by a signal: stopping the servers this call started" in out
        assert f"server_pids: stopped pid {server} and its process group, its harness" in out
        assert not alive(server)
    finally:
        if script.poll() is None:
            script.kill()
            script.wait(timeout=10)
        if pid_file.exists() and pid_file.read_text():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(int(pid_file.read_text()), 9)


# A server whose child shares its listening socket and ignores SIGTERM (a worker that outlives its parent)
FORKING = """
import http.server, os, signal, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
    def log_message(self, *a): pass
server = http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H)
if os.fork() == 0:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
server.serve_forever()
"""


def test_the_next_server_finds_the_port_free_after_a_child_that_ignored_sigterm(tmp_path: Path) -> None:
    port = free_port()
    (tmp_path / "forking.py").write_text(FORKING)
    launch = launch_file(tmp_path, [sys.executable, str(tmp_path / "forking.py"), str(port)])
    servers = sglang_gpu.start("base", launch, wait_for(port))
    server = next(servers)
    holders = {item.pid for item in port_owner.listeners(port)}
    assert holders and holders <= port_owner.process_tree(server.proc.pid)
    servers.close()
    assert port_owner.listeners(port) == () and not server_pids.group_running(server.proc.pid)


def recording_venv(tmp_path: Path) -> tuple[Path, Path]:
    """A venv whose python is a stand-in that writes its arguments, then the environment it was given, to a file."""
    venv, seen = tmp_path / "venv", tmp_path / "seen.txt"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text(f'#!/bin/sh\n{{ printf "%s\\n" "$@"; env; }} > {seen}\n')
    (venv / "bin" / "python").chmod(0o755)
    return venv, seen


@pytest.mark.parametrize(
    ("phase", "env", "selection"),
    [
        ("envelope-a", "SGLANG_ENABLE_METRICS_DEVICE_TIMER=1", "TestEnvelopeCurves and not spec-7"),
        ("envelope-repeat-a", "SM120KIT_ENVELOPE_REPEATS=2", "TestEnvelopeCurves and base"),
        ("envelope-spread-b", "SM120KIT_ENVELOPE_SPREAD=0.5", "test_sweep_the_policy_server or test_the_policy_is_on"),
        ("envelope-gap", "SM120KIT_ENVELOPE_REPEATS=2", "TestEnvelopeGap"),
        ("envelope-profile", "SGLANG_ENABLE_METRICS_DEVICE_TIMER=1", "TestEnvelopeProfile"),
    ],
)
def test_the_envelope_phases_pass_their_settings_to_pytest(
    tmp_path: Path, state_file: Path, phase: str, env: str, selection: str
) -> None:
    """Each envelope phase runs the envelope file with its -k selection, SGLang's device timer on and its own
    setting in pytest's environment (the servers inherit it); the stand-in python records what it was given."""
    venv, seen = recording_venv(tmp_path)
    (tmp_path / "out").mkdir()
    environ = {**os.environ, "VENV": str(venv), "OUT": str(tmp_path / "out"), "SM120KIT_SERVER_STATE": str(state_file)}
    for name in ("GPU_TESTS", "PYTEST_K", "SM120KIT_ENVELOPE_REPEATS", "SM120KIT_ENVELOPE_SPREAD"):
        environ.pop(name, None)
    run = subprocess.run(["bash", str(SCRIPT), phase], capture_output=True, text=True, env=environ, timeout=120)
    lines = seen.read_text().splitlines() if seen.exists() else []
    assert "tests/gpu/test_sglang_envelope.py" in lines, run.stdout + run.stderr
    assert any(line.startswith(selection) for line in lines), lines[:20]
    assert "SGLANG_ENABLE_METRICS_DEVICE_TIMER=1" in lines and env in lines


@pytest.mark.parametrize("phase", ["gputests", "server-base", "server-spec"])
def test_the_quick_phases_never_run_the_long_gpu_files(tmp_path: Path, state_file: Path, phase: str) -> None:
    """The quick phases name their test files: the sweeps and soaks (many minutes each) run only in their own phases,
    so a quick phase reaches the server tests within its timeout. The venv's python is a stand-in that records its
    arguments."""
    venv, args = recording_venv(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "VENV": str(venv), "OUT": str(out), "SM120KIT_SERVER_STATE": str(state_file)}
    env.pop("GPU_TESTS", None)
    run = subprocess.run(["bash", str(SCRIPT), phase], capture_output=True, text=True, env=env, timeout=120)
    named = args.read_text().splitlines() if args.exists() else []
    files = {a for a in named if a.startswith("tests/gpu/")}
    assert files, run.stdout + run.stderr
    assert all((SCRIPT.parents[2] / f).is_file() for f in files), files
    long_files = {"test_sglang_policy.py", "test_sglang_envelope.py", "test_sglang_switch.py", "test_sglang_soak.py"}
    assert not {Path(f).name for f in files} & long_files, files
    assert "tests/gpu/test_sglang_server.py" in files


def test_the_jit_phase_without_its_venv_fails_naming_the_parts_and_phase(tmp_path: Path, state_file: Path) -> None:
    """pcie-ipc-jit runs in the JIT venv made from the carried parts; without it the call fails saying what to do,
    instead of building with the stack's FlashInfer (which has no pcie_ipc_comm)."""
    (tmp_path / "out").mkdir()
    env = {**os.environ, "OUT": str(tmp_path / "out"), "SM120KIT_SERVER_STATE": str(state_file)}
    env |= {"JIT_VENV": str(tmp_path / "no-jit-venv"), "VENV": str(tmp_path / "no-venv")}
    run = subprocess.run(["bash", str(SCRIPT), "pcie-ipc-jit"], capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode != 0
    assert "carry the JIT parts and run the jit-venv phase first" in run.stdout, run.stdout + run.stderr
    assert not (tmp_path / "out" / "pcie-ipc-jit").exists()
