"""The speculation switch (`sm120check sglang patch --plain-decode`) on a real SGLang 0.5.16 server, in one call:

- the plain server (base.txt): greedy outputs for a fixed prompt set, and its decode rate at C=1, 30 and 100;
- the EAGLE-3 server with the switch (switch.txt: spec.txt uncapped; switch.env sets
  SGLANG_SM120KIT_PLAIN_DECODE_MIN_BS, so batches of that many requests or more run the target's plain decode and
  smaller ones speculate): the same greedy outputs token for token, on requests that cross the switch both ways
  (started in a large batch and finished alone; started alone and joined by a large batch), through the native and
  OpenAI APIs; its decode rate at the same levels; the batches it ran plain and speculative per batch size (the
  patch's `sm120kit plain decode batches:` log line).

`scripts/device/sglang-server.sh venv switch` runs it. The served pair is tests/lab/sglang_models.py's: its target's
next token depends on the current token only (attention's output projection is zero), so equal tokens prove the
switch's token plumbing (input token, sampler, commit), not the attention or KV cache path.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from lab.crossing import differ, outputs
from lab.sglang_gpu import LAUNCH, MARKS, Patched, Server, bench_level, save, sm120check, start, write_models
from sm120check.sglang import plain_decode

pytestmark = MARKS
LEVELS = (1, 30, 100)
MIN_BS = 30  # switch.env


RESULTS: dict[str, Any] = {}  # what one test hands the next (one server at a time on the GPU)


@pytest.fixture(scope="module")
def patched() -> Iterator[Patched]:
    from lab.sglang_gpu import patch_tree

    run = sm120check("sglang", "patch", "--cc", "9.0", "--plain-decode", "--json")
    save("patch-switch.json", run.stdout or run.stderr)
    assert run.returncode == 0, run.stderr[-2000:]
    tree = patch_tree()  # the digest of the patched tree; the patch is already complete, so this changes nothing
    yield tree
    revert = sm120check("sglang", "patch", "--revert", "--json")
    save("revert-switch.json", revert.stdout or revert.stderr)


class TestSwitch:
    def test_base_server_outputs_and_rates(self, patched: Patched) -> None:
        write_models("switch.txt")
        for server in start("switch-base", LAUNCH / "base.txt"):
            RESULTS["base"] = outputs(server)
            RESULTS["base_levels"] = {c: _level(server, c, "base") for c in LEVELS}
        save("switch-base.json", RESULTS["base_levels"])
        assert all(RESULTS["base_levels"][c]["errors"] == 0 for c in LEVELS)

    def test_switch_server_equals_the_plain_server_token_for_token(self, patched: Patched) -> None:
        assert "base" in RESULTS, "the base server's outputs are missing (its test failed)"
        for server in start("switch", LAUNCH / "switch.txt"):
            ready = [line for line in server.lines() if plain_decode.READY_PREFIX in line]
            got: dict[str, Any] = outputs(server)
            counts_after_crossing = plain_decode.counts(server.lines())
            RESULTS["switch_levels"] = {c: _level(server, c, "switch") for c in LEVELS}
            RESULTS["counts"] = plain_decode.counts(server.lines())
            RESULTS["ready"] = ready
        differs = differ(RESULTS["base"], got)
        save(
            "switch-result.json",
            {
                "ready": ready,
                "counts_after_crossing": counts_after_crossing,
                "counts": RESULTS["counts"],
                "differ": differs,
                "levels": RESULTS["switch_levels"],
                "base_levels": RESULTS["base_levels"],
                "requests_compared": len(got["crossing"]) + len(got["openai"]),
            },
        )
        assert ready, "the switch server never logged that its plain decode graphs were captured"
        assert not differs, f"outputs differ from the plain server: {differs}"
        counts = RESULTS["counts"]
        assert counts is not None, "no `sm120kit plain decode batches:` line in the server log"
        plain, spec = counts["plain"], counts["speculative"]
        assert isinstance(plain, dict) and isinstance(spec, dict)
        assert plain and min(plain) >= MIN_BS, plain
        assert spec and max(spec) < MIN_BS, spec
        assert counts.get("draft_prefills_skipped", 0) > 0, counts  # the bursts of 40 joined a plain batch

    def test_switch_server_decodes_at_the_plain_servers_rate_above_its_threshold(self, patched: Patched) -> None:
        base, switch = RESULTS.get("base_levels"), RESULTS.get("switch_levels")
        assert base and switch, "a server's levels are missing (its test failed)"
        ratios = {c: switch[c]["steady_decode_tok_s"] / base[c]["steady_decode_tok_s"] for c in LEVELS if c >= MIN_BS}
        save("switch-ratios.json", ratios)
        assert all(r >= 1 / 1.05 for r in ratios.values()), ratios


def _level(server: Server, concurrency: int, label: str) -> dict[str, Any]:
    level = bench_level(server, "sglang", concurrency, f"{label}-c{concurrency}")
    return {
        "concurrency": concurrency,
        "throughput_tok_s": level.record["throughput_tok_s"],
        "errors": level.record["errors"],
        "accept_length": level.record.get("accept_length"),
        "steady_decode_tok_s": None if level.view is None else level.view.gen_tok_s,
        "server_log_tok_s": None if level.rate is None else level.rate.tok_s,
    }
