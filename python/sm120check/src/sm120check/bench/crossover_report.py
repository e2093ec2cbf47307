"""Render a crossover analysis as text (Markdown tables) or JSON."""

from __future__ import annotations

import json
import math
import shlex
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from sm120check.bench.crossover import ZERO_STEP_HOWTO, Analysis, Spread, running_cap, speculation_reported
from sm120check.bench.policy import (
    FLOOR_CAVEAT,
    MERGE_HINT,
    PIECEWISE_CAVEAT,
    ROUTER_FILE,
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
from sm120check.bench.records import LevelSummary


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


@dataclass(frozen=True)
class SweepFacts:
    """What the records say of the sweeps, for the plot's title and labels ("" where they did not say)."""

    model: str = ""
    engine: str = ""
    version: str = ""
    gpu: str = ""
    date: str = ""
    spec_cap: int | None = None  # the speculative server's max running requests
    spec_steps: int | None = None

    def title(self) -> str:
        engine = " ".join(part for part in (self.engine, self.version) if part)
        return ", ".join(part for part in (self.model, engine, self.gpu, self.date) if part)


def _gpus(record: LevelSummary, tp_size: object) -> str:
    """The GPU the bench saw on the server's host, times the server's tensor-parallel size when it reported one
    ("2x NVIDIA RTX PRO 6000 Blackwell ..."; "" when the bench did not look or the host mixes kinds)."""
    client = record.meta.get("client")
    names = client.get("gpus") if isinstance(client, dict) else None
    if not isinstance(names, list) or not names or len(set(map(str, names))) != 1:
        return ""
    tp = tp_size if isinstance(tp_size, int) and not isinstance(tp_size, bool) and tp_size > 0 else None
    return f"{tp}x {names[0]}" if tp else str(names[0])


def _server(record: LevelSummary) -> dict[str, object]:
    server = record.meta.get("server")
    return dict(server) if isinstance(server, dict) else {}


def sweep_facts(base: Sequence[LevelSummary], spec: Sequence[LevelSummary]) -> SweepFacts:
    first = _server(spec[0]) if spec else {}
    model = str(first.get("model_path") or (spec[0].meta.get("model") if spec else "") or "")
    engine = {"sglang": "SGLang", "vllm": "vLLM", "llama.cpp": "llama.cpp"}.get(str(first.get("engine", "")), "")
    started = str(spec[0].meta.get("started_at", "")) if spec else ""
    gpu = first.get("gpu_name") or first.get("gpu") or (_gpus(spec[0], first.get("tp_size")) if spec else "")
    caps = [cap for r in spec if (cap := running_cap(r)) is not None]
    steps = first.get("speculative_num_steps")
    return SweepFacts(
        model=Path(model).name if "/" in model else model,
        engine=engine,
        version=str(first.get("version") or ""),
        gpu=str(gpu),
        date=started[:10],
        spec_cap=min(caps) if caps else None,
        spec_steps=steps if isinstance(steps, int) and not isinstance(steps, bool) else None,
    )


def role_problem(base: Sequence[LevelSummary], spec: Sequence[LevelSummary], names: tuple[str, str]) -> str:
    """Why the two files cannot be the plain server's sweep and the speculative server's ("" when they can), from
    what their records say: the server's own report of speculation, else the bench's --label."""

    def said(records: Sequence[LevelSummary]) -> bool | None:
        values = {speculation_reported(r)[0] for r in records} - {None}
        if len(values) == 1:
            return values.pop()
        labels = {r.label for r in records} & {"base", "spec"}
        return (labels == {"spec"}) if len(labels) == 1 else None

    base_spec, spec_spec = said(base), said(spec)
    if base_spec is True and spec_spec is False:
        return (
            f"the files are swapped: {names[0]} was measured on the speculative server and {names[1]} on the plain "
            f"one (their records say so); give the plain server's sweep first: sm120check crossover {names[1]} "
            f"{names[0]}"
        )
    if base_spec is True:
        return (
            f"{names[0]} was measured on a speculative server (its records say so): the first file must be the "
            "plain server's sweep (bench --label base against the server without speculation)"
        )
    if spec_spec is False:
        return (
            f"{names[1]} was measured on a server without speculation (its records say so): the second file must be "
            "the speculative server's sweep (bench --label spec against the EAGLE-3 server)"
        )
    return ""


def verdict(analysis: Analysis, policies: Policies | None, reason: str, files: Sequence[str]) -> list[str]:
    """The three lines a reader needs first: the crossover, what to launch, the files written."""
    if policies is None:
        launch = f"Policies: none - {reason}"
    else:
        sg = policies.sglang
        flags = (
            f"--speculative-algorithm EAGLE3 --speculative-num-steps {policies.steps} --speculative-eagle-topk 1"
            if sg.static
            else sglang_flags(policies)
        )
        launch = (
            f"Launch: the EAGLE-3 server below C={policies.off_at} and the plain server from C={policies.off_at} "
            f"on, behind the router rule ({ROUTER_FILE}); SGLang {SGLANG_MIN_RELEASE}+: {flags} "
            "(--verbose: vLLM, TensorRT-LLM and the notes)"
        )
    written = ", ".join(files) if files else "none (--write-policies DIR writes the policy files and the plot)"
    return [crossover_line(analysis), launch, f"Files: {written}"]


def render_text(
    analysis: Analysis,
    names: tuple[str, str],
    policies: Policies | None,
    reason: str,
    files: Sequence[str] = (),
    verbose: bool = False,
) -> str:
    parts = [
        *verdict(analysis, policies, reason, files),
        "",
        f"{names[0]} ({analysis.base_runs} run(s)) vs {names[1]} ({analysis.spec_runs} run(s)):",
        side_by_side(analysis),
    ]
    if verbose:
        parts += ["", model_line(analysis), "", policies_text(policies, reason)]
    parts += [""] + [f"warning: {w}" for w in analysis.warnings] if analysis.warnings else []
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
