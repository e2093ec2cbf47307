"""A check that runs one probe child on the selected GPUs: the prelude every such check shares, written once.

A `ProbeCheck` declares its probe (the child module), its payload type (read strictly by `from_json`), how many
GPUs it needs, the remedy of a probe that died, and a pure `judge` (payload, context, GPUs -> Result). `run` does
the rest in one place: select the GPUs (the node's facts restricted to --gpus, after the prerequisites in
`requires`), run the probe under its hard limit, report a child that hung, died or printed nothing, report an
answer that does not fit its type (naming the field), judge. The helpers below are also what the checks with a
run of their own (several probe runs, a gate before the probe) build on.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from sm120check.doctor import remedies
from sm120check.doctor.child import ChildOutcome, probe_env, run_probe
from sm120check.doctor.model import Context, Result, Status
from sm120check.doctor.nvml_api import Gpu
from sm120check.doctor.payload import PayloadError
from sm120check.doctor.pcie import roots, sysfs

COMM = "comm"  # the family of most probe checks: what the helpers' results carry unless told
GEFORCE_NOTE = "P2P not available on GeForce with the stock driver: expected, P2P features off"
RANK = {Status.FAIL: 3, Status.WARN: 2, Status.PASS: 1, Status.SKIP: 0}  # the worst status of many parts first

P = TypeVar("P")
P_co = TypeVar("P_co", covariant=True)


class Payload(Protocol[P_co]):
    """A probe's answer type: built from the probe's JSON, strictly (PayloadError names the field)."""

    def from_json(self, data: Mapping[str, Any]) -> P_co: ...


def skip(check_id: str, summary: str, remedy: str = "", family: str = COMM) -> Result:
    return Result(check_id, Status.SKIP, summary, remedy=remedy, family=family, level=3)


def selected_gpus(
    ctx: Context, check_id: str, need_torch: bool, needed: int = 2, family: str = COMM
) -> list[Gpu] | Result:
    """The GPUs NVML listed (the node's facts) restricted to --gpus, or a skip saying why there is nothing to run on."""
    for required in ("driver", "torch") if need_torch else ("driver",):
        prior = ctx.results.get(required)
        if prior is None:
            return skip(check_id, f"prerequisite `{required}` did not run", remedies.comm_select(required), family)
        if prior.status in (Status.FAIL, Status.SKIP):
            summary = f"prerequisite `{required}` {prior.status.value}ed: {prior.summary}"
            return skip(check_id, summary, prior.remedy, family)
    rows = list(ctx.facts.gpus or ())  # `driver` passed or warned: NVML listed them
    if ctx.gpus is not None:
        known = {g.index for g in rows}
        unknown = [i for i in ctx.gpus if i not in known]
        if unknown:
            summary = f"--gpus names {unknown}, the driver sees {sorted(known)}"
            return skip(check_id, summary, remedies.COMM_GPU_INDICES, family)
        rows = [g for g in rows if g.index in ctx.gpus]
    if len(rows) < needed:
        return skip(check_id, f"needs at least {needed} GPUs, {len(rows)} selected", remedies.COMM_TWO_GPUS, family)
    return rows


def gpu_arg(gpus: Sequence[Gpu]) -> str:
    """The selected GPUs as a probe's `--gpus` value (NVML indices, \"0,1\")."""
    return ",".join(str(g.index) for g in gpus)


def capability(gpu: Gpu) -> str:
    """The compute capability as FlashInfer and the release tables write it: "12.0"."""
    return f"{gpu.cc[0]}.{gpu.cc[1]}"


def stack_child(ctx: Context) -> dict[str, Any]:
    """Run torch probes with the stack venv's interpreter (the manifest's venv), like the torch check."""
    return {"python": str(ctx.facts.venv_python), "env": probe_env()}


def child_failure(check_id: str, what: str, outcome: ChildOutcome, remedy: str, family: str = COMM) -> Result:
    """A level-3 probe that hung, died or printed nothing: a FAIL naming the probe, why, and the step it was in."""
    during = f" during {outcome.step}" if outcome.step else ""
    return Result(
        check_id,
        Status.FAIL,
        f"{what} {outcome.problem}{during}",
        details=outcome.stderr_tail[-2000:],
        remedy=remedy,
        family=family,
        level=3,
    )


def malformed(check_id: str, probe: str, exc: PayloadError, remedy: str, family: str = COMM) -> Result:
    """A probe answer that does not fit its type: a fail naming the field, never a crash or a silent pass."""
    return Result(
        check_id,
        Status.FAIL,
        f"the {probe} probe printed a malformed answer: {exc}",
        remedy=remedy,
        family=family,
        level=3,
    )


def is_geforce(name: str) -> bool:
    return "geforce" in name.lower()


def geforce_of(gpus: Sequence[Gpu]) -> frozenset[int]:
    """The GPUs the level-1 checks call "expected, P2P features off": GeForce parts on the stock driver."""
    return frozenset(g.index for g in gpus if is_geforce(g.name))


def fabric_roots(ctx: Context, gpus: Sequence[Gpu]) -> dict[int, str]:
    """Each selected GPU's root port (NVML index -> BDF), from the run's PCIe read (a check that calls this declares
    `needs_pcie`); without one (tests, API callers that built no facts) from sysfs here (no lspci: the bridge chain
    is all this needs)."""
    gathered = ctx.facts.pcie
    view = gathered.sysfs if gathered is not None else sysfs.read()
    return roots.root_ports(view, {g.index: g.bus_id for g in gpus})


def part(status: Status, summary: str, details: str, remedy: str = "") -> Result:
    """The verdict on one part of a pair check (one target GPU, one pair): a Result without an id, folded into the
    check's own."""
    return Result("", status, summary, details, remedy)


def with_evidence(result: Result, evidence: str | Mapping[str, object]) -> Result:
    """A failed multi-GPU result carries each failing rank's phase and log tail (Python stacks on a hang).
    `evidence` is the answer's evidence text (a mapping with an "evidence" entry: sglang_comm's call)."""
    if not isinstance(evidence, str):
        evidence = str(evidence["evidence"]) if "evidence" in evidence else ""
    if result.status is not Status.FAIL or not evidence.strip():
        return result
    return dataclasses.replace(result, details=f"{result.details}\n{evidence.strip()}".strip())


class ProbeCheck(Generic[P]):
    """A level-3 check that runs one probe child and judges its typed answer (see the module docstring).

    A subclass sets the Check attributes and these, and writes `judge`; the other methods have defaults."""

    id: ClassVar[str]
    family: ClassVar[str]
    level: ClassVar[int] = 3
    requires: ClassVar[tuple[str, ...]] = ("driver",)  # "torch" too: the probe runs torch in the stack venv
    uses: ClassVar[tuple[str, ...]] = ()
    needs_pcie: ClassVar[bool] = False  # True: the judge reads the run's PCIe facts (facts.pcie_reader reads them)

    probe: ClassVar[str]  # the child module, run as `python -m`
    payload: ClassVar[Payload[Any]]  # the answer's type
    answer: ClassVar[str]  # how a malformed answer names the probe ("the <answer> probe printed ...")
    what: ClassVar[str]  # how a probe that died is named ("<what> timed out after 60 s")
    remedy: ClassVar[str]  # the remedy of a probe that died (a name from remedies.py)
    gpus_needed: ClassVar[int] = 2

    def judge(self, answer: P, ctx: Context, gpus: Sequence[Gpu]) -> Result:
        raise NotImplementedError

    def prepare(self, ctx: Context, gpus: Sequence[Gpu]) -> Result | None:
        """A verdict reached before the probe runs (something it needs is missing), or None to run it."""
        return None

    def timeout(self, ctx: Context, gpus: Sequence[Gpu]) -> float:
        return ctx.timeout

    def args(self, ctx: Context, gpus: Sequence[Gpu], limit: float) -> list[str]:
        """The probe's arguments: the GPUs, and its own limit 5 s under ours (`limit`; at least 10 s)."""
        return ["--gpus", gpu_arg(gpus), "--timeout", str(max(10.0, limit - 5))]

    def child(self, ctx: Context) -> dict[str, Any]:
        """How the child runs: with the stack venv's interpreter when the probe needs torch."""
        return stack_child(ctx) if "torch" in self.requires else {}

    def failed(self, outcome: ChildOutcome, gpus: Sequence[Gpu]) -> Result:
        """The Result of a probe that hung, died or printed nothing."""
        return child_failure(self.id, self.what, outcome, self.remedy, self.family)

    def malformed_answer(self, exc: PayloadError) -> Result:
        """The Result of an answer that does not fit its type: report the probe's output."""
        return malformed(self.id, self.answer, exc, remedies.comm_malformed(self.probe), self.family)

    def select(self, ctx: Context) -> list[Gpu] | Result:
        return selected_gpus(ctx, self.id, "torch" in self.requires, self.gpus_needed, self.family)

    def ask(self, ctx: Context, gpus: Sequence[Gpu], timeout: float | None = None) -> P | Result:
        """Run the probe; its typed answer, or the Result of a child that failed or an answer that is malformed."""
        limit = self.timeout(ctx, gpus) if timeout is None else timeout
        outcome = run_probe(self.probe, self.args(ctx, gpus, limit), timeout=limit, **self.child(ctx))
        if not outcome.ok:
            return self.failed(outcome, gpus)
        try:
            answer: P = self.payload.from_json(outcome.data)
        except PayloadError as exc:
            return self.malformed_answer(exc)
        return answer

    def run(self, ctx: Context) -> Result:
        gpus = self.select(ctx)
        if isinstance(gpus, Result):
            return gpus
        early = self.prepare(ctx, gpus)
        if early is not None:
            return early
        answer = self.ask(ctx, gpus)
        if isinstance(answer, Result):
            return answer
        return self.judge(answer, ctx, gpus)
