"""verify-launch and the decode-log reader on what a real SGLang 0.5.16 server wrote on the lent H200
(2026-12-01, docs/validation/2026-12-01-h200-sglang-server): its startup log (paths redacted to <site-packages>)
and its /server_info, served here on 127.0.0.1, against the launch files the sglang_server role rendered
(tests/gpu/launch). The verdicts must be the ones verify-launch gave against the live servers there."""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lab import decode_log
from lab.loopback import QuietHandler, serve, url
from sm120check import cli

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "sglang" / "fixtures" / "server-0.5.16"
LAUNCH = ROOT / "tests" / "gpu" / "launch"


def _handler(info: bytes) -> type[QuietHandler]:
    class Handler(QuietHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            found = path in ("/server_info", "/get_server_info")
            self.send(200 if found else 404, "application/json", info if found else b"{}")

    return Handler


@contextlib.contextmanager
def recorded(name: str) -> Iterator[str]:
    with serve(_handler(FIXTURES.joinpath(f"{name}-server_info.json").read_bytes())) as server:
        yield url(server)


def verify(server: str, log: str, launch: str) -> tuple[int, dict[str, Any]]:
    out = io.StringIO()
    path = log if "/" in log else str(FIXTURES / f"{log}-startup.log")  # a recorded name or a file
    argv = ["sglang", "verify-launch", "--json", "--url", server, "--log", path]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        status = cli.main([*argv, "--launch-command", str(LAUNCH / launch)])
    report: dict[str, Any] = json.loads(out.getvalue())
    return status, report


def verdicts(report: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {v["expectation"]: (v["verdict"], v["summary"]) for v in report["verdicts"]}


@pytest.mark.parametrize(
    ("server", "launch", "status", "expected"),
    [
        ("base", "base.txt", 0, {"cuda-graph": ("ok", "internal_states[0].memory_usage.graph=0.20 GB")}),
        (
            "base",
            "spec.txt",
            1,
            {
                "cuda-graph": ("ok", "internal_states[0].memory_usage.graph=0.20 GB"),
                "speculative": ("degraded", "server_args.speculative_algorithm=null"),
            },
        ),
        (
            "base",
            "fusion-on-one-gpu.txt",
            1,
            {
                "cuda-graph": ("ok", "internal_states[0].memory_usage.graph=0.20 GB"),
                "fusion": ("degraded", "server_args.enforce_disable_flashinfer_allreduce_fusion=true"),
            },
        ),
        (
            "spec",
            "spec.txt",
            0,
            {
                "cuda-graph": ("ok", "internal_states[0].memory_usage.graph=0.16 GB"),
                "speculative": ("ok", 'server_args.speculative_algorithm="EAGLE3"'),
            },
        ),
    ],
)
def test_verdicts_on_the_real_servers_record(
    server: str, launch: str, status: int, expected: dict[str, tuple[str, str]]
) -> None:
    with recorded(server) as where:
        code, report = verify(where, server, launch)
    assert report["sglang_version"] == "0.5.16" and report["log"]["ready"] is True
    assert (code, verdicts(report)) == (status, expected)


def test_the_speculative_servers_cap_of_48_is_noted_and_an_asked_for_cap_is_checked(tmp_path: Path) -> None:
    """The recorded EAGLE-3 server ran max_running_requests=48 (SGLang's speculative default, spec.txt asks for no
    cap): a note naming the role variable, no verdict changed; the base server reported none; a launch asking for 256
    against that server is noted as not given."""
    with recorded("spec") as where:
        code, report = verify(where, "spec", "spec.txt")
        uncapped = tmp_path / "uncapped.txt"
        uncapped.write_text(
            LAUNCH.joinpath("spec.txt").read_text().replace("--port 30000", "--port 30000 --max-running-requests 256")
        )
        _, asked = verify(where, "spec", str(uncapped))
    assert code == 0 and report["data"]["max_running_requests"] == 48
    (note,) = [n for n in report["notes"] if "requests at once" in n]
    assert note.startswith("the server runs at most 48 requests at once: SGLang's default for speculative decoding")
    assert "sglang_server_max_running_requests" in note
    assert "the launch asked for --max-running-requests 256, the server runs at most 48" in " ".join(asked["notes"])
    with recorded("base") as where:
        _, base = verify(where, "base", "base.txt")
    assert base["data"]["max_running_requests"] is None
    assert not [n for n in base["notes"] if "requests at once" in n]


def test_the_eagle3_servers_decode_lines_carry_its_accept_length() -> None:
    rows = decode_log.parse(FIXTURES.joinpath("spec-startup.log").read_text().splitlines())
    assert rows and all(r.accept_length is not None and 1.0 <= r.accept_length <= 4.0 for r in rows)
    assert all(r.cuda_graph is True for r in rows)
    info = json.loads(FIXTURES.joinpath("spec-server_info.json").read_text())
    assert info["speculative_num_steps"] == 3 and info["decode_log_interval"] == 10


# SGLang 0.5.16's HTTP server (uvicorn) on a port another process holds, as the H100 run of issue #39 logged it.
BIND_ERROR = (
    "[2026-12-01 22:33:40] ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', 30000): "
    "address already in use"
)


def _log_with_bind_error(tmp: Path, name: str) -> Path:
    """The recorded startup log with its 'Uvicorn running on' line replaced by the bind error: the run went on to
    print that it was ready (its warmup reached the process holding the port)."""
    lines = FIXTURES.joinpath(f"{name}-startup.log").read_text().splitlines()
    at = next(i for i, text in enumerate(lines) if "Uvicorn running on" in text)
    lines[at] = BIND_ERROR
    path = tmp / f"{name}-bind-error.log"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize(("stale", "launch"), [("base", "base.txt"), ("base", "spec.txt")])
def test_a_bind_error_is_a_failed_start_even_when_the_log_says_ready(tmp_path: Path, stale: str, launch: str) -> None:
    """A stale server holds the port and answers /server_info: with the same arguments every verdict is ok, and only
    the bind error in the new server's log tells that this launch never served."""
    log = _log_with_bind_error(tmp_path, launch.removesuffix(".txt"))
    assert "fired up and ready to roll" in log.read_text()
    with recorded(stale) as where:
        out, err = io.StringIO(), io.StringIO()
        argv = ["sglang", "verify-launch", "--url", where, "--log", str(log), "--launch-command", str(LAUNCH / launch)]
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            text_status = cli.main(argv)
        json_status, report = verify(where, str(log), launch)
    assert text_status == json_status == 1
    failed = report["failed_start"]
    assert failed.startswith("failed start: this run's HTTP server could not bind its port (log line ")
    assert "[Errno 98] error while attempting to bind on address ('127.0.0.1', 30000): address already in use" in failed
    assert "Fix: stop the process that listens on the port" in failed
    assert report["problems"][0] == failed
    assert "the server did not start: the verdicts above judge another process" in out.getvalue()
