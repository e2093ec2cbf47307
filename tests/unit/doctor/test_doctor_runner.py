"""The runner: order, --level / --select / --skip, prerequisites, exceptions, exit codes."""

from __future__ import annotations

import ast
import threading
import time

import pytest
from doctor_helpers import CheckDouble, ToyCheck, as_checks

from sm120check.doctor import runner
from sm120check.doctor.model import Context, Result, Status


def _catalogue() -> list[ToyCheck]:
    return [
        ToyCheck("platform"),
        ToyCheck("driver", Status.SKIP),
        ToyCheck("gpu_nodes", requires=("driver",)),
        ToyCheck("nvrtc", Status.FAIL),
        ToyCheck("sm120_jit", level=2, requires=("nvrtc",)),
        ToyCheck("comm_allreduce", level=3, requires=("driver",)),
    ]


def test_level_filter_includes_every_level_up_to_n() -> None:
    ids = [c.id for c in runner.plan(as_checks(_catalogue()), level=2)]
    assert ids == ["platform", "driver", "gpu_nodes", "nvrtc", "sm120_jit"]


def test_checks_run_by_level_then_catalogue_order() -> None:
    checks = [ToyCheck("b", level=2), ToyCheck("a", level=1), ToyCheck("c", level=2), ToyCheck("d", level=1)]
    assert [c.id for c in runner.plan(as_checks(checks), level=3)] == ["a", "d", "b", "c"]


def test_select_brings_its_prerequisites_along() -> None:
    ids = [c.id for c in runner.plan(as_checks(_catalogue()), level=1, select=["sm120_jit"])]
    assert ids == ["nvrtc", "sm120_jit"]


def test_unknown_select_id_is_named_with_the_valid_ids() -> None:
    with pytest.raises(runner.SelectionError) as err:
        runner.plan(as_checks(_catalogue()), level=2, select=["nvrtcc"])
    assert "'nvrtcc'" in str(err.value)
    assert "nvrtc, sm120_jit" in str(err.value)


def test_dependent_of_a_skipped_check_skips_with_its_reason() -> None:
    results = runner.run(runner.plan(as_checks(_catalogue()), level=1), Context())
    gpu_nodes = next(r for r in results if r.id == "gpu_nodes")
    assert gpu_nodes.status is Status.SKIP
    assert gpu_nodes.summary == "needs driver, which was skipped: driver said skip"
    assert gpu_nodes.remedy == "fix driver"


def test_dependent_of_a_failed_check_does_not_run() -> None:
    checks = _catalogue()
    results = runner.run(runner.plan(as_checks(checks), level=2), Context())
    jit = next(r for r in results if r.id == "sm120_jit")
    assert jit.status is Status.SKIP and jit.summary.startswith("needs nvrtc, which failed")
    assert checks[4].ran == []


def test_dependent_of_a_check_removed_by_skip_says_so() -> None:
    results = runner.run(runner.plan(as_checks(_catalogue()), level=1, skip=["driver"]), Context())
    gpu_nodes = next(r for r in results if r.id == "gpu_nodes")
    assert gpu_nodes.summary == "needs driver, which did not run"


def test_a_check_that_raises_becomes_a_fail_with_the_traceback() -> None:
    boom = ToyCheck("boom", raises=KeyError("gpus"))
    (result,) = runner.run(as_checks([boom]), Context())
    assert result.status is Status.FAIL
    assert "raised KeyError" in result.summary
    assert "KeyError: 'gpus'" in result.details
    assert "in run" in result.details  # the frame that raised


def test_results_carry_family_level_and_duration() -> None:
    (result,) = runner.run(as_checks([ToyCheck("x", level=2, family="cuda_toolkit")]), Context())
    assert (result.family, result.level) == ("cuda_toolkit", 2)
    assert result.seconds >= 0


def test_exit_code_is_1_only_when_something_failed() -> None:
    passing = runner.run(as_checks([ToyCheck("a"), ToyCheck("b", Status.WARN), ToyCheck("c", Status.SKIP)]), Context())
    assert runner.exit_code(passing) == 0
    assert runner.exit_code(runner.run(as_checks([ToyCheck("d", Status.FAIL)]), Context())) == 1


