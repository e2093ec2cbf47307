"""The chunked and SSE decoders accept what the socket hands them, however it is split."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import pytest

from sm120check.bench.wire import ChunkedDecoder, SseDecoder, WireError

# Two SSE events in chunked framing, as SGLang and vLLM send them (one event per chunk), then the last chunk.
BODY = b'19\r\ndata: {"a": 1}\n\ndata: [DO\r\n5\r\nNE]\n\n\r\n0\r\n\r\n'


T = TypeVar("T")


def feed_split(decoder_feed: Callable[[bytes], T], data: bytes, size: int) -> list[T]:
    out = []
    for i in range(0, len(data), size):
        out.append(decoder_feed(data[i : i + size]))
    return out


@pytest.mark.parametrize("size", [1, 2, 3, 7, 1000])
def test_chunked_body_decodes_identically_however_it_is_split(size: int) -> None:
    decoder = ChunkedDecoder()
    payload = b"".join(feed_split(decoder.feed, BODY, size))
    assert payload == b'data: {"a": 1}\n\ndata: [DONE]\n\n'
    assert decoder.done
    assert decoder.leftover == b""


def test_bad_chunk_size_is_reported_with_the_bytes_seen() -> None:
    with pytest.raises(WireError, match="bad chunk size line b'zz'"):
        ChunkedDecoder().feed(b"zz\r\nhello\r\n")


@pytest.mark.parametrize("size", [1, 5, 1000])
def test_sse_events_come_out_whole_with_crlf_and_multiline_data(size: int) -> None:
    stream = b'data: {"x":\r\ndata: 2}\r\n\r\n: keep-alive comment\n\ndata:[DONE]\n\n'
    decoder = SseDecoder()
    events = [e for part in feed_split(decoder.feed, stream, size) for e in part]
    assert events == ['{"x":\n2}', "[DONE]"]


def test_sse_event_without_final_blank_line_is_flushed() -> None:
    decoder = SseDecoder()
    assert decoder.feed(b'data: {"last": true}') == []
    assert decoder.flush() == ['{"last": true}']


def test_an_endless_sse_line_is_refused_at_its_bound() -> None:
    decoder = SseDecoder()
    chunk = b"data: " + b"x" * 65530
    fed = 0
    with pytest.raises(WireError) as refused:  # was 132 MB and a busy core after 20 s (probe 3 BH20)
        while fed < 1000:
            fed += 1
            decoder.feed(chunk)
    assert str(refused.value) == "a line of the stream is longer than 16 MiB with no end"
    assert fed == 257  # refused as soon as the bound was passed


def test_sse_events_split_across_feeds_are_joined() -> None:
    decoder = SseDecoder()
    assert decoder.feed(b'data: {"a":') == []
    assert decoder.feed(b" 1}\r\n") == []
    assert decoder.feed(b"\r\ndata: two\n\ndata: [DO") == ['{"a": 1}', "two"]
    assert decoder.flush() == ["[DO"]
