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


GPU_SAME = 0.05  # GPU work per token within this of the other curve's counts as the same work


def where(policy: Sequence[dict[str, float]], best: Sequence[dict[str, float]]) -> str:
    """A level the policy missed, told apart from its sweeps and the best curve's (per_token's rows): `GPU work` where
    its GPU milliseconds per output token exceed the best's by more than GPU_SAME, `host time` where they do not and
    its GPU sat idle a larger share of the level; `unknown` without the servers' device timer."""
    p, b = per_token(policy), per_token(best)
    gpu_p = sum(v for k, v in p.items() if k not in ("wall_ms", "not_computing_share"))
    gpu_b = sum(v for k, v in b.items() if k not in ("wall_ms", "not_computing_share"))
    if gpu_p <= 0 or gpu_b <= 0:
        return "unknown: no GPU seconds per forward kind (SGLANG_ENABLE_METRICS_DEVICE_TIMER=1 on both servers)"
    idle_p, idle_b = p["not_computing_share"], b["not_computing_share"]
    if gpu_p > (1 + GPU_SAME) * gpu_b:
        kind = "GPU work"
    elif idle_p > idle_b:
        kind = "host time"
    else:
        kind = "neither alone"
    return (
        f"{kind}: GPU {gpu_p:.4f} against {gpu_b:.4f} ms a token, idle {idle_p:.0%} against {idle_b:.0%} of the level"
    )


DECODE_COST = 1.05  # the target: a switched decode costs at most this much of the plain server's


def decode_cost(policy: Sequence[dict[str, float]], plain: Sequence[dict[str, float]]) -> float | None:
    """The policy server's plain-decode GPU milliseconds per decoded token over the plain server's at one level
    (per_token's rows; tokens from speculative batches are counted as decoded too, so call it where the policy's
    batches ran plain): the switched step's cost from SGLang's device timer, which a decode log's `gen throughput`
    (the time since the previous log line, prefills included) is not. None without a `decode` kind on either side."""
    rates = []
    for rows in (policy, plain):
        tokens = sum(r["output_tokens"] for r in rows)
        decode = sum(r.get("decode", 0.0) for r in rows)
        if tokens <= 0 or decode <= 0:
            return None
        rates.append(decode / tokens)
    return round(rates[0] / rates[1], 4)
