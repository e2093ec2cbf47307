"""What a fleet report is made of: one report per node, each node's check results, the fleet's verdict."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, replace

from sm120check.fleet.outliers import DEFAULT, NOTHING, Figure, Ignored, Review, Thresholds, judge


class NodeState(str, enum.Enum):
    READY = "ready"  # the doctor ran and nothing failed
    FAILED = "failed"  # the doctor ran and a check failed
    UNREACHABLE = "unreachable"  # Ansible could not reach the node
    NO_CHECKER = "no_checker"  # the node has no sm120check (not provisioned)
    ERROR = "error"  # the doctor gave no usable report (crashed, usage error, unreadable output)

    @property
    def label(self) -> str:
        return "no sm120check" if self is NodeState.NO_CHECKER else self.value


# Matrix cells: a check's status upper-cased, or NO_RESULT where the node has no result for it.
NO_RESULT = "-"
STATUSES = ("pass", "warn", "fail", "skip")
# The states a node file may state without doctor results (the playbook's stubs). "ready" and "failed" are never
# taken from a file: only the doctor's results make a node ready or failed.
STUB_STATES = (NodeState.UNREACHABLE.value, NodeState.NO_CHECKER.value, NodeState.ERROR.value)


@dataclass(frozen=True)
class CheckResult:
    """One check's result on one node, as the doctor's JSON report gives it."""

    id: str
    status: str  # pass, warn, fail, skip
    summary: str = ""
    details: str = ""
    remedy: str = ""
    level: int = 0
    family: str = ""


@dataclass(frozen=True)
class NodeReport:
    """A node's doctor report, or why there is none."""

    host: str
    state: NodeState
    results: tuple[CheckResult, ...] = ()
    error: str = ""  # why there is no report (unreachable, no checker, doctor error)
    version: str = ""  # sm120check's version on the node
    level: int | None = None
    started: str = ""
    seconds: float = 0.0
    source: str = ""  # the file it was read from
    figures: tuple[Figure, ...] = ()  # measured numbers from the checks' data (fleet/outliers.py)
    ignored: tuple[Ignored, ...] = ()  # numbers the report gave that were not usable
    reported_host: str = ""  # the host the report names, where it is not the file's name (a copied or renamed file)
    tp_groups: tuple[str, ...] = ()  # pcie_acs's TP-group suggestion, where the GPUs are behind several root complexes

    def result(self, check_id: str) -> CheckResult | None:
        return next((r for r in self.results if r.id == check_id), None)

    def cell(self, check_id: str) -> str:
        found = self.result(check_id)
        return found.status.upper() if found else NO_RESULT

    def counts(self) -> dict[str, int]:
        tally = dict.fromkeys(STATUSES, 0)
        for result in self.results:
            tally[result.status] = tally.get(result.status, 0) + 1
        return tally

    def problems(self) -> tuple[CheckResult, ...]:
        """Failures first, then warnings, each in check order."""
        return tuple(r for r in self.results if r.status == "fail") + tuple(
            r for r in self.results if r.status == "warn"
        )


@dataclass(frozen=True)
class Fleet:
    """Every node's report (sorted by host) and every check any node ran (sorted by level, then id)."""

    nodes: tuple[NodeReport, ...]
    checks: tuple[str, ...]
    source: str = ""
    review: Review = NOTHING  # the nodes' figures against the fleet median of their GPU model
    fail_on_outlier: bool = False  # `fleet report --fail-on-outlier`: an outlier fails the report (never a node)

    def judged(self, limits: Thresholds, fail_on_outlier: bool = False) -> Fleet:
        """The same fleet with its figures judged against other thresholds."""
        return replace(self, review=_review(self.nodes, limits), fail_on_outlier=fail_on_outlier)

    @property
    def passed(self) -> bool:
        """What the report's exit code says: every node ready and, with fail_on_outlier, no outlier. An outlier
        alone never makes a node failed (its checks passed): it is a warning about the fleet."""
        return self.ok and not (self.fail_on_outlier and self.review.outliers)

    @property
    def ok(self) -> bool:
        """True when there are nodes and every one is ready: reachable, checked (at least one result), nothing
        failed."""
        return bool(self.nodes) and all(node.state is NodeState.READY and node.results for node in self.nodes)

    def node(self, host: str) -> NodeReport | None:
        return next((n for n in self.nodes if n.host == host), None)

    def state_counts(self) -> Mapping[str, int]:
        tally = {state.value: 0 for state in NodeState}
        for node in self.nodes:
            tally[node.state.value] += 1
        return tally

    def levels(self) -> tuple[int, ...]:
        return tuple(sorted({n.level for n in self.nodes if n.level is not None}))


def build_fleet(nodes: list[NodeReport], source: str = "") -> Fleet:
    """A fleet with nodes sorted by host and the union of their checks sorted by level, then by the doctor's own
    order (prerequisites first: platform, manifest, driver, ...), as the nodes' reports list them."""
    rank: dict[str, tuple[int, int]] = {}
    for node in nodes:
        for position, result in enumerate(node.results):
            rank[result.id] = min(rank.get(result.id, (result.level, position)), (result.level, position))
    checks = tuple(sorted(rank, key=lambda check: (*rank[check], check)))
    ordered = tuple(sorted(nodes, key=lambda n: n.host))
    return Fleet(ordered, checks, source, _review(ordered, DEFAULT))


def _review(nodes: tuple[NodeReport, ...], limits: Thresholds) -> Review:
    figures = [f for n in nodes for f in n.figures]
    return judge(figures, [i for n in nodes for i in n.ignored], limits)
