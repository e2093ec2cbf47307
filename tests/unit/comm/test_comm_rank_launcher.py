"""The rank launcher: bounded in time, nothing left behind (processes, /dev/shm, temp dirs), failures named."""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import pytest

from sm120check.doctor.ranks import free_port, launch

HERE = Path(__file__).parent
ENV = {"PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is gone for our purposes only once reaped; a killed grandchild is reaped by init.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def test_every_rank_returns_its_result() -> None:
    result = launch("comm_fake_ranks:echo", 3, {}, timeout=30, env=ENV)
    assert result.ok, result.problem
    assert [r.data["rank"] for r in result.ranks] == [0, 1, 2]
    assert {r.data["port"] for r in result.ranks} == {result.ranks[0].data["port"]}


@pytest.mark.timeout(120)  # a guard against a hang, not a speed target: timed_out says the 3 s timeout ended it
def test_hung_ranks_are_killed_at_the_timeout_with_their_children(tmp_path: Path) -> None:
    result = launch("comm_fake_ranks:hang_with_child", 2, {"pid_dir": str(tmp_path)}, timeout=3, env=ENV)
    assert result.timed_out and not result.ok
    assert "first allreduce" in result.problem
    pids = [int(p) for f in tmp_path.glob("*.pids") for p in f.read_text().split()]
    assert len(pids) == 4
    deadline = time.monotonic() + 5
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in pids if alive(p)]


@pytest.mark.timeout(120)  # a guard against a hang, not a speed target
def test_a_failing_rank_ends_the_others_after_the_grace_period() -> None:
    result = launch("comm_fake_ranks:rank1_fails", 2, {}, timeout=60, grace=1.0, env=ENV)
    # ended by the failing rank plus the 1 s grace, not by the 60 s timeout (that would set timed_out)
    assert not result.timed_out and not result.ok
    assert "rank 1: RuntimeError: invalid device ordinal" in result.problem


def test_shared_memory_left_by_killed_ranks_is_removed() -> None:
    name = f"sm120check-test-{uuid.uuid4().hex[:8]}"
    # the bound lets two Python ranks start and write their segments before the kill, on a loaded machine too
    result = launch("comm_fake_ranks:leave_shm_and_hang", 2, {"shm_name": name}, timeout=10, env=ENV)
    assert result.timed_out
    assert sorted(result.shm_removed) == [f"{name}-0", f"{name}-1"]
    assert not list(Path("/dev/shm").glob(f"{name}*"))


def test_the_private_work_directory_is_removed(tmp_path: Path) -> None:
    before = set(Path("/tmp").glob("sm120check-ranks-*"))
    launch("comm_fake_ranks:echo", 2, {}, timeout=30, env=ENV)
    assert set(Path("/tmp").glob("sm120check-ranks-*")) == before


def test_a_target_without_function_is_reported_by_the_rank() -> None:
    result = launch("comm_fake_ranks", 1, {}, timeout=30, env=ENV)
    assert "is not of the form module:function" in result.problem


def test_free_port_is_bindable_on_loopback() -> None:
    """The rendezvous store can listen on the port it is given, on 127.0.0.1, and a rank can connect to it there."""
    import socket

    port = free_port()
    assert 1024 <= port <= 65535  # an ephemeral port: no root needed to bind it
    with socket.socket() as server:
        server.bind(("127.0.0.1", port))
        server.listen(1)
        assert server.getsockname() == ("127.0.0.1", port)
        with socket.create_connection(("127.0.0.1", port), timeout=5) as client:
            assert client.getpeername() == ("127.0.0.1", port)


def test_zero_ranks_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one rank"):
        launch("comm_fake_ranks:echo", 0, {}, timeout=1)


def test_a_hang_reports_where_each_rank_was_stuck(tmp_path: Path) -> None:
    result = launch("comm_fake_ranks:hang_with_child", 2, {"pid_dir": str(tmp_path)}, timeout=3, env=ENV)
    assert result.timed_out
    for rank in (0, 1):
        assert f"--- rank {rank} (first allreduce)" in result.evidence
    # faulthandler's stacks, taken just before the kill, name the function each rank hung in.
    assert result.evidence.count("in hang_with_child") == 2, result.evidence


@pytest.mark.timeout(120)  # a guard against a hang, not a speed target
def test_a_rank_that_fails_with_partial_results_reports_them_and_ends_the_launch() -> None:
    result = launch("comm_fake_ranks:rank0_fails_with_partial", 2, {}, timeout=60, grace=1.0, env=ENV)
    assert not result.timed_out and not result.ok  # ended by the failure plus the grace, not the timeout
    failed = result.ranks[0]
    assert failed.returncode == 1 and failed.data["nccl"] == "2.26.2"
    assert failed.error == "allreduce of 512 KiB: RuntimeError: illegal memory access"
    assert "rank 0: allreduce of 512 KiB" in result.problem
