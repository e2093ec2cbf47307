"""The policy files `crossover --write-policies` writes, judged by the engines' own rules (tests/bench/engine_rules.py):
SGLang's loader, initial-step check and padded slot routing from the release wheels; vLLM 0.24.0's schedule
validator and lookup from its wheel. TensorRT-LLM is the exception: its "validators" are our own transcription of its
rules (engine_rules.TRTLLM_SOURCES names the files and commits), not its code, so the TensorRT-LLM tests check our
reading of its rules and would not notice TensorRT-LLM changing them. For every batch size the engine's lookup must
give full speculation below the reduced tier, one draft step in it, none from the off point.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from bench.conftest import run_subcommand
from bench.engine_rules import (
    SGLangRelease,
    TrtllmConfigError,
    VllmRelease,
    sglang_release,
    trtllm_draft_len_for_batch_size,
    trtllm_validate_eagle3,
    vllm_release,
)
from sm120check.bench.crossover import Analysis, Crossover, ZeroStep
from sm120check.bench.crossover_cli import write_policy_files
from sm120check.bench.policy import (
    STEPS_HELP,
    Policies,
    PolicyError,
    make_policies,
    sglang_speculative_capture_sizes,
    trtllm_yaml,
    vllm_config,
)
from sm120check.bench.records import LevelSummary, append_jsonl

pytestmark = pytest.mark.slow  # reads (and, when missing, downloads) SGLang releases and a vllm wheel

CROSSOVERS = (2.2, 3.18, 5.0, 17.5, 40.0, 120.0, 300.0)
SGLANG_RELEASES = ("0.5.14", "0.5.16", "0.5.22", "0.5.23")
BATCHES = range(1, 513)
DRAFT = "/models/eagle3-draft"


def analysis(crossover: float, spec_steps: int | None = 3) -> Analysis:
    return Analysis((), Crossover("found", crossover, message="test"), None, 1, 1, spec_steps)


def measured_zero(crossover: float) -> ZeroStep:
    """A 0-step sweep that overtakes full speculation where the plain server does (SGLang gets its 0 slot there)."""
    return ZeroStep(crossover, "zero.jsonl", "test")


def policies(crossover: float, steps: int = 3, **kw: object) -> Policies:
    """The three-tier policy (the reduced tier asked for, a measured 0-step tier at the same crossover), so every
    tier meets every engine's lookup."""
    opts = {"reduced_tier": True, "zero_step": measured_zero(crossover), **kw}
    return make_policies(analysis(crossover), steps, **opts)  # type: ignore[arg-type]


def expected_tier(p: Policies, bs: int, off_at: int, reduced_from: int | None) -> str:
    if bs >= off_at:
        return "off"
    return "reduced" if reduced_from is not None and bs >= reduced_from else "full"


@pytest.fixture(scope="module", params=SGLANG_RELEASES)
def sglang(request: pytest.FixtureRequest) -> SGLangRelease:
    return sglang_release(str(request.param))


@pytest.fixture(scope="module")
def vllm() -> VllmRelease:
    return vllm_release()


# --- SGLang -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("max_bs", [64, 100, 160, 256, 512, 1024])
def test_sglang_capture_sizes_are_the_releases_own(sglang: SGLangRelease, max_bs: int) -> None:
    assert sglang.capture_sizes(max_bs) == sglang_speculative_capture_sizes(max_bs)


