"""`sm120check crossover` finds the crossover the simulated servers were built with, and says so when there is none.

The simulated servers (conftest.SIM_ARGS) have a plain step of 10 + 0.4*B ms, a verify step of 13 + 1.2*B ms and
an accepted length of 2, so speculation stops paying at B = 17.5.

The crossover math is tested on sweeps built from the simulator's own model (SimModel.throughput, the known step
costs), not on live measurements: a live sweep's throughput is wall-clock sleeps measured by the client, and on a
loaded machine it drifts (a model crossover of 22.5 was once read under load average 4.75). So the numbers here are
exact; one live sweep end to end (bench -> records -> crossover) asserts only structure, never a value.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from bench.conftest import SIM_ARGS, TRUE_CROSSOVER, Sim, run_subcommand
from sm120check.bench.crossover import analyze
from sm120check.bench.percentiles import Dist
from sm120check.bench.records import LevelSummary, append_jsonl, level_table, read_jsonl
from sm120check.bench.simserver import SimModel

LEVELS = "1,4,8,16,32,64"
MODEL_LEVELS = (1, 2, 4, 8, 16, 32, 64)
_ARGS = dict(zip(SIM_ARGS[::2], SIM_ARGS[1::2], strict=True))
PLAIN = SimModel("plain", a=float(_ARGS["--a-ms"]) / 1e3, b=float(_ARGS["--b-ms"]) / 1e3)
SPEC = SimModel("spec", c=float(_ARGS["--c-ms"]) / 1e3, d=float(_ARGS["--d-ms"]) / 1e3, tau=float(_ARGS["--tau"]))
# two runs of each sweep, 0.5% above and below the model: their mean is the model, their spread over run pairs is not 0
RUN_SCALE = {"r1": (1.005, 1.005), "r2": (0.995, 0.995)}
OUTPUT_LEN = 32


def model_records(model: SimModel, label: str, run_id: str, scale: float) -> list[LevelSummary]:
    """What a noise-free `sm120check bench` sweep of this simulated server records, from its known step costs."""
    spec = model.mode == "spec"
    server = {"speculative_algorithm": "EAGLE3" if spec else None, "speculative_num_steps": 3 if spec else None}
    out = []
    for c in MODEL_LEVELS:
        tput = model.throughput(c) * scale
        e2e = OUTPUT_LEN * c / tput  # every request gets OUTPUT_LEN tokens at 1/C of the throughput
        per = OUTPUT_LEN / e2e
        out.append(
            LevelSummary(
                c,
                tput,
                10.0,
                int(tput * 10),
                4 * c,
                0,
                label,
                run_id,
                per_request_tok_s=Dist(4 * c, per, per, per, per),
                e2e_s=Dist(4 * c, e2e, e2e, e2e, e2e),
                accept_length=model.tau if spec else None,
                meta={"server": server},
            )
        )
    return out


@pytest.fixture(scope="module")
def model_sweeps(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two runs per sweep, written through the code the bench uses, as `crossover` reads them."""
    root = tmp_path_factory.mktemp("model-sweeps")
    base, spec = root / "base.jsonl", root / "spec.jsonl"
    for run_id, (base_scale, spec_scale) in RUN_SCALE.items():
        append_jsonl(base, model_records(PLAIN, "base", run_id, base_scale))
        append_jsonl(spec, model_records(SPEC, "spec", run_id, spec_scale))
    return base, spec


def test_the_simulated_servers_true_crossover_is_the_one_the_tests_expect() -> None:
    assert PLAIN.a / PLAIN.b == pytest.approx(25.0) and SPEC.tau == 2.0
    assert SimModel("spec", a=PLAIN.a, b=PLAIN.b, c=SPEC.c, d=SPEC.d, tau=SPEC.tau).true_crossover() == pytest.approx(
        TRUE_CROSSOVER
    )


