"""Turn a measured crossover into settings serving engines and routers understand.

All four say the same thing: full speculation well below the crossover, reduced speculation (one draft step) in
the half-decade below it, none at and above it. The engines key on the running batch size, which equals the client
concurrency while concurrency stays below the server's max running requests. Formats:
- SGLang (0.5.11+): `--speculative-adaptive --speculative-adaptive-config FILE`, FILE a JSON object keyed by the
  smallest batch size of each slot, each with `candidate_steps` (EAGLE/EAGLE3, topk 1; the initial
  --speculative-num-steps must be one of the candidates).
- vLLM: `num_speculative_tokens_per_batch_size` in the speculative config, a list of [min_bs, max_bs, k].
- TensorRT-LLM: `draft_len_schedule` {max batch size of the tier: draft length} (larger batches draft 0) and
  `max_concurrency` (speculation off above it), in the speculative_config of extra LLM API options.
- A router rule with hysteresis between a speculative pool and a plain pool.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sm120check.bench.crossover import Analysis


@dataclass(frozen=True)
class Policies:
    crossover: float
    off_at: int  # first batch size / concurrency where speculation is off
    reduced_from: int | None  # first batch size with one draft step, if a reduced tier exists
    steps: int
    sglang_adaptive: dict[str, dict[str, list[int]]]
    vllm_per_batch_size: list[list[int]]
    trtllm_schedule: dict[int, int]
    router: dict[str, object]


def make_policies(
    analysis: Analysis, steps: int | None = None, hysteresis: float = 0.15, max_bs: int = 1024
) -> Policies:
    """Policies for the analysis' interpolated crossover. Raises ValueError when there is no crossover to use."""
    cross = analysis.crossover
    if cross.value is None:
        raise ValueError(f"no policy: {cross.message}")
    if not 0 <= hysteresis < 1:
        raise ValueError(f"--hysteresis {hysteresis} must be in [0, 1)")
    if steps is not None and steps < 1:
        raise ValueError(f"--steps {steps} must be at least 1")
    k = steps if steps is not None else analysis.spec_steps if analysis.spec_steps and analysis.spec_steps > 0 else 3
    value = cross.value
    off_at = max(2, math.ceil(value))
    reduced = max(2, math.floor(value / 2))
    reduced_from = reduced if reduced < off_at else None

    sglang: dict[str, dict[str, list[int]]] = {"1": {"candidate_steps": sorted({1, max(1, k // 2), k})}}
    vllm: list[list[int]] = []
    trt_schedule: dict[int, int] = {}
    if reduced_from is not None:
        sglang[str(reduced_from)] = {"candidate_steps": [0, 1]}
        vllm += [[1, reduced_from - 1, k], [reduced_from, off_at - 1, 1]]
        trt_schedule = {reduced_from - 1: k, off_at - 1: 1}
    else:
        vllm.append([1, off_at - 1, k])
        trt_schedule = {off_at - 1: k}
    sglang[str(off_at)] = {"candidate_steps": [0]}
    vllm.append([off_at, max(max_bs, off_at), 0])

    low = min(cross.low if cross.low is not None else value, value * (1 - hysteresis))
    high = max(cross.high if cross.high is not None else value, value * (1 + hysteresis))
    to_spec = max(1, math.floor(low))
    to_plain = max(to_spec + 1, math.ceil(high))
    router = {
        "metric": "requests in flight on the speculative pool",
        "crossover": round(value, 2),
        "route_new_requests_to": {"below": "speculative pool", "above": "plain pool"},
        "switch_to_plain_at_or_above": to_plain,
        "switch_back_to_spec_at_or_below": to_spec,
        "rule": (
            f"state=spec; on each new request: if state=spec and in_flight_spec >= {to_plain}: state=plain; "
            f"if state=plain and in_flight_spec <= {to_spec}: state=spec; send to the state's pool"
        ),
    }
    return Policies(value, off_at, reduced_from, k, sglang, vllm, trt_schedule, router)


def trtllm_yaml(p: Policies) -> str:
    """extra_llm_api_options YAML; max_concurrency keeps speculation on up to and including that batch size."""
    lines = ["speculative_config:", "  decoding_type: Eagle3", f"  max_draft_len: {p.steps}", "  draft_len_schedule:"]
    lines += [f"    {bs}: {n}" for bs, n in sorted(p.trtllm_schedule.items())]
    lines.append(f"  max_concurrency: {p.off_at - 1}")
    return "\n".join(lines) + "\n"


def vllm_config(p: Policies) -> dict[str, object]:
    return {
        "method": "eagle3",
        "num_speculative_tokens": p.steps,
        "num_speculative_tokens_per_batch_size": p.vllm_per_batch_size,
    }
