"""`sm120check crossover` on the sweeps of a real SGLang 0.5.16 server (tests/fixtures/bench/README.md): the
crossover, the 48-request cap of SGLang's speculative server said per level it touches, the SGLang file without a
0-step slot from the base sweep alone, and the policy server's 0-step levels refused as a 0-step sweep's stand-in
where they drafted. Run 2 (docs/validation/2026-12-02-h200-policy-2): a real 0-step sweep that never overtakes full
speculation, so no 0-step slot, and the note that more draft steps are likely to pay at low load."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.conftest import run_subcommand

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "bench"
BASE, SPEC, POLICY = (FIXTURES / f"h200-sglang-0.5.16-{name}.jsonl" for name in ("base", "spec", "policy"))
BASE2, SPEC2, ZERO2 = (FIXTURES / f"h200-sglang-0.5.16-run2-{name}.jsonl" for name in ("base", "spec", "zero-step"))
SPEC7 = FIXTURES / "h200-sglang-0.5.16-run2-spec-7.jsonl"


def test_the_real_sweeps_cross_at_6_4_and_say_the_speculative_servers_cap(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "pol"
    assert run_subcommand("crossover", str(BASE), str(SPEC), "--format", "json", "--write-policies", str(out)) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["crossover"]["value"] == pytest.approx(6.39, abs=0.01)
    capped = [w for w in report["warnings"] if "max_running_requests" in w]
    assert len(capped) == 1 and capped[0].startswith(f"{SPEC}: its server runs at most 48 requests at once"), capped
    assert "C=70,100,250" in capped[0] and "sglang_server_max_running_requests" in capped[0]
    # the plain server reported no cap: nothing said of it
    assert not any(w.startswith(str(BASE)) and "max_running_requests" in w for w in report["warnings"])
    assert json.loads((out / "sglang-spec-adaptive.json").read_text()) == {"1": {"candidate_steps": [1, 3]}}
    assert report["policies"]["sglang_off_at"] is None
    assert json.loads((out / "vllm-speculative-config.fragment.json").read_text())[
        "num_speculative_tokens_per_batch_size"
    ] == [[1, 6, 3], [7, 1024, 0]]  # fmt: skip


def test_the_policy_servers_sweep_is_not_a_zero_step_sweep(capsys: pytest.CaptureFixture[str]) -> None:
    """Its batch sizes 1-6 ran 3 draft steps (accept length 3.36): crossover refuses it as --zero-step."""
    assert run_subcommand("crossover", str(BASE), str(SPEC), "--zero-step", str(POLICY)) == 2
    err = capsys.readouterr().err
    assert f"--zero-step {POLICY}: accept length 3.357 at concurrency 1: the server drafted" in err


def test_run2_the_zero_step_sweep_never_overtakes_so_the_file_keeps_speculation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The EAGLE-3 server held at 0 steps, uncapped, with SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND=1: 0.43-0.71 x the
    plain server and below full speculation at every level to C=250. The router keeps the plain server's side."""
    out = tmp_path / "pol"
    argv = ["crossover", str(BASE2), str(SPEC2), "--zero-step", str(ZERO2), "--format", "json"]
    assert run_subcommand(*argv, "--write-policies", str(out)) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["crossover"]["value"] == pytest.approx(29.3, abs=0.05)
    policies = report["policies"]
    assert policies["sglang_off_at"] is None
    assert policies["sglang_zero_step"].startswith(f"no 0-step slot: in {ZERO2} 0 steps never overtake full spec")
    assert json.loads((out / "sglang-spec-adaptive.json").read_text()) == {"1": {"candidate_steps": [1, 3]}}
    assert policies["router"]["switch_to_plain_at_or_above"] == 34
    # one slot: the file changes nothing with load, and adaptive mode cost 0.78-0.82 x at C=1: the static launch
    assert policies["sglang_static"].startswith("the file gives every batch size the same candidates")
    assert "launch static (--speculative-num-steps 3, without --speculative-adaptive)" in policies["sglang_static"]


def test_run2_a_draft_accepted_nearly_in_full_at_c1_says_more_steps_are_likely_to_pay(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """3.36 of 4 tokens at C=1 (84 %): the note names the steps to try. The same sweep with the accept lengths
    scaled to 2.0 at C=1 (50 %) gets no note."""
    assert run_subcommand("crossover", str(BASE2), str(SPEC2), "--format", "json") == 0
    notes = [w for w in json.loads(capsys.readouterr().out)["warnings"] if "more draft steps" in w]
    assert len(notes) == 1 and notes[0].startswith("at C=1 the draft was accepted 3.36 of the 4 tokens"), notes
    assert "--speculative-num-steps 7 --speculative-num-draft-tokens 8" in notes[0]
    low = tmp_path / "spec-low-accept.jsonl"
    rows = [json.loads(line) for line in SPEC2.read_text().splitlines()]
    low.write_text("".join(json.dumps({**r, "accept_length": 2.0}) + "\n" for r in rows))
    assert run_subcommand("crossover", str(BASE2), str(low), "--format", "json") == 0
    assert not [w for w in json.loads(capsys.readouterr().out)["warnings"] if "more draft steps" in w]


def test_run2_the_7_step_server_the_note_sent_us_to_is_not_sent_further(capsys: pytest.CaptureFixture[str]) -> None:
    """The 7-step sweep (C=1, 2, 5; docs/validation/2026-12-02-h200-deeper): 5.47 of 8 tokens at C=1 (68 %) is below
    the note's 80 %, so no note; against the base sweep speculation wins at all three levels (no crossover)."""
    assert run_subcommand("crossover", str(BASE2), str(SPEC7), "--format", "json") == 0
    report = json.loads(capsys.readouterr().out)
    assert report["spec_steps"] == 7 and report["crossover"]["value"] is None
    assert not [w for w in report["warnings"] if "more draft steps" in w]
    assert [lv["concurrency"] for lv in report["levels"]] == [1, 2, 5]
