"""Timeouts and task stops that never lose a cancel.

`asyncio.wait_for` before Python 3.12 returns the inner result when a cancel arrives as the inner awaitable completes:
the cancel is lost and the cancelled task runs on (CPython gh-86296). A loop stopped that way (a /metrics sampler, a
request worker) runs until its server goes away, and whoever awaits it waits as long. `within` is `wait_for` that keeps
the cancel; `stop` cancels tasks until they end, bounded. Every timeout of the package goes through here.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Collection
from typing import Any, TypeVar

T = TypeVar("T")

RECANCEL_S = 0.5  # `stop` cancels again any task still running after this long: a cancel may have been lost
STOP_BOUND_S = 30.0  # `stop` gives up on tasks still running after this long (they ignore cancels: a bug)


async def within(aw: Awaitable[T], timeout: float) -> T:
    """`await aw`, cancelled after `timeout` seconds with asyncio.TimeoutError; a cancel of the caller is never
    turned into a result."""
    if sys.version_info >= (3, 11):  # asyncio.timeout keeps a cancel that races the deadline (Task.uncancel)
        async with asyncio.timeout(timeout):
            return await aw
    return await within_task(aw, timeout)  # pragma: no cover - Python 3.10


async def within_task(aw: Awaitable[T], timeout: float) -> T:
    """`within` for Python 3.10 (no asyncio.timeout): `aw` runs as a task the caller's cancel always reaches."""
    task = asyncio.ensure_future(aw)
    try:
        done, _ = await asyncio.wait({task}, timeout=timeout)
    except asyncio.CancelledError:
        task.cancel()
        await asyncio.wait({task})
        raise
    if not done:
        task.cancel()
        await asyncio.wait({task})
        if task.cancelled():
            raise asyncio.TimeoutError
    return task.result()


async def stop(tasks: Collection[asyncio.Future[Any]], bound: float = STOP_BOUND_S) -> set[asyncio.Future[Any]]:
    """Cancel `tasks` and wait for them to end, cancelling again every RECANCEL_S any that went on; returns the ones
    still running after `bound` seconds, which are not waited on. The exceptions of those that ended stay
    readable (Task.exception) and are marked read, so none is logged as never retrieved."""
    loop = asyncio.get_running_loop()
    end = loop.time() + bound
    left: set[asyncio.Future[Any]] = {task for task in tasks if not task.done()}
    while left:
        for task in left:
            task.cancel()
        wait = min(RECANCEL_S, end - loop.time())
        if wait <= 0:
            break
        _, left = await asyncio.wait(left, timeout=wait)
    for task in tasks:
        if task.done() and not task.cancelled():
            task.exception()
    return left