@pytest.mark.parametrize("steps", [3, 8])
@pytest.mark.parametrize("crossover", CROSSOVERS)
def test_sglang_routes_every_batch_size_to_the_intended_slot(
    sglang: SGLangRelease, crossover: float, steps: int, tmp_path: Path
) -> None:
    p = policies(crossover, steps)
    write_policy_files(tmp_path, p)
    path = str(tmp_path / "sglang-spec-adaptive.json")
    assert steps in sglang.resolve_candidate_steps(path)  # the release's loader takes the file
    assert sglang.check_initial_steps(steps, path) == steps + 1  # --speculative-num-steps validates
    sg = p.sglang
    # padded with the release's capture sizes for several --cuda-graph-max-bs (100: not on the grid, appended),
    # with padding disabled, and without CUDA graphs
    for graphs in (*(sglang.capture_sizes(m) for m in (100, 256, 1024)), sglang.capture_sizes(256, False), None):
        params = sglang.adaptive_params(initial_steps=steps, cfg_path=path)
        params.set_cuda_graph_bs(graphs)
        for bs in BATCHES:
            slot = params._route(bs).candidate_steps
            assert sg.off_at is not None
            tier = expected_tier(p, bs, sg.off_at, sg.reduced_from)
            assert slot == {"full": sorted({1, max(1, steps // 2), steps}), "reduced": [0, 1], "off": [0]}[tier], (
                bs,
                graphs is not None,
            )
            if tier == "full":
                assert params.get_steps_for_batch(bs) == steps  # starts at the server's steps


@pytest.mark.parametrize("crossover", CROSSOVERS)
def test_sglang_switches_at_the_last_boundary_padding_allows(sglang: SGLangRelease, crossover: float) -> None:
    """Between SGLang's off slot and the crossover's off point every batch pads to the same capture size, so no
    slot key could switch any closer; and speculation is never on at or past the crossover."""
    p = policies(crossover)
    sizes = sglang.capture_sizes(1024)

    def pad(bs: int) -> int:
        return next((c for c in sizes if c >= bs), bs)

    for intended, snapped in ((p.off_at, p.sglang.off_at), (p.reduced_from, p.sglang.reduced_from)):
        if intended is None or snapped is None:
            continue
        assert snapped <= intended
        assert pad(snapped - 1) < snapped  # the batch below lands below the slot
        assert {pad(bs) for bs in range(snapped, intended + 1)} == {pad(intended)}


def test_sglang_unsnapped_key_switched_one_batch_early(tmp_path: Path) -> None:
    """The defect the snapping fixes: an off slot keyed 18 (crossover 17.5) already switches at 17 under padding."""
    release = sglang_release("0.5.23")
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"1": {"candidate_steps": [1, 3]}, "8": {"candidate_steps": [0, 1]}, "18": {
        "candidate_steps": [0]}}))  # fmt: skip
    params = release.adaptive_params(initial_steps=3, cfg_path=str(old))
    params.set_cuda_graph_bs(release.capture_sizes(256))
    assert params._route(17).candidate_steps == [0]
    assert policies(17.5).sglang.off_at == 17  # what the policy now says, and the text prints


def test_sglang_initial_steps_outside_the_candidates_are_refused_by_the_release(tmp_path: Path) -> None:
    release = sglang_release("0.5.23")
    write_policy_files(tmp_path, policies(17.5, 3))
    with pytest.raises(ValueError, match="is not in the adaptive config candidate_steps"):
        release.check_initial_steps(5, str(tmp_path / "sglang-spec-adaptive.json"))


def test_sglang_0_5_13_refuses_a_zero_step_slot_so_the_minimum_is_0_5_14(tmp_path: Path) -> None:
    release = sglang_release("0.5.13")
    write_policy_files(tmp_path, policies(17.5, 3))
    with pytest.raises(ValueError, match="candidate_steps must be a list of positive ints"):
        release.resolve_candidate_steps(str(tmp_path / "sglang-spec-adaptive.json"))


# --- vLLM ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("steps", [1, 3, 8])
@pytest.mark.parametrize("crossover", CROSSOVERS)
def test_vllm_schedule_validates_and_looks_up_the_intended_tiers(
    vllm: VllmRelease, crossover: float, steps: int
) -> None:
    p = policies(crossover, steps, draft_model=DRAFT)
    schedule = vllm_config(p)["num_speculative_tokens_per_batch_size"]
    assert vllm.validate(schedule)
    for max_num_seqs in (16, 256):
        dense = vllm.lookup(schedule, max_num_seqs, steps)
        for bs in range(1, max_num_seqs + 1):
            tier = expected_tier(p, bs, p.off_at, p.reduced_from)
            assert dense[bs] == {"full": steps, "reduced": min(1, steps), "off": 0}[tier], bs


def test_vllm_config_is_complete_with_the_draft_model_and_a_labelled_fragment_without(
    vllm: VllmRelease, tmp_path: Path
) -> None:
    speculative = vllm.text("vllm/config/speculative.py")
    assert "num_speculative_tokens_per_batch_size" in speculative
    assert "num_speculative_tokens was provided but without speculative model." in speculative  # model is required
    assert "_maybe_override_dynamic_sd_cudagraph_mode" in vllm.text("vllm/config/vllm.py")  # the PIECEWISE caveat
    complete = policies(17.5, 3, draft_model=DRAFT)
    assert vllm_config(complete)["model"] == DRAFT
    assert write_policy_files(tmp_path / "c", complete)[2] == "vllm-speculative-config.json"
    fragment = policies(17.5, 3)
    assert "model" not in vllm_config(fragment)
    assert write_policy_files(tmp_path / "f", fragment)[2] == "vllm-speculative-config.fragment.json"


