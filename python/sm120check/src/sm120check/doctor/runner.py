"""The runner: picks checks, orders them, skips dependents of failed prerequisites, times each one.

It knows nothing about any family: a check is anything with the `Check` protocol's attributes. Order is the
declared graph (a check after every check it `requires` or `uses`), then level, then registry order.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import replace

from sm120check.doctor import child, remedies
from sm120check.doctor.model import Check, Context, DeclaredResults, Result, Status


class SelectionError(ValueError):
    """--select or --skip named a check that does not exist; the message lists the valid ids."""


class Stopped(BaseException):
    """Raised in the main thread by the doctor's SIGTERM handler (SIGINT raises KeyboardInterrupt).

    A BaseException, like KeyboardInterrupt, so that no check's `except Exception` swallows it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class Interrupted(BaseException):
    """run() was stopped by SIGINT or SIGTERM: every child process group is killed; `results` holds one
    result per check, those that did not finish marked interrupted (status skip, data interrupted=True)."""

    def __init__(self, signum: int, results: list[Result]) -> None:
        super().__init__(signum)
        self.signum = signum
        self.results = results


def on_signal(signum: int, frame: object) -> None:
    """The doctor's SIGINT and SIGTERM handler (the CLI installs it; run() does after a plain KeyboardInterrupt).

    The first signal kills every child process group at once, here in the handler (so no exception handling
    can skip it), then raises KeyboardInterrupt or Stopped: run() reports what finished. A second signal,
    while the doctor is already stopping, kills the children again and exits at once."""
    first = not child.stopping()
    child.kill_all()
    if not first:
        os._exit(128 + signum)
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise Stopped(signum)


def interrupted_result(check: Check, signame: str) -> Result:
    return Result(
        check.id,
        Status.SKIP,
        f"interrupted by {signame} before it finished",
        details="the doctor was stopped; the check's child processes were killed with their process groups",
        remedy=remedies.RERUN_DOCTOR,
        data={"interrupted": True},
        family=check.family,
        level=check.level,
    )


def plan(
    checks: Sequence[Check],
    *,
    level: int,
    select: Iterable[str] = (),
    skip: Iterable[str] = (),
) -> list[Check]:
    """The checks to run, in run order.

    Without `select`: every check of level <= `level`. With it: the selected checks and, transitively,
    their prerequisites, whatever their level. `skip` then removes checks by id (their dependents will
    skip with a reason rather than run without their prerequisite).
    """
    by_id = {check.id: check for check in checks}
    select, skip = list(select), list(skip)
    for wanted in (*select, *skip):
        if wanted not in by_id:
            raise SelectionError(f"unknown check id {wanted!r}; valid ids: {', '.join(by_id)}")
    if select:
        chosen: set[str] = set()
        pending = list(select)
        while pending:
            check_id = pending.pop()
            if check_id in chosen or check_id not in by_id:
                continue
            chosen.add(check_id)
            pending.extend(by_id[check_id].requires)
    else:
        chosen = {check.id for check in checks if check.level <= level}
    chosen -= set(skip)
    return _graph_order([by_id[i] for i in chosen], {check.id: index for index, check in enumerate(checks)})


def _graph_order(chosen: Sequence[Check], position: dict[str, int]) -> list[Check]:
    """The chosen checks with every check after the ones it reads (`requires`, `uses`): among the checks whose
    readers are all placed, lowest level first, then registry position. A cycle is a bug in the registry."""
    ids = {check.id for check in chosen}
    before = {check.id: {r for r in (*check.requires, *check.uses) if r in ids} for check in chosen}
    by_id = {check.id: check for check in chosen}
    placed: list[Check] = []
    while before:
        ready = [i for i, deps in before.items() if not deps]
        if not ready:
            raise ValueError(f"the checks {sorted(before)} read each other in a cycle")
        first = min(ready, key=lambda i: (by_id[i].level, position[i]))
        placed.append(by_id[first])
        del before[first]
        for deps in before.values():
            deps.discard(first)
    return placed


