"""A small HTTP/1.1 client on asyncio streams: one keep-alive connection per in-flight request.

Enough of HTTP for LLM servers: JSON requests, responses with Content-Length, chunked or read-to-close bodies,
keep-alive reuse, https through the standard `ssl` module. No pool with a hidden cap: the caller owns one
`Connection` per concurrent request.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from sm120check.aio import within
from sm120check.bench.wire import ChunkedDecoder

_READ_SIZE = 65536
_HEADER_LIMIT = 1 << 20
_CLOSE_TIMEOUT = 5.0


class HttpError(Exception):
    """The request could not be sent or the response could not be read."""


def lost(exc: BaseException) -> str:
    """Why a connection broke, as a user reads it: "connection reset by the server" for a TCP reset (a server
    that crashed, was OOM-killed or lost its GPU mid-response), else the error's own words."""
    if isinstance(exc, ConnectionResetError):
        return "connection reset by the server"
    if isinstance(exc, asyncio.IncompleteReadError):
        return "connection closed in the middle of a response"
    if isinstance(exc, OSError):
        return f"connection lost ({exc.strerror or exc})"
    return f"connection lost ({exc})"


def redact_url(url: str) -> str:
    """The URL without `user:password@` (and without a query, which may carry a token): what records, logs and
    messages may show."""
    try:
        parts = urlsplit(url)
        netloc = parts.netloc.rpartition("@")[2]
        return urlunsplit((parts.scheme, netloc, parts.path, "", ""))
    except ValueError:
        return "(unparsable URL)" if "@" in url else url


def has_credentials(url: str) -> bool:
    try:
        return "@" in urlsplit(url).netloc
    except ValueError:
        return False


@dataclass(frozen=True)
class Endpoint:
    """Where the server listens: scheme, host, port, and a path prefix (for servers behind a proxy path)."""

    scheme: str
    host: str
    port: int
    prefix: str = ""

    @classmethod
    def parse(cls, url: str) -> Endpoint:
        shown = redact_url(url)
        try:
            parts = urlsplit(url)
        except ValueError as exc:
            raise ValueError(f"--url {shown!r} is not a URL ({exc}); give one like http://127.0.0.1:30000") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"--url {shown!r} is not an http(s) URL; give one like http://127.0.0.1:30000")
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError as exc:
            raise ValueError(f"--url {shown!r} has a bad port: {exc}") from None
        return cls(parts.scheme, parts.hostname, port, parts.path.rstrip("/"))

    def __str__(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}{self.prefix}"


class Response:
    """Status line, headers, and a body to iterate once."""

    def __init__(self, conn: Connection, status: int, reason: str, headers: dict[str, str]) -> None:
        self._conn = conn
        self.status = status
        self.reason = reason
        self.headers = headers
        self._consumed = False
        self._reusable = False

    async def iter_body(self) -> AsyncIterator[bytes]:
        """Yield body bytes as they arrive; afterwards the connection is reusable if the server allows it."""
        if self._consumed:
            raise HttpError("response body already read")
        self._consumed = True
        reader = self._conn.reader
        assert reader is not None
        try:
            async for payload in self._body(reader):
                yield payload
        except (OSError, asyncio.IncompleteReadError) as exc:  # a reset mid-body: the server went away
            await self._conn.close()
            raise HttpError(f"{lost(exc)} while the response was streaming") from None
        if not self._reusable:
            await self._conn.close()

    async def _body(self, reader: asyncio.StreamReader) -> AsyncIterator[bytes]:
        """The body by its framing; sets `_reusable` (the connection can carry the next request)."""
        reusable = self.headers.get("connection", "").lower() != "close"
        if "chunked" in self.headers.get("transfer-encoding", "").lower():
            decoder = ChunkedDecoder()
            while not decoder.done:
                data = await reader.read(_READ_SIZE)
                if not data:
                    await self._conn.close()
                    raise HttpError("connection closed in the middle of a chunked body")
                payload = decoder.feed(data)
                if payload:
                    yield payload
            reusable = reusable and not decoder.leftover
        elif "content-length" in self.headers:
            try:
                remaining = int(self.headers["content-length"])
            except ValueError:
                raise HttpError(f"bad Content-Length {self.headers['content-length']!r}") from None
            while remaining > 0:
                data = await reader.read(min(remaining, _READ_SIZE))
                if not data:
                    await self._conn.close()
                    raise HttpError("connection closed before the whole body arrived")
                remaining -= len(data)
                yield data
        else:
            reusable = False
            while data := await reader.read(_READ_SIZE):
                yield data
        self._reusable = reusable

    async def read(self) -> bytes:
        return b"".join([part async for part in self.iter_body()])

    async def json(self) -> object:
        body = await self.read()
        try:
            return json.loads(body)
        except (ValueError, RecursionError):
            raise HttpError(f"response is not JSON: {body[:200]!r}") from None


