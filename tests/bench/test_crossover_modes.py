"""Crossover on other axes: offered request rate (open-loop levels) and goodput against SLOs, with records as
today's files hold them (new fields under their JSON keys) and as typed fields once records.py has them; and
speculation the server did not report is unknown, not "off" (real-engine.md defect 5)."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

from sm120check.bench.crossover import (
    Point,
    analyze,
    analyze_mode,
    compare_points,
    level_goodput,
    level_mode,
    speculation_reported,
)
from sm120check.bench.goodput import Goodput, Slo
from sm120check.bench.records import LevelSummary, RecordError, append_jsonl, read_jsonl

RATES = (1.0, 2.0, 4.0, 8.0, 16.0)
LEVELS = (1, 2, 4, 8, 16, 32)
SPEC_SERVER: dict[str, object] = {"speculative_algorithm": "EAGLE3", "speculative_num_steps": 3}
BASE_SERVER: dict[str, object] = {"speculative_algorithm": None, "speculative_num_steps": None}


def ratio(x: float, x0: float) -> float:
    """spec/base as a power law in x: log-log interpolation finds its crossing at x0 exactly."""
    return float((x0 / x) ** 0.25)


def level(
    c: int,
    throughput: float,
    run_id: str,
    server: dict[str, object],
    *,
    rate: float | None = None,
    goodput: Goodput | None = None,
) -> LevelSummary:
    """A record as bench writes it; the open-loop fields go where this records.py keeps them (typed fields once
    it has them, else their JSON keys, which is where reading a file puts them today)."""
    meta: dict[str, object] = {"server": server}
    extra: dict[str, object] = {}
    fields = {f.name for f in dataclasses.fields(LevelSummary)}
    new = {"mode": "open" if rate is not None else "closed", "request_rate": rate, "goodput": goodput}
    for key, value in new.items():
        if key in fields:
            extra[key] = value
        elif value is not None:
            meta[key] = value.to_json() if isinstance(value, Goodput) else value
    return LevelSummary(c, throughput, 10.0, int(throughput * 10), 40, 0, "", run_id, meta=meta, **extra)  # type: ignore[arg-type]


def goodput_of(good_per_s: float, tokens_per_good: int = 100) -> Goodput:
    good = round(good_per_s * 100)
    return Goodput(
        Slo(ttft=0.5, tpot=0.05), 100.0, max(good, 1) + 5, good, good * tokens_per_good, {"ttft": good, "tpot": good}
    )


def test_request_rate_crossover_is_found_where_the_open_loop_throughput_ratio_crosses_1() -> None:
    base, spec = [], []
    for run_id, scale in (("r1", 1.01), ("r2", 0.99)):
        for r in RATES:
            served = 50.0 * r
            base.append(level(4, served * scale, run_id, BASE_SERVER, rate=r))
            spec.append(level(4, served * ratio(r, 5.0) / scale, run_id, SPEC_SERVER, rate=r))
    result = analyze_mode(base, spec, ("base", "spec"), x_axis="rate", metric="throughput")
    assert result.crossover.status == "found" and result.crossover.value == pytest.approx(5.0, rel=0.01)
    assert [lv.x for lv in result.levels] == list(RATES) and (result.base_runs, result.spec_runs) == (2, 2)
    # four run pairs give a spread around the crossover
    c = result.crossover
    assert c.pairs == 4 and c.low is not None and c.high is not None and c.low < 5.0 < c.high
    assert "5 req/s" in c.message and not result.warnings
    text = result.render_text(("base", "spec"))
    assert "| rate (req/s) | base | spec | spec/base |" in text and c.message in text
    assert result.to_json()["crossover"]["value"] == pytest.approx(c.value)  # type: ignore[index]


def test_goodput_crossover_on_concurrency_and_on_token_goodput() -> None:
    base = [level(c, 100.0 * c, "r", BASE_SERVER, goodput=goodput_of(c)) for c in LEVELS]
    spec = [level(c, 100.0 * c, "r", SPEC_SERVER, goodput=goodput_of(c * ratio(c, 12.0))) for c in LEVELS]
    result = analyze_mode(base, spec, ("b", "s"), x_axis="concurrency", metric="goodput")
    assert result.crossover.status == "found"
    assert result.crossover.value == pytest.approx(12.0, rel=0.03)  # good counts are whole requests: rounded
    assert "C=1" in result.crossover.message and result.crossover.low is None  # one run: no spread
    tokens = analyze_mode(base, spec, ("b", "s"), x_axis="concurrency", metric="token-goodput")
    assert tokens.crossover.value == pytest.approx(result.crossover.value)
    # throughput never crosses here: the same records say so on the throughput metric
    flat = analyze_mode(base, spec, ("b", "s"), metric="throughput")
    assert flat.crossover.status == "below-range"


def test_files_written_today_carry_the_new_fields_through_a_round_trip(tmp_path: Path) -> None:
    base_path, spec_path = tmp_path / "base.jsonl", tmp_path / "spec.jsonl"
    append_jsonl(base_path, [level(4, 50.0 * r, "x", BASE_SERVER, rate=r, goodput=goodput_of(r)) for r in RATES])
    append_jsonl(
        spec_path,
        [level(4, 50.0 * r, "x", SPEC_SERVER, rate=r, goodput=goodput_of(r * ratio(r, 3.0))) for r in RATES],
    )
    base, spec = read_jsonl(base_path), read_jsonl(spec_path)
    assert all(level_mode(r) == "open" for r in base)
    assert level_goodput(base[0], "here") == goodput_of(1.0)
    result = analyze_mode(base, spec, ("base", "spec"), x_axis="rate", metric="goodput")
    assert result.crossover.status == "found" and result.crossover.value == pytest.approx(3.0, rel=0.05)


def test_the_concurrency_axis_leaves_open_loop_levels_out_and_says_which_axis_fits() -> None:
    opened = [level(4, 50.0 * r, "o", SPEC_SERVER, rate=r) for r in RATES]
    closed_base = [level(c, 100.0 * c, "c", BASE_SERVER) for c in LEVELS]
    closed_spec = [level(c, 100.0 * c * ratio(c, 8.0), "c", SPEC_SERVER) for c in LEVELS]
    with pytest.raises(RecordError, match=r"only open-loop .* rate axis"):
        analyze(opened, opened, ("a", "b"))
    mixed = analyze(closed_base, [*closed_spec, *opened], ("base", "spec"))
    assert mixed.crossover.value == pytest.approx(8.0, rel=0.01)
    assert any("5 open-loop level(s) left out" in w for w in mixed.warnings)
    with pytest.raises(RecordError, match="share 0 rate level"):  # closed-loop levels are not on the rate axis
        analyze_mode(closed_base, closed_spec, ("base", "spec"), x_axis="rate")


def test_levels_without_what_the_axis_needs_are_refused_with_the_flag_to_add() -> None:
    closed_base = [level(c, 100.0 * c, "c", BASE_SERVER) for c in LEVELS]
    closed_spec = [level(c, 90.0 * c, "c", SPEC_SERVER) for c in LEVELS]
    with pytest.raises(RecordError, match=r"share 0 rate level.*same --request-rate"):
        analyze_mode(closed_base, closed_spec, ("base", "spec"), x_axis="rate")
    with pytest.raises(RecordError, match="same --concurrency and --slo"):
        analyze_mode(closed_base, closed_spec, ("base", "spec"), metric="goodput")
    with pytest.raises(RecordError, match="give x in"):
        analyze_mode(closed_base, closed_spec, ("base", "spec"), x_axis="batch")
    inf = [level(4, 100.0, "c", BASE_SERVER, rate=math.inf)] * 2
    with pytest.raises(RecordError, match="share 0"):
        analyze_mode(inf, inf, ("a", "b"), x_axis="rate")


def test_a_hostile_goodput_entry_is_a_record_error_naming_the_record() -> None:
    bad = dataclasses.replace(level(1, 10.0, "c", BASE_SERVER), meta={"goodput": {"slo_s": {"ttft": "x"}}})
    with pytest.raises(RecordError, match=r"base record 1: .*goodput.slo_s.ttft"):
        analyze_mode([bad, bad], [bad, bad], ("base", "spec"), metric="goodput")


def test_points_that_cannot_be_used_are_left_out_with_a_warning() -> None:
    base = [Point("r", x, 10.0 * x) for x in (1.0, 2.0, 4.0)] + [Point("r", 8.0, math.nan)]
    spec = [Point("r", x, 12.0 * x * ratio(x, 3.0)) for x in (1.0, 2.0, 4.0, 8.0)]
    result = compare_points(base, spec, ("b", "s"), "rate", "throughput")
    assert [lv.x for lv in result.levels] == [1.0, 2.0, 4.0]
    assert "accept length" not in result.render_text(("b", "s"))  # no histograms: no column
    assert any("not usable" in w for w in result.warnings) and any("only one sweep" in w for w in result.warnings)


@pytest.mark.parametrize(
    ("server", "said", "warned"),
    [
        ({}, None, False),  # llama.cpp: no server info at all
        ({"engine": "llama.cpp", "speculative": None}, None, False),  # normalized, engine does not say
        ({"engine": "sglang", "speculative": False, "speculative_algorithm": None}, False, True),
        ({"speculative_algorithm": None}, False, True),  # an older file from SGLang, which reports it
        ({"engine": "vllm", "speculative": True, "speculative_num_steps": 8}, True, False),
        (SPEC_SERVER, True, False),
    ],
)
def test_speculation_the_server_did_not_report_is_unknown_not_off(
    server: dict[str, object], said: bool | None, warned: bool
) -> None:
    base = [level(c, 100.0 * c, "c", BASE_SERVER) for c in LEVELS]
    spec = [level(c, 100.0 * c * ratio(c, 8.0), "c", server) for c in LEVELS]
    assert speculation_reported(spec[0])[0] is said
    analysis = analyze(base, spec, ("base", "spec"))
    assert analysis.spec_reported is said
    assert any("without speculation" in w for w in analysis.warnings) is warned
    assert not any("with speculation on" in w for w in analysis.warnings)


def test_a_base_sweep_on_a_speculative_server_is_still_warned_about() -> None:
    base = [level(c, 100.0 * c, "c", {"engine": "vllm", "speculative": True}) for c in LEVELS]
    spec = [level(c, 100.0 * c * ratio(c, 8.0), "c", SPEC_SERVER) for c in LEVELS]
    warnings = analyze(base, spec, ("base", "spec")).warnings
    assert any("base was measured on a server with speculation on (speculative: true)" in w for w in warnings)


def test_per_request_accept_histograms_are_shown_when_the_records_have_them() -> None:
    base = [Point(run, x, 10.0 * x) for run in ("r1", "r2") for x in (1.0, 2.0)]
    spec = [Point(run, x, 11.0 * x, ((1.5, 2), (2.0, 3))) for run in ("r1", "r2") for x in (1.0, 2.0)]
    result = compare_points(base, spec, ("b", "s"), "rate", "throughput")
    assert result.levels[0].accept_hist == ((1.5, 4), (2.0, 6))  # summed over the spec sweep's runs
    assert "| 1 | 10 +- 0 | 11 +- 0 | 1.100 | 1.5+:4 2+:6 |" in result.render_text(("b", "s"))
