"""Where a server's host time goes under load, without pausing it: each process's CPU time per thread from /proc
(utime + stime over one window) and py-spy's sampled Python stacks of the same processes over the same window
(`--nonblocking`, so a process is never stopped). The envelope's host phase (tests/gpu/test_sglang_envelope.py)
runs it on SGLang's processes (the HTTP and tokenizer process, the scheduler, the detokenizer) and on the bench
client, to tell which of them limits a load where the GPU waits.

A thread at a CPU share near 1.0 is a limit; py-spy's stacks say in which calls. py-spy needs to attach to the
process (ptrace): where it cannot, the CPU shares still come back and the py-spy error is kept.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

TICK = os.sysconf("SC_CLK_TCK")
RATE = 100  # py-spy samples a second
TOP = 25  # frames kept per summary
MAX_LINES = 200_000  # a collapsed-stack file longer than this is cut (the rest counted as skipped)
MAX_LINE = 65_536
MAX_PROCESSES = 256
KEEP_DIR = "sm120kit_bin"  # where scripts/device/sglang_stack.py keeps the py-spy binary in the stack's site-packages


def pyspy_binary() -> Path | None:
    """py-spy from the stack's site-packages (the GPU machine), beside this Python (a venv), or on PATH."""
    found = shutil.which("py-spy")
    for candidate in (
        Path(sysconfig.get_paths()["purelib"]) / KEEP_DIR / "py-spy",
        Path(sys.executable).parent / "py-spy",
        Path(found) if found else None,
    ):
        if candidate is not None and candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


def _stat_fields(path: Path) -> list[str] | None:
    """/proc/.../stat's fields after the command name (which may hold spaces and parentheses); None when gone."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    return text[text.rfind(")") + 2 :].split()


def _role(pid: int) -> str:
    """SGLang titles its children (setproctitle: sglang::scheduler_TP0, sglang::detokenizer); others by argv[0]."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "gone"
    first = argv[0].decode("utf-8", "replace").strip() if argv else ""
    if first.startswith("sglang::"):
        return first.removeprefix("sglang::").split()[0]
    return Path(first).name or "unknown"


def processes(root: int) -> dict[int, str]:
    """The root process and its descendants (at most MAX_PROCESSES), each with its role; the root is `main`."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _stat_fields(entry / "stat")
            if fields and len(fields) > 1 and fields[1].isdigit():
                children.setdefault(int(fields[1]), []).append(int(entry.name))
    found: dict[int, str] = {}
    todo = [root]
    while todo and len(found) < MAX_PROCESSES:
        pid = todo.pop()
        if pid in found or not Path(f"/proc/{pid}").is_dir():
            continue
        found[pid] = "main" if pid == root else _role(pid)
        todo.extend(children.get(pid, []))
    return found


def _thread_ticks(pid: int) -> dict[int, tuple[str, int]]:
    """Per thread of `pid`: its name and its CPU ticks so far (utime + stime)."""
    out: dict[int, tuple[str, int]] = {}
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return out
    for task in tasks:
        fields = _stat_fields(task / "stat")
        if not fields or len(fields) < 13:
            continue
        try:
            name = (task / "comm").read_text(encoding="utf-8", errors="replace").strip()
        except OSError:
            name = "?"
        out[int(task.name)] = (name, int(fields[11]) + int(fields[12]))
    return out


@dataclass
class CpuShare:
    """One process's CPU time over the window as a share of the window (1.0: one core all the time)."""

    pid: int
    role: str
    share: float
    busiest_thread: str
    busiest_share: float
    threads: dict[str, float] = field(default_factory=dict)  # "name (tid)" -> share, those above 0.01


def cpu_shares(pids: dict[int, str], seconds: float) -> list[CpuShare]:
    """Each process's and thread's CPU share over `seconds` (two /proc reads; threads born inside count from 0)."""
    if not 0 < seconds <= 600:
        raise ValueError(f"seconds={seconds}: expected a window of more than 0 and at most 600 s")
    before = {pid: _thread_ticks(pid) for pid in pids}
    began = time.monotonic()
    time.sleep(seconds)
    after = {pid: _thread_ticks(pid) for pid in pids}
    wall = time.monotonic() - began
    out = []
    for pid, role in pids.items():
        threads = {}
        for tid, (name, ticks) in after[pid].items():
            used = ticks - before[pid].get(tid, (name, 0))[1]
            threads[f"{name} ({tid})"] = round(max(used, 0) / TICK / wall, 3)
        busiest = max(threads.items(), key=lambda kv: kv[1], default=("none", 0.0))
        out.append(
            CpuShare(pid, role, round(sum(threads.values()), 3), busiest[0], busiest[1],
                     {k: v for k, v in sorted(threads.items(), key=lambda kv: -kv[1]) if v > 0.01})
        )  # fmt: skip
    return out


def _frame_key(frame: str) -> str:
    """`func (path/to/file.py:123)` -> `func (to/file.py)`: one key per function, the path's last two parts."""
    name, sep, where = frame.partition(" (")
    if not sep:
        return frame
    place = where.rstrip(")").rsplit(":", 1)[0]
    return f"{name} ({'/'.join(Path(place).parts[-2:])})"


def _rows(text: str) -> Iterator[tuple[str, int] | None]:
    """py-spy's raw lines as (stack, samples); None for a line that does not parse or is past the bounds."""
    for n, line in enumerate(text.splitlines()):
        stack, _, count = line.rpartition(" ")
        ok = n < MAX_LINES and len(line) <= MAX_LINE and stack and count.isdigit()
        yield (stack, int(count)) if ok else None