def run(
    checks: Sequence[Check],
    ctx: Context,
    on_result: Callable[[Result], None] | None = None,
) -> list[Result]:
    """Run `checks`; every check yields exactly one result, whatever it does, reported in the given order.

    Levels 1 and 2 run concurrently, each check as soon as its prerequisites are done: they mostly wait on
    child processes (nvcc, an NVRTC compile, a torch import), so the doctor takes about as long as its
    slowest chain. Level-3 checks then run one at a time, alone on the GPUs, so their timings are clean.
    Prerequisites and used checks must come earlier in `checks` (plan() orders them so); a check waits for
    both, and sees only their results.
    """
    position = {check.id: index for index, check in enumerate(checks)}
    for check in checks:
        late = [r for r in (*check.requires, *check.uses) if position.get(r, -1) > position[check.id]]
        if late:
            raise ValueError(f"check {check.id!r} is ordered before the check(s) it reads {late}")
    concurrent = [check for check in checks if check.level < 3]
    results: list[Result] = []
    pool = ThreadPoolExecutor(max_workers=max(1, len(concurrent)))
    futures: dict[str, Future[Result]] = {}
    try:
        for check in concurrent:
            waits = [futures[r] for r in (*check.requires, *check.uses) if r in futures]
            futures[check.id] = pool.submit(_after, waits, check, ctx)
        for check in concurrent:
            results.append(_result(futures[check.id]))
            if on_result is not None:
                on_result(results[-1])
        pool.shutdown(wait=True)
        for check in checks:
            if check.level >= 3:
                results.append(_timed(check, ctx))
                if on_result is not None:
                    on_result(results[-1])
    except (KeyboardInterrupt, Stopped) as exc:
        child.kill_all()  # every probe, nvcc and their helpers (if on_signal did not yet): running checks return
        signum = exc.signum if isinstance(exc, Stopped) else int(signal.SIGINT)
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, on_signal)  # from now on a signal exits at once
        pool.shutdown(wait=False, cancel_futures=True)
        raise Interrupted(signum, _partial(checks, ctx, signum)) from None
    return results


def _result(future: Future[Result]) -> Result:
    """future.result(), waking every 0.2 s: a signal the kernel hands to a worker thread only sets a flag, and
    the main thread runs the Python handler (Ctrl-C, SIGTERM) only when it runs; blocked in an untimed lock wait
    it would never see the signal."""
    while not wait([future], timeout=0.2).done:
        pass
    return future.result()


def _partial(checks: Sequence[Check], ctx: Context, signum: int) -> list[Result]:
    """One result per check after an interruption: those that finished before it, the rest interrupted."""
    done = dict(ctx.results)
    signame = child.signal_name(signum)
    return [
        done[check.id]
        if check.id in done and not done[check.id].data.get("interrupted")
        else interrupted_result(check, signame)
        for check in checks
    ]


def _after(waits: Sequence[Future[Result]], check: Check, ctx: Context) -> Result:
    for future in waits:
        future.result()
    return _timed(check, ctx)


def _timed(check: Check, ctx: Context) -> Result:
    start = time.monotonic()
    blocked = _blocked_by(check, ctx)
    view = replace(ctx, results=DeclaredResults(ctx.results, (*check.requires, *check.uses), check.id))
    result = blocked if blocked is not None else _run_one(check, view)
    if child.stopping() and result.status in (Status.FAIL, Status.SKIP):  # children killed under it: no verdict
        result = replace(result, data={**result.data, "interrupted": True})
    result = replace(result, id=check.id, family=check.family, level=check.level, seconds=time.monotonic() - start)
    assert isinstance(ctx.results, dict), "the runner's context holds the one mutable results table"
    ctx.results[check.id] = result
    return result


def _blocked_by(check: Check, ctx: Context) -> Result | None:
    for required in check.requires:
        prior = ctx.results.get(required)
        if prior is None:
            return Result(
                check.id,
                Status.SKIP,
                f"needs {required}, which did not run",
                remedy=remedies.unskip(required),
            )
        if prior.status in (Status.FAIL, Status.SKIP):
            verb = "failed" if prior.status is Status.FAIL else "was skipped"
            return Result(
                check.id, Status.SKIP, f"needs {required}, which {verb}: {prior.summary}", remedy=prior.remedy
            )
    return None


def _run_one(check: Check, ctx: Context) -> Result:
    try:
        result = check.run(ctx)
    except Exception as exc:  # a broken check is a verdict about the doctor, never a crash of it
        tail = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)[-6:])
        return Result(
            check.id,
            Status.FAIL,
            f"the check itself raised {type(exc).__name__}: {exc}",
            details=tail.rstrip(),
            remedy=remedies.CHECK_RAISED,
        )
    if not isinstance(result, Result):
        return Result(check.id, Status.FAIL, f"the check returned {type(result).__name__}, not a Result")
    return result


def exit_code(results: Iterable[Result]) -> int:
    """0 when nothing failed, 1 when something failed."""
    return 1 if any(result.status is Status.FAIL for result in results) else 0
