"""Issue #24 on a real SGLang 0.5.16 server: the account's sweep (base and EAGLE-3), the policy `sm120check
crossover --write-policies` writes from it, the server restarted with that policy, and SGLang's own adaptive mode
(no file) as the anchor; one table and one PNG of the four curves.

Long (four servers, four sweeps of eight levels): not part of `sglang-server.sh gputests`; its own phase runs it
(`scripts/device/sglang-server.sh venv policy`). Not yet run on a GPU: written after the first server run
(docs/validation/2026-12-01-h200-sglang-server), from the same helpers.
"""

from __future__ import annotations

import json
import shutil
import statistics
from collections.abc import Iterator
from pathlib import Path

import pytest

from lab.sglang_gpu import LAUNCH, MARKS, OUT, Patched, Server, patch_tree, save, sm120check, start, write_models

LEVELS = (1, 2, 5, 10, 30, 70, 100, 250)  # the account's sweep
LEVEL_S = 8  # steady seconds per level (the bench's --duration)
POLICY = Path("/tmp/sm120kit-policy/sglang-spec-adaptive.json")  # rendered into tests/gpu/launch/policy.txt
ENVELOPE = 0.05  # the target: our policy within 5 % of max(base, EAGLE-3) at every level

pytestmark = MARKS


@pytest.fixture(scope="module")
def patched() -> Iterator[Patched]:
    tree = patch_tree()
    yield tree
    sm120check("sglang", "patch", "--revert")


@pytest.fixture(scope="module")
def models() -> Path:
    return write_models()


def sweep(server: Server, label: str) -> Path:
    out = OUT / f"policy-sweep-{label}.jsonl"
    levels = ",".join(map(str, LEVELS))
    run = sm120check(
        "bench", "--url", server.url, "--concurrency", levels, "--duration", str(LEVEL_S), "--input-len", "64",
        "--output-len", "128", "--label", label, "--out", str(out), "--level-timeout", "120", "--quiet",
        timeout=1800,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    return out


def throughput(path: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {int(r["concurrency"]): float(r["throughput_tok_s"]) for r in rows}


def accept_by_batch(server: Server) -> dict[int, float]:
    """The accept length per number of running requests from the server's decode lines (a stand-in for the draft
    steps per batch size, which 0.5.16 logs only as the `sglang:spec_num_steps` gauge: reading that gauge per level
    is still to do, issue #24)."""
    from sm120check.sglang import decode_log

    views = decode_log.server_view(decode_log.parse(server.lines()))
    return {c: v.accept_length for c, v in views.items() if v.accept_length is not None}


class TestCurves:
    RESULTS: dict[str, Path] = {}  # noqa: RUF012 - filled in order by the tests below

    @pytest.mark.parametrize("name", ["base", "spec"])
    def test_sweep_base_and_eagle3(self, patched: Patched, models: Path, name: str) -> None:
        for server in start(f"policy-{name}", LAUNCH / f"{name}.txt"):
            self.RESULTS[name] = sweep(server, name)
        assert set(throughput(self.RESULTS[name])) == set(LEVELS)

    def test_crossover_writes_the_policy(self) -> None:
        out = OUT / "policies"
        run = sm120check(
            "crossover", str(self.RESULTS["base"]), str(self.RESULTS["spec"]), "--write-policies", str(out),
            "--png", str(OUT / "crossover.png"), "--format", "json",
        )  # fmt: skip
        save("crossover.json", run.stdout or run.stderr)
        assert run.returncode == 0, run.stderr[-2000:]
        POLICY.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(out / POLICY.name, POLICY)
        assert json.loads(POLICY.read_text())

    @pytest.mark.parametrize("name", ["policy", "sglang-adaptive"])
    def test_sweep_with_the_policy_and_sglangs_own_adaptive_mode(
        self, patched: Patched, models: Path, name: str
    ) -> None:
        for server in start(f"policy-{name}", LAUNCH / f"{name}.txt"):
            self.RESULTS[name] = sweep(server, name)
            save(f"policy-{name}-accept-by-batch.json", accept_by_batch(server))
        assert set(throughput(self.RESULTS[name])) == set(LEVELS)

    def test_the_policy_holds_the_upper_envelope_and_beats_sglangs_adaptive(self) -> None:
        curves = {name: throughput(path) for name, path in self.RESULTS.items()}
        table = [
            {"concurrency": c, **{name: curve.get(c) for name, curve in curves.items()}}
            for c in LEVELS
        ]  # fmt: skip
        save("policy-table.json", table)
        plot(curves, OUT / "policy-curves.png")
        misses = []
        for c in LEVELS:
            envelope = max(curves["base"][c], curves["spec"][c])
            if curves["policy"][c] < (1 - ENVELOPE) * envelope:
                misses.append(f"C={c}: policy {curves['policy'][c]:.0f} < 95 % of {envelope:.0f}")
            if curves["policy"][c] < curves["sglang-adaptive"][c] * (1 - ENVELOPE):
                anchor = curves["sglang-adaptive"][c]
                misses.append(f"C={c}: policy {curves['policy'][c]:.0f} < SGLang adaptive {anchor:.0f}")
        ratio = statistics.median(curves["policy"][c] / curves["sglang-adaptive"][c] for c in LEVELS)
        save("policy-verdict.json", {"misses": misses, "median_policy_over_sglang_adaptive": ratio})
        assert not misses, misses


def plot(curves: dict[str, dict[int, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, curve in curves.items():
        xs = sorted(curve)
        ax.plot(xs, [curve[x] for x in xs], marker="o", label=name)
    ax.set_xscale("log")
    ax.set_xlabel("concurrency")
    ax.set_ylabel("output tok/s")
    ax.legend()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
