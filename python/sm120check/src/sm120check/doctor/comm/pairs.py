"""Level 3, per GPU pair over PCIe (issue #25): many-to-one staggered writes (`gpu_peer_stress`, family `comm`) and
a two-rank NCCL all-reduce per pair under a watchdog with P2P on and again with NCCL_P2P_DISABLE=1 (`nccl_pairs`,
family `pcie_p2p`: the role that fixes what it finds). The per-pair write/read bandwidth is `gpu_peer_bandwidth`'s
(comm/peer.py).

Both judges are pure functions of the probes' typed answers (comm/peer_stress_payload.py, pcie_p2p/nccl_pair_payload.py), read
strictly: a malformed answer is a fail naming the field. GeForce GPUs (no P2P with the stock driver) are what the
level-1 `iommu` and `pcie_acs` checks call "expected, P2P features off": their pairs pass with that note.

Met real hardware: none of this. The copy engine (comm/stress_copies.py) ran only against a stand-in for libcuda, the
watchdog only against stand-in ranks that hang or exit non-zero; neither has run on a GPU, and no verdict here has
been checked against a real PCIe switch fabric or a real IOMMU/ACS hang.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

from sm120check.doctor import remedies
from sm120check.doctor.child import ChildOutcome, probe_env, run_probe
from sm120check.doctor.comm.collectives import FAMILY, PROBES, child_failure, gpu_arg, malformed, selected_gpus
from sm120check.doctor.comm.peer import fabric_roots, geforce_of
from sm120check.doctor.comm.peer_stress_payload import NOT_MEASURED, StressAnswer, StressTarget
from sm120check.doctor.comm.peer_stress_payload import PROBE as STRESS_PROBE
from sm120check.doctor.model import Context, Result, Status
from sm120check.doctor.payload import PayloadError
from sm120check.doctor.pcie_p2p import fabric as pcie_checks
from sm120check.doctor.pcie_p2p.nccl_pair_payload import PairRun
from sm120check.doctor.pcie_p2p.nccl_pair_probe import pair_env

_RANK = {Status.FAIL: 3, Status.WARN: 2, Status.PASS: 1, Status.SKIP: 0}

# ---- many-to-one staggered writes ---------------------------------------------------------------------------------

# The aggregate into a target against the best solo write into it (the target's own ingress): a healthy fabric
# saturates the target's link (the collapse report's CONTROL row: 52.1 GB/s together against 52.5 alone, 99 %);
# its collapsed rows carried 26 % (13.5 against 52.5). Fail below half, warn below 75 %: the fractions of the
# posted-write verdict (node_health/verdicts.WRITE_COLLAPSE_FRACTION), from the same report.
AGGREGATE_FAIL_FRACTION = 0.50
AGGREGATE_WARN_FRACTION = 0.75
# A source against its equal share of that aggregate (aggregate / sources), not against its solo rate: every source
# shares the target's link, so each is far below its solo rate on any healthy node. Nor is an equal share what a
# healthy switch gives: arbitration is per port, so sources that reach the target's switch through one upstream port
# share one port's turn (8 GPUs, 4 behind each of two switches: each remote source gets 7/16 = 44 % of an equal
# share). Ours: warn below 25 % and fail below 10 % of the equal share, under what port arbitration explains: a
# source shut out of the target, not outvoted.
SOURCE_WARN_FRACTION = 0.25
SOURCE_FAIL_FRACTION = 0.10
STRESS_MARGIN_S = 5.0  # the probe stops starting rounds this long before the check's own limit kills it


@dataclass(frozen=True)
class TargetVerdict:
    status: Status
    summary: str
    details: str
    remedy: str = ""


def _port(roots: Mapping[int, str], index: int) -> str:
    return f"root port {roots[index]}" if roots.get(index) else "root port unknown"


def judge_target(target: StressTarget, roots: Mapping[int, str], geforce: frozenset[int]) -> TargetVerdict:
    """One round into one target (pure): the aggregate against the best solo write into it, each P2P source
    against its equal share of the aggregate."""
    t = f"GPU {target.target}"
    n = len(target.sources)
    lines = [
        f"into {t} ({target.target_bus}, {_port(roots, target.target)}) from {n} GPUs at once: aggregate "
        f"{target.aggregate_gbps} GB/s in {target.seconds} s" + (f"; {target.error}" if target.error else "")
    ]
    for s in target.sources:
        lines.append(
            f"  GPU {s.src} ({s.src_bus}, {_port(roots, s.src)}): solo {s.solo_gbps} GB/s, under load "
            f"{s.loaded_gbps} GB/s, peer access {s.access or '(not tried)'}" + (f"; {s.error}" if s.error else "")
        )
    details = "\n".join(lines)
    if target.error.startswith(NOT_MEASURED):
        return TargetVerdict(Status.WARN, f"{t}: {target.error}", details, remedies.PEER_STRESS_TIMEOUT)
    p2p = [s for s in target.sources if s.p2p]
    if not target.sources:
        return TargetVerdict(Status.SKIP, f"{t}: no other GPU wrote to it", details)
    if target.aggregate_gbps is None or target.error:
        why = target.error or "no copy was timed"
        everyone = ",".join(str(i) for i in (target.target, *(s.src for s in target.sources)))
        return TargetVerdict(
            Status.FAIL, f"{t}: the many-to-one writes failed: {why}", details, remedies.peer_stress_probe(everyone)
        )
    if not p2p:
        if geforce & ({target.target} | {s.src for s in target.sources}):
            return TargetVerdict(Status.PASS, f"{t}: {pcie_checks.GEFORCE_NOTE}", details)
        return TargetVerdict(
            Status.SKIP, f"{t}: no source has P2P to it (gpu_peer_bandwidth says which pairs)", details
        )
    solos = [s.solo_gbps for s in p2p if s.solo_gbps]
    best = max(solos, default=0.0)
    aggregate = target.aggregate_gbps
    share = aggregate / n
    starved = [
        (s, s.loaded_gbps / share)
        for s in p2p
        if s.loaded_gbps is not None and s.loaded_gbps < SOURCE_WARN_FRACTION * share
    ]
    if best and aggregate < AGGREGATE_WARN_FRACTION * best:
        fraction = aggregate / best
        status = Status.FAIL if fraction < AGGREGATE_FAIL_FRACTION else Status.WARN
        limit = AGGREGATE_FAIL_FRACTION if status is Status.FAIL else AGGREGATE_WARN_FRACTION
        return TargetVerdict(
            status,
            f"{t}: {n} GPUs writing at once carry {aggregate:.1f} GB/s, {fraction:.0%} of the best solo write into it "
            f"({best:.1f} GB/s; {status.value} below {limit:.0%}): the fabric collapses under many-to-one load; "
            f"{_port(roots, target.target)}",
            details,
            remedies.PEER_STRESS,
        )
    if starved:
        worst = min(fraction for _, fraction in starved)
        status = Status.FAIL if worst < SOURCE_FAIL_FRACTION else Status.WARN
        named = ", ".join(
            f"GPU {s.src} {s.loaded_gbps:.1f} GB/s ({fraction:.0%} of an equal share {share:.1f}; solo "
            f"{s.solo_gbps} GB/s; {_port(roots, s.src)})"
            for s, fraction in starved
        )
        return TargetVerdict(
            status,
            f"{t}: under many-to-one load (aggregate {aggregate:.1f} GB/s from {n} GPUs) a source is nearly shut out: "
            f"{named}",
            details,
            remedies.PEER_STRESS,
        )
    loads = [s.loaded_gbps for s in p2p if s.loaded_gbps is not None]
    spread = f"{min(loads):.1f}-{max(loads):.1f}" if loads else "-"
    return TargetVerdict(Status.PASS, f"{t}: {aggregate:.1f} GB/s from {n} GPUs at once ({spread} GB/s each)", details)


def judge_stress(
    answer: StressAnswer,
    roots: Mapping[int, str] | None = None,
    geforce: frozenset[int] = frozenset(),
    selected: str = "",
) -> Result:
    """The probe's answer as one Result (pure): the worst round, the bad rounds named in the summary. `selected`:
    the GPUs the probe was given (its `--gpus`), for the remedy that reruns it."""
    check_id = "gpu_peer_stress"
    roots = roots or {}
    data: dict[str, object] = {
        "targets": [
            {
                "target": t.target,
                "aggregate_gbps": t.aggregate_gbps,
                "sources": [{"src": s.src, "solo_gbps": s.solo_gbps, "loaded_gbps": s.loaded_gbps} for s in t.sources],
            }
            for t in answer.targets
        ],
        "size_bytes": answer.size_bytes,
        "copies": answer.copies,
        "stagger_s": answer.stagger_s,
    }
    if answer.error:
        return Result(
            check_id, Status.FAIL, f"the many-to-one write probe could not measure: {answer.error}", data=data
        )
    verdicts = [judge_target(t, roots, geforce) for t in answer.targets]
    if answer.left_out:
        listed = "; ".join(answer.left_out)
        verdicts.append(
            TargetVerdict(
                Status.FAIL,
                f"GPUs left out of every round: {listed}",
                listed,
                remedies.peer_stress_probe(selected),
            )
        )
    if not verdicts:
        return Result(check_id, Status.SKIP, "no GPU to write to", data=data)
    worst = max(_RANK[v.status] for v in verdicts)
    status = next(s for s, r in _RANK.items() if r == worst)
    bad = [v for v in verdicts if v.status is status]
    details = "\n".join(v.details for v in verdicts)
    if status is Status.PASS:
        summary = (
            f"{len(verdicts)} targets, each written by every other GPU at once (starts {answer.stagger_s * 1000:.0f} "
            f"ms apart): " + "; ".join(v.summary for v in verdicts)
        )
    else:
        summary = (
            bad[0].summary
            if len(bad) == 1
            else f"{len(bad)} of {len(verdicts)} targets: " + "; ".join(v.summary for v in bad)
        )
    remedy = remedies.all_of(*(v.remedy for v in bad))
    return Result(check_id, status, summary, details, remedy=remedy, data=data)


class PeerStress:
    """Many-to-one staggered writes: each selected GPU in turn is written to by every other at once (64 MiB
    cuMemcpyPeerAsync copies on a stream of each source's context, starts 1 ms apart); the aggregate against the
    best solo write into it, each source against its equal share."""

    id: ClassVar[str] = "gpu_peer_stress"
    family: ClassVar[str] = FAMILY
    level: ClassVar[int] = 3
    requires: ClassVar[tuple[str, ...]] = ("driver",)
    uses: ClassVar[tuple[str, ...]] = ()

    def run(self, ctx: Context) -> Result:
        gpus = selected_gpus(ctx, self.id, need_torch=False)
        if isinstance(gpus, Result):
            return gpus
        selected = gpu_arg(gpus)
        budget = str(max(5.0, ctx.timeout - STRESS_MARGIN_S))
        outcome = run_probe(f"{PROBES}.peer_stress", ["--gpus", selected, "--timeout", budget], timeout=ctx.timeout)
        if not outcome.ok:
            return child_failure(self.id, "the many-to-one write probe", outcome, remedies.peer_stress_probe(selected))
        try:
            answer = StressAnswer.from_json(outcome.data)
        except PayloadError as exc:
            return malformed(self.id, STRESS_PROBE, exc)
        return judge_stress(answer, fabric_roots(ctx, gpus), geforce_of(gpus), selected)


# ---- a two-rank NCCL all-reduce per pair, P2P on and off, under a watchdog ----------------------------------------

# Our limit for one run of one pair: two ranks import torch, start NCCL and all-reduce 1 MiB once and 64 MiB six
# times, which takes seconds on a healthy node; the hang this looks for (vllm#33041, rtx6kpro#15) never ends.
PAIR_TIMEOUT_S = 60.0
PAIR_PROBE_MARGIN_S = 5.0  # the probe's own watchdog fires this long before the doctor's kills the probe
# Our bound for the whole check: 28 pairs of 8 GPUs run twice each at about 10 s a run fit; pairs that would start
# after it are listed, not run.
PAIRS_BUDGET_S = 900.0
PAIR_PROBE = f"{PROBES}.nccl_pair"


@dataclass(frozen=True)
class PairOutcome:
    """One pair's two runs. `on` is None where P2P was not tried (a GeForce GPU: expected, P2P features off)."""

    gpus: tuple[int, int]
    on: PairRun | None
    off: PairRun


def run_outcome(gpus: tuple[int, int], p2p: bool, outcome: ChildOutcome) -> PairRun:
    """What one probe child gave, as a run: its answer when it printed one (PayloadError when malformed), else a
    run that hung (the doctor's watchdog killed the probe with its process group) or failed."""
    if outcome.ok:
        run = PairRun.from_json(outcome.data)
        if run.gpus != gpus or run.p2p != p2p:
            raise PayloadError("nccl_pair", "gpus", f"answered for {list(run.gpus)} p2p={run.p2p}, asked {list(gpus)}")
        return run
    during = f" during {outcome.step}" if outcome.step else ""
    return PairRun(
        gpus,
        p2p,
        finished=False,
        hung=outcome.timed_out,
        seconds=round(outcome.seconds, 2),
        problem=f"the probe {outcome.problem}{during}",
        evidence=outcome.stderr_tail[-2000:],
    )


def run_pair_child(
    gpus: tuple[int, int],
    p2p: bool,
    *,
    limit: float,
    python: str | None = None,
    module: str = PAIR_PROBE,
    target: str = "",
) -> PairRun:
    """One run in a probe child (`module`; its ranks run `target`, default the NCCL rank) with the doctor's watchdog
    at `limit` (the probe's own fires `PAIR_PROBE_MARGIN_S` earlier); raises PayloadError on a malformed answer."""
    args = ["--gpus", f"{gpus[0]},{gpus[1]}", "--timeout", str(max(5.0, limit - PAIR_PROBE_MARGIN_S))]
    args += ["--target", target] if target else []
    if not p2p:
        args.append("--p2p-off")
    env = {**probe_env(), **pair_env(p2p)}
    return run_outcome(gpus, p2p, run_probe(module, args, timeout=limit, env=env, python=python))


def _how(run: PairRun) -> str:
    mode = "with P2P" if run.p2p else "with NCCL_P2P_DISABLE=1"
    if run.finished:
        return f"finished {mode} (busbw {run.busbw_gbps} GB/s)"
    if run.hung:
        return f"hung {mode}: the watchdog killed it after {run.seconds:.0f} s ({run.problem})"
    return f"failed {mode}: {run.problem}"


def judge_pair(pair: PairOutcome) -> TargetVerdict:
    """One pair's two runs (pure)."""
    g = f"GPU {pair.gpus[0]}-{pair.gpus[1]}"
    on, off = pair.on, pair.off
    runs = [r for r in (on, off) if r is not None]
    details = f"{g}: " + "; ".join(_how(r) for r in runs)
    evidence = "\n".join(r.evidence for r in runs if r.evidence and not r.finished)
    details += f"\n{evidence}" if evidence else ""
    if on is None:
        if off.finished:
            return TargetVerdict(Status.PASS, f"{g}: {pcie_checks.GEFORCE_NOTE}; NCCL all-reduce {_how(off)}", details)
        return TargetVerdict(Status.FAIL, f"{g}: NCCL all-reduce {_how(off)}", details, remedies.NCCL_PAIR_BROKEN)
    if on.finished and off.finished:
        return TargetVerdict(
            Status.PASS,
            f"{g}: all-reduce busbw {on.busbw_gbps} GB/s with P2P, {off.busbw_gbps} GB/s with NCCL_P2P_DISABLE=1",
            details,
        )
    if off.finished:
        return TargetVerdict(
            Status.FAIL,
            f"{g}: NCCL all-reduce {_how(on)}, and {_how(off)}: PCIe P2P between them is blocked (IOMMU "
            "translation or ACS redirect)",
            details,
            remedies.NCCL_PAIR_P2P_BLOCKED,
        )
    if on.finished:
        return TargetVerdict(
            Status.WARN, f"{g}: NCCL all-reduce {_how(on)}, but {_how(off)}", details, remedies.NCCL_PAIR_NO_FALLBACK
        )
    return TargetVerdict(
        Status.FAIL, f"{g}: NCCL all-reduce {_how(on)}, and {_how(off)}", details, remedies.NCCL_PAIR_BROKEN
    )


def judge_pairs(pairs: Sequence[PairOutcome], not_run: Sequence[tuple[int, int]] = ()) -> Result:
    """Every pair's verdict folded (pure): the worst status, its pairs in the summary; pairs the budget left out
    warn."""
    check_id = "nccl_pairs"
    verdicts = [judge_pair(p) for p in pairs]
    if not_run:
        listed = ", ".join(f"GPU {a}-{b}" for a, b in not_run)
        verdicts.append(
            TargetVerdict(
                Status.WARN,
                f"{len(not_run)} pair(s) not run, the check's {PAIRS_BUDGET_S:.0f} s would pass first: {listed}",
                f"not run: {listed}",
                remedies.NCCL_PAIRS_BUDGET,
            )
        )
    data: dict[str, object] = {
        "pairs": [
            {
                "gpus": list(p.gpus),
                "p2p_on": p.on.to_json() if p.on is not None else None,
                "p2p_off": p.off.to_json(),
            }
            for p in pairs
        ],
        "not_run": [list(p) for p in not_run],
    }
    if not verdicts:
        return Result(check_id, Status.SKIP, "no GPU pair to run", data=data)
    worst = max(_RANK[v.status] for v in verdicts)
    status = next(s for s, r in _RANK.items() if r == worst)
    bad = [v for v in verdicts if v.status is status]
    details = "\n".join(v.details for v in verdicts)
    if status is Status.PASS and len(verdicts) > 1:
        summary = f"{len(verdicts)} GPU pairs finished with P2P and without: " + "; ".join(v.summary for v in verdicts)
    else:
        summary = (
            bad[0].summary
            if len(bad) == 1
            else f"{len(bad)} of {len(verdicts)} pairs: " + "; ".join(v.summary for v in bad)
        )
    return Result(check_id, status, summary, details, remedy=remedies.all_of(*(v.remedy for v in bad)), data=data)


class NcclPairs:
    """A two-rank NCCL all-reduce on every pair of the selected GPUs under a watchdog, with P2P and again with
    NCCL_P2P_DISABLE=1: only the second finishing fails naming IOMMU/ACS; a hang names the pair and how long it
    was waited for. GeForce pairs run without P2P only (expected, P2P features off)."""

    id: ClassVar[str] = "nccl_pairs"
    family: ClassVar[str] = pcie_checks.FAMILY
    level: ClassVar[int] = 3
    requires: ClassVar[tuple[str, ...]] = ("driver", "torch")
    uses: ClassVar[tuple[str, ...]] = ()

    def run(self, ctx: Context) -> Result:
        gpus = selected_gpus(ctx, self.id, need_torch=True)
        if isinstance(gpus, Result):
            return gpus
        geforce = geforce_of(gpus)
        limit = min(ctx.timeout, PAIR_TIMEOUT_S)
        python = str(ctx.facts.venv_python)
        began = time.monotonic()
        done: list[PairOutcome] = []
        not_run: list[tuple[int, int]] = []
        for a, b in itertools.combinations([g.index for g in gpus], 2):
            expected_off = bool(geforce & {a, b})
            if time.monotonic() - began + limit * (1 if expected_off else 2) > PAIRS_BUDGET_S:
                not_run.append((a, b))
                continue
            try:
                on = None if expected_off else run_pair_child((a, b), True, limit=limit, python=python)
                off = run_pair_child((a, b), False, limit=limit, python=python)
            except PayloadError as exc:
                return malformed(self.id, "nccl_pair", exc)
            done.append(PairOutcome((a, b), on, off))
        return judge_pairs(done, not_run)


CHECKS = (PeerStress, NcclPairs)
