"""Incremental decoders for the bytes an LLM server streams: HTTP/1.1 chunked bodies and server-sent events.

Both are pure and synchronous so they can be fed whatever the socket returned (many frames per read at high
concurrency, or one frame split across reads) and tested without a network.
"""

from __future__ import annotations


class WireError(ValueError):
    """The server sent bytes that are not valid HTTP/1.1 chunked encoding or SSE."""


class ChunkedDecoder:
    """Decodes a `Transfer-Encoding: chunked` body fed in arbitrary pieces.

    `feed` returns the payload bytes decoded so far; `done` turns true after the last (zero-size) chunk and its
    trailer. Bytes after the end are kept in `leftover` (a well-behaved server sends none).
    """

    _MAX_SIZE_LINE = 4096

    def __init__(self) -> None:
        self._buf = bytearray()
        self._need = -1  # payload bytes still expected in the current chunk; -1: reading a size line
        self._trailer = False
        self.done = False
        self.leftover = b""

    def feed(self, data: bytes) -> bytes:
        if self.done:
            self.leftover += data
            return b""
        self._buf += data
        out = bytearray()
        buf = self._buf
        pos = 0
        while True:
            if self._trailer:
                end = buf.find(b"\r\n", pos)
                if end < 0:
                    break
                line = bytes(buf[pos:end])
                pos = end + 2
                if not line:  # blank line ends the trailer section
                    self.done = True
                    self.leftover = bytes(buf[pos:])
                    pos = len(buf)
                    break
                continue
            if self._need < 0:
                end = buf.find(b"\r\n", pos)
                if end < 0:
                    if len(buf) - pos > self._MAX_SIZE_LINE:
                        raise WireError("chunk size line longer than 4096 bytes")
                    break
                size_text = bytes(buf[pos:end]).split(b";", 1)[0].strip()
                try:
                    size = int(size_text, 16)
                except ValueError:
                    raise WireError(f"bad chunk size line {size_text[:40]!r}") from None
                pos = end + 2
                if size == 0:
                    self._trailer = True
                    continue
                self._need = size
            avail = len(buf) - pos
            if avail < self._need + 2:
                # Hand out what we have of the payload now; keep waiting for the rest and the CRLF.
                take = min(avail, self._need)
                out += buf[pos : pos + take]
                pos += take
                self._need -= take
                if self._need == 0 and len(buf) - pos < 2:
                    break
                if self._need > 0:
                    break
            else:
                out += buf[pos : pos + self._need]
                pos += self._need
                self._need = 0
            if buf[pos : pos + 2] != b"\r\n":
                raise WireError("chunk payload not followed by CRLF")
            pos += 2
            self._need = -1
        del buf[:pos]
        return bytes(out)


MAX_EVENT = 16 << 20  # one SSE line or event; a token stream's events are a few hundred bytes


class SseDecoder:
    """Splits a `text/event-stream` into the `data` payloads of its events (multi-line data joined by newlines).
    A line or an event longer than MAX_EVENT is a WireError: memory stays bounded against an endless line."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._data: list[str] = []
        self._size = 0  # bytes of the event being gathered

    def feed(self, data: bytes) -> list[str]:
        events: list[str] = []
        searched = len(self._buf)  # bytes already known to hold no newline
        self._buf += data
        buf = self._buf
        start = 0
        while True:
            end = buf.find(b"\n", max(start, searched))
            if end < 0:
                break
            line = bytes(buf[start:end])
            start = end + 1
            if line.endswith(b"\r"):
                line = line[:-1]
            if not line:
                if self._data:
                    events.append("\n".join(self._data))
                    self._data, self._size = [], 0
                continue
            if line.startswith(b"data:"):
                value = line[5:]
                if value.startswith(b" "):
                    value = value[1:]
                self._size += len(value)
                if self._size > MAX_EVENT:
                    raise WireError(f"an event of the stream is longer than {MAX_EVENT >> 20} MiB")
                self._data.append(value.decode("utf-8", errors="replace"))
            # comments (":" lines), event:, id:, retry: carry nothing a benchmark needs
        del buf[:start]
        if len(buf) > MAX_EVENT:
            raise WireError(f"a line of the stream is longer than {MAX_EVENT >> 20} MiB with no end")
        return events

    def flush(self) -> list[str]:
        """Events still open at the end of the body (a server that omits the final blank line)."""
        if self._buf.strip():
            self.feed(b"\n")
        if self._data:
            event, self._data = "\n".join(self._data), []
            return [event]
        return []
