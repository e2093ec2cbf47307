"""The envelope-gap phase's arithmetic (tests/gpu/test_sglang_envelope.py): its levels, a level's GPU seconds per
forward kind (bench's server_forward_seconds) over its output tokens, and the share of its wall time the GPU did not
compute."""

from __future__ import annotations

from collections.abc import Sequence

NOT_KINDS = frozenset({"level_wall_s", "output_tokens"})
GAP_DEFAULT = (30, 70, 100, 250)  # the gap phase's levels: the ones above the crossing


def gap_levels(text: str) -> tuple[int, ...]:
    """The gap's levels from SM120KIT_ENVELOPE_GAP_LEVELS; a value outside GAP_DEFAULT is refused, naming it."""
    parts = [v.strip() for v in text.split(",")]
    if not all(v.isdigit() and int(v) in GAP_DEFAULT for v in parts):
        raise ValueError(f"SM120KIT_ENVELOPE_GAP_LEVELS={text!r}: expected a comma-separated subset of {GAP_DEFAULT}")
    return tuple(sorted({int(v) for v in parts}))


def per_token(rows: Sequence[dict[str, float]]) -> dict[str, float]:
    """Summed over the sweeps of one level (rows: each sweep's kinds, `level_wall_s` and `output_tokens`): GPU
    milliseconds per output token by forward kind, `wall_ms` per token, and `not_computing_share` of the wall time."""
    tokens = sum(r["output_tokens"] for r in rows)
    if tokens <= 0:
        raise ValueError(f"no output tokens in {len(rows)} sweep(s) of the level: nothing to divide by")
    kinds = sorted({k for r in rows for k in r} - NOT_KINDS)
    out = {k: round(1000 * sum(r.get(k, 0.0) for r in rows) / tokens, 4) for k in kinds}
    wall = sum(r["level_wall_s"] for r in rows)
    gpu = sum(r.get(k, 0.0) for r in rows for k in kinds)
    out["wall_ms"] = round(1000 * wall / tokens, 4)
    out["not_computing_share"] = round(1 - gpu / wall, 4) if wall > 0 else 0.0
    return out
