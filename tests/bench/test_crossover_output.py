"""`sm120check crossover` as a newcomer reads it, on the real H200 sweeps of SGLang 0.5.16 (run 2,
docs/validation/2026-12-02-h200-policy-2; tests/fixtures/bench/README.md): the verdict first, the table after, the
engine notes behind --verbose, swapped files refused, and the plot beside the policy files."""

from __future__ import annotations

import importlib.util
import os
import stat
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from matplotlib.patches import Rectangle

from bench.conftest import SIM_ARGS, Sim, run_subcommand
from sm120check.bench.crossover import analyze, analyze_mode
from sm120check.bench.crossover_report import sweep_facts
from sm120check.bench.plot import build_figure, build_mode_figure
from sm120check.bench.records import read_jsonl

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "bench"
BASE2, SPEC2, SPEC7 = (FIXTURES / f"h200-sglang-0.5.16-run2-{name}.jsonl" for name in ("base", "spec", "spec-7"))
POLICY_FILES = [
    "sglang-spec-adaptive.json",
    "sglang-zero-step.json",
    "vllm-speculative-config.fragment.json",
    "trtllm-extra-llm-api-options.fragment.yaml",
    "router-rule.json",
]


def test_the_verdict_comes_first_in_three_lines_then_the_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pol = tmp_path / "pol"
    assert run_subcommand("crossover", str(BASE2), str(SPEC2), "--write-policies", str(pol)) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[:4] == [
        "Crossover (interpolated): C = 29.3 - speculation stops paying near C=29.3 (one run per sweep: no "
        "uncertainty; append repeated runs to the same files to get one)",
        "Launch: the EAGLE-3 server below C=30 and the plain server from C=30 on, behind the router rule "
        "(router-rule.json); SGLang 0.5.14+: --speculative-algorithm EAGLE3 --speculative-num-steps 3 "
        "--speculative-eagle-topk 1 (--verbose: vLLM, TensorRT-LLM and the notes)",
        "Files: " + ", ".join(str(pol / name) for name in [*POLICY_FILES, "crossover.png"]),
        "",
    ]
    assert lines[5].startswith("| Concurrency | Base (tok/s) | Spec (tok/s) | Speedup |")
    assert lines[7] == "| 1 | 445.0 | 718.6 | 1.61 | 438.9 | 722.1 | 0.29 | 0.18 | 3.36 |"


