"""Render a crossover analysis as text (Markdown tables) or JSON."""

from __future__ import annotations

import json
import math
import shlex
from dataclasses import asdict

from sm120check.bench.crossover import ZERO_STEP_HOWTO, Analysis, Spread
from sm120check.bench.policy import (
    FLOOR_CAVEAT,
    MERGE_HINT,
    PIECEWISE_CAVEAT,
    SGLANG_FILE,
    SGLANG_MIN_RELEASE,
    TRTLLM_SOURCE,
    VLLM_MIN_RELEASE,
    ZERO_STEP_FILE,
    Policies,
    sglang_flags,
    trtllm_file,
    trtllm_yaml,
    vllm_config,
    vllm_file,
)


def _num(s: Spread, digits: int = 1) -> str:
    if math.isnan(s.mean):
        return "n/a"
    if s.n > 1:
        return f"{s.mean:.{digits}f} ± {s.std:.{digits}f}"
    return f"{s.mean:.{digits}f}"


def side_by_side(analysis: Analysis) -> str:
    """Both sweeps per level, as in the seed account's table, with the speedup (± over repeated runs)."""
    lines = [
        "| Concurrency | Base (tok/s) | Spec (tok/s) | Speedup | Base Per-Req (tok/s) | Spec Per-Req (tok/s) "
        "| Base Latency (s) | Spec Latency (s) | Accept Len |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for lv in analysis.levels:
        speedup = f"{lv.speedup:.2f}" + (f" ± {lv.speedup_std:.2f}" if lv.base.n > 1 or lv.spec.n > 1 else "")
        accept = f"{lv.accept_length:.2f}" if lv.accept_length else "n/a"
        lines.append(
            f"| {lv.concurrency} | {_num(lv.base)} | {_num(lv.spec)} | {speedup} | {_num(lv.base_per_req)} "
            f"| {_num(lv.spec_per_req)} | {_num(lv.base_latency, 2)} | {_num(lv.spec_latency, 2)} | {accept} |"
        )
    return "\n".join(lines)


def crossover_line(analysis: Analysis) -> str:
    cross = analysis.crossover
    if cross.value is None:
        return f"Crossover: none in the measured range - {cross.message}"
    line = f"Crossover (interpolated): C = {cross.value:.1f}"
    if cross.low is not None and cross.high is not None and cross.std is not None:
        line += f" (run pairs: {cross.low:.1f} .. {cross.high:.1f}, sd {cross.std:.1f}, {cross.pairs} pairs"
        line += f", {cross.pairs_without} without a crossing)" if cross.pairs_without else ")"
    return f"{line} - {cross.message}"


def model_line(analysis: Analysis) -> str:
    m = analysis.model
    if m is None:
        return "Cost model: not fitted (needs two levels with throughput in each sweep)"
    text = (
        f"Cost model: base step a + bB with a = {m.a * 1e3:.2f} ms, b = {m.b * 1e3:.3f} ms/request; "
        f"spec step (c + dB)/tau with c/tau = {m.c_over_tau * 1e3:.2f} ms, d/tau = {m.d_over_tau * 1e3:.3f} ms/request"
    )
    if m.tau is not None and m.c is not None and m.d is not None:
        text += f"; tau = {m.tau:.2f} -> c = {m.c * 1e3:.2f} ms, d = {m.d * 1e3:.3f} ms/request"
    else:
        text += "; tau not reported by the server (c and d unknown, their crossover is not affected)"
    text += f"; R^2 {m.r2_base:.3f} / {m.r2_spec:.3f}"
    pred = f"C = {m.predicted:.1f}" if m.predicted is not None else "none"
    return f"{text}\nModel crossover: {pred} - {m.message}"


def policies_text(p: Policies | None, reason: str) -> str:
    if p is None:
        return f"Policies: none - {reason}"
    sg = p.sglang
    sglang = json.dumps(sg.config, separators=(", ", ": "))
    vllm = json.dumps(vllm_config(p))
    steps_from = "from --steps" if p.steps_source == "--steps" else "as the server reported"
    head = (
        f"Policies (crossover {p.crossover:.1f}: speculation off from batch {p.off_at}"
        + (f", one draft step from {p.reduced_from}" if p.reduced_from else "")
        + f", {p.steps} draft steps below, {steps_from}):"
    )
    snapped = (
        ""
        if sg.off_at is None or (sg.off_at, sg.reduced_from) == (p.off_at, p.reduced_from)
        else (
            f"  SGLang pads the batch to its next CUDA-graph capture size before it picks a slot, so its slots begin "
            f"one past a capture size: 0 steps from {sg.off_at}"
            + (f", one draft step from {sg.reduced_from}" if sg.reduced_from else "")
            + " (the nearest such boundaries at or below the measured ones)"
        )
    )
    zero = f"  {sg.zero_step}" + (
        f"; above the crossover the plain server's throughput is the router's (Router, below); to measure the 0-step "
        f"tier: {ZERO_STEP_HOWTO} ({ZERO_STEP_FILE}), then pass it as --zero-step"
        if sg.off_at is None
        else ""
    )
    fragment = "" if p.complete else f" - {MERGE_HINT} (pass --draft-model PATH to get a complete one)"
    lines = [
        head,
        f"SGLang {SGLANG_MIN_RELEASE}+ (EAGLE/EAGLE3, topk 1): {sglang_flags(p)}",
        f"  {SGLANG_FILE} = {sglang}",
        zero,
    ]
    lines += [snapped] if snapped else []
    lines += [f"  {sg.static}"] if sg.static else []
    lines += [
        f"  {SGLANG_MIN_RELEASE} is the first release that takes a 0-step candidate (0.5.13 refuses it, "
        "0.5.11/0.5.12 ignore per-batch-size slots); adaptive falls back to static steps without an error "
        "(non-EAGLE, topk != 1, DP attention, ...): check the log for 'AdaptiveSpeculativeParams initialized'",
        f"vLLM {VLLM_MIN_RELEASE}+: {vllm_file(p)}{fragment}",
        f"  --speculative-config {shlex.quote(vllm)}" if p.complete else f"  {vllm}",
        f"  note: {PIECEWISE_CAVEAT}",
        f"TensorRT-LLM (PyTorch backend): --extra_llm_api_options {trtllm_file(p)}{fragment}",
        *("  " + line for line in trtllm_yaml(p).splitlines()),
        "  keys are the largest batch size of each tier, batches above the largest key draft 0; no max_concurrency "
        f"(TensorRT-LLM refuses it beside draft_len_schedule; checked against {TRTLLM_SOURCE})",
    ]
    if p.draft_floor > 0:
        lines.append(f"  {FLOOR_CAVEAT}")
    lines.append(f"Router: {p.router['rule']}")
    return "\n".join(lines)


def render_text(analysis: Analysis, names: tuple[str, str], policies: Policies | None, reason: str) -> str:
    parts = [
        f"Speculation crossover: {names[0]} ({analysis.base_runs} run(s)) vs {names[1]} ({analysis.spec_runs} run(s))",
        "",
        side_by_side(analysis),
        "",
        crossover_line(analysis),
        model_line(analysis),
        "",
        policies_text(policies, reason),
    ]
    parts += [f"warning: {w}" for w in analysis.warnings]
    return "\n".join(parts)


def render_json(analysis: Analysis, names: tuple[str, str], policies: Policies | None, reason: str) -> str:
    out: dict[str, object] = {"base": names[0], "spec": names[1], **asdict(analysis)}
    if analysis.model is not None:
        out["model"] = dict(asdict(analysis.model), c=analysis.model.c, d=analysis.model.d)
    if policies is None:
        out["policies"] = None
        out["policies_reason"] = reason
    else:
        out["policies"] = {
            "steps": policies.steps,
            "steps_source": policies.steps_source,
            "complete": policies.complete,
            "sglang_min_release": SGLANG_MIN_RELEASE,
            "sglang_flags": sglang_flags(policies),
            "sglang_off_at": policies.sglang.off_at,
            "sglang_reduced_from": policies.sglang.reduced_from,
            "sglang_zero_step": policies.sglang.zero_step,
            "sglang_static": policies.sglang.static,
            "sglang_speculative_adaptive_config": policies.sglang.config,
            "vllm_min_release": VLLM_MIN_RELEASE,
            "vllm_file": vllm_file(policies),
            "vllm_speculative_config": vllm_config(policies),
            "trtllm_file": trtllm_file(policies),
            "trtllm_draft_floor": policies.draft_floor,
            "trtllm_extra_llm_api_options_yaml": trtllm_yaml(policies),
            "router": policies.router,
        }
    return json.dumps(out, indent=2, default=_nan_safe)


def _nan_safe(value: object) -> object:
    return str(value)