def test_interpolated_crossover_matches_the_servers_true_crossover(model_sweeps: tuple[Path, Path]) -> None:
    analysis = analyze(read_jsonl(model_sweeps[0]), read_jsonl(model_sweeps[1]), ("base", "spec"))
    cross = analysis.crossover
    assert cross.status == "found" and cross.value is not None
    # linear interpolation in log-log between C=16 and C=32 of the exact curves puts it at 17.5 within 1%
    assert cross.value == pytest.approx(TRUE_CROSSOVER, rel=0.01)
    assert (analysis.base_runs, analysis.spec_runs, cross.pairs) == (2, 2, 4)
    assert cross.low is not None and cross.high is not None and cross.std is not None
    assert cross.low < cross.value < cross.high and cross.std > 0  # the runs differ, so the spread is not zero
    assert cross.high - cross.low < 0.2 * TRUE_CROSSOVER


def test_levels_flagged_as_cohorts_are_named_in_the_comparison(model_sweeps: tuple[Path, Path]) -> None:
    base = [replace(r, flags=("cohorts",)) if r.concurrency >= 16 else r for r in read_jsonl(model_sweeps[0])]
    analysis = analyze(base, read_jsonl(model_sweeps[1]), ("base", "spec"))
    (note,) = [w for w in analysis.warnings if "came back in cohorts" in w]
    assert note.startswith("at C=16,32,64 a sweep's requests came back in cohorts") and "--output-len-spread" in note
    clean = analyze(read_jsonl(model_sweeps[0]), read_jsonl(model_sweeps[1]), ("base", "spec"))
    assert not [w for w in clean.warnings if "cohorts" in w]


def test_cost_model_recovers_step_times_accepted_length_and_crossover(tmp_path: Path) -> None:
    base, spec = tmp_path / "base.jsonl", tmp_path / "spec.jsonl"
    append_jsonl(base, model_records(PLAIN, "base", "r1", 1.0))
    append_jsonl(spec, model_records(SPEC, "spec", "r1", 1.0))
    model = analyze(read_jsonl(base), read_jsonl(spec), ("base", "spec")).model
    assert model is not None and model.c is not None and model.d is not None and model.tau is not None
    # exact step times in, exact step times out (to the 6 digits records keep): the fit and the algebra are right
    assert model.tau == pytest.approx(2.0, rel=1e-9)
    assert (model.a, model.b) == pytest.approx((0.010, 0.0004), rel=1e-4)
    assert (model.c, model.d) == pytest.approx((0.013, 0.0012), rel=1e-4)
    assert model.predicted == pytest.approx(TRUE_CROSSOVER, rel=1e-4)
    assert min(model.r2_base, model.r2_spec) == pytest.approx(1.0, abs=1e-6)


def test_cost_model_of_repeated_runs_off_the_model_by_half_a_percent_still_finds_the_crossover(
    model_sweeps: tuple[Path, Path],
) -> None:
    model = analyze(read_jsonl(model_sweeps[0]), read_jsonl(model_sweeps[1]), ("base", "spec")).model
    assert model is not None and model.predicted is not None
    assert model.predicted == pytest.approx(TRUE_CROSSOVER, rel=0.15)


