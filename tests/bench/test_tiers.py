"""The tier builder (sm120check.bench.tiers, `crossover --more-spec`) on the real SGLang 0.5.16 sweeps of the H200
(tests/fixtures/bench/h200-sglang-0.5.16-run2-*: base and EAGLE-3 at 3 steps over C=1-250, EAGLE-3 at 7 steps over
C=1-5), and on trees with and without the speculation switch (the real 0.5.23 wheel, patched with --plain-decode)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from lab.sglang_releases import release_dir, run_cli
from sm120check.bench import tiers
from sm120check.bench.records import read_jsonl
from sm120check.cli import main

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "bench"
BASE = FIXTURES / "h200-sglang-0.5.16-run2-base.jsonl"
SPEC = FIXTURES / "h200-sglang-0.5.16-run2-spec.jsonl"
SPEC7 = FIXTURES / "h200-sglang-0.5.16-run2-spec-7.jsonl"


def sweep(path: Path, steps: int) -> tiers.Sweep:
    return tiers.Sweep(path.name, steps, {r.concurrency: r.throughput_tok_s for r in read_jsonl(path)})


def real() -> list[tiers.Sweep]:
    return [sweep(BASE, 0), sweep(SPEC, 3), sweep(SPEC7, 7)]


def test_the_winner_at_each_level_is_the_measured_best() -> None:
    plan = tiers.plan(real(), switch=True)
    winners = {lv.level: lv.steps for lv in plan.levels}
    # 7 steps measured at C=1-5 only and won there; 3 steps at 10 and 30; the plain server from 70 to 100
    assert winners[1] == winners[2] == winners[5] == 7
    assert winners[10] == 3
    assert winners[70] == winners[100] == 0
    for lv in plan.levels:
        assert lv.tok_s == max(lv.measured.values())
        assert 7 not in lv.measured or lv.level <= 5  # steps only where a sweep measured them


def test_without_the_switch_no_plain_tier_and_the_reason() -> None:
    plan = tiers.plan(real(), switch=False)
    assert all(lv.steps != tiers.PLAIN for lv in plan.levels)
    assert all(t.steps != tiers.PLAIN for t in plan.tiers)
    assert any("no speculation switch" in n for n in plan.notes)
    assert tiers.static_launch(plan).plain_from is None


def test_sglang_file_has_one_candidate_slots_from_batch_1() -> None:
    config = tiers.sglang_config(tiers.plan(real(), switch=True))
    assert next(iter(config)) == "1"
    assert all(len(slot["candidate_steps"]) == 1 for slot in config.values())
    assert config["1"] == {"candidate_steps": [7]}


def test_static_launch_names_the_levels_it_cannot_realise() -> None:
    plan = tiers.plan(real(), switch=True)
    launch = tiers.static_launch(plan)
    assert launch.steps == 7
    assert plan.plain_from is not None and launch.plain_from is not None and launch.plain_from <= plan.plain_from
    for lv in plan.levels:
        if tiers.launched(launch.steps, launch.plain_from, lv.level) != lv.steps:
            assert lv.level in launch.lost


@pytest.mark.parametrize(
    ("sweeps", "message"),
    [
        ([tiers.Sweep("a", 3, {1: 1.0})], "one plain"),
        ([tiers.Sweep("b", 0, {1: 1.0}), tiers.Sweep("s", 3, {1: 1.0}), tiers.Sweep("t", 3, {1: 2.0})], "both"),
        ([tiers.Sweep("b", 0, {1: 1.0}), tiers.Sweep("s", -1, {1: 1.0})], "draft steps -1"),
        ([tiers.Sweep("b", 0, {1: float("nan")}), tiers.Sweep("s", 3, {1: 1.0})], "no usable throughput"),
        ([tiers.Sweep("b", 0, {1: -1.0}), tiers.Sweep("s", 3, {1: 1.0})], "b: levels \\[1\\] have no usable"),
        ([tiers.Sweep("b", 0, {1: 1.0}), tiers.Sweep("s", 3, {1: float("inf")})], "s: levels \\[1\\] have no usable"),
        ([tiers.Sweep("b", 0, {0: 1.0}), tiers.Sweep("s", 3, {1: 1.0})], "b: levels \\[0\\] have no usable"),
        ([tiers.Sweep("b", 0, {}), tiers.Sweep("s", 3, {1: 1.0})], "b: no measured level"),  # was an empty plan
        ([tiers.Sweep("b", 0, {1: 1.0}), tiers.Sweep("s", 3, {})], "s: no measured level"),
    ],
)
def test_sweeps_that_cannot_combine_are_refused(sweeps: list[tiers.Sweep], message: str) -> None:
    with pytest.raises(tiers.TierError, match=message):
        tiers.plan(sweeps, switch=True)


def _switched_tree(tmp_path: Path, switch: bool) -> Path:
    tree = tmp_path / "sglang"
    shutil.copytree(release_dir("0.5.23") / "sglang", tree)
    if switch:
        args = ("--cc", "12.0", "--flashinfer-version", "0.7.2", "--plain-decode", "--json")
        assert run_cli("patch", "--source", str(tree), *args)[0] == 0
    return tree


@pytest.mark.slow
@pytest.mark.parametrize("switch", [True, False])
def test_crossover_more_spec_writes_tiers_from_the_trees_patch_state(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], switch: bool
) -> None:
    tree = _switched_tree(tmp_path, switch)
    out = tmp_path / "policies"
    args = ["crossover", str(BASE), str(SPEC), "--more-spec", str(SPEC7), "--sglang-source", str(tree)]
    status = main([*args, "--write-policies", str(out), "--no-png", "--format", "json"])
    assert status == 0
    report = json.loads(capsys.readouterr().out)["tiers"]
    assert report["switch"] is switch
    config = json.loads((out / tiers.TIERS_FILE).read_text())
    static = json.loads((out / tiers.STATIC_FILE).read_text())
    assert config == report["sglang_config"]
    assert static["speculative_num_steps"] == 7
    has_plain = any(slot["candidate_steps"] == [0] for slot in config.values())
    assert has_plain is switch
    assert ("SGLANG_SM120KIT_PLAIN_DECODE_MIN_BS" in static["environment"]) is switch
    assert oct((out / tiers.TIERS_FILE).stat().st_mode & 0o777) == "0o644"


def test_crossover_more_spec_refuses_a_sweep_without_its_draft_steps(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bare = tmp_path / "bare.jsonl"
    rows = [json.loads(line) for line in SPEC7.read_text().splitlines() if line.strip()]
    for row in rows:
        row.pop("server", None)
    bare.write_text("".join(json.dumps(r) + "\n" for r in rows))
    status = main(["crossover", str(BASE), str(SPEC), "--more-spec", str(bare), "--sglang-source", str(tmp_path)])
    assert status == 2
    assert "draft steps" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("version", ["0.5.16", "0.5.23"])
def test_sglangs_own_slots_keep_the_tiers_whatever_the_acceptance(tmp_path: Path, version: str) -> None:
    """The tiers file in SGLang's own adaptive code (the release's adaptive_spec_params.py, tests/bench/engine_rules):
    its loader takes it, and a one-candidate slot never moves, a [0] slot included, however the drafts fare."""
    from bench.engine_rules import sglang_release

    config = tiers.sglang_config(tiers.plan(real(), switch=True))
    path = tmp_path / tiers.TIERS_FILE
    path.write_text(json.dumps(config))
    release = sglang_release(version)
    top = max(t.steps for t in tiers.plan(real(), switch=True).tiers)
    params = release.adaptive_params(top, str(path))
    for start, slot in config.items():
        batch = int(start)
        want = slot["candidate_steps"][0]
        for correct in (0, top, 0, top):  # every draft rejected, then every draft accepted, for many batches
            for _ in range(100):
                params.on_verify_complete([correct] * batch, batch_size=batch)
            assert params.get_steps_for_batch(batch) == want, (version, batch, correct)


def test_the_switch_threshold_follows_the_launchs_own_depth_where_another_depth_won_below_the_plain_tier() -> None:
    """The H100 envelope at draft error 0.3 (docs/validation/2026-12-07-h100-envelope-accept-3): 3 steps win at
    C=1-2, 7 steps at C=5, plain from C=10. The static launch runs 3 steps, which already lost to plain at C=5, so
    its crossing with plain lies between C=2 and C=5 (near 3), not between 5 and 10: a threshold of 10 left the
    batches of 3-9 speculating at 3 steps, slower than plain there, and every batch of 9 at level 10."""
    levels = (1, 2, 5, 10, 30, 70, 100, 250)

    def sweep(name: str, steps: int, tok_s: tuple[float, ...]) -> tiers.Sweep:
        return tiers.Sweep(name, steps, dict(zip(levels, tok_s, strict=True)))

    base = sweep("base", 0, (355.9, 686.8, 1550.1, 2776.6, 5692.0, 7644.0, 8708.9, 8617.0))
    spec3 = sweep("spec-3", 3, (426.4, 815.3, 1247.6, 2438.0, 3713.4, 6244.9, 6323.0, 7987.9))
    spec7 = sweep("spec-7", 7, (391.2, 738.8, 1589.5, 2437.4, 5124.8, 6802.4, 6704.6, 7873.9))
    plan = tiers.plan([base, spec3, spec7], switch=True)
    assert plan.plain_from == 10
    assert [(t.start, t.steps) for t in plan.tiers] == [(1, 3), (5, 7), (10, 0)]
    launch = tiers.static_launch(plan)
    assert (launch.steps, launch.plain_from, launch.lost) == (3, 3, (5,))
    assert tiers.render_lines(plan, launch)[-1] == (
        "  static launch: 3 steps, plain decode from batch 3; not realised at C=5 (7 steps won, it runs plain)"
    )
    # the depth wins again just below the plain tier: the crossing between that level and the plain tier, as before
    spec3_late = tiers.Sweep("spec-3", 3, {**spec3.tok_s, 5: 1600.0})
    assert tiers.static_launch(tiers.plan([base, spec3_late, spec7], switch=True)).plain_from == 6
    # the depth never beats plain below the plain tier where both were measured: the first plain level
    never = tiers.Sweep("spec-3", 3, {10: 2438.0, 30: 3713.4})
    only = tiers.plan([base, never, spec7], switch=True)
    assert tiers.static_launch(only).steps == 7


def test_the_switch_threshold_is_the_interpolated_crossing_not_the_first_plain_level() -> None:
    """The H100 envelope run (docs/validation/2026-12-06-h100-envelope): 7 steps win by 2 % at C=30, plain by 24 %
    at C=70; a threshold of 70 left every batch of 46-69 at level 70 speculating. The curves cross near 33."""
    base = tiers.Sweep("base", 0, {1: 350.1, 10: 3009.0, 30: 7524.1, 70: 12607.9, 100: 14627.0})
    spec = tiers.Sweep("spec-7", 7, {1: 606.5, 10: 3969.5, 30: 7678.4, 70: 10176.2, 100: 10391.6})
    plan = tiers.plan([base, spec], switch=True)
    assert plan.plain_from == 70
    launch = tiers.static_launch(plan)
    assert launch.plain_from == 33 and launch.lost == ()
    assert tiers.static_json(launch)["environment"] == {"SGLANG_SM120KIT_PLAIN_DECODE_MIN_BS": "33"}
    # a crossing at 1.5 rounds up to the first plain level
    only_plain = tiers.plan([tiers.Sweep("b", 0, {1: 5.0, 2: 9.0}), tiers.Sweep("s", 3, {1: 6.0, 2: 8.0})], True)
    assert tiers.static_launch(only_plain).plain_from == 2
    # a depth the level below did not measure: no crossing to draw, the first plain level
    gap = tiers.plan(
        [tiers.Sweep("b", 0, {1: 5.0, 2: 9.0}), tiers.Sweep("s", 3, {2: 8.0}), tiers.Sweep("t", 7, {1: 6.0})], True
    )
    assert tiers.static_launch(gap).plain_from == 2