# --- TensorRT-LLM -------------------------------------------------------------------------------------------------
# Against our transcription of TensorRT-LLM's rules (engine_rules.TRTLLM_SOURCES), not TensorRT-LLM's own code.


@pytest.mark.parametrize("floor", [0, 1])
@pytest.mark.parametrize("steps", [1, 3, 8])
@pytest.mark.parametrize("crossover", CROSSOVERS)
def test_trtllm_yaml_passes_its_validators_and_drafts_the_intended_lengths(
    crossover: float, steps: int, floor: int
) -> None:
    """Our transcription of TensorRT-LLM's validators and lookup (engine_rules.TRTLLM_SOURCES), not its code."""
    p = policies(crossover, steps, draft_model=DRAFT, draft_floor=floor)
    spec = yaml.safe_load(trtllm_yaml(p))["speculative_config"]
    assert "max_concurrency" not in spec and spec["speculative_model"] == DRAFT
    schedule = trtllm_validate_eagle3(spec)
    for bs in range(1, 1100):
        tier = expected_tier(p, bs, p.off_at, p.reduced_from)
        want = {"full": steps, "reduced": max(min(1, steps), floor), "off": floor if bs <= 1024 else 0}[tier]
        assert trtllm_draft_len_for_batch_size(schedule, bs, steps) == want, bs


def test_trtllm_fragment_without_a_draft_model_is_what_tensorrt_llm_would_refuse() -> None:
    """Refused by our transcription of validate_speculative_model (engine_rules.TRTLLM_SOURCES), not by TensorRT-LLM."""
    text = trtllm_yaml(policies(17.5, 3))
    assert text.startswith("# FRAGMENT")
    with pytest.raises(TrtllmConfigError, match="Draft model must be provided for EAGLE"):
        trtllm_validate_eagle3(yaml.safe_load(text)["speculative_config"])


def test_trtllm_old_output_with_max_concurrency_is_refused() -> None:
    """What sm120check wrote before (real-engine.md, crossover 3.18): the schedule and max_concurrency together, refused
    by our transcription of TensorRT-LLM's mutual-exclusion validator (engine_rules.TRTLLM_SOURCES), not by its code."""
    old = (
        "speculative_config:\n  decoding_type: Eagle3\n  max_draft_len: 3\n  speculative_model: /m\n"
        "  draft_len_schedule:\n    1: 3\n    3: 1\n  max_concurrency: 3\n"
    )
    with pytest.raises(TrtllmConfigError, match="mutually exclusive"):
        trtllm_validate_eagle3(yaml.safe_load(old)["speculative_config"])


def test_by_default_speculation_stays_full_up_to_the_off_point(tmp_path: Path) -> None:
    """The H200 run's crossover (13.2): no one-step tier unless asked for; SGLang's release routes every batch below
    the off slot (from a measured 0-step sweep) to full speculation."""
    p = make_policies(analysis(13.2), 3, zero_step=measured_zero(13.2))
    assert p.reduced_from is None and p.sglang.reduced_from is None
    assert p.sglang.config == {"1": {"candidate_steps": [1, 3]}, "13": {"candidate_steps": [0]}}
    assert p.vllm_per_batch_size == [[1, 13, 3], [14, 1024, 0]]
    write_policy_files(tmp_path, p)
    release = sglang_release("0.5.16")
    params = release.adaptive_params(initial_steps=3, cfg_path=str(tmp_path / "sglang-spec-adaptive.json"))
    params.set_cuda_graph_bs(release.capture_sizes(256))
    assert {bs: params._route(bs).candidate_steps for bs in (1, 6, 10, 12, 13, 30)} == {
        1: [1, 3], 6: [1, 3], 10: [1, 3], 12: [1, 3], 13: [0], 30: [0]
    }  # fmt: skip
    with_tier = make_policies(analysis(13.2), 3, reduced_tier=True, zero_step=measured_zero(13.2))
    assert with_tier.sglang.config["6"] == {"candidate_steps": [0, 1]}