def test_the_cost_model_and_engine_notes_only_with_verbose(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_subcommand("crossover", str(BASE2), str(SPEC2)) == 0
    short = capsys.readouterr().out
    assert "Cost model" not in short and "TensorRT-LLM (PyTorch backend)" not in short
    assert short.splitlines()[2] == "Files: none (--write-policies DIR writes the policy files and the plot)"
    assert run_subcommand("crossover", str(BASE2), str(SPEC2), "--verbose") == 0
    full = capsys.readouterr().out
    assert "Cost model: base step a + bB" in full and "TensorRT-LLM (PyTorch backend)" in full


def test_messages_cite_the_record_not_its_numbers(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_subcommand("crossover", str(BASE2), str(SPEC2), "--verbose") == 0
    out = capsys.readouterr().out
    # the lab's own figures (7 static steps: 871 tok/s; 0-step: 0.53 x; adaptive: 0.82 x) are in the records only
    for figure in ("871", "0.53, 0.47", "0.82 and 0.78"):
        assert figure not in out
    assert "docs/validation/2026-12-02-h200-deeper" in out and "docs/validation/2026-12-02-h200-policy-2" in out


def test_swapped_files_are_refused_from_what_the_records_say(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_subcommand("crossover", str(SPEC2), str(BASE2)) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        f"sm120check crossover: the files are swapped: {SPEC2} was measured on the speculative server and {BASE2} "
        f"on the plain one (their records say so); give the plain server's sweep first: sm120check crossover "
        f"{BASE2} {SPEC2}\n"
    )


@pytest.mark.parametrize(
    ("base", "spec", "said"),
    [
        (SPEC7, SPEC2, "the first file must be the plain server's sweep"),
        (BASE2, BASE2, "the second file must be the speculative server's sweep"),
    ],
)
def test_a_file_from_the_other_server_is_refused(
    base: Path, spec: Path, said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_subcommand("crossover", str(base), str(spec)) == 2
    assert said in capsys.readouterr().err


@pytest.mark.parametrize("umask", [0o022, 0o077], ids=["umask-022", "umask-077"])
def test_policy_files_and_the_plot_are_readable_by_other_users(tmp_path: Path, umask: int) -> None:
    # a server or router running as another user must enter DIR (and any parent crossover made) and read each file
    pol = tmp_path / "new" / "pol"
    old = os.umask(umask)
    try:
        assert run_subcommand("crossover", str(BASE2), str(SPEC2), "--write-policies", str(pol)) == 0
    finally:
        os.umask(old)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in pol.iterdir()}
    assert set(modes) == {*POLICY_FILES, "crossover.png"}
    assert all(mode == 0o644 for mode in modes.values()), modes
    assert stat.S_IMODE(pol.stat().st_mode) == 0o755 and stat.S_IMODE(pol.parent.stat().st_mode) == 0o755


def test_no_png_keeps_the_plot_out(tmp_path: Path) -> None:
    pol = tmp_path / "pol"
    assert run_subcommand("crossover", str(BASE2), str(SPEC2), "--write-policies", str(pol), "--no-png") == 0
    assert not (pol / "crossover.png").exists()


def test_without_matplotlib_the_default_plot_is_said_missing_not_listed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # A node provisioned by `make provision` has the checker but no matplotlib: the policies are the result (exit 0),
    # the verdict lists only the files written, and stderr says why the plot is not beside them.
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real_find_spec(name, *a)
    )
    pol = tmp_path / "pol"
    assert run_subcommand("crossover", str(BASE2), str(SPEC2), "--write-policies", str(pol)) == 0
    captured = capsys.readouterr()
    assert captured.out.splitlines()[2] == "Files: " + ", ".join(str(pol / name) for name in POLICY_FILES)
    assert sorted(p.name for p in pol.iterdir()) == sorted(POLICY_FILES)
    assert captured.err.splitlines()[-1] == (
        f"no plot: matplotlib is not installed (`pip install matplotlib` puts {pol / 'crossover.png'} beside the "
        "policies; --no-png says you want none)"
    )


def test_the_plot_has_a_speedup_panel_ticks_at_the_levels_short_labels_and_the_cap() -> None:
    base, spec = read_jsonl(BASE2), read_jsonl(SPEC2)
    fig = build_figure(analyze(base, spec, (str(BASE2), str(SPEC2))), sweep_facts(base, spec))
    fig.canvas.draw()  # tick labels are laid out on drawing, as when the PNG is saved
    top, bottom = fig.axes
    assert top.get_title() == "target, SGLang 0.5.16, 2026-12-02"  # the model the tests write, from the records
    assert bottom.get_ylabel() == "Speedup (EAGLE-3 / plain)"
    assert any(list(line.get_ydata(orig=True)) == [1.0, 1.0] for line in bottom.get_lines())  # type: ignore[arg-type]
    levels = [1, 2, 5, 10, 30, 70, 100, 250]
    for ax in (top, bottom):
        assert list(ax.get_xticks()) == levels
    assert [t.get_text() for t in bottom.get_xticklabels()] == [str(c) for c in levels]  # no 10^n
    legend = top.get_legend()
    assert legend is not None
    labels = [t.get_text() for t in legend.get_texts()]
    assert labels == [
        "plain, cost model",
        "EAGLE-3, cost model",
        "crossover C=29.3",
        "above the EAGLE-3 server's cap (48 running)",
        "plain",
        "EAGLE-3",
    ]
    assert not any("/" in label or ".jsonl" in label for label in labels)
    (cap,) = [p for p in bottom.patches if str(p.get_label()).startswith("above the EAGLE-3 server's cap")]
    assert isinstance(cap, Rectangle) and cap.get_x() == 48  # from the speculative server's cap on


def test_an_open_loop_pair_gets_its_plot_with_ticks_at_the_rates(
    sim_factory: Callable[..., Sim], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sweeps = {}
    for mode in ("plain", "spec"):
        sim = sim_factory(mode, *SIM_ARGS)
        sweeps[mode] = tmp_path / f"{mode}.jsonl"
        argv = ["--url", sim.url, "--request-rate", "5,20", "--requests-per-level", "8", "--output-len", "8"]
        argv += ["--input-len", "8", "--pause", "0", "--quiet", "--label", "base" if mode == "plain" else "spec"]
        assert run_subcommand("bench", *argv, "--out", str(sweeps[mode])) == 0
    png = tmp_path / "open.png"
    assert run_subcommand("crossover", str(sweeps["plain"]), str(sweeps["spec"]), "--x", "rate", "--png", str(png)) == 0
    assert png.stat().st_size > 0 and f"plot written to {png}" in capsys.readouterr().err
    base, spec = read_jsonl(sweeps["plain"]), read_jsonl(sweeps["spec"])
    fig = build_mode_figure(analyze_mode(base, spec, ("plain", "spec"), "rate", "throughput"), sweep_facts(base, spec))
    fig.canvas.draw()
    top, bottom = fig.axes
    assert [t.get_text() for t in bottom.get_xticklabels()] == ["5", "20"]
    assert bottom.get_xlabel() == "Offered request rate (requests/s)"
    assert any(list(line.get_ydata(orig=True)) == [1.0, 1.0] for line in bottom.get_lines())  # type: ignore[arg-type]
    legend = top.get_legend()
    assert legend is not None and [t.get_text() for t in legend.get_texts()] == ["plain", "EAGLE-3"]


def test_the_plot_title_names_the_gpu_the_bench_saw() -> None:
    base, spec = read_jsonl(BASE2), read_jsonl(SPEC2)
    spec = [replace(r, meta={**r.meta, "client": {"host": "vm", "gpus": ["NVIDIA H200"] * 8}}) for r in spec]
    # the server reported tp_size 1: one of the host's eight GPUs served
    assert sweep_facts(base, spec).title() == "target, SGLang 0.5.16, 1x NVIDIA H200, 2026-12-02"