class _Rendezvous:
    """A check that waits like one waiting on a child process, for events rather than for time: `meet` is a barrier
    the side-by-side checks must all reach (a runner running them one after another never fills it), `after` an event
    this check waits for before it finishes, `sets` the one it sets when it starts. Failing runners are caught by the
    waits' generous timeouts (a verdict of error), never by how long the run took."""

    family = "toy"
    id: str
    level: int
    requires: tuple[str, ...]
    uses: tuple[str, ...]

    def __init__(
        self,
        check_id: str,
        level: int,
        log: list[str],
        requires: tuple[str, ...] = (),
        uses: tuple[str, ...] = (),
        meet: threading.Barrier | None = None,
        after: threading.Event | None = None,
        sets: threading.Event | None = None,
    ):
        self.id, self.level, self.requires, self.uses, self.log = check_id, level, requires, uses, log
        self.meet, self.after, self.sets = meet, after, sets

    def run(self, ctx: Context) -> Result:
        self.log.append(f"{self.id} start")
        if self.sets is not None:
            self.sets.set()
        if self.meet is not None:
            self.meet.wait(timeout=30)  # raises BrokenBarrierError unless all parties run at once
        if self.after is not None and not self.after.wait(timeout=30):
            return Result(self.id, Status.FAIL, "the event it waited for never came")
        self.log.append(f"{self.id} end")
        return Result(self.id, Status.PASS, "ok")


def test_independent_single_node_checks_run_side_by_side_and_report_in_order() -> None:
    log: list[str] = []
    together, d_started = threading.Barrier(3), threading.Event()
    checks = [
        _Rendezvous("a", 1, log, meet=together),
        _Rendezvous("b", 2, log, meet=together, after=d_started),
        _Rendezvous("c", 2, log, meet=together, after=d_started),
        _Rendezvous("d", 2, log, requires=("a",), sets=d_started),
    ]
    reported: list[str] = []
    results = runner.run(as_checks(checks), Context(), on_result=lambda r: reported.append(r.id))
    # a, b and c met at the barrier: they ran side by side; b and c finished only after d had started, so d ran
    # as soon as its prerequisite a was done, not after every other check (two waits, not four)
    assert [(r.id, r.status) for r in results] == [(i, Status.PASS) for i in "abcd"]
    assert [r.id for r in results] == reported == ["a", "b", "c", "d"]
    assert log.index("d start") > log.index("a end")  # a prerequisite finishes before its dependent starts
    assert log.index("d start") < min(log.index("b end"), log.index("c end"))


class _Counted:
    """A check that counts how many checks are running while it runs (a count, not a clock: the short sleep only
    gives an overlapping runner the chance to show itself; a runner that keeps them apart passes whatever the load)."""

    family = "toy"
    id: str
    level: int
    requires: tuple[str, ...]
    uses: tuple[str, ...]

    def __init__(self, check_id: str, level: int, running: list[int], most: list[int], lock: threading.Lock):
        self.id, self.level, self.requires, self.uses = check_id, level, (), ()
        self.running, self.most, self.lock = running, most, lock

    def run(self, ctx: Context) -> Result:
        with self.lock:
            self.running[0] += 1
            self.most.append(self.running[0])
        time.sleep(0.05)
        with self.lock:
            self.running[0] -= 1
        return Result(self.id, Status.PASS, "ok")


def test_multi_gpu_checks_run_alone_one_after_another() -> None:
    running, lock = [0], threading.Lock()
    most: list[int] = []
    checks = [_Counted(i, level, running, most, lock) for i, level in (("single", 2), ("nccl", 3), ("fusion", 3))]
    results = runner.run(as_checks(checks), Context())
    assert [r.id for r in results] == ["single", "nccl", "fusion"]
    assert most == [1, 1, 1]  # each check found itself alone


def test_a_prerequisite_ordered_after_its_dependent_is_refused() -> None:
    with pytest.raises(ValueError, match="before the check"):
        runner.run(as_checks([ToyCheck("late", requires=("early",)), ToyCheck("early")]), Context())


