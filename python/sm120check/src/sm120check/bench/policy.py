"""Turn a measured crossover into settings serving engines and routers accept.

All of them say the same thing: full speculation below the crossover, none at and above it; with
`reduced_tier`, reduced speculation (one draft step) in the half-decade below it. The reduced tier is opt-in: the
two sweeps measure full speculation and none, not one step, and full speculation has measured ahead inside that
half-decade (see finding sglang-full-speculation-ahead-below-crossover). The engines key on the running batch size,
which equals the client concurrency while concurrency stays below the server's max running requests. Formats, each
checked against the engine's own code (tests/bench/test_policy_engines.py):
- SGLang 0.5.14+: `--speculative-adaptive --speculative-adaptive-config FILE`, FILE a JSON object keyed by the
  smallest batch size of each slot, each with `candidate_steps` (EAGLE/EAGLE3, topk 1; the initial
  --speculative-num-steps must be one of the candidates). SGLang pads the running batch up to its next speculative
  CUDA-graph capture size before it picks a slot, so a slot can only begin right after a capture size: the keys
  are snapped to those boundaries (at or below the intended batch size). 0.5.13 refuses a 0-step candidate,
  0.5.11/0.5.12 silently ignore per-batch-size slots.
  A 0-step slot is not the plain server: it still runs a one-token verify through the speculative path every step,
  and measured below full speculation at every level (see finding sglang-zero-step-verify-cost). The base sweep says
  nothing about that tier, so the SGLang file gets a 0 candidate only from a measured 0-step sweep (`ZeroStep`: the
  speculative server started with ZERO_STEP_FILE, benched, passed as `crossover --zero-step`), from the batch size
  where it overtakes full speculation; without one, the file keeps speculation at every batch size and the plain
  server's throughput above the crossover is the router's to get.
- vLLM 0.24.0+: `num_speculative_tokens_per_batch_size` in the speculative config, a list of inclusive
  [min_bs, max_bs, k]; the V1 model runner then forces PIECEWISE CUDA graphs.
- TensorRT-LLM: `draft_len_schedule` {largest batch size of the tier: draft length} in the speculative_config of
  extra LLM API options (batches above the largest key draft 0), without `max_concurrency` (mutually exclusive).
- A router rule with hysteresis between a speculative pool and a plain pool (engine-neutral).
"""

from __future__ import annotations

import json
import math
import shlex
from dataclasses import dataclass

from sm120check import findings
from sm120check.bench.crossover import Analysis, ZeroStep

SGLANG_MIN_RELEASE = "0.5.14"
VLLM_MIN_RELEASE = "0.24.0"
TRTLLM_SOURCE = "NVIDIA/TensorRT-LLM tensorrt_llm/llmapi/llm_args.py @ 0004396720054fd8e205cbf616f21f0b57c6b412"
STEPS_HELP = (
    "the server did not report its draft length; pass --steps N (the N you run with: SGLang "
    "--speculative-num-steps, vLLM num_speculative_tokens, TensorRT-LLM max_draft_len)"
)


class PolicyError(ValueError):
    """No policy can be made from this analysis and these options (the message says why and what to pass)."""


def sglang_speculative_capture_sizes(max_bs: int) -> list[int]:
    """SGLang's speculative decode CUDA-graph capture sizes for --cuda-graph-max-bs `max_bs` (padding on).

    Transcribed from SGLang 0.5.13-0.5.23 (`ServerArgs._generate_cuda_graph_batch_sizes`, later
    `_generate_decode_cuda_graph_batch_sizes`, then `arg_groups/cuda_graph_hook.py::
    generate_decode_cuda_graph_batch_sizes`; identical lists); the tests compare it with each release's function."""
    sizes = [
        *range(1, 9),
        *range(10, 33, 2),
        *range(40, 65, 4),
        *range(72, 257, 8),
        *range(272, max_bs + 1, 16),
    ]
    sizes = [bs for bs in sizes if bs <= max_bs]
    if max_bs not in sizes:
        sizes.append(max_bs)
    return sizes


