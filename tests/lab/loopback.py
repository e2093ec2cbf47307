"""A real HTTP server on 127.0.0.1 for tests that need one: ephemeral port, daemon threads, always shut down."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from socketserver import BaseRequestHandler


class QuietHandler(BaseHTTPRequestHandler):
    """A request handler that logs nothing and answers with `send(status, content type, body)`."""

    def log_message(self, format: str, *args: object) -> None:
        pass

    def send(self, status: int, kind: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)


def sse(events: Iterable[Mapping[str, object]]) -> bytes:
    """An SGLang/OpenAI event stream: one `data:` line per event, then `data: [DONE]`."""
    return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"


def url(server: ThreadingHTTPServer) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}"


@contextlib.contextmanager
def serve(
    handler: Callable[..., BaseRequestHandler], server_class: type[ThreadingHTTPServer] = ThreadingHTTPServer
) -> Iterator[ThreadingHTTPServer]:
    server = server_class(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
