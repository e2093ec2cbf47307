"""`sm120check mock-server`, the documented simulated server (docs/bench.md "The simulated server")."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Callable

from bench.conftest import SIM_ARGS, Sim, live_sim, start_sim, stop_sim
from sm120check.bench.simserver import _WRITE_HIGH_WATER, SimModel, SimServer


def test_mock_server_serves_the_model_it_was_given_until_terminated() -> None:
    sim = start_sim("spec", *SIM_ARGS)
    try:
        with urllib.request.urlopen(f"{sim.url}/get_server_info", timeout=10) as reply:
            info = json.load(reply)
    finally:
        stop_sim(sim)
    assert sim.proc.returncode == 0
    assert info["sim_model"] == {
        "mode": "spec",
        "a": 0.01,
        "b": 0.0004,
        "c": 0.013,
        "d": 0.0012,
        "tau": 2.0,
        "max_batch": 4096,
    }
    assert info["sim_stats"]["requests"] == 0
    assert info["speculative_num_steps"] == 3


def test_mock_server_help_lists_the_model_options_and_exit_statuses() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "sm120check", "mock-server", "--help"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0
    assert "--tau" in done.stdout and "exit status:" in done.stdout


def test_mock_server_refuses_a_start_batch_above_max_batch() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "sm120check", "mock-server", "--max-batch", "2", "--start-batch", "3"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "start_batch must be between 1 and max_batch" in done.stderr


def test_a_client_that_stops_reading_is_dropped_and_the_others_are_served() -> None:
    # One connection that asks for a long stream and never reads must not stop the engine: the server waits for it
    # write_stall_s, then drops it, and a second request still gets all its tokens.
    async def scenario() -> tuple[int, bytes]:
        server = SimServer(SimModel("plain", a=0.001, b=0.0), write_stall_s=1.0)
        port = await server.start()
        stalled = socket.socket()
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stalled.connect(("127.0.0.1", port))
        stalled.sendall(_generate_request(200_000))
        try:
            await asyncio.wait_for(_stalled_on_a_client(server), 60)  # from here every step waits on it
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(_generate_request(20))
            body = await asyncio.wait_for(reader.readuntil(b'"finish_reason":{"type":"length"'), 30)
            writer.close()
            stalled.setblocking(False)
            return _cut_off(stalled), body
        finally:
            stalled.close()
            await server.close()

    dropped, body = asyncio.run(scenario())
    assert b'"completion_tokens":20' in body
    assert dropped == 1  # the stalled client was cut off, not left waiting


async def _stalled_on_a_client(server: SimServer) -> None:
    """Until a running request's unsent output is over the high-water mark (the engine then waits on its drain)."""
    while not any(seq.writer.transport.get_write_buffer_size() > _WRITE_HIGH_WATER for seq in server._running):
        await asyncio.sleep(0.01)


def _cut_off(sock: socket.socket) -> int:
    """1 when the server closed or reset the connection: reads what was in flight, then EOF or the reset."""
    sock.setblocking(False)
    try:
        while sock.recv(1 << 20):
            pass
    except ConnectionResetError:
        return 1
    except BlockingIOError:
        return 0  # still open, with nothing more to read
    return 1


def _generate_request(tokens: int) -> bytes:
    body = json.dumps({"text": "hi", "sampling_params": {"max_new_tokens": tokens}, "stream": True}).encode()
    head = f"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
    return head.encode() + body


def test_a_session_server_that_exited_is_started_again(sim_factory: Callable[..., Sim]) -> None:
    sims: dict[str, Sim] = {}
    first = live_sim(sims, sim_factory, "plain")
    assert live_sim(sims, sim_factory, "plain") is first  # alive: the same server
    first.proc.terminate()
    first.proc.wait(timeout=10)
    second = live_sim(sims, sim_factory, "plain")
    assert second is not first and second.proc.poll() is None and sims["plain"] is second
