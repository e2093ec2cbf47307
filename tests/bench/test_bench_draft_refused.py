"""A speculative server whose draft is (almost) never accepted is not a speculative run (sglang#21272): the bench
flags the level at concurrency 1 and says why, and `crossover` refuses that sweep as the speculative one.

Against the simulated SGLang server (tau = 1: every verify step keeps only its bonus token). The real SGLang 0.5.16
server with such a draft (tests/lab/sglang_models.py --draft-error 1.0) ran on the H200 on 2026-12-02: accept length
1.008, flagged and refused as here (tests/gpu/test_sglang_server.py TestBadDraft).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from bench.conftest import SIM_ARGS, Sim, run_subcommand
from sm120check.bench.records import read_jsonl
from sm120check.bench.speculation import FLAG, draft_problem


def sweep(sim: Sim, out: Path, label: str) -> int:
    argv = ["bench", "--url", sim.url, "--quiet", "--output-len", "16", "--input-len", "8", "--pause", "0"]
    argv += ["--concurrency", "1,2", "--requests-per-level", "4", "--label", label, "--out", str(out)]
    return run_subcommand(*argv)


def test_an_unaccepted_draft_is_flagged_and_crossover_refuses_it(
    sim_factory: Callable[..., Sim], plain_sim: Sim, tmp_path: Path, capsys: object
) -> None:
    bad = sim_factory("spec", *[*SIM_ARGS[:-1], "1.0"])  # --tau 1.0
    assert sweep(bad, tmp_path / "spec.jsonl", "spec") == 0
    one, two = read_jsonl(tmp_path / "spec.jsonl")
    assert one.accept_length is not None and one.accept_length <= 1.05
    assert FLAG in one.flags and any("sglang#21272" in w for w in one.warnings)
    assert FLAG not in two.flags  # only concurrency 1 decides
    assert sweep(plain_sim, tmp_path / "base.jsonl", "base") == 0
    code = run_subcommand("crossover", str(tmp_path / "base.jsonl"), str(tmp_path / "spec.jsonl"))
    assert code == 2
    err = capsys.readouterr().err  # type: ignore[attr-defined]
    assert "not a speculative sweep" in err and "sglang#21272" in err


def test_the_rule_reads_only_concurrency_one_of_a_speculative_server() -> None:
    assert draft_problem(1, True, 1.02).startswith("the server runs speculation but accepts 1.020")
    assert draft_problem(1, True, 1.3) == "" and draft_problem(2, True, 1.0) == ""
    assert draft_problem(1, None, 1.0) == "" and draft_problem(1, False, 1.0) == ""  # unknown is not speculative
    assert draft_problem(1, True, None) == ""
