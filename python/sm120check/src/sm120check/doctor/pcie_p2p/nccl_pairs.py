"""Level 3, per GPU pair: a two-rank NCCL all-reduce on every pair under a watchdog, with P2P on and
again with NCCL_P2P_DISABLE=1 (`nccl_pairs`, family `pcie_p2p`: the role that fixes what it finds). The judge is a
pure function of the probe's typed answer (pcie_p2p/nccl_pair_payload.py), read strictly: a malformed answer is a
fail naming the field. GeForce GPUs (no P2P with the stock driver) are what the level-1 `iommu` and `pcie_acs`
checks call "expected, P2P features off": their pairs run without P2P only and pass with that note.

What of this has run on a GPU is in the GPU coverage table (scripts/coverage_table.py).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from sm120check.doctor import remedies
from sm120check.doctor.child import ChildOutcome, probe_env, run_probe
from sm120check.doctor.model import Context, Result, Status
from sm120check.doctor.payload import PayloadError
from sm120check.doctor.pcie_p2p.nccl_pair_payload import PairRun
from sm120check.doctor.pcie_p2p.nccl_pair_probe import pair_env
from sm120check.doctor.probecheck import (
    GEFORCE_NOTE,
    RANK,
    geforce_of,
    malformed,
    part,
    selected_gpus,
)

FAMILY = "pcie_p2p"

# ---- a two-rank NCCL all-reduce per pair, P2P on and off, under a watchdog ----------------------------------------

# Our limit for one run of one pair: two ranks import torch, start NCCL and all-reduce 1 MiB once and 64 MiB six
# times, which takes seconds on a healthy node; the hang this looks for (vllm#33041, rtx6kpro#15) never ends.
PAIR_TIMEOUT_S = 60.0
PAIR_PROBE_MARGIN_S = 5.0  # the probe's own watchdog fires this long before the doctor's kills the probe
# Our bound for the whole check: 28 pairs of 8 GPUs run twice each at about 10 s a run fit; pairs that would start
# after it are listed, not run.
PAIRS_BUDGET_S = 900.0
PAIR_PROBE = "sm120check.doctor.pcie_p2p.nccl_pair_probe"


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


def judge_pair(pair: PairOutcome) -> Result:
    """One pair's two runs (pure)."""
    g = f"GPU {pair.gpus[0]}-{pair.gpus[1]}"
    on, off = pair.on, pair.off
    runs = [r for r in (on, off) if r is not None]
    details = f"{g}: " + "; ".join(_how(r) for r in runs)
    evidence = "\n".join(r.evidence for r in runs if r.evidence and not r.finished)
    details += f"\n{evidence}" if evidence else ""
    if on is None:
        if off.finished:
            return part(Status.PASS, f"{g}: {GEFORCE_NOTE}; NCCL all-reduce {_how(off)}", details)
        return part(Status.FAIL, f"{g}: NCCL all-reduce {_how(off)}", details, remedies.NCCL_PAIR_BROKEN)
    if on.finished and off.finished:
        return part(
            Status.PASS,
            f"{g}: all-reduce busbw {on.busbw_gbps} GB/s with P2P, {off.busbw_gbps} GB/s with NCCL_P2P_DISABLE=1",
            details,
        )
    if off.finished:
        return part(
            Status.FAIL,
            f"{g}: NCCL all-reduce {_how(on)}, and {_how(off)}: PCIe P2P between them is blocked (IOMMU "
            "translation or ACS redirect)",
            details,
            remedies.NCCL_PAIR_P2P_BLOCKED,
        )
    if on.finished:
        return part(
            Status.WARN, f"{g}: NCCL all-reduce {_how(on)}, but {_how(off)}", details, remedies.NCCL_PAIR_NO_FALLBACK
        )
    return part(Status.FAIL, f"{g}: NCCL all-reduce {_how(on)}, and {_how(off)}", details, remedies.NCCL_PAIR_BROKEN)


def judge_pairs(pairs: Sequence[PairOutcome], not_run: Sequence[tuple[int, int]] = ()) -> Result:
    """Every pair's verdict folded (pure): the worst status, its pairs in the summary; pairs the budget left out
    warn."""
    check_id = "nccl_pairs"
    verdicts = [judge_pair(p) for p in pairs]
    if not_run:
        listed = ", ".join(f"GPU {a}-{b}" for a, b in not_run)
        verdicts.append(
            part(
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
    worst = max(RANK[v.status] for v in verdicts)
    status = next(s for s, r in RANK.items() if r == worst)
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
    family: ClassVar[str] = FAMILY
    level: ClassVar[int] = 3
    requires: ClassVar[tuple[str, ...]] = ("driver", "torch")
    uses: ClassVar[tuple[str, ...]] = ()

    # Its own run, not ProbeCheck's: one probe child per pair and P2P mode (up to two a pair), under one budget.
    def run(self, ctx: Context) -> Result:
        gpus = selected_gpus(ctx, self.id, need_torch=True, family=FAMILY)
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
                return malformed(self.id, "nccl_pair", exc, remedies.comm_malformed(PAIR_PROBE), FAMILY)
            done.append(PairOutcome((a, b), on, off))
        return judge_pairs(done, not_run)


CHECKS = (NcclPairs,)
