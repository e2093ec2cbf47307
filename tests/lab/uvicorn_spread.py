"""How uvicorn's worker processes share a client's connections: keep-alive against a connection per request.

`python tests/lab/uvicorn_spread.py [--workers 4] [--clients 250] [--requests 8] [--rounds 3]` starts the real uvicorn
supervisor with WORKERS processes serving a small ASGI app (each request spins 2 ms of CPU and answers its process id),
then runs CLIENTS concurrent clients of REQUESTS requests each, ROUNDS times per mode: `keep` (one keep-alive
connection a client, as `sm120check bench` without --fresh-connections) and `fresh` (a new connection a request).
It prints, per round, each process's share of the requests (largest first), and one JSON line with them all.

SGLang's `--tokenizer-worker-num N` runs its HTTP processes this way (uvicorn workers on one listening socket).
Every wait is bounded; the server is stopped by its process group.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

APP = """
import os, time

async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    t = time.perf_counter()
    while time.perf_counter() - t < 0.002:
        pass
    body = str(os.getpid()).encode()
    headers = [(b"content-type", b"text/plain"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": body})
"""


async def _client(port: int, requests: int, fresh: bool, counts: collections.Counter[str]) -> None:
    reader = writer = None
    for _ in range(requests):
        if writer is None:
            reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 10)
        assert reader is not None and writer is not None
        writer.write(b"GET / HTTP/1.1\r\nHost: lab\r\n\r\n")
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
        length = next(int(h.split(b":")[1]) for h in head.split(b"\r\n") if h.lower().startswith(b"content-length"))
        counts[(await asyncio.wait_for(reader.readexactly(length), 30)).decode()] += 1
        if fresh:
            writer.close()
            reader = writer = None
    if writer is not None:
        writer.close()


async def one_round(port: int, clients: int, requests: int, fresh: bool) -> list[float]:
    counts: collections.Counter[str] = collections.Counter()
    await asyncio.gather(*[_client(port, requests, fresh, counts) for _ in range(clients)])
    total = sum(counts.values())
    return sorted((round(v / total, 3) for v in counts.values()), reverse=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--clients", type=int, default=250)
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "spread_app.py").write_text(APP, encoding="utf-8")
        cmd = [sys.executable, "-m", "uvicorn", "spread_app:app", "--host", "127.0.0.1", "--port", str(port)]
        cmd += ["--workers", str(args.workers), "--log-level", "warning", "--timeout-worker-healthcheck", "60"]
        server = subprocess.Popen(cmd, cwd=tmp, start_new_session=True)
        try:
            deadline = time.monotonic() + 60
            while True:  # bounded: the supervisor's workers import and bind within a minute
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2).read()
                    break
                except OSError:
                    if time.monotonic() > deadline or server.poll() is not None:
                        raise SystemExit("uvicorn did not answer within 60 s") from None
                    time.sleep(0.5)
            time.sleep(3)  # every worker up, not only the first to answer
            shares: dict[str, list[list[float]]] = {"keep": [], "fresh": []}
            for _ in range(args.rounds):
                for mode in ("keep", "fresh"):
                    got = asyncio.run(one_round(port, args.clients, args.requests, mode == "fresh"))
                    shares[mode].append(got)
                    print(f"{mode:5s} {got}")
            print(json.dumps({"workers": args.workers, "clients": args.clients, "shares": shares}))
        finally:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait(timeout=10)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