def sglang_slot_start(batch: int) -> int:
    """The largest batch size <= `batch` at which an SGLang slot can begin: 1 or one past a speculative capture size.
    A slot keyed there switches at that batch size with CUDA-graph padding on or off and for any
    --cuda-graph-max-bs: a server's capture list is a prefix of the full one (plus its max), and sizes above its
    max are not padded."""
    return max([1] + [c + 1 for c in sglang_speculative_capture_sizes(batch) if c + 1 <= batch])


ZERO_STEP_FINDING = "sglang-zero-step-verify-cost"
REDUCED_TIER_FINDING = "sglang-full-speculation-ahead-below-crossover"  # why the reduced tier is opt-in
ADAPTIVE_FINDING = "sglang-adaptive-slower-at-c1"  # adaptive mode against the same server without it, same steps


def zero_step_measured() -> str:
    """What a measured 0-step slot gave, against the plain server, and where it was measured."""
    return f"below the plain server at every level (see {findings.get(ZERO_STEP_FINDING).cite()})"


def adaptive_at_c1() -> str:
    """SGLang's adaptive mode at the static server's steps, as measured."""
    finding = findings.get(ADAPTIVE_FINDING)
    return (
        f"SGLang {finding.versions['sglang']}'s adaptive mode was slower than the static server at "
        f"C={finding.numbers['concurrency']} in {finding.numbers['runs']} runs (see {finding.cite()})"
    )


# A slot key no running batch reaches: SGLang's zero-step measuring file names the server's draft steps there, so the
# union of its candidates (which sizes SGLang's draft buffers and graphs) still matches --speculative-num-steps
UNREACHED_BATCH = 1 << 20


@dataclass(frozen=True)
class SGLangPolicy:
    config: dict[str, dict[str, list[int]]]  # the --speculative-adaptive-config file
    off_at: int | None  # first batch size of the [0] slot (snapped); None: no 0-step slot
    reduced_from: int | None  # first batch size of the one-step slot (snapped), if any
    initial_steps: int  # --speculative-num-steps: a candidate of the first slot
    zero_step: str  # why the file has a 0-step slot or not

    @property
    def static(self) -> str:
        """Where the file's one slot changes nothing by batch size: the static launch, and why ("" otherwise)."""
        if len(self.config) > 1:
            return ""
        return (
            f"the file gives every batch size the same candidates, so it changes nothing with load; at unchanged "
            f"steps {adaptive_at_c1()}: unless you want SGLang to drop to fewer steps when acceptance falls, launch "
            f"static (--speculative-num-steps {self.initial_steps}, without --speculative-adaptive)"
        )


@dataclass(frozen=True)
class Policies:
    crossover: float
    off_at: int  # first batch size / concurrency where speculation is off (vLLM, TensorRT-LLM with floor 0)
    reduced_from: int | None  # first batch size with one draft step, if a reduced tier exists
    steps: int
    steps_source: str  # "--steps" or "server"
    draft_model: str | None  # --draft-model: vLLM `model`, TensorRT-LLM `speculative_model`
    draft_floor: int  # TensorRT-LLM: fewest draft tokens at any batch size (1 = never resolve to 0)
    sglang: SGLangPolicy
    vllm_per_batch_size: list[list[int]]
    trtllm_schedule: dict[int, int]
    router: dict[str, object]

    @property
    def complete(self) -> bool:
        """Whether the vLLM and TensorRT-LLM outputs name the draft model (else they are fragments to merge)."""
        return self.draft_model is not None


def resolve_steps(analysis: Analysis, steps: int | None) -> tuple[int, str]:
    if steps is not None:
        if steps < 1:
            raise PolicyError(f"--steps {steps} must be at least 1")
        return steps, "--steps"
    if analysis.spec_steps is not None and analysis.spec_steps > 0:
        return analysis.spec_steps, "server"
    raise PolicyError(STEPS_HELP)


