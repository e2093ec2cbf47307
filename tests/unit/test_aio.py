"""sm120check.aio: a timeout that keeps the caller's cancel, and a stop that ends tasks whose cancel was lost; the
bench's /metrics sampler ends when a cancel of its read is lost, and no module of the package uses asyncio.wait_for."""

from __future__ import annotations

import asyncio
import contextlib
import re
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

import sm120check
from sm120check import aio
from sm120check.bench.http import Endpoint
from sm120check.bench.server_rate import CounterSampler

PACKAGE = Path(sm120check.__file__).parent
Within = Callable[[Awaitable[Any], float], Awaitable[Any]]


async def cancel_as_it_completes(wrap: Callable[[Awaitable[int]], Awaitable[int]]) -> str:
    """Cancel a task in `wrap(inner)` in the same loop turn as `inner` completes: what the task ends with."""
    loop = asyncio.get_running_loop()
    inner: asyncio.Future[int] = loop.create_future()
    task = asyncio.ensure_future(wrap(inner))
    await asyncio.sleep(0)  # the task now waits on inner
    inner.set_result(1)
    task.cancel()
    try:
        return f"returned {await task}"
    except asyncio.CancelledError:
        return "cancelled"


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="Python 3.12 rewrote wait_for on asyncio.timeout")
def test_wait_for_loses_a_cancel_that_races_completion_here() -> None:
    """Why aio exists: on this Python the cancel is turned into the inner result."""
    assert asyncio.run(cancel_as_it_completes(lambda aw: asyncio.wait_for(aw, 10))) == "returned 1"


@pytest.mark.parametrize("within", [aio.within, aio.within_task], ids=["within", "within_task"])
def test_within_keeps_a_cancel_that_races_completion(within: Within) -> None:
    assert asyncio.run(cancel_as_it_completes(lambda aw: within(aw, 10))) == "cancelled"


@pytest.mark.parametrize("within", [aio.within, aio.within_task], ids=["within", "within_task"])
def test_within_returns_the_result_or_times_out_and_cancels_the_awaitable(within: Within) -> None:
    async def main() -> tuple[object, bool]:
        async def quick() -> str:
            return "done"

        got = await within(quick(), 10)
        cancelled = False

        async def slow() -> None:
            nonlocal cancelled
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                cancelled = True
                raise

        with pytest.raises(asyncio.TimeoutError):
            await within(slow(), 0.05)
        return got, cancelled

    assert asyncio.run(main()) == ("done", True)


def test_stop_ends_a_task_that_lost_its_first_cancel() -> None:
    async def main() -> tuple[set[asyncio.Future[Any]], bool, int]:
        rounds = 0

        async def sampler_like() -> None:  # what wait_for made of the sampler: one cancel lost, the loop goes on
            nonlocal rounds
            while True:
                rounds += 1
                try:
                    await asyncio.sleep(0.01)
                except asyncio.CancelledError:
                    if rounds < 5:
                        continue
                    raise

        task = asyncio.ensure_future(sampler_like())
        await asyncio.sleep(0.03)
        left = await aio.stop([task], bound=10)
        return left, task.cancelled(), rounds

    left, cancelled, rounds = asyncio.run(main())
    assert left == set() and cancelled and rounds >= 2


def test_stop_gives_up_on_a_task_that_ignores_every_cancel_and_keeps_exceptions_readable() -> None:
    async def main() -> tuple[bool, bool, str]:
        release = asyncio.Event()

        async def stubborn() -> None:
            while not release.is_set():
                try:
                    await asyncio.sleep(0.01)
                except asyncio.CancelledError:
                    continue

        async def broken() -> None:
            raise ValueError("worker bug")

        bad = asyncio.ensure_future(broken())
        stuck = asyncio.ensure_future(stubborn())
        await asyncio.sleep(0)
        left = await aio.stop([stuck, bad], bound=0.3)
        release.set()
        await stuck
        error = bad.exception()
        return left == {stuck}, bad.done(), str(error)

    assert asyncio.run(main()) == (True, True, "worker bug")


def test_the_counter_sampler_ends_when_its_cancel_is_lost(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stand-in for the one read (the read is what lost the cancel; no server is needed for that), the real
    sampler around it: its exit returns, its loop ended (a single cancel would leave the loop reading on)."""
    reads = 0

    async def read_losing_its_cancel(self: CounterSampler) -> None:
        nonlocal reads
        reads += 1
        with contextlib.suppress(asyncio.CancelledError):  # as wait_for returned the finished read
            await asyncio.sleep(0.2)

    monkeypatch.setattr(CounterSampler, "_read", read_losing_its_cancel)

    async def level() -> CounterSampler:
        sampler = CounterSampler(Endpoint("http", "127.0.0.1", 9), {}, "sglang:generation_tokens_total", 1.0)
        async with sampler:
            await asyncio.sleep(0.05)  # the level; the sampler's loop is in its read when the exit cancels it
        return sampler

    async def main() -> tuple[bool, bool]:
        task = asyncio.ensure_future(level())
        done, _ = await asyncio.wait({task}, timeout=20)  # a bound on a hang, far above the exit's 0.5 s
        if not done:
            await aio.stop([task])
            return False, False
        inner = task.result()._task
        return True, inner is not None and inner.done()

    assert asyncio.run(main()) == (True, True) and reads >= 3


def test_no_module_of_the_package_uses_asyncio_wait_for() -> None:
    users = [
        str(path.relative_to(PACKAGE))
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.name != "aio.py" and re.search(r"\bwait_for\(", path.read_text(encoding="utf-8"))
    ]
    assert users == [], "use sm120check.aio.within: asyncio.wait_for before Python 3.12 can lose a cancel"
