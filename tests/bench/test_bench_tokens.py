"""Tokens are counted from what the server reports, never one per streamed chunk."""

from __future__ import annotations

import json

import pytest

from sm120check.bench.apis import Api, StreamFormatError, StreamTally


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
