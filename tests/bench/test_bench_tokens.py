"""Tokens are counted from what the server reports, never one per streamed chunk."""

from __future__ import annotations

import json

import pytest

from sm120check.bench.apis import Api, RequestSpec, StreamFormatError, StreamTally, build_body


def sglang_event(text: str, completion_tokens: int, verify: int) -> str:
    meta = {"prompt_tokens": 7, "completion_tokens": completion_tokens, "spec_verify_ct": verify}
    return json.dumps({"text": text, "meta_info": meta})


def test_speculative_chunks_of_several_tokens_count_every_token() -> None:
    tally = StreamTally()
    # SGLang with EAGLE-3: cumulative text and counts; 3 verify steps gave 3, 1 and 4 tokens
    for i, (text, cum, verify) in enumerate([(" a b c", 3, 1), (" a b c d", 4, 2), (" a b c d e f g h", 8, 3)]):
        tally.add_event(Api.SGLANG, sglang_event(text, cum, verify), now=float(i))
    chunks, source = tally.finish()
    assert [n for _, n in chunks] == [3, 1, 4]
    assert source == "meta_info"
    assert (tally.spec_verify_ct, tally.prompt_tokens) == (3, 7)


def test_openai_final_usage_is_spread_over_chunks_by_text_length() -> None:
    tally = StreamTally()
    for i, piece in enumerate(["ab", "abcd", "ab"]):
        tally.add_event(Api.OPENAI_COMPLETIONS, json.dumps({"choices": [{"text": piece}], "usage": None}), float(i))
    tally.add_event(Api.OPENAI_COMPLETIONS, json.dumps({"choices": [], "usage": {"completion_tokens": 8}}), 3.0)
    assert tally.add_event(Api.OPENAI_COMPLETIONS, "[DONE]", 3.0)
    chunks, source = tally.finish()
    assert [n for _, n in chunks] == [2, 4, 2]
    assert source == "usage-split"


def test_openai_continuous_usage_gives_exact_per_chunk_counts() -> None:
    tally = StreamTally()
    for i, (piece, cum) in enumerate([("x", 2), ("y", 5)]):
        event = {"choices": [{"delta": {"content": piece}}], "usage": {"completion_tokens": cum, "prompt_tokens": 3}}
        tally.add_event(Api.OPENAI_CHAT, json.dumps(event), float(i))
    chunks, source = tally.finish()
    assert [n for _, n in chunks] == [2, 3]
    assert source == "usage"


def test_text_without_any_token_count_is_an_error_not_a_guess() -> None:
    tally = StreamTally()
    tally.add_event(Api.OPENAI_COMPLETIONS, json.dumps({"choices": [{"text": "hello"}]}), 0.0)
    with pytest.raises(StreamFormatError, match="no token counts"):
        tally.finish()


def test_server_error_inside_the_stream_is_reported() -> None:
    with pytest.raises(StreamFormatError, match="out of memory"):
        StreamTally().add_event(Api.OPENAI_CHAT, json.dumps({"error": {"message": "out of memory"}}), 0.0)


# llama.cpp 0c1e57098 `/v1/completions` with stream: one event per token, no usage, then this final event
# (real-engine.md, "What llama.cpp sends"; timings as server-common.cpp's server_slot_stats::to_json writes them)
LLAMACPP_FINAL = {
    "choices": [{"text": "", "index": 0, "logprobs": None, "finish_reason": "length"}],
    "created": 0,
    "model": "target",
    "system_fingerprint": "b1-0c1e57098",
    "object": "text_completion",
    "id": "cmpl-1",
    "usage": {
        "completion_tokens": 4,
        "prompt_tokens": 48,
        "total_tokens": 52,
        "prompt_tokens_details": {"cached_tokens": 47},
    },
    "timings": {"cache_n": 47, "prompt_n": 1, "predicted_n": 4, "draft_n": 6, "draft_n_accepted": 2},
}


def llamacpp_completions(pieces: list[str], final: dict[str, object]) -> StreamTally:
    tally = StreamTally()
    for i, piece in enumerate(pieces):
        event = {"choices": [{"text": piece, "index": 0, "logprobs": None, "finish_reason": None}]}
        tally.add_event(Api.OPENAI_COMPLETIONS, json.dumps(event), float(i))
    tally.add_event(Api.OPENAI_COMPLETIONS, json.dumps(final), float(len(pieces)))
    assert tally.add_event(Api.OPENAI_COMPLETIONS, "[DONE]", float(len(pieces)))
    return tally


