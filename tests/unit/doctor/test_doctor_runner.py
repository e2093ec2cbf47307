"""The runner: order, --level / --select / --skip, prerequisites, exceptions, exit codes."""

from __future__ import annotations

import itertools
import time

import pytest
from doctor_helpers import ToyCheck

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
    ids = [c.id for c in runner.plan(_catalogue(), level=2)]
    assert ids == ["platform", "driver", "gpu_nodes", "nvrtc", "sm120_jit"]


def test_checks_run_by_level_then_catalogue_order() -> None:
    checks = [ToyCheck("b", level=2), ToyCheck("a", level=1), ToyCheck("c", level=2), ToyCheck("d", level=1)]
    assert [c.id for c in runner.plan(checks, level=3)] == ["a", "d", "b", "c"]


def test_select_brings_its_prerequisites_along() -> None:
    ids = [c.id for c in runner.plan(_catalogue(), level=1, select=["sm120_jit"])]
    assert ids == ["nvrtc", "sm120_jit"]


def test_unknown_select_id_is_named_with_the_valid_ids() -> None:
    with pytest.raises(runner.SelectionError) as err:
        runner.plan(_catalogue(), level=2, select=["nvrtcc"])
    assert "'nvrtcc'" in str(err.value)
    assert "nvrtc, sm120_jit" in str(err.value)


def test_dependent_of_a_skipped_check_skips_with_its_reason() -> None:
    results = runner.run(runner.plan(_catalogue(), level=1), Context())
    gpu_nodes = next(r for r in results if r.id == "gpu_nodes")
    assert gpu_nodes.status is Status.SKIP
    assert gpu_nodes.summary == "needs driver, which was skipped: driver said skip"
    assert gpu_nodes.remedy == "fix driver"


def test_dependent_of_a_failed_check_does_not_run() -> None:
    checks = _catalogue()
    results = runner.run(runner.plan(checks, level=2), Context())
    jit = next(r for r in results if r.id == "sm120_jit")
    assert jit.status is Status.SKIP and jit.summary.startswith("needs nvrtc, which failed")
    assert checks[4].ran == []


def test_dependent_of_a_check_removed_by_skip_says_so() -> None:
    results = runner.run(runner.plan(_catalogue(), level=1, skip=["driver"]), Context())
    gpu_nodes = next(r for r in results if r.id == "gpu_nodes")
    assert gpu_nodes.summary == "needs driver, which did not run"


def test_a_check_that_raises_becomes_a_fail_with_the_traceback() -> None:
    boom = ToyCheck("boom", raises=KeyError("gpus"))
    (result,) = runner.run([boom], Context())
    assert result.status is Status.FAIL
    assert "raised KeyError" in result.summary
    assert "KeyError: 'gpus'" in result.details
    assert "in run" in result.details  # the frame that raised


def test_results_carry_family_level_and_duration() -> None:
    (result,) = runner.run([ToyCheck("x", level=2, family="jit")], Context())
    assert (result.family, result.level) == ("jit", 2)
    assert result.seconds >= 0


def test_exit_code_is_1_only_when_something_failed() -> None:
    passing = runner.run([ToyCheck("a"), ToyCheck("b", Status.WARN), ToyCheck("c", Status.SKIP)], Context())
    assert runner.exit_code(passing) == 0
    assert runner.exit_code(runner.run([ToyCheck("d", Status.FAIL)], Context())) == 1


class _Timed:
    """A check that records when it ran; it waits `seconds` like a check waiting on a child process."""

    family = "toy"

    def __init__(self, check_id: str, level: int, log: list[tuple[str, float, float]], requires: tuple[str, ...] = ()):
        self.id, self.level, self.requires, self.log = check_id, level, requires, log

    def run(self, ctx: Context) -> Result:
        start = time.monotonic()
        time.sleep(0.3)
        self.log.append((self.id, start, time.monotonic()))
        return Result(self.id, Status.PASS, "ok")


def test_independent_single_node_checks_run_side_by_side_and_report_in_order() -> None:
    log: list[tuple[str, float, float]] = []
    checks = [_Timed("a", 1, log), _Timed("b", 2, log), _Timed("c", 2, log), _Timed("d", 2, log, requires=("a",))]
    start = time.monotonic()
    reported: list[str] = []
    results = runner.run(checks, Context(), on_result=lambda r: reported.append(r.id))
    assert time.monotonic() - start < 0.9  # a, b, c together; d after a: two waits, not four
    assert [r.id for r in results] == reported == ["a", "b", "c", "d"]
    spans = {check_id: (begin, end) for check_id, begin, end in log}
    assert spans["d"][0] >= spans["a"][1]  # a prerequisite finishes before its dependent starts


def test_multi_gpu_checks_run_alone_one_after_another() -> None:
    log: list[tuple[str, float, float]] = []
    checks = [_Timed("single", 2, log), _Timed("nccl", 3, log), _Timed("fusion", 3, log)]
    runner.run(checks, Context())
    spans = sorted((begin, end) for _, begin, end in log)
    assert all(later[0] >= earlier[1] for earlier, later in itertools.pairwise(spans))


def test_a_prerequisite_ordered_after_its_dependent_is_refused() -> None:
    with pytest.raises(ValueError, match="before its prerequisite"):
        runner.run([ToyCheck("late", requires=("early",)), ToyCheck("early")], Context())
