"""Start N ranks of a distributed probe with a hard time limit, and leave nothing behind.

`launch(target, world_size, args, timeout=)` runs `python -m sm120check.doctor.ranks TARGET RANK
WORKDIR` once per rank. TARGET is "module:function"; the function takes a RankContext and returns a JSON
object (a payload type's `to_json()`; a failure that still has something to report raises RankFailed). Each rank:
- runs in its own session (so killing it kills the compilers or helpers it started) and dies with the
  launcher (PR_SET_PDEATHSIG), so a launcher killed by the doctor's timeout takes its ranks along;
- reports progress (`ctx.phase("first allreduce")`), so a hang names the step that hung;
- writes its result to WORKDIR/rank<r>.json and leaves with os._exit, so a wedged NCCL or CUDA teardown
  cannot hold it.
Once one rank fails the others get `grace` seconds (they are likely stuck in a collective), then all
are killed. WORKDIR is private (also the ranks' TMPDIR, where torch's symmetric memory keeps its
sockets) and removed afterwards; /dev/shm segments that appeared during the run and that no live
process still maps or holds open (NCCL's, left by a killed rank) are unlinked.
"""

from __future__ import annotations

import contextlib
import faulthandler
import importlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sm120check.doctor.child import die_with_parent

SHM = Path("/dev/shm")