def summarize(text: str, seconds: float, rate: int = RATE) -> dict[str, Any]:
    """py-spy's raw output (`--format raw --threads`: `thread (TID): NAME;frame;...;frame COUNT` per line) as shares
    of the window's samples (seconds x rate per thread): per thread, and the top frames by own and inclusive time.
    Lines that do not parse are counted, not trusted."""
    if seconds <= 0 or rate <= 0:
        raise ValueError(f"seconds={seconds}, rate={rate}: both must be above 0")
    budget = seconds * rate
    threads: dict[str, int] = {}
    own: dict[str, int] = {}
    inclusive: dict[str, int] = {}
    samples = 0
    rows = list(_rows(text))
    skipped = sum(row is None for row in rows)
    for row in rows:
        if row is None:
            continue
        stack, k = row
        frames = stack.split(";")
        thread = frames[0] if frames[0].startswith("thread (") else "?"
        calls = [_frame_key(f) for f in (frames[1:] if thread != "?" else frames)]
        samples += k
        threads[thread] = threads.get(thread, 0) + k
        if calls:
            own[calls[-1]] = own.get(calls[-1], 0) + k
        for call in set(calls):
            inclusive[call] = inclusive.get(call, 0) + k

    def top(table: dict[str, int]) -> list[list[Any]]:
        ranked = sorted(table.items(), key=lambda kv: (-kv[1], kv[0]))[:TOP]  # ties by name: the same order every run
        return [[k, round(v / budget, 4)] for k, v in ranked]

    return {
        "samples": samples,
        "window_samples_per_thread": round(budget),
        "threads": {k: round(v / budget, 4) for k, v in sorted(threads.items(), key=lambda kv: -kv[1])},
        "own": top(own),
        "inclusive": top(inclusive),
        "skipped_lines": skipped,
    }


# Where SGLang's HTTP process spends its time: the first rule whose text a sample's stack contains names its bucket.
HTTP_BUCKETS = (
    ("/metrics page", "prometheus_client"),
    ("unpickling the detokenizer's output", "_AsyncSocket._deserialize"),
    ("handling the output per request", "TokenizerManager._handle_batch_output"),
    ("tokenizing new requests", "TokenizerManager._tokenize_one_request"),
    ("building each chunk", "generate_request.<locals>.stream_results"),
    ("writing to the sockets", "RequestResponseCycle.send"),
)


def buckets(text: str, rules: tuple[tuple[str, str], ...] = HTTP_BUCKETS) -> dict[str, float]:
    """py-spy's raw output as shares of its samples per bucket: a sample goes to the first rule whose text its stack
    contains, else to "other"; lines that do not parse are left out."""
    counts = dict.fromkeys([name for name, _ in rules] + ["other"], 0)
    for row in _rows(text):
        if row is not None:
            name = next((name for name, key in rules if key in row[0]), "other")
            counts[name] += row[1]
    total = sum(counts.values())
    return {k: round(v / total, 4) if total else 0.0 for k, v in counts.items()}


def _pyspy(binary: Path, pid: int, seconds: float, out: Path) -> str:
    """One bounded `py-spy record` of `pid`; "" when it wrote `out`, else the reason."""
    cmd = [str(binary), "record", "--pid", str(pid), "--duration", str(max(1, round(seconds))), "--rate", str(RATE),
           "--format", "raw", "--threads", "--nonblocking", "--output", str(out)]  # fmt: skip
    try:
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 60)
    except subprocess.TimeoutExpired:
        return f"py-spy did not finish within {seconds + 60:.0f} s"
    if run.returncode != 0 or not out.is_file():
        tail = (run.stderr or run.stdout).strip().splitlines()[-3:]
        return f"py-spy exited {run.returncode}: {' | '.join(tail) or 'no output'}"
    return ""


@dataclass
class ProcessProfile:
    pid: int
    role: str
    cpu: CpuShare
    stacks: dict[str, Any] | None  # summarize() of py-spy's record; None with `stacks_error`
    stacks_file: str
    stacks_error: str


def profile(pids: dict[int, str], seconds: float, folder: Path) -> list[ProcessProfile]:
    """The CPU shares of every process in `pids` and, at the same time, py-spy's stacks of each (one py-spy per
    process, in parallel), over one window of `seconds`. Raw stack files land in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    binary = pyspy_binary()
    errors: dict[int, str] = {}
    files = {pid: folder / f"pyspy-{role}-{pid}.txt" for pid, role in pids.items()}

    def one(pid: int) -> None:
        errors[pid] = _pyspy(binary, pid, seconds, files[pid]) if binary else "py-spy is not installed here"

    workers = [threading.Thread(target=one, args=(pid,), daemon=True) for pid in pids]
    for w in workers:
        w.start()
    shares = {c.pid: c for c in cpu_shares(pids, seconds)}
    for w in workers:
        w.join(timeout=seconds + 90)
    out = []
    for pid, role in pids.items():
        error = errors.get(pid, "py-spy did not return")
        stacks = None
        if not error:
            stacks = summarize(files[pid].read_text(encoding="utf-8", errors="replace"), seconds)
        out.append(ProcessProfile(pid, role, shares[pid], stacks, files[pid].name if not error else "", error))
    return out


def as_json(profiles: list[ProcessProfile]) -> list[dict[str, Any]]:
    return [asdict(p) for p in profiles]