def test_report_shows_both_sweeps_side_by_side_and_the_policies(
    model_sweeps: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # SGLang's 0-step tier measured as the plain server measures (the base sweep relabelled as the speculative
    # server held at 0 draft steps): its slot then switches where the plain server's crossover is
    zero = tmp_path / "zero" / "zero.jsonl"
    zero.parent.mkdir()
    speculative = {"server": {"speculative": True, "speculative_algorithm": "EAGLE3"}}
    append_jsonl(zero, [replace(r, accept_length=1.0, meta=speculative) for r in read_jsonl(model_sweeps[0])])
    argv = ("--write-policies", str(tmp_path), "--draft-model", "/models/eagle3", "--zero-step", str(zero))
    assert run_subcommand("crossover", str(model_sweeps[0]), str(model_sweeps[1]), *argv, "--verbose") == 0
    out = capsys.readouterr().out
    assert "| Concurrency | Base (tok/s) | Spec (tok/s) | Speedup |" in out
    assert out.count("\n| ") == 1 + len(MODEL_LEVELS)  # header and one row per level
    assert "Crossover (interpolated): C = " in out and "Model crossover: C = " in out
    sglang = json.loads((tmp_path / "sglang-spec-adaptive.json").read_text())
    off_key = max(sglang, key=int)
    assert sglang[off_key] == {"candidate_steps": [0]}
    # 17.5 -> off from 18; SGLang pads 17 to the capture size 18, so its off slot begins at 17 (one past 16)
    assert int(off_key) == 17
    assert 3 in sglang["1"]["candidate_steps"]  # the server's --speculative-num-steps must stay a candidate
    vllm = json.loads((tmp_path / "vllm-speculative-config.json").read_text())
    assert vllm["model"] == "/models/eagle3"
    assert vllm["num_speculative_tokens_per_batch_size"][-1][:1] == [18]
    assert vllm["num_speculative_tokens_per_batch_size"][-1][2] == 0
    trt = yaml.safe_load((tmp_path / "trtllm-extra-llm-api-options.yaml").read_text())["speculative_config"]
    assert "max_concurrency" not in trt  # TensorRT-LLM refuses it beside draft_len_schedule
    assert trt["speculative_model"] == "/models/eagle3" and trt["max_draft_len"] == 3
    # no one-step tier by default: 3 draft tokens to batch 17, then floor 1 (default): 1 draft token from 18 on
    assert trt["draft_len_schedule"] == {17: 3, 1024: 1}
    assert set(sglang) == {"1", "17"}  # the SGLang file likewise: full speculation, then none
    assert run_subcommand("crossover", *map(str, model_sweeps), *argv, "--reduced-tier", "--force") == 0
    trt = yaml.safe_load((tmp_path / "trtllm-extra-llm-api-options.yaml").read_text())["speculative_config"]
    assert trt["draft_len_schedule"] == {7: 3, 1024: 1}  # with the tier: 1 draft token from batch 8 on
    assert set(json.loads((tmp_path / "sglang-spec-adaptive.json").read_text())) == {"1", "8", "17"}
    assert "SGLang 0.5.14+" in out and "vLLM 0.24.0+" in out and "PIECEWISE" in out
    router = json.loads((tmp_path / "router-rule.json").read_text())
    assert router["switch_back_to_spec_at_or_below"] < TRUE_CROSSOVER < router["switch_to_plain_at_or_above"] + 1
    # without the 0-step sweep, SGLang keeps speculation everywhere; vLLM and TensorRT-LLM still switch at 18
    assert run_subcommand("crossover", *map(str, model_sweeps), *argv[:-2], "--force", "--verbose") == 0
    assert json.loads((tmp_path / "sglang-spec-adaptive.json").read_text()) == {"1": {"candidate_steps": [1, 3]}}
    assert "no 0-step slot" in capsys.readouterr().out
    trt = yaml.safe_load((tmp_path / "trtllm-extra-llm-api-options.yaml").read_text())["speculative_config"]
    assert trt["draft_len_schedule"] == {17: 3, 1024: 1}


def test_json_format_carries_the_same_numbers(
    model_sweeps: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_subcommand("crossover", str(model_sweeps[0]), str(model_sweeps[1]), "--format", "json") == 0
    data = json.loads(capsys.readouterr().out)
    analysis = analyze(read_jsonl(model_sweeps[0]), read_jsonl(model_sweeps[1]), ("base", "spec"))
    assert data["crossover"]["value"] == pytest.approx(analysis.crossover.value, rel=1e-6)
    assert data["crossover"]["value"] == pytest.approx(TRUE_CROSSOVER, rel=0.01)
    assert data["policies"]["sglang_speculative_adaptive_config"]["1"]["candidate_steps"]


def test_plot_is_written(model_sweeps: tuple[Path, Path], tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    png = tmp_path / "crossover.png"
    assert run_subcommand("crossover", str(model_sweeps[0]), str(model_sweeps[1]), "--png", str(png)) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# -- end to end against the live simulated servers: structure only, since their timings are wall clock --------


def test_live_sweeps_of_both_servers_go_through_bench_and_crossover(
    plain_sim: Sim, spec_sim: Sim, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base, spec = tmp_path / "base.jsonl", tmp_path / "spec.jsonl"
    for sim, records, label in ((plain_sim, base, "base"), (spec_sim, spec, "spec")):
        args = ["--url", sim.url, "--concurrency", LEVELS, "--output-len", "32", "--duration", "0.5", "--quiet"]
        assert run_subcommand("bench", *args, "--label", label, "--out", str(records)) == 0
    levels = [int(c) for c in LEVELS.split(",")]
    analysis = analyze(read_jsonl(base), read_jsonl(spec), ("base", "spec"))
    assert [lv.concurrency for lv in analysis.levels] == levels and (analysis.base_runs, analysis.spec_runs) == (1, 1)
    for lv in analysis.levels:
        assert all(math.isfinite(v) and v > 0 for v in (lv.base.mean, lv.spec.mean, lv.speedup))
        assert lv.accept_length is not None and math.isfinite(lv.accept_length)
    # fixed lengths in a closed loop come back in cohorts at some levels, which the comparison says; nothing else
    assert analysis.spec_steps == 3 and not [w for w in analysis.warnings if "came back in cohorts" not in w]
    cross = analysis.crossover
    assert cross.status in ("found", "above-range", "below-range") and cross.message
    if cross.status == "found":
        assert cross.value is not None and levels[0] <= cross.value <= levels[-1]
    else:
        assert cross.value is None
    assert analysis.model is not None and all(
        math.isfinite(v) for v in (analysis.model.a, analysis.model.b, analysis.model.c_over_tau)
    )
    capsys.readouterr()  # the bench's own tables
    assert run_subcommand("crossover", str(base), str(spec)) == 0
    out = capsys.readouterr().out
    assert "| Concurrency | Base (tok/s) | Spec (tok/s) | Speedup |" in out
    assert out.count("\n| ") == 1 + len(levels)
    assert "Crossover (interpolated): C = " in out or "Crossover: none in the measured range" in out


# -- bad and borderline input (records written through the same code the bench uses) --------------------------


def write(path: Path, label: str, points: dict[int, float], run_id: str = "r1") -> Path:
    append_jsonl(
        path, [LevelSummary(c, tput, 10.0, int(tput * 10), 20, 0, label, run_id) for c, tput in points.items()]
    )
    return path


def test_empty_file_is_rejected_with_the_command_that_fills_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "base.jsonl"
    empty.write_text("")
    spec = write(tmp_path / "spec.jsonl", "spec", {1: 100.0, 2: 150.0})
    assert run_subcommand("crossover", str(empty), str(spec)) == 2
    assert f"{empty} holds no bench records; write some with `sm120check bench" in capsys.readouterr().err


def test_sweeps_without_common_levels_are_rejected_naming_the_levels(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = write(tmp_path / "base.jsonl", "base", {1: 90.0, 2: 170.0})
    spec = write(tmp_path / "spec.jsonl", "spec", {2: 150.0, 4: 200.0})
    assert run_subcommand("crossover", str(base), str(spec)) == 2
    err = capsys.readouterr().err
    assert "share 1 concurrency level(s) (2;" in err and "has 1,2" in err and "has 2,4" in err
    assert "same --concurrency" in err


def test_speculation_winning_everywhere_reports_no_crossover_and_no_policy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = write(tmp_path / "base.jsonl", "base", {1: 90.0, 10: 500.0, 100: 900.0})
    spec = write(tmp_path / "spec.jsonl", "spec", {1: 130.0, 10: 600.0, 100: 950.0})
    assert run_subcommand("crossover", str(base), str(spec)) == 0
    out = capsys.readouterr().out
    assert "Crossover: none in the measured range" in out and "lies above C=100" in out
    assert "Policies: none" in out and "Crossover (interpolated)" not in out


def test_speculation_losing_at_the_first_level_says_it_never_pays(tmp_path: Path) -> None:
    base = write(tmp_path / "base.jsonl", "base", {1: 90.0, 10: 500.0})
    spec = write(tmp_path / "spec.jsonl", "spec", {1: 80.0, 10: 400.0})
    cross = analyze(read_jsonl(base), read_jsonl(spec), ("b", "s")).crossover
    assert (cross.status, cross.value) == ("below-range", None)
    assert "slower already at the lowest level C=1" in cross.message


def test_bad_json_line_is_named_by_file_and_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = write(tmp_path / "base.jsonl", "base", {1: 90.0, 2: 150.0})
    with base.open("a") as fh:
        fh.write("{not json\n")
    spec = write(tmp_path / "spec.jsonl", "spec", {1: 100.0, 2: 150.0})
    assert run_subcommand("crossover", str(base), str(spec)) == 2
    assert f"{base}:3: not JSON" in capsys.readouterr().err


def test_seed_accounts_table_is_reproduced_in_its_format() -> None:
    # The EAGLE-3 sweep of the seed account (8x RTX PRO 6000, Kimi-K2.5-NVFP4), msg 5417, first four rows.
    rows = [(1, 77.5, 77.7, 6.6), (2, 125.1, 62.9, 8.2), (5, 183.2, 37.3, 13.8), (250, 340.9, 2.9, 243.6)]
    summaries = [
        LevelSummary(
            c, tput, 60.0, 0, c, 0, per_request_tok_s=Dist(1, per, per, per, per), e2e_s=Dist(1, lat, lat, lat, lat)
        )
        for c, tput, per, lat in rows
    ]
    # `bench` prints the seed account's four columns first (then TTFT and TPOT, n/a here)
    assert ["|" + "|".join(line.split("|")[1:5]) + "|" for line in level_table(summaries).splitlines()] == [
        "| Concurrency | Throughput (tok/s) | Per-Req (tok/s) | Avg Latency (s) |",
        "|---|---|---|---|",
        "| 1 | 77.5 | 77.7 | 6.6 |",
        "| 2 | 125.1 | 62.9 | 8.2 |",
        "| 5 | 183.2 | 37.3 | 13.8 |",
        "| 250 | 340.9 | 2.9 | 243.6 |",
    ]


def test_subcommands_are_dispatched_by_the_sm120check_command(tmp_path: Path) -> None:
    from sm120check.cli import main

    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    assert main(["crossover", str(empty), str(empty)]) == 2


def test_missing_matplotlib_still_prints_and_writes_policies_then_exits_2(tmp_path: Path) -> None:
    """Defect 7: --png without matplotlib returned 2 before --write-policies ran. The stand-in: a `matplotlib`
    package first on PYTHONPATH whose import raises ImportError, as `import matplotlib` does where it is absent."""
    fake = tmp_path / "no-matplotlib" / "matplotlib"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError(\"No module named 'matplotlib' (stand-in)\")\n")
    base = write(tmp_path / "base.jsonl", "base", {1: 90.0, 10: 500.0})
    spec = write(tmp_path / "spec.jsonl", "spec", {1: 130.0, 10: 400.0})
    pol, png = tmp_path / "pol", tmp_path / "x.png"
    src = Path(__file__).resolve().parents[2] / "python" / "sm120check" / "src"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(fake.parent), str(src)])}
    argv = ["crossover", str(base), str(spec), "--png", str(png), "--write-policies", str(pol), "--steps", "3"]
    proc = subprocess.run(
        [sys.executable, "-m", "sm120check", *argv], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 2, proc.stderr
    assert "Crossover (interpolated): C = " in proc.stdout and "SGLang 0.5.14+" in proc.stdout
    assert "pip install matplotlib" in proc.stderr and "only the plot is missing" in proc.stderr
    assert sorted(p.name for p in pol.iterdir()) == [
        "router-rule.json",
        "sglang-spec-adaptive.json",
        "sglang-zero-step.json",
        "trtllm-extra-llm-api-options.fragment.yaml",
        "vllm-speculative-config.fragment.json",
    ]
    assert not png.exists()