class Connection:
    """One HTTP/1.1 connection, opened on first use and reopened after the server closes it."""

    def __init__(self, endpoint: Endpoint, headers: Mapping[str, str] | None = None, connect_timeout: float = 10.0):
        self.endpoint = endpoint
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self._headers = dict(headers or {})
        self._connect_timeout = connect_timeout
        self.sent_at = 0.0  # perf_counter() when the last request was handed to the socket

    async def _connect(self) -> None:
        ctx = ssl.create_default_context() if self.endpoint.scheme == "https" else None
        try:
            self.reader, self.writer = await within(
                asyncio.open_connection(self.endpoint.host, self.endpoint.port, ssl=ctx, limit=_HEADER_LIMIT),
                self._connect_timeout,
            )
        except (OSError, asyncio.TimeoutError) as exc:
            raise HttpError(f"cannot connect to {self.endpoint}: {exc or 'timed out'}") from None

    async def request(self, method: str, path: str, body: object | None = None, stream: bool = False) -> Response:
        """Send a request (JSON body if given) and read the status line and headers."""
        payload = b"" if body is None else json.dumps(body, separators=(",", ":")).encode()
        lines = [
            f"{method} {self.endpoint.prefix}{path} HTTP/1.1",
            f"Host: {self.endpoint.host}:{self.endpoint.port}",
            "Accept: text/event-stream" if stream else "Accept: application/json",
            "User-Agent: sm120check-bench",
        ]
        if body is not None:
            lines += ["Content-Type: application/json", f"Content-Length: {len(payload)}"]
        lines += [f"{k}: {v}" for k, v in self._headers.items()]
        head = ("\r\n".join(lines) + "\r\n\r\n").encode()
        for attempt in (0, 1):
            fresh = self.writer is None
            if fresh:
                await self._connect()
            assert self.reader is not None and self.writer is not None
            try:
                self.writer.write(head + payload)
                await self.writer.drain()
                self.sent_at = time.perf_counter()
                status_line = await self.reader.readline()
                if not status_line:
                    raise ConnectionResetError("server closed the connection")
            except ValueError:  # StreamReader's limit: a status line of more than 1 MiB
                await self.close()
                raise HttpError(f"{method} {path}: the response's status line is longer than 1 MiB") from None
            except (ConnectionError, OSError) as exc:
                await self.close()
                if fresh or attempt:  # a stale keep-alive connection gets one retry on a new socket
                    raise HttpError(f"{method} {path}: {exc}") from None
                continue
            return await self._read_head(status_line)
        raise HttpError(f"{method} {path}: no response")  # pragma: no cover - loop always returns or raises

    async def _read_head(self, status_line: bytes) -> Response:
        assert self.reader is not None
        parts = status_line.decode("latin-1").rstrip("\r\n").split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            await self.close()
            raise HttpError(f"not an HTTP/1.x response: {status_line[:80]!r}")
        headers: dict[str, str] = {}
        size = 0
        while True:
            try:
                line = await self.reader.readline()
            except (OSError, ValueError) as exc:  # a reset, or a line over the stream's limit
                await self.close()
                raise HttpError(f"response headers cut short: {lost(exc)}") from None
            size += len(line)
            if not line or size > _HEADER_LIMIT:
                await self.close()
                raise HttpError("response headers cut short or larger than 1 MiB")
            if line in (b"\r\n", b"\n"):
                break
            name, sep, value = line.decode("latin-1").partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        if parts[0] == "HTTP/1.0" and headers.get("connection", "").lower() != "keep-alive":
            headers["connection"] = "close"
        return Response(self, int(parts[1]), parts[2] if len(parts) > 2 else "", headers)

    async def close(self) -> None:
        writer, self.reader, self.writer = self.writer, None, None
        if writer is not None:
            writer.close()
            try:  # bounded too: a peer that stopped reading never lets buffered bytes drain
                await within(writer.wait_closed(), _CLOSE_TIMEOUT)
            except asyncio.TimeoutError:
                writer.transport.abort()
            except (ConnectionError, OSError, ssl.SSLError):
                pass