def make_policies(
    analysis: Analysis,
    steps: int | None = None,
    hysteresis: float = 0.15,
    max_bs: int = 1024,
    draft_model: str | None = None,
    draft_floor: int = 1,
    reduced_tier: bool = False,
    zero_step: ZeroStep | None = None,
) -> Policies:
    """Policies for the analysis' interpolated crossover (SGLang's 0-step slot from `zero_step`'s instead, see the
    module's docstring). Raises PolicyError when there is no crossover to use or the draft length is unknown."""
    cross = analysis.crossover
    if cross.value is None:
        raise PolicyError(f"no policy: {cross.message}")
    if not 0 <= hysteresis < 1:
        raise PolicyError(f"--hysteresis {hysteresis} must be in [0, 1)")
    k, source = resolve_steps(analysis, steps)
    if not 0 <= draft_floor <= 1:
        raise PolicyError(f"--draft-floor {draft_floor} must be 0 or 1")
    if draft_model is not None and not draft_model.strip():
        raise PolicyError("--draft-model is empty; give the draft model's path or hub id")
    value = cross.value
    off_at = max(2, math.ceil(value))
    reduced = max(2, math.floor(value / 2))
    reduced_from = reduced if reduced_tier and reduced < off_at else None
    top = max(max_bs, off_at)

    vllm: list[list[int]] = []
    if reduced_from is not None:
        vllm += [[1, reduced_from - 1, k], [reduced_from, off_at - 1, 1]]
    else:
        vllm.append([1, off_at - 1, k])
    vllm.append([off_at, top, 0])

    return Policies(
        crossover=value,
        off_at=off_at,
        reduced_from=reduced_from,
        steps=k,
        steps_source=source,
        draft_model=draft_model,
        draft_floor=draft_floor,
        sglang=_sglang(k, off_at, reduced_from, zero_step),
        vllm_per_batch_size=vllm,
        trtllm_schedule=_trtllm_schedule(k, off_at, reduced_from, top, draft_floor),
        router=_router(analysis, value, hysteresis),
    )