def test_llamacpp_final_completions_usage_is_a_total_given_one_token_per_event() -> None:
    # defect 1: read as a running count, all 4 tokens went to the final (empty) event and TTFT became E2E
    chunks, source = llamacpp_completions([" a", " bcd", " e", "f"], LLAMACPP_FINAL).finish()
    assert chunks == [(0.0, 1), (1.0, 1), (2.0, 1), (3.0, 1)]
    assert source == "usage-per-event"


def test_a_final_total_other_than_the_event_count_is_spread_by_text_length() -> None:
    final = dict(LLAMACPP_FINAL, usage={"completion_tokens": 8, "prompt_tokens": 3})
    chunks, source = llamacpp_completions(["ab", "abcd", "ab"], final).finish()
    assert [n for _, n in chunks] == [2, 4, 2] and source == "usage-split"


def test_llamacpp_timings_give_cached_prompt_and_drafted_tokens() -> None:
    tally = llamacpp_completions([" a", " b", " c", " d"], LLAMACPP_FINAL)
    assert (tally.prompt_tokens, tally.cached_prompt_tokens) == (48, 47)
    assert (tally.draft_tokens, tally.draft_accepted) == (6, 2)


def test_openai_cached_tokens_are_read_from_usage_details() -> None:
    tally = StreamTally()
    tally.add_event(Api.OPENAI_CHAT, json.dumps({"choices": [{"delta": {"content": "x"}}]}), 0.0)
    usage = {"completion_tokens": 1, "prompt_tokens": 10, "prompt_tokens_details": {"cached_tokens": 6}}
    tally.add_event(Api.OPENAI_CHAT, json.dumps({"choices": [], "usage": usage}), 1.0)
    assert tally.cached_prompt_tokens == 6 and tally.finish() == ([(0.0, 1)], "usage-per-event")


def test_continuous_usage_with_a_final_event_stays_a_running_count() -> None:
    # vLLM with continuous_usage_stats: every event has usage, the last one a finish_reason too
    tally = StreamTally()
    for i, (piece, cum, finish) in enumerate([("ab", 2, None), ("cd", 5, "length")]):
        event = {"choices": [{"text": piece, "finish_reason": finish}], "usage": {"completion_tokens": cum}}
        tally.add_event(Api.OPENAI_COMPLETIONS, json.dumps(event), float(i))
    assert tally.finish() == ([(0.0, 2), (1.0, 3)], "usage")


def test_cache_prompt_is_sent_only_when_set_and_never_to_sglang() -> None:
    spec = RequestSpec("hi", 4, cache_prompt=False)
    assert build_body(Api.OPENAI_CHAT, spec)["cache_prompt"] is False
    assert "cache_prompt" not in build_body(Api.OPENAI_CHAT, RequestSpec("hi", 4))
    assert "cache_prompt" not in build_body(Api.SGLANG, spec)


def test_sglang_meta_info_cached_tokens_are_read() -> None:
    """The last event of a real SGLang 0.5.16 /generate (recorded on the H200): meta_info carries cached_tokens,
    so --api sglang records a cache-hit fraction (it was None before: only OpenAI usage details were read)."""
    from pathlib import Path

    fixture = Path(__file__).resolve().parents[1] / "sglang/fixtures/server-0.5.16/generate-response.json"
    event = json.loads(fixture.read_text())
    tally = StreamTally()
    tally.add_event(Api.SGLANG, json.dumps(event), 1.0)
    assert (tally.prompt_tokens, tally.cached_prompt_tokens) == (3, 0)
    event["meta_info"]["cached_tokens"] = 2
    hit = StreamTally()
    hit.add_event(Api.SGLANG, json.dumps(event), 1.0)
    assert hit.cached_prompt_tokens == 2


def test_unique_prompts_of_one_run_share_no_more_than_the_tags_bracket() -> None:
    """A prefix cache matches from the first token: the tag's varying part (the request's index) comes first."""
    from sm120check.bench.prompts import unique_prompt

    body = "The operators of a small inference cluster"
    tags = [unique_prompt(body, "2026-12-01T22:31:12Z-ab12", 8, i) for i in (3, 4, 13, 30)]
    for a in tags:
        for b in tags:
            if a != b:
                shared = next(k for k, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)
                assert shared <= 3, (a, b)  # "[#", and "[#1" for 1 and 13
    assert unique_prompt(body, "r", 8, 3).endswith(body) and len(set(tags)) == len(tags)
