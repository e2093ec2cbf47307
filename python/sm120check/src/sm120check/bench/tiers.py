"""Speculation tiers from several sweeps: the plain server's and any number of speculative servers' (one draft depth
each), in three pure steps: `best` (the measured winner at each level), `tiers` (runs of one winner), and the two
launches that realise them on SGLang (`sglang_config`: an adaptive file of one-candidate slots; `static_launch`: one
static depth with the speculation switch's threshold).

Steps appear only where a sweep measured them; a level one sweep lacks is judged among the sweeps that have it. The
plain tier (0 steps) is offered only where the server has the speculation switch (`sglang patch --plain-decode`),
known from the patch state or the server's log, never guessed: without it SGLang's 0-step slot is a one-token verify,
slower than the plain server, and the plain side belongs to a router (crossover's router rule).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sm120check.bench.crossover import interpolate

PLAIN = 0  # the steps of the plain server's curve


class TierError(ValueError):
    """Sweeps that cannot be combined; the message names the sweep and the fix."""


@dataclass(frozen=True)
class Sweep:
    """One server's throughput per level: `steps` 0 for the plain server, k for a k-step speculative one."""

    name: str
    steps: int
    tok_s: Mapping[int, float]  # level (concurrency) -> output tok/s


@dataclass(frozen=True)
class Level:
    level: int
    steps: int  # the measured winner (0: plain)
    tok_s: float
    measured: Mapping[int, float]  # steps -> tok/s of every sweep that has this level


@dataclass(frozen=True)
class Tier:
    start: int  # the first level of the run (SGLang's slot key: a batch size)
    steps: int


@dataclass(frozen=True)
class TierPlan:
    levels: tuple[Level, ...]
    tiers: tuple[Tier, ...]
    switch: bool
    notes: tuple[str, ...]

    @property
    def plain_from(self) -> int | None:
        """The first level from which the plain decode wins at every higher level (None: it never does)."""
        start: int | None = None
        for lv in self.levels:
            start = (lv.level if start is None else start) if lv.steps == PLAIN else None
        return start


def check(sweeps: Sequence[Sweep]) -> None:
    plain = [s for s in sweeps if s.steps == PLAIN]
    if len(plain) != 1:
        raise TierError(f"expected one plain (0-step) sweep, got {len(plain)}: {[s.name for s in plain]}")
    seen: dict[int, str] = {}
    for s in sweeps:
        if s.steps < 0:
            raise TierError(f"{s.name}: draft steps {s.steps} (expected 0 for the plain server or a positive depth)")
        if s.steps in seen:
            raise TierError(f"{s.name} and {seen[s.steps]} both measure {s.steps} steps: give one sweep per depth")
        seen[s.steps] = s.name
        if not s.tok_s:
            raise TierError(f"{s.name}: no measured level; bench it again")
        bad = [c for c, v in s.tok_s.items() if c < 1 or not v >= 0 or v == float("inf")]
        if bad:
            raise TierError(f"{s.name}: levels {bad} have no usable throughput; bench them again")
    if len(sweeps) < 2:
        raise TierError("give the plain sweep and at least one speculative sweep")


def best(sweeps: Sequence[Sweep], switch: bool) -> tuple[Level, ...]:
    """The winner at each level the plain sweep measured. Without the switch the plain server is no tier of the
    speculative server: the winner among the speculative sweeps there (ties to the fewer steps)."""
    check(sweeps)
    plain = next(s for s in sweeps if s.steps == PLAIN)
    out = []
    for c in sorted(plain.tok_s):
        measured = {s.steps: float(s.tok_s[c]) for s in sweeps if c in s.tok_s}
        candidates = {k: v for k, v in measured.items() if switch or k != PLAIN}
        if not candidates:
            continue
        steps = max(sorted(candidates), key=lambda k: candidates[k])
        out.append(Level(c, steps, candidates[steps], measured))
    return tuple(out)


def tiers(levels: Sequence[Level]) -> tuple[Tier, ...]:
    out: list[Tier] = []
    for lv in levels:
        if not out or out[-1].steps != lv.steps:
            out.append(Tier(lv.level, lv.steps))
    if out:
        out[0] = Tier(1, out[0].steps)  # SGLang's file needs the slot of batch size 1
    return tuple(out)


def plan(sweeps: Sequence[Sweep], switch: bool) -> TierPlan:
    levels = best(sweeps, switch)
    notes = []
    if not switch and any(PLAIN in lv.measured and lv.measured[PLAIN] > lv.tok_s for lv in levels):
        notes.append(
            "the plain server beats every speculative sweep at some levels, and this server has no speculation "
            "switch (sm120check sglang patch --plain-decode): SGLang's 0-step slot is a one-token verify, so the "
            "plain side there is the router's (a plain pool beside the speculative one)"
        )
    return TierPlan(levels, tiers(levels), switch, tuple(notes))


def sglang_config(p: TierPlan) -> dict[str, dict[str, list[int]]]:
    """SGLang's adaptive file: one slot per tier, each of one candidate (its EMA cannot move it off the measured
    winner; a slot of [0] alone never probes up)."""
    return {str(t.start): {"candidate_steps": [t.steps]} for t in p.tiers}