def test_without_a_measured_zero_step_sweep_sglang_keeps_speculation_at_every_batch_size(tmp_path: Path) -> None:
    """On the H200 (SGLang 0.5.16) the policy server's 0-step slot gave 0.39-0.53 x the plain server, below full
    speculation: the base sweep does not give SGLang a 0 slot; vLLM, TensorRT-LLM and the router still switch at
    the crossover. SGLang's own loader and router send every batch size to full speculation."""
    p = make_policies(analysis(7.2), 3)
    assert p.sglang.config == {"1": {"candidate_steps": [1, 3]}} and p.sglang.off_at is None
    assert "no 0-step slot" in p.sglang.zero_step
    # the finding and its record, not its numbers
    assert p.sglang.zero_step.endswith(
        "(see finding sglang-zero-step-verify-cost, docs/validation/2026-12-02-h200-policy-2)"
    )
    assert p.vllm_per_batch_size == [[1, 7, 3], [8, 1024, 0]] and p.router["switch_to_plain_at_or_above"] == 9
    reduced = make_policies(analysis(13.2), 3, reduced_tier=True)
    assert reduced.sglang.config == {"1": {"candidate_steps": [1, 3]}, "6": {"candidate_steps": [1]}}  # no 0 there
    write_policy_files(tmp_path, reduced)
    release = sglang_release("0.5.16")
    params = release.adaptive_params(initial_steps=3, cfg_path=str(tmp_path / "sglang-spec-adaptive.json"))
    params.set_cuda_graph_bs(release.capture_sizes(256))
    assert {params._route(bs).candidate_steps[0] for bs in range(1, 513)} == {1}  # never a 0-step candidate
    never = make_policies(analysis(13.2), 3, zero_step=ZeroStep(None, "zero.jsonl", "speculation wins everywhere"))
    assert never.sglang.off_at is None and "never overtake" in never.sglang.zero_step
    # one slot changes nothing with load: the static launch is named; a file with tiers gets no such hint
    assert "launch static (--speculative-num-steps 3, without --speculative-adaptive)" in p.sglang.static
    assert (
        reduced.sglang.static == ""
        and make_policies(analysis(13.2), 3, zero_step=measured_zero(13.2)).sglang.static == ""
    )


@pytest.mark.parametrize("version", ["0.5.14", "0.5.16", "0.5.23"])
@pytest.mark.parametrize("steps", [3, 8])
def test_the_zero_step_measuring_file_holds_every_batch_at_zero_steps(version: str, steps: int, tmp_path: Path) -> None:
    """sglang-zero-step.json, by the release's own loader, initial-step check and router: 0 draft steps at every
    batch size a server runs, while the union of its candidates (which sizes the buffers) keeps the server's steps."""
    release = sglang_release(version)
    write_policy_files(tmp_path, make_policies(analysis(13.2), steps))
    path = str(tmp_path / "sglang-zero-step.json")
    assert release.resolve_candidate_steps(path) == [0, steps]
    assert release.check_initial_steps(steps, path) == steps + 1
    params = release.adaptive_params(initial_steps=steps, cfg_path=path)
    for graphs in (release.capture_sizes(256), None):
        params.set_cuda_graph_bs(graphs)
        assert {params.get_steps_for_batch(bs) for bs in range(1, 4097)} == {0}


# --- steps and the CLI --------------------------------------------------------------------------------------------


def test_unknown_draft_length_is_an_error_naming_steps() -> None:
    with pytest.raises(PolicyError) as exc:
        make_policies(analysis(17.5, spec_steps=None))
    assert str(exc.value) == STEPS_HELP and "--steps N" in STEPS_HELP
    assert make_policies(analysis(17.5, spec_steps=8)).steps == 8  # what the server reported
    assert make_policies(analysis(17.5, spec_steps=8), steps=2).steps == 2  # --steps wins


def _sweeps(tmp_path: Path) -> tuple[Path, Path]:
    base, spec = tmp_path / "base.jsonl", tmp_path / "spec.jsonl"
    for path, label, points in ((base, "base", {1: 90.0, 10: 500.0}), (spec, "spec", {1: 130.0, 10: 400.0})):
        append_jsonl(path, [LevelSummary(c, t, 10.0, int(t * 10), 20, 0, label, "r1") for c, t in points.items()])
    return base, spec


def test_cli_without_steps_prints_the_analysis_and_exits_2_only_for_the_policy_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base, spec = _sweeps(tmp_path)
    assert run_subcommand("crossover", str(base), str(spec)) == 0  # nothing asked that needs the draft length
    assert f"Policies: none - {STEPS_HELP}" in capsys.readouterr().out
    assert run_subcommand("crossover", str(base), str(spec), "--write-policies", str(tmp_path / "pol")) == 2
    captured = capsys.readouterr()
    assert "Crossover (interpolated): C = " in captured.out and "pass --steps N" in captured.err
    assert not (tmp_path / "pol").exists()