class _Reader:
    """A check that reads another's result: what it saw is the evidence (the race of issue #15: `torch` read
    `driver` without declaring it, so the runner did not wait and it saw no GPUs)."""

    family = "toy"
    id: str
    level: int
    requires: tuple[str, ...]
    uses: tuple[str, ...]

    def __init__(self, check_id: str, reads: str, log: list[str], uses: tuple[str, ...] = ()) -> None:
        self.id, self.level, self.requires, self.uses = check_id, 2, (), uses
        self.reads, self.log = reads, log

    def run(self, ctx: Context) -> Result:
        self.log.append(f"{self.id} start")
        prior = ctx.results.get(self.reads)
        return Result(self.id, Status.PASS, f"saw {prior.status.value if prior else 'nothing'}")


def test_a_check_waits_for_the_checks_it_uses_and_runs_whatever_their_status() -> None:
    log: list[str] = []
    # `slow` waits (bounded) for an event the reader would set if it started early; the runner must not start it
    # before `slow` ends, so the wait times out and the reader then sees slow's failure.
    early = threading.Event()

    class Slow:
        id, level, family = "slow", 1, "toy"
        requires: tuple[str, ...] = ()
        uses: tuple[str, ...] = ()

        def run(self, ctx: Context) -> Result:
            early.wait(timeout=1.0)  # a hang guard, not a measurement
            log.append("slow end")
            return Result("slow", Status.FAIL, "broken")

    class Eager(_Reader):
        def run(self, ctx: Context) -> Result:
            early.set()
            return super().run(ctx)

    results = runner.run(as_checks([Slow(), Eager("reader", "slow", log, uses=("slow",))]), Context())
    assert log == ["slow end", "reader start"]
    assert results[1].status is Status.PASS and results[1].summary == "saw fail"  # ran although slow failed


def test_reading_an_undeclared_result_is_an_error_not_a_race() -> None:
    results = runner.run(as_checks([ToyCheck("driver"), _Reader("torch", "driver", [])]), Context())
    assert results[1].status is Status.FAIL
    assert "UndeclaredResult" in results[1].summary and "'driver'" in results[1].summary


def test_plan_orders_by_the_declared_graph_not_by_registry_position() -> None:
    checks: list[CheckDouble] = [_Reader("torch", "toolkit", [], uses=("toolkit",)), ToyCheck("toolkit")]
    assert [c.id for c in runner.plan(as_checks(checks), level=2)] == ["toolkit", "torch"]


def _results_read(node: ast.AST) -> set[str]:
    """Ids X in `<...>.results.get("X")` and `<...>.results["X"]` under an AST node."""
    read: set[str] = set()
    for sub in ast.walk(node):
        target = key = None
        if isinstance(sub, ast.Subscript):
            target, key = sub.value, sub.slice
        elif isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute) and sub.func.attr == "get":
            target, key = sub.func.value, sub.args[0] if sub.args else None
        if isinstance(target, ast.Attribute) and target.attr == "results" and isinstance(key, ast.Constant):
            read.add(str(key.value))
    return read


def test_every_registered_check_declares_each_result_it_reads() -> None:
    """Static scan of the real checks: every result id a check class reads, itself or through a module-level
    helper it calls, is declared in its `requires` or `uses` (the runner-side guard catches the rest at run time)."""
    import inspect

    from sm120check.doctor.catalogue import all_checks

    scanned = 0
    for check in all_checks():
        tree = ast.parse(inspect.getsource(inspect.getmodule(type(check))))  # type: ignore[arg-type]
        helpers = {n.name: _results_read(n) for n in tree.body if isinstance(n, ast.FunctionDef)}
        cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == type(check).__name__)
        read = _results_read(cls)
        for call in ast.walk(cls):
            if isinstance(call, ast.Call) and isinstance(call.func, ast.Name):
                read |= helpers.get(call.func.id, set())
        scanned += bool(read)
        undeclared = read - set(check.requires) - set(check.uses)
        assert not undeclared, f"{check.id} reads {sorted(undeclared)} without declaring them"
    # The scan sees the real reads, not nothing: the orderings left once the GPU list, toolkit home and venv became
    # facts (torch reads toolkit and driver, sm120_jit the driver's verdict, abi_libs what torch's process mapped).
    assert scanned >= 3