@dataclass(frozen=True)
class StaticLaunch:
    """One static depth below the switch's threshold, the plain decode from it: no adaptive mode."""

    steps: int
    plain_from: int | None  # SGLANG_SM120KIT_PLAIN_DECODE_MIN_BS, a batch size (None: the switch stays off)
    lost: tuple[int, ...]  # levels whose winner this launch cannot run (another depth)


def static_launch(p: TierPlan) -> StaticLaunch:
    speculative = [lv for lv in p.levels if lv.steps != PLAIN]
    if not speculative:
        raise TierError("the plain server wins at every level: launch it without speculation")
    steps = speculative[0].steps  # the lowest level's winner: where speculation pays most
    start = switch_threshold(p, steps) if p.switch else None
    lost = tuple(lv.level for lv in p.levels if launched(steps, start, lv.level) != lv.steps)
    return StaticLaunch(steps, start, lost)


def switch_threshold(p: TierPlan, steps: int) -> int | None:
    """The batch size from which the switch runs plain: where the `steps` curve last crosses below the plain one
    before `plain_from`, interpolated (log-log, as crossover's) between the last level `steps` beats plain and the
    next level both measured, rounded up. Not the first level plain wins: at a level of C requests the running batch
    dips below C as requests finish and their successors queue, so every batch between the crossing and C would
    speculate where plain is faster (see finding switch-threshold-below-level). Not the level below `plain_from`
    either when `steps` already lost there to plain (another depth won it): those batches run plain, the faster of
    what the launch can run (see finding switch-threshold-own-depth)."""
    start = p.plain_from
    if start is None:
        return None
    both = [lv for lv in p.levels if lv.level <= start and steps in lv.measured and PLAIN in lv.measured]
    wins = [i for i, lv in enumerate(both) if lv.level < start and lv.measured[steps] > lv.measured[PLAIN]]
    if not wins or both[-1].level != start:
        return start
    prev, at = both[wins[-1]], both[wins[-1] + 1]
    status, value, _ = interpolate(
        [prev.level, at.level], [prev.measured[PLAIN], at.measured[PLAIN]], [prev.measured[steps], at.measured[steps]]
    )
    if status != "found" or value is None:
        return at.level
    return min(at.level, max(prev.level + 1, math.ceil(value)))


def launched(steps: int, plain_from: int | None, level: int) -> int:
    """The steps a static launch runs at a level (batch size): plain from the threshold on."""
    return PLAIN if plain_from is not None and level >= plain_from else steps


TIERS_FILE = "sglang-tiers.json"  # the adaptive file of one-candidate slots
STATIC_FILE = "sglang-static-launch.json"  # the static launch with the switch's threshold


def static_json(launch: StaticLaunch) -> dict[str, object]:
    """What a user sets: the static draft depth (sglang_server_speculative_num_steps) and the switch's threshold
    (sglang_server_plain_decode_min_bs, the unit's SGLANG_SM120KIT_PLAIN_DECODE_MIN_BS)."""
    env = {"SGLANG_SM120KIT_PLAIN_DECODE_MIN_BS": str(launch.plain_from)} if launch.plain_from else {}
    return {
        "speculative_num_steps": launch.steps,
        "speculative_num_draft_tokens": launch.steps + 1,
        "environment": env,
        "levels_not_realised": list(launch.lost),
    }


def _depth(steps: int) -> str:
    return f"{steps} steps" if steps != PLAIN else "plain"


def render_lines(p: TierPlan, launch: StaticLaunch | None) -> list[str]:
    winners = ", ".join(f"C={lv.level}: {'plain' if lv.steps == PLAIN else f'{lv.steps} steps'}" for lv in p.levels)
    lines = [f"tiers (measured winner per level): {winners}"]
    lines.append(
        "  SGLang adaptive file: "
        + ", ".join(f"from batch {t.start}: [{t.steps}]" for t in p.tiers)
        + ("" if p.switch else " (no plain tier: this SGLang has no speculation switch)")
    )
    if launch is not None:
        where = f"plain decode from batch {launch.plain_from}" if launch.plain_from else "no plain tier"
        won = {lv.level: lv.steps for lv in p.levels}

        def runs(level: int) -> str:
            ran = launched(launch.steps, launch.plain_from, level)
            return f"C={level} ({_depth(won[level])} won, it runs {_depth(ran)})"

        lost = f"; not realised at {', '.join(runs(level) for level in launch.lost)}" if launch.lost else ""
        lines.append(f"  static launch: {launch.steps} steps, {where}{lost}")
    lines += [f"  note: {n}" for n in p.notes]
    return lines


def to_json(p: TierPlan, launch: StaticLaunch | None) -> dict[str, object]:
    return {
        "switch": p.switch,
        "levels": [
            {
                "level": lv.level,
                "steps": lv.steps,
                "tok_s": lv.tok_s,
                "measured": {str(k): v for k, v in lv.measured.items()},
            }
            for lv in p.levels
        ],
        "tiers": [{"start": t.start, "steps": t.steps} for t in p.tiers],
        "sglang_config": sglang_config(p),
        "static_launch": static_json(launch) if launch is not None else None,
        "notes": list(p.notes),
    }