@dataclass(frozen=True)
class RankContext:
    rank: int
    world_size: int
    port: int
    args: Mapping[str, Any]
    workdir: Path

    @property
    def init_method(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    def phase(self, name: str) -> None:
        """Record the step this rank is in; a timeout reports the last one."""
        (self.workdir / f"rank{self.rank}.phase").write_text(name, encoding="utf-8")


@dataclass(frozen=True)
class RankOutcome:
    rank: int
    returncode: int | None  # None: still running when killed
    data: Mapping[str, object] = field(default_factory=dict)  # what the target returned (or its failure)
    phase: str = ""
    log_tail: str = ""

    @property
    def error(self) -> str:
        if self.data.get("error"):
            return str(self.data["error"])
        if self.returncode is None:
            return f"killed while in phase {self.phase or 'start'!r}"
        if self.returncode != 0 or not self.data:
            last = self.log_tail.strip().splitlines()[-1:] or ["no output"]
            return f"exited {self.returncode} in phase {self.phase or 'start'!r}: {last[0]}"
        return ""


@dataclass(frozen=True)
class Launch:
    ranks: tuple[RankOutcome, ...]
    timed_out: bool
    seconds: float
    shm_removed: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.timed_out and all(not r.error for r in self.ranks)

    @property
    def evidence(self) -> str:
        """Each rank that did not deliver: its phase and the end of its log (on a hang, its Python stacks)."""
        parts = []
        for r in self.ranks:
            if r.error:
                parts.append(f"--- rank {r.rank} ({r.phase or 'start'}): {r.error}\n{r.log_tail[-1500:].strip()}")
        return "\n".join(parts)

    @property
    def problem(self) -> str:
        """One line: why the ranks did not all deliver."""
        if self.timed_out:
            phases = sorted({r.phase or "start" for r in self.ranks if r.returncode is None})
            return f"ranks hung for {self.seconds:.0f} s (in {', '.join(phases) or 'teardown'}) and were killed"
        failed = [r for r in self.ranks if r.error]
        return "; ".join(f"rank {r.rank}: {r.error}" for r in failed[:2])


class RankFailed(Exception):
    """Raised by a rank target that failed but has measured something (the NCCL version, the sizes that passed):
    the rank reports `partial` with the error, and exits 1 like any failed rank."""

    def __init__(self, message: str, partial: Mapping[str, object]) -> None:
        super().__init__(message)
        self.partial = partial


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now (the rendezvous store binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def launch(
    target: str,
    world_size: int,
    args: Mapping[str, Any],
    *,
    timeout: float,
    grace: float = 10.0,
    env: Mapping[str, str] | None = None,
    python: str | None = None,
) -> Launch:
    """Run `target` on `world_size` ranks; every rank is gone when this returns."""
    if world_size < 1:
        raise ValueError(f"world_size={world_size}: launch at least one rank")
    workdir = Path(tempfile.mkdtemp(prefix="sm120check-ranks-"))
    shm_before = _shm_names()
    port = free_port()
    (workdir / "args.json").write_text(json.dumps({"world_size": world_size, "port": port, "args": dict(args)}))
    base_env = dict(os.environ)
    base_env.update(env or {})
    base_env.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": str(world_size)})
    base_env["TMPDIR"] = str(workdir)
    procs: list[subprocess.Popen[bytes]] = []
    start = time.monotonic()
    timed_out = False
    try:
        for rank in range(world_size):
            log = (workdir / f"rank{rank}.log").open("wb")
            rank_env = dict(base_env, RANK=str(rank), LOCAL_RANK=str(rank))
            procs.append(
                subprocess.Popen(
                    [python or sys.executable, "-m", __name__, target, str(rank), str(workdir)],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=rank_env,
                    start_new_session=True,
                    preexec_fn=die_with_parent if sys.platform == "linux" else None,
                )
            )
            log.close()
        deadline = start + timeout
        failed = False
        while [p.poll() for p in procs].count(None):  # poll every rank: any() would stop at the first
            now = time.monotonic()
            if now >= deadline:
                timed_out = not failed
                break
            if not failed and any(p.returncode not in (None, 0) for p in procs):
                failed = True  # the others are likely stuck waiting for it: give them `grace`, once
                deadline = min(deadline, now + grace)
            time.sleep(0.05)
    finally:
        killed = {p.pid for p in procs if p.poll() is None}
        if killed:  # ask each hung rank for its Python stacks (faulthandler, into its log) before the kill
            for proc in procs:
                if proc.pid in killed:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(proc.pid, signal.SIGUSR1)
            time.sleep(1.0)
        for proc in procs:
            _kill_session(proc)
        for proc in procs:
            proc.wait()
        outcomes = tuple(_outcome(rank, proc, workdir, proc.pid in killed) for rank, proc in enumerate(procs))
        removed = _remove_orphan_shm(shm_before)
        shutil.rmtree(workdir, ignore_errors=True)
    return Launch(outcomes, timed_out, time.monotonic() - start, removed)


def _kill_session(proc: subprocess.Popen[bytes]) -> None:
    # The rank leads its own session: its process group holds whatever it started (ninja, nvcc).
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def _outcome(rank: int, proc: subprocess.Popen[bytes], workdir: Path, killed: bool) -> RankOutcome:
    def read(name: str) -> str:
        try:
            return (workdir / name).read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""

    try:
        data = json.loads(read(f"rank{rank}.json") or "{}")
    except (ValueError, RecursionError):
        data = {}
    return RankOutcome(
        rank=rank,
        returncode=None if killed else proc.returncode,
        data=data if isinstance(data, dict) else {},
        phase=read(f"rank{rank}.phase"),
        log_tail=read(f"rank{rank}.log")[-3000:],
    )


def _shm_names() -> set[str]:
    try:
        return {p.name for p in SHM.iterdir()}
    except OSError:
        return set()


def _shm_in_use() -> set[str]:
    """Names under /dev/shm that some live process maps or holds open."""
    used: set[str] = set()
    for proc_dir in Path("/proc").iterdir():
        if not proc_dir.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for line in (proc_dir / "maps").read_text(errors="replace").splitlines():
                if "/dev/shm/" in line:
                    used.add(line.rsplit("/dev/shm/", 1)[1].split()[0])
        with contextlib.suppress(OSError):
            for fd in (proc_dir / "fd").iterdir():
                with contextlib.suppress(OSError):
                    target = str(fd.readlink())
                    if target.startswith("/dev/shm/"):
                        used.add(target[len("/dev/shm/") :].split()[0])
    return used


def _remove_orphan_shm(before: set[str]) -> tuple[str, ...]:
    new = _shm_names() - before
    if not new:
        return ()
    in_use = _shm_in_use()
    removed = []
    for name in sorted(new - in_use):
        with contextlib.suppress(OSError):
            path = SHM / name
            if path.is_dir():
                continue
            path.unlink()
            removed.append(name)
    return tuple(removed)


def _load(target: str) -> Callable[[RankContext], Mapping[str, object]]:
    module_name, _, function = target.partition(":")
    if not function:
        raise ValueError(f"rank target {target!r} is not of the form module:function")
    fn: Callable[[RankContext], Mapping[str, object]] = getattr(importlib.import_module(module_name), function)
    return fn


def _rank_main(argv: list[str]) -> int:
    target, rank_text, workdir_text = argv
    workdir = Path(workdir_text)
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the launcher's request for stacks on a hang
    spec = json.loads((workdir / "args.json").read_text())
    ctx = RankContext(int(rank_text), int(spec["world_size"]), int(spec["port"]), spec["args"], workdir)
    code = 0
    try:
        data: Mapping[str, object] = _load(target)(ctx)
    except RankFailed as exc:
        data = dict(exc.partial) | {"error": str(exc), "traceback": traceback.format_exc()[-2000:]}
        code = 1
    except BaseException as exc:  # a rank reports every failure as data; the launcher judges
        data = {"error": f"{type(exc).__name__}: {exc}".strip(), "traceback": traceback.format_exc()[-2000:]}
        code = 1
    tmp = workdir / f"rank{ctx.rank}.json.tmp"
    tmp.write_text(json.dumps(dict(data), default=str), encoding="utf-8")
    tmp.replace(workdir / f"rank{ctx.rank}.json")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip interpreter teardown: a wedged NCCL or CUDA destructor must not hold the rank


if __name__ == "__main__":
    # Run the copy imported under its own name: a target's RankFailed is that module's class, not __main__'s.
    from sm120check.doctor import ranks

    sys.exit(ranks._rank_main(sys.argv[1:]))
