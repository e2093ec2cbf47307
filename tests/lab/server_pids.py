"""The servers the GPU harness started, recorded in a state file under /tmp, so that none outlives its call.

tests/lab/sglang_gpu.py records each server it starts (pid, its start time in clock ticks since boot, its command
line) and removes it once stopped. A pytest killed by its timeout cannot do that: scripts/device/sglang-server.sh
then runs `python3 tests/lab/server_pids.py stop` (after pytest, from its EXIT/TERM/INT trap, and before each run),
which stops each recorded server whose pid still runs the recorded command line from the recorded start, and
nothing else: a pid reused by another process is left alone. Each stop then waits (bounded) until nvidia-smi lists
none of the stopped group's processes, so the next server finds the GPU memory free.

    python3 tests/lab/server_pids.py stop        # stop the servers whose harness is gone, one line per entry
    python3 tests/lab/server_pids.py stop --all  # and those of a harness still running (the script's trap)
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

STATE = Path(os.environ.get("SM120KIT_SERVER_STATE") or "/tmp/sm120kit-gpu-servers.json")
MAX_STATE_BYTES = 1 << 20
STOP_WAIT_S = 30.0
# After the group is gone, how long to wait for the GPU to stop listing its processes (the driver can hold a dead
# server's memory for seconds: the next server would start short of it).
GPU_RELEASE_WAIT_S = float(os.environ.get("SM120KIT_GPU_RELEASE_WAIT_S") or 60)


@dataclass(frozen=True)
class Started:
    pid: int
    start_ticks: int  # /proc/PID/stat field 22: with the pid, names one process for as long as the machine runs
    cmdline: tuple[str, ...]
    by: tuple[int, int] = (0, 0)  # the harness process that started it: pid and start ticks


def _proc_start(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()  # the command name in parentheses may hold spaces
    return int(fields[19]) if len(fields) > 19 and fields[19].isdigit() else None


def _proc_cmdline(pid: int) -> tuple[str, ...]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()[:MAX_STATE_BYTES]
    except OSError:
        return ()
    return tuple(part.decode("utf-8", "replace") for part in raw.split(b"\0") if part)


def describe(pid: int) -> Started | None:
    """The running process `pid` as the state file records it (None when it is gone)."""
    ticks = _proc_start(pid)
    return None if ticks is None else Started(pid, ticks, _proc_cmdline(pid))


@contextlib.contextmanager
def _locked() -> Iterator[list[Started]]:
    """The recorded servers, read and written back under an exclusive lock (a bad or foreign file reads as empty)."""
    fd = os.open(STATE, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "r+", encoding="utf-8") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        entries: list[Started] = []
        with contextlib.suppress(ValueError, TypeError, KeyError):
            for item in json.loads(fh.read(MAX_STATE_BYTES) or "[]"):
                by = (int(item["by"][0]), int(item["by"][1]))
                cmdline = tuple(map(str, item["cmdline"]))
                entries.append(Started(int(item["pid"]), int(item["start_ticks"]), cmdline, by))
        yield entries
        fh.seek(0)
        fh.truncate()
        rows = [
            {"pid": e.pid, "start_ticks": e.start_ticks, "cmdline": list(e.cmdline), "by": list(e.by)} for e in entries
        ]
        fh.write(json.dumps(rows))


def record(pid: int, argv: Sequence[str]) -> None:
    """Add the running process `pid` (just started from `argv`, in its own process group) to the state file. The
    command line recorded is `argv`, not /proc's: right after the fork the child may not have exec'd it yet."""
    started = describe(pid)
    if started is None:
        return
    by = (os.getpid(), _proc_start(os.getpid()) or 0)
    started = Started(started.pid, started.start_ticks, tuple(map(str, argv)), by)
    with _locked() as entries:
        entries[:] = [e for e in entries if e.pid != pid] + [started]


def recorded() -> list[Started]:
    with _locked() as entries:
        return list(entries)


def forget(pid: int) -> None:
    with _locked() as entries:
        entries[:] = [e for e in entries if e.pid != pid]


def stop_group(pid: int) -> None:
    """SIGTERM to the server's process group (it was started in its own session), SIGKILL to what is left after the
    wait; returns once no process of the group runs (bounded)."""
    for sig, wait in ((signal.SIGTERM, STOP_WAIT_S), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if not group_running(pid):
                return
            time.sleep(0.2)


def _group_states(pgid: int) -> dict[int, str]:
    """Every process of the group and its state letter (Z: a zombie)."""
    found = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError):
            fields = stat.read_text(errors="replace").rpartition(")")[2].split()
            if len(fields) > 2 and fields[2] == str(pgid):
                found[int(stat.parent.name)] = fields[0]
    return found


def group_pids(pgid: int) -> set[int]:
    """Every process of the group, zombies included."""
    return set(_group_states(pgid))


def gpu_pids() -> set[int] | None:
    """The pids nvidia-smi lists as GPU compute processes (None: no nvidia-smi, or it did not answer)."""
    if shutil.which("nvidia-smi") is None:
        return None
    cmd = ["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"]
    try:
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if run.returncode != 0:
        return None
    return {int(line) for line in run.stdout.split() if line.strip().isdigit()}


def wait_gpu_released(pids: set[int], wait_s: float | None = None) -> tuple[list[int], str]:
    """Wait (bounded: GPU_RELEASE_WAIT_S) until the GPU lists none of `pids`: those still listed, and what was seen."""
    wait_s = GPU_RELEASE_WAIT_S if wait_s is None else wait_s
    started = time.monotonic()
    while True:
        listed = gpu_pids()
        if listed is None:
            return [], "GPU not queried (no nvidia-smi answer)"
        held = sorted(pids & listed)
        waited = time.monotonic() - started
        if not held:
            return [], f"its GPU memory released after {waited:.1f} s"
        if waited >= wait_s:
            return (
                held,
                f"the GPU still lists pids {held} after {wait_s:.0f} s: the next server may start short of memory",
            )
        time.sleep(0.5)


def group_running(pgid: int) -> bool:
    """Whether a process of the group still runs (zombies, reaped by whoever adopted them, do not count)."""
    return any(state != "Z" for state in _group_states(pgid).values())


def _zombie(pid: int) -> bool:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z"
    return False


def _harness_alive(entry: Started) -> bool:
    return entry.by[0] > 0 and _proc_start(entry.by[0]) == entry.by[1] and not _zombie(entry.by[0])


def stop_recorded(everything: bool = False) -> list[str]:
    """Stop every recorded server that is still the process recorded and whose harness is gone (or every one with
    `everything`); forget those entries. One line per entry handled."""
    said: list[str] = []
    with _locked() as entries:
        kept = [e for e in entries if not everything and _harness_alive(e)]
        for entry in [e for e in entries if e not in kept]:
            now = describe(entry.pid)
            shown = " ".join(entry.cmdline)[:200]
            if now is None or _zombie(entry.pid):
                said.append(f"pid {entry.pid} is gone ({shown})")
            elif (now.start_ticks, now.cmdline) != (entry.start_ticks, entry.cmdline):
                said.append(f"pid {entry.pid} now runs another process ({' '.join(now.cmdline)[:200]}): left alone")
            else:
                whose = (
                    "its harness still runs" if _harness_alive(entry) else f"its harness (pid {entry.by[0]}) is gone"
                )
                members = group_pids(entry.pid) | {entry.pid}
                stop_group(entry.pid)
                _, released = wait_gpu_released(members)
                said.append(f"stopped pid {entry.pid} and its process group, {whose}; {released} ({shown})")
        entries[:] = kept
    return said


def main(argv: list[str]) -> int:
    if argv not in (["stop"], ["stop", "--all"]):
        print(__doc__, file=sys.stderr)
        return 2
    for line in stop_recorded(everything=argv == ["stop", "--all"]):
        print(f"server_pids: {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