def test_cli_text_names_each_engines_flags_files_and_minimum_release(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base, spec = _sweeps(tmp_path)
    argv = ("--steps", "4", "--write-policies", str(tmp_path / "pol"), "--verbose")
    assert run_subcommand("crossover", str(base), str(spec), *argv, "--draft-model", DRAFT) == 0
    out = capsys.readouterr().out
    assert "SGLang 0.5.14+" in out and "--speculative-num-steps 4 --speculative-eagle-topk 1" in out
    assert "--speculative-adaptive --speculative-adaptive-config sglang-spec-adaptive.json" in out
    assert "vLLM 0.24.0+: vllm-speculative-config.json" in out and f'"model": "{DRAFT}"' in out and "PIECEWISE" in out
    assert "--extra_llm_api_options trtllm-extra-llm-api-options.yaml" in out and "#16888" in out
    assert "FRAGMENT" not in out and "Router: state=spec" in out
    assert run_subcommand("crossover", str(base), str(spec), *argv, "--force") == 0
    out = capsys.readouterr().out
    assert "vllm-speculative-config.fragment.json - FRAGMENT" in out
    assert sorted(p.name for p in (tmp_path / "pol").iterdir()) == [
        "crossover.png",  # the plot, by default beside the policies
        "router-rule.json",
        "sglang-spec-adaptive.json",
        "sglang-zero-step.json",
        "trtllm-extra-llm-api-options.fragment.yaml",
        "vllm-speculative-config.fragment.json",
    ]  # the complete files of the first run are gone: no stale config beside the fragments


SPEC_SERVER = {"server": {"speculative": True, "speculative_algorithm": "EAGLE3"}}


def _zero_sweep(tmp_path: Path, points: dict[int, float], accept: float | None = 1.008, meta: object = None) -> Path:
    """A sweep of the speculative server held at 0 draft steps, as bench writes it (accept length per verify step)."""
    path = tmp_path / "zero.jsonl"
    rows = [
        LevelSummary(c, t, 10.0, int(t * 10), 20, 0, "zero", "r1", accept_length=accept,
                     meta=SPEC_SERVER if meta is None else meta)  # type: ignore[arg-type]
        for c, t in points.items()
    ]  # fmt: skip
    append_jsonl(path, rows)
    return path


def test_cli_zero_step_sweep_gives_sglang_its_0_slot_where_it_overtakes_full_speculation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base, spec = _sweeps(tmp_path)  # spec 130 / 400, base 90 / 500: crossover between 1 and 10
    out_dir = tmp_path / "pol"
    argv = ("--steps", "3", "--format", "json", "--write-policies", str(out_dir))
    zero = _zero_sweep(tmp_path, {1: 80.0, 10: 460.0})  # below spec at 1, above at 10
    assert run_subcommand("crossover", str(base), str(spec), "--zero-step", str(zero), *argv) == 0
    report = json.loads(capsys.readouterr().out)["policies"]
    config = json.loads((out_dir / "sglang-spec-adaptive.json").read_text())
    assert report["sglang_speculative_adaptive_config"] == config
    assert config["1"] == {"candidate_steps": [1, 3]} and report["sglang_off_at"] is not None
    assert config[str(report["sglang_off_at"])] == {"candidate_steps": [0]}
    assert "overtakes full speculation at" in report["sglang_zero_step"] and str(zero) in report["sglang_zero_step"]
    # without it: the same sweeps, no 0 slot, and the text says how to measure one
    assert run_subcommand("crossover", str(base), str(spec), "--steps", "3", "--verbose") == 0
    text = capsys.readouterr().out
    assert "no 0-step slot" in text and "sglang-zero-step.json" in text and "--zero-step" in text
    assert '"1": {"candidate_steps": [1, 3]}}' in text


@pytest.mark.parametrize(
    ("accept", "meta", "message"),
    [
        (3.35, None, "accept length 3.350 at concurrency 1: the server drafted"),
        (None, {"server": {"speculative": False}}, "reported speculation off: a plain server's sweep"),
        (None, {}, "neither its server nor its responses say speculation ran"),
    ],
)
def test_cli_refuses_a_zero_step_sweep_that_is_not_one_before_writing_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], accept: float | None, meta: object, message: str
) -> None:
    base, spec = _sweeps(tmp_path)
    zero = _zero_sweep(tmp_path, {1: 80.0, 10: 460.0}, accept, meta)
    argv = ("--steps", "3", "--write-policies", str(tmp_path / "pol"), "--zero-step", str(zero))
    assert run_subcommand("crossover", str(base), str(spec), *argv) == 2
    err = capsys.readouterr().err
    assert f"--zero-step {zero}: " in err and message in err and "sglang-zero-step.json" in err
    assert not (tmp_path / "pol").exists()
