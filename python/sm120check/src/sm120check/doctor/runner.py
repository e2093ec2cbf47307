"""The runner: picks checks, orders them, skips dependents of failed prerequisites, times each one.

It knows nothing about any family: a check is anything with the `Check` protocol's attributes. Order
is level, then the family order of CHECK_MODULES, then the order inside a family's CHECKS.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace

from sm120check.doctor.model import Check, Context, Result, Status


class SelectionError(ValueError):
    """--select or --skip named a check that does not exist; the message lists the valid ids."""


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
    position = {check.id: index for index, check in enumerate(checks)}
    return sorted((by_id[i] for i in chosen), key=lambda check: (check.level, position[check.id]))


def run(
    checks: Sequence[Check],
    ctx: Context,
    on_result: Callable[[Result], None] | None = None,
) -> list[Result]:
    """Run `checks`; every check yields exactly one result, whatever it does, reported in the given order.

    Levels 1 and 2 run concurrently, each check as soon as its prerequisites are done: they mostly wait on
    child processes (nvcc, an NVRTC compile, a torch import), so the doctor takes about as long as its
    slowest chain. Level-3 checks then run one at a time, alone on the GPUs, so their timings are clean.
    Prerequisites must come earlier in `checks` (plan() orders them so).
    """
    position = {check.id: index for index, check in enumerate(checks)}
    for check in checks:
        late = [r for r in check.requires if position.get(r, -1) > position[check.id]]
        if late:
            raise ValueError(f"check {check.id!r} is ordered before its prerequisite(s) {late}")
    concurrent = [check for check in checks if check.level < 3]
    results: list[Result] = []
    with ThreadPoolExecutor(max_workers=max(1, len(concurrent))) as pool:
        futures: dict[str, Future[Result]] = {}
        for check in concurrent:
            waits = [futures[r] for r in check.requires if r in futures]
            futures[check.id] = pool.submit(_after, waits, check, ctx)
        for check in concurrent:
            results.append(futures[check.id].result())
            if on_result is not None:
                on_result(results[-1])
    for check in checks:
        if check.level >= 3:
            results.append(_timed(check, ctx))
            if on_result is not None:
                on_result(results[-1])
    return results


def _after(waits: Sequence[Future[Result]], check: Check, ctx: Context) -> Result:
    for future in waits:
        future.result()
    return _timed(check, ctx)


def _timed(check: Check, ctx: Context) -> Result:
    start = time.monotonic()
    blocked = _blocked_by(check, ctx)
    result = blocked if blocked is not None else _run_one(check, ctx)
    result = replace(result, id=check.id, family=check.family, level=check.level, seconds=time.monotonic() - start)
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
                remedy=f"run without `--skip {required}` (or add `--select {required}`)",
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
            remedy="report this traceback to the sm120kit maintainers (and `--skip` the check meanwhile)",
        )
    if not isinstance(result, Result):
        return Result(check.id, Status.FAIL, f"the check returned {type(result).__name__}, not a Result")
    return result


def exit_code(results: Iterable[Result]) -> int:
    """0 when nothing failed, 1 when something failed."""
    return 1 if any(result.status is Status.FAIL for result in results) else 0