def _sglang(k: int, off_at: int, reduced_from: int | None, zero_step: ZeroStep | None) -> SGLangPolicy:
    """The slots: full speculation from 1, one step in the reduced tier (0 or 1 where 0 steps were measured to pay
    there), 0 steps only from where the measured 0-step sweep overtakes full speculation."""
    off: int | None = None
    if zero_step is None:
        why = (
            "no 0-step slot: no 0-step sweep was given (crossover --zero-step), and a 0-step slot is not the plain "
            f"server: measured {zero_step_measured()}"
        )
    elif zero_step.crossover is None:
        why = f"no 0-step slot: in {zero_step.source} 0 steps never overtake full speculation ({zero_step.message})"
    else:
        off = max(2, sglang_slot_start(max(2, math.ceil(zero_step.crossover))))
        why = f"0 steps from batch {off}: {zero_step.source} overtakes full speculation at {zero_step.crossover:.1f}"
    reduced = sglang_slot_start(reduced_from) if reduced_from is not None else None
    if reduced is not None and not (1 < reduced < (off if off is not None else UNREACHED_BATCH)):
        reduced = None
    config: dict[str, dict[str, list[int]]] = {"1": {"candidate_steps": sorted({1, max(1, k // 2), k})}}
    if reduced is not None:
        config[str(reduced)] = {"candidate_steps": [0, 1] if off is not None else [1]}
    if off is not None:
        config[str(off)] = {"candidate_steps": [0]}
    return SGLangPolicy(config, off, reduced, k, why)


def sglang_zero_step_config(k: int) -> dict[str, dict[str, list[int]]]:
    """The file that holds an SGLang speculative server at 0 draft steps at every batch size it runs, for measuring
    the 0-step tier (bench it, then `crossover --zero-step`). Its unreached slot keeps the server's own steps among
    the candidates, so SGLang sizes its draft buffers and CUDA graphs for --speculative-num-steps `k` as usual."""
    return {"1": {"candidate_steps": [0]}, str(UNREACHED_BATCH): {"candidate_steps": [k]}}


def _trtllm_schedule(k: int, off_at: int, reduced_from: int | None, top: int, floor: int) -> dict[int, int]:
    """Keys are the largest batch size of each tier (upper bounds); batches above the largest key draft 0."""
    tiers: list[tuple[int, int]] = []  # (last batch size of the tier, draft length)
    if reduced_from is not None:
        tiers += [(reduced_from - 1, k), (off_at - 1, 1)]
    else:
        tiers.append((off_at - 1, k))
    if floor > 0:
        tiers.append((top, floor))
    merged: list[tuple[int, int]] = []
    for last, n in tiers:
        n = max(n, floor)
        if merged and merged[-1][1] == n:
            merged[-1] = (last, n)  # the same draft length as the tier below: one tier
        else:
            merged.append((last, n))
    return dict(merged)


def _router(analysis: Analysis, value: float, hysteresis: float) -> dict[str, object]:
    cross = analysis.crossover
    low = min(cross.low if cross.low is not None else value, value * (1 - hysteresis))
    high = max(cross.high if cross.high is not None else value, value * (1 + hysteresis))
    to_spec = max(1, math.floor(low))
    to_plain = max(to_spec + 1, math.ceil(high))
    return {
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


# --- what is written and printed --------------------------------------------------------------------------------

SGLANG_FILE = "sglang-spec-adaptive.json"
ZERO_STEP_FILE = "sglang-zero-step.json"  # sglang_zero_step_config: for measuring the 0-step tier
ROUTER_FILE = "router-rule.json"
VLLM_FILES = ("vllm-speculative-config.json", "vllm-speculative-config.fragment.json")  # complete, fragment
TRTLLM_FILES = ("trtllm-extra-llm-api-options.yaml", "trtllm-extra-llm-api-options.fragment.yaml")
ALL_POLICY_FILES = (SGLANG_FILE, ZERO_STEP_FILE, *VLLM_FILES, *TRTLLM_FILES, ROUTER_FILE)
PIECEWISE_CAVEAT = (
    "with a per-batch-size schedule vLLM's V1 model runner overrides full CUDA graphs to PIECEWISE "
    "(vllm/config/vllm.py::_maybe_override_dynamic_sd_cudagraph_mode), which costs single-stream speed; "
    "measure both, or use the V2 runner (VLLM_USE_V2_MODEL_RUNNER=1) where your release supports dynamic K there"
)
FLOOR_CAVEAT = (
    "draft floor 1 (default): until NVIDIA/TensorRT-LLM PR #16888 lands, a tier resolving to 0 draft tokens on "
    "the EAGLE-3 one-model path silently ruins acceptance after speculation resumes; --draft-floor 0 turns "
    "speculation fully off above the crossover once your release has that fix"
)
MERGE_HINT = "FRAGMENT, not usable alone: merge into your speculative config and add the draft model"


def vllm_file(p: Policies) -> str:
    return VLLM_FILES[0] if p.complete else VLLM_FILES[1]


def trtllm_file(p: Policies) -> str:
    return TRTLLM_FILES[0] if p.complete else TRTLLM_FILES[1]


def vllm_config(p: Policies) -> dict[str, object]:
    """vLLM's --speculative-config: complete with --draft-model, else a fragment without `model` (which vLLM
    requires for eagle3)."""
    out: dict[str, object] = {"method": "eagle3"}
    if p.draft_model is not None:
        out["model"] = p.draft_model
    out["num_speculative_tokens"] = p.steps
    out["num_speculative_tokens_per_batch_size"] = p.vllm_per_batch_size
    return out


def trtllm_yaml(p: Policies) -> str:
    """extra_llm_api_options YAML: `draft_len_schedule` only (TensorRT-LLM refuses it with `max_concurrency`)."""
    lines = []
    if not p.complete:
        lines += [
            f"# {MERGE_HINT}: set speculative_model (TensorRT-LLM: 'Draft model must be provided for EAGLE').",
        ]
    lines += ["speculative_config:", "  decoding_type: Eagle3", f"  max_draft_len: {p.steps}"]
    if p.draft_model is not None:
        lines.append(f"  speculative_model: {_yaml_str(p.draft_model)}")
    lines.append("  draft_len_schedule:")
    lines += [f"    {bs}: {n}" for bs, n in sorted(p.trtllm_schedule.items())]
    return "\n".join(lines) + "\n"


def _yaml_str(text: str) -> str:
    """A double-quoted YAML scalar (JSON string syntax is valid YAML)."""
    return json.dumps(text)


def sglang_flags(p: Policies) -> str:
    flags = "--speculative-algorithm EAGLE3"
    if p.draft_model is not None:
        flags += f" --speculative-draft-model-path {shlex.quote(p.draft_model)}"
    return (
        f"{flags} --speculative-num-steps {p.sglang.initial_steps} --speculative-eagle-topk 1 "
        f"--speculative-adaptive --speculative-adaptive-config {SGLANG_FILE}"
    )
