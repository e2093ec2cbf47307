"""Goodput against SLOs, counted on hand-built request records (no server, no clock)."""

from __future__ import annotations

import json
import math

import pytest

from sm120check.bench.closedloop import RequestRecord
from sm120check.bench.goodput import Goodput, GoodputError, Slo, compute_goodput, observed_latency


def rec(
    scheduled: float, first: float | None, end: float, tokens: int = 10, *, warmup: bool = False, **kw: object
) -> RequestRecord:
    """A request with `tokens` tokens spread evenly from `first` to `end`."""
    if first is None or tokens == 0:
        chunks: tuple[tuple[float, int], ...] = ()
    elif tokens == 1:
        chunks = ((first, 1),)
    else:
        step = (end - first) / (tokens - 1)
        chunks = tuple((first + i * step, 1) for i in range(tokens))
    return RequestRecord(warmup, scheduled, scheduled, end, first, chunks, **kw)  # type: ignore[arg-type]


def test_slo_parser_reads_seconds_and_refuses_bad_input_with_the_fix() -> None:
    assert Slo.parse("ttft=0.5,tpot=0.05,e2e=10") == Slo(0.5, 0.05, 10.0)
    assert Slo.parse(" TTFT = 0.25s ") == Slo(ttft=0.25)
    assert Slo.parse("e2el=3") == Slo(e2e=3.0)  # SGLang's and vLLM's name for it
    for text, words in [
        ("", "names no SLO"),
        ("ttft", "not KEY=SECONDS"),
        ("ttft:500", "milliseconds"),
        ("itl=0.1", "unknown SLO 'itl'"),
        ("ttft=1,ttft=2", "given twice"),
        ("ttft=fast", "not a number"),
        ("ttft=0", "above 0"),
        ("tpot=-1", "above 0"),
        ("e2e=inf", "finite"),
        ("e2e=nan", "finite"),
    ]:
        with pytest.raises(GoodputError, match=words) as info:
            Slo.parse(text)
        assert "--slo" in str(info.value) or "keys are" in str(info.value) or "once" in str(info.value)


def test_latencies_are_those_summarize_and_sglang_use() -> None:
    r = rec(1.0, 1.5, 3.5, tokens=5)
    assert observed_latency(r) == pytest.approx({"ttft": 0.5, "tpot": 0.5, "e2e": 2.5})
    # one token: TPOT 0 (SGLang's and vLLM's rule)
    assert observed_latency(rec(0.0, 0.2, 0.2, tokens=1))["tpot"] == 0.0


def test_a_request_counts_only_when_it_meets_every_slo_given() -> None:
    slo = Slo(ttft=0.5, tpot=0.1, e2e=2.0)
    records = [
        rec(0.0, 0.2, 1.0, tokens=10),  # ttft 0.2, tpot 0.089, e2e 1.0: good
        rec(0.0, 0.6, 1.5, tokens=10),  # ttft too slow
        rec(0.0, 0.2, 2.0, tokens=10),  # tpot 0.2 too slow
        rec(0.0, 0.1, 2.5, tokens=100),  # tpot fine, e2e too slow
        rec(0.0, 0.1, 0.5, tokens=5),  # good
    ]
    g = compute_goodput(slo, records, 0.0, 10.0)
    assert (g.finished, g.good, g.good_tokens) == (5, 2, 15)
    assert dict(g.met) == {"ttft": 4, "tpot": 4, "e2e": 4}
    assert g.request_goodput == pytest.approx(0.2) and g.token_goodput == pytest.approx(1.5)
    assert g.attainment == pytest.approx(0.4)
    # only the SLOs given are checked
    assert compute_goodput(Slo(ttft=0.5), records, 0.0, 10.0).good == 4


def test_errors_untrusted_counts_and_cut_requests_are_never_good_and_the_window_bounds_the_count() -> None:
    slo = Slo(e2e=5.0)
    records = [
        rec(1.0, 1.1, 2.0),  # good
        rec(1.0, None, 1.2, tokens=0, error="HTTP 500"),  # finished, failed: counts against attainment
        rec(1.0, 1.1, 2.0, anomalies=("more tokens than asked",)),  # finished, untrusted: not good
        rec(1.0, 1.1, 2.0, cut=True),  # did not finish: not counted at all
        rec(0.0, 0.1, 0.5, warmup=True),  # ended before the window: not counted
        rec(8.0, 8.1, 12.0),  # ends after the window: not counted
        rec(0.5, 0.6, 3.0, warmup=True),  # a warm-up (or tail) request that finished inside the window counts
    ]
    g = compute_goodput(slo, records, 1.0, 11.0)
    assert (g.finished, g.good, g.good_tokens) == (4, 2, 20)
    assert g.window_s == pytest.approx(10.0) and g.request_goodput == pytest.approx(0.2)


def test_without_a_window_goodput_covers_the_measured_span() -> None:
    records = [rec(2.0, 2.1, 3.0), rec(2.5, 2.6, 6.0)]
    g = compute_goodput(Slo(e2e=10), records, None, None)
    assert g.window_s == pytest.approx(4.0) and g.good == 2
    empty = compute_goodput(Slo(e2e=10), [], None, None)
    assert empty.request_goodput == 0.0 and empty.attainment is None


def test_json_round_trip_is_strict_and_recomputes_the_rates() -> None:
    g = compute_goodput(Slo(ttft=0.5, e2e=2.0), [rec(0.0, 0.2, 1.0), rec(0.0, 0.9, 1.0)], 0.0, 4.0)
    data = json.loads(json.dumps(g.to_json()))
    assert data["request_goodput"] == pytest.approx(0.25) and data["slo_s"] == {"ttft": 0.5, "e2e": 2.0}
    back = Goodput.from_json(data, "f.jsonl:3")
    assert back == g
    # a file's own rate is not trusted: it is recomputed from the counts
    assert Goodput.from_json({**data, "request_goodput": 1e9}, "f").request_goodput == pytest.approx(0.25)
    hostile = [
        ("not an object", "must be an object"),
        ({**data, "slo_s": {"ttft": "fast"}}, "goodput.slo_s.ttft"),
        ({**data, "slo_s": {"itl": 1}}, "unknown key"),
        ({**data, "slo_s": {}}, "no SLO given"),
        ({**data, "slo_s": {"ttft": -1}}, "above 0"),
        ({**data, "window_s": math.inf}, "goodput.window_s"),
        ({**data, "window_s": -1}, "negative"),
        ({**data, "good": -1}, "goodput.good"),
        ({**data, "good": 3}, "exceeds finished"),
        ({**data, "finished": True}, "goodput.finished"),
        ({**data, "met": {"tpot": 1}}, "not one of its SLOs"),
        ({**data, "met": {"ttft": 0}}, "exceeds a per-SLO count"),
        ({**data, "met": [1]}, "goodput.met must be an object"),
    ]
    for bad, words in hostile:
        with pytest.raises(GoodputError, match=words) as info:
            Goodput.from_json(bad, "f.jsonl:3")
        assert str(info.value).startswith("f.jsonl:3: ") and not str(info.value).startswith("f.jsonl:3: f.jsonl")
