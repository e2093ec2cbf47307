"""A hostile SGLang stand-in on raw sockets (127.0.0.1, an ephemeral port): it resets streams with a TCP RST
(SO_LINGER 0, as a crashed or OOM-killed server's kernel does), stalls mid-stream, fails every request, stops
answering /metrics after a few scrapes, or dies after a number of requests. Threads only; every wait is bounded."""

from __future__ import annotations

import contextlib
import json
import socket
import struct
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

_EVENT = {"text": " tok", "meta_info": {"completion_tokens": 1, "finish_reason": None}}


@dataclass
class Hostile:
    """What the server does. `generate`: "ok" (a 3-token answer), "reset" (two events, then a TCP reset),
    "stall" (one event, then silence with the connection held), "fail" (HTTP 500), "long-status" (a status line of
    2 MiB with no end). `metrics_ok`: /metrics answers
    this many scrapes, then stalls (None: always answers). `die_after`: after this many answered /generate
    requests the server closes its port and resets every open connection (None: never). `delay`: seconds an "ok"
    answer waits before its events."""

    generate: str = "ok"
    metrics_ok: int | None = None
    die_after: int | None = None
    delay: float = 0.0  # seconds before an "ok" answer's events
    counter: Callable[[int], str] | None = None  # the counter's text at the Nth scrape (None: 3 tokens per answer)
    url: str = ""
    posts: int = 0
    scrapes: int = 0
    release: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    dead: threading.Event = field(default_factory=threading.Event)


def _reset(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()


def _read_request(sock: socket.socket) -> tuple[str, str] | None:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk or len(data) > 1 << 20:
            return None
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    length = next(
        (int(v) for k, _, v in (line.partition(":") for line in lines[1:]) if k.lower() == "content-length"), 0
    )
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            return None
        body += chunk
    method, path = lines[0].split(" ")[:2]
    return method, path


def _send(sock: socket.socket, status: int, kind: str, body: bytes) -> None:
    head = f"HTTP/1.1 {status} X\r\nContent-Type: {kind}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    sock.sendall(head.encode() + body)


def _event(n: int, last: bool = False) -> bytes:
    meta = {"completion_tokens": n, "finish_reason": {"type": "length", "length": n} if last else None}
    return b"data: " + json.dumps({"text": " tok" * n, "meta_info": meta}).encode() + b"\n\n"


def _serve_one(state: Hostile, sock: socket.socket, live: set[socket.socket]) -> None:
    request = _read_request(sock)
    if request is None:
        return
    method, path = request
    if path in ("/get_server_info", "/server_info"):
        _send(sock, 200, "application/json", b'{"version": "hostile", "model_path": "m"}')
    elif path == "/metrics":
        with state.lock:
            state.scrapes += 1
            stall = state.metrics_ok is not None and state.scrapes > state.metrics_ok
            count = state.posts * 3
        if stall:
            state.release.wait(60)
            return
        said = state.counter(state.scrapes) if state.counter is not None else str(count)
        _send(sock, 200, "text/plain", f"sglang:generation_tokens_total {said}\n".encode())
    elif method == "POST":
        with state.lock:
            state.posts += 1
            posts = state.posts
        if state.generate == "long-status":
            sock.sendall(b"HTTP/1.1 200 " + b"A" * (2 << 20))
            state.release.wait(5)
            return
        if state.generate == "fail":
            _send(sock, 500, "application/json", b'{"error": "every request fails here"}')
            return
        sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")
        if state.generate == "ok":
            state.release.wait(state.delay)
            sock.sendall(_event(1) + _event(2) + _event(3, last=True) + b"data: [DONE]\n\n")
            if state.die_after is not None and posts >= state.die_after:
                state.dead.set()
                for other in list(live - {sock}):
                    _reset(other)
            return
        sock.sendall(_event(1) if state.generate == "stall" else _event(1) + _event(2))
        if state.generate == "stall":
            state.release.wait(60)
            return
        state.release.wait(0.2)  # "reset": the events reach the client, then the server dies
        _reset(sock)
    else:
        _send(sock, 404, "application/json", b"{}")


@contextlib.contextmanager
def hostile_server(state: Hostile) -> Iterator[Hostile]:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    listener.settimeout(0.1)
    state.url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    live: set[socket.socket] = set()

    def handle(sock: socket.socket) -> None:
        live.add(sock)
        try:
            sock.settimeout(70)
            _serve_one(state, sock, live)
        except OSError:
            pass
        finally:
            live.discard(sock)
            with contextlib.suppress(OSError):
                sock.close()

    def accept() -> None:
        while not state.release.is_set() and not state.dead.is_set():
            try:
                sock, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if state.dead.is_set():
                _reset(sock)
                break
            threading.Thread(target=handle, args=(sock,), daemon=True).start()
        listener.close()  # died: connections are refused from now on

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        state.release.set()
        thread.join(10)
        for sock in list(live):
            _reset(sock)
