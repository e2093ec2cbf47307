"""bench/metrics.py reads what llama.cpp and vLLM serve at /metrics as prometheus_client's own parser does, skips
what is not a sample (naming it), bounds the input, and differences the speculative counters per level."""

from __future__ import annotations

import math

import pytest
from prometheus_client.parser import text_string_to_metric_families

from sm120check.bench.metrics import MAX_BYTES, MetricsError, Scrape, draft_positions, family_for, parse, spec_delta

# llama-server 0c1e57098 --metrics with a draft model, after some requests: the shape of
# server_task_result_metrics::to_metrics (server-task.cpp), counts from real-engine.md's SPEC server
LLAMACPP = """# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed, excluding cached tokens
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 7835
# HELP llamacpp:prompt_tokens_cached_total Number of prompt tokens reused from the cache
# TYPE llamacpp:prompt_tokens_cached_total counter
llamacpp:prompt_tokens_cached_total 94200
# HELP llamacpp:tokens_predicted_total Number of generation tokens processed
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total 4096
# HELP llamacpp:spec_decode_num_draft_tokens_total Speculative: Total draft tokens generated
# TYPE llamacpp:spec_decode_num_draft_tokens_total counter
llamacpp:spec_decode_num_draft_tokens_total 3584
# HELP llamacpp:spec_decode_num_accepted_tokens_total Speculative: Total draft tokens accepted by the target model
# TYPE llamacpp:spec_decode_num_accepted_tokens_total counter
llamacpp:spec_decode_num_accepted_tokens_total 1644
# HELP llamacpp:spec_decode_num_drafts_total Speculative: Total speculative decoding verification steps
# TYPE llamacpp:spec_decode_num_drafts_total counter
llamacpp:spec_decode_num_drafts_total 448
# HELP llamacpp:predicted_tokens_seconds Average generation throughput in tokens/s
# TYPE llamacpp:predicted_tokens_seconds gauge
llamacpp:predicted_tokens_seconds 137.25
# HELP llamacpp:requests_processing Number of requests processing
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 0
# HELP llamacpp:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens per draft position
# TYPE llamacpp:spec_decode_num_accepted_tokens_per_pos_total counter
""" + "".join(
    f'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{{position="{i}"}} {400 - 40 * i}\n' for i in range(8)
)

# vLLM 0.11-style exposition: labels, escapes, a histogram, exponent notation, NaN, a timestamp
VLLM = r"""# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="Qwen/Qwen3-8B"} 0.0
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="Qwen/Qwen3-8B"} 1.2e+03
# HELP vllm:spec_decode_num_accepted_tokens_total Number of accepted tokens.
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="Qwen/Qwen3-8B"} 2400.0
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="Qwen/Qwen3-8B"} 3600.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="Qwen/Qwen3-8B",position="0"} 1000.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="Qwen/Qwen3-8B",position="1"} 800.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="Qwen/Qwen3-8B",position="2"} 600.0
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{le="0.3",model_name="Qwen/Qwen3-8B"} 3.0
vllm:e2e_request_latency_seconds_bucket{le="+Inf",model_name="Qwen/Qwen3-8B"} 10.0
vllm:e2e_request_latency_seconds_sum{model_name="Qwen/Qwen3-8B"} 4.5
vllm:e2e_request_latency_seconds_count{model_name="Qwen/Qwen3-8B"} 10.0
vllm:cache_config_info{block_size="16",note="a \"quoted\" back\\slash\nnewline"} 1.0
vllm:gpu_prefix_cache_hit_rate NaN 1700000000000
"""


def reference(text: str) -> list[tuple[str, tuple[tuple[str, str], ...], float]]:
    out = []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.append((s.name, tuple(sorted(s.labels.items())), s.value))
    return out


def ours(scrape: Scrape) -> list[tuple[str, tuple[tuple[str, str], ...], float]]:
    return [(s.name, tuple(sorted(s.labels)), s.value) for s in scrape.samples]


def same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


@pytest.mark.parametrize("text", [LLAMACPP, VLLM], ids=["llama.cpp", "vllm"])
def test_samples_match_prometheus_clients_parser(text: str) -> None:
    scrape = parse(text)
    assert scrape.problems == () and scrape.skipped == 0
    mine, theirs = sorted(ours(scrape), key=repr), sorted(reference(text), key=repr)
    assert [(n, lab) for n, lab, _ in mine] == [(n, lab) for n, lab, _ in theirs]
    assert all(same(a[2], b[2]) for a, b in zip(mine, theirs, strict=True))


def test_label_escapes_are_decoded_like_prometheus_client() -> None:
    scrape = parse(VLLM)
    (info,) = scrape.series("vllm:cache_config_info")
    assert dict(info.labels)["note"] == 'a "quoted" back\\slash\nnewline'


def test_bad_lines_are_skipped_and_named_not_guessed() -> None:
    text = 'good 1\nbad{label="x" 2\nworse 1 2 3\n{x="1"} 4\nnan_value abc\nalso_good{a="b"} 5\n'
    scrape = parse(text)
    assert [(s.name, s.value) for s in scrape.samples] == [("good", 1.0), ("also_good", 5.0)]
    assert scrape.skipped == 4 and scrape.problems[0].startswith("line 2:")


def test_oversized_or_binary_bodies_are_refused() -> None:
    with pytest.raises(MetricsError, match="above the"):
        parse("x 1\n" * (MAX_BYTES // 4 + 1))
    with pytest.raises(MetricsError, match="not UTF-8"):
        parse(b"x 1\n\xff\xfe")


def test_llamacpp_level_accept_length_is_the_counters_growth() -> None:
    family = family_for("llama.cpp")
    assert family is not None
    before = parse(LLAMACPP)
    after = parse(
        LLAMACPP.replace("accepted_tokens_total 1644", "accepted_tokens_total 2044").replace(
            "drafts_total 448", "drafts_total 548"
        )
    )
    delta = spec_delta(family, before, after)
    assert delta.spec is not None and delta.spec.accept_length == pytest.approx(1 + 400 / 100)
    assert draft_positions(family, after) == 8


def test_vllm_counters_summed_over_engines_and_a_restart_is_a_problem() -> None:
    family = family_for("vllm")
    assert family is not None
    scrape = parse(VLLM)
    assert scrape.value(family.steps) == 1200.0 and draft_positions(family, scrape) == 3
    restarted = parse(VLLM.replace("1.2e+03", "10"))
    delta = spec_delta(family, scrape, restarted)
    assert delta.spec is None and "went down" in delta.problems[0]
    assert spec_delta(family, scrape, scrape).spec is None  # nothing drafted during the level: no value
