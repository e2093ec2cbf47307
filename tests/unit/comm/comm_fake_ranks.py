"""CPU-only rank functions for the rank launcher's tests (imported by rank subprocesses via PYTHONPATH)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

from sm120check.doctor.ranks import RankContext, RankFailed


def echo(ctx: RankContext) -> dict[str, Any]:
    ctx.phase("echo")
    return {"rank": ctx.rank, "world_size": ctx.world_size, "port": ctx.port, "tmpdir_is_workdir": True}


def hang_with_child(ctx: RankContext) -> dict[str, Any]:
    """Start a grandchild (as a JIT build starts nvcc), record both pids, then hang like a stuck collective."""
    child = subprocess.Popen(["sleep", "300"])
    record = Path(ctx.args["pid_dir"])
    (record / f"rank{ctx.rank}.pids").write_text(f"{__import__('os').getpid()} {child.pid}")
    ctx.phase("first allreduce")
    time.sleep(300)
    return {}


def rank1_fails(ctx: RankContext) -> dict[str, Any]:
    if ctx.rank == 1:
        raise RuntimeError("invalid device ordinal")
    ctx.phase("waiting for peer")
    time.sleep(300)
    return {}


def leave_shm_and_hang(ctx: RankContext) -> dict[str, Any]:
    Path("/dev/shm", ctx.args["shm_name"] + f"-{ctx.rank}").write_bytes(b"x" * 64)
    ctx.phase("first allreduce")
    time.sleep(300)
    return {}


def rank0_fails_with_partial(ctx: RankContext) -> dict[str, Any]:
    """Rank 0 fails after measuring something (as the NCCL probe does at a faulting size); rank 1 waits."""
    if ctx.rank == 0:
        raise RankFailed("allreduce of 512 KiB: RuntimeError: illegal memory access", {"nccl": "2.26.2"})
    ctx.phase("waiting for peer")
    time.sleep(300)
    return {}
