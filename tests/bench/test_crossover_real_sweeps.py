"""`sm120check crossover` on the sweeps of a real SGLang 0.5.16 server (tests/fixtures/bench/README.md): the
crossover, the 48-request cap of SGLang's speculative server said per level it touches, the SGLang file without a
0-step slot from the base sweep alone, and the policy server's 0-step levels refused as a 0-step sweep's stand-in
where they drafted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.conftest import run_subcommand

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "bench"
BASE, SPEC, POLICY = (FIXTURES / f"h200-sglang-0.5.16-{name}.jsonl" for name in ("base", "spec", "policy"))


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
