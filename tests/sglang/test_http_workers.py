"""SGLang's HTTP processes under uvicorn's supervisor (sm120check.sglang.http_workers): the real uvicorn killing
workers that start slower than its health check, the same workers serving once the check is raised, the GPU
record's server logs, and verify-launch's verdict on a release's log."""

from __future__ import annotations

import gzip
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lab import server_pids
from lab.sglang_logs import LOG_PREFIX, log_formats, render
from lab.sglang_releases import release_dir
from sm120check.sglang import http_workers

REPO = Path(__file__).resolve().parents[2]
RECORD = REPO / "docs/validation/2026-12-07-h100-envelope-starts"

# A stand-in for SGLang's HTTP entry point (SGLang cannot start without a GPU): the real uvicorn supervisor with
# SGLang's worker count and its three log lines (its arguments, each worker's start, the ready line). A spawned
# worker imports the launch module first, as SGLang's workers import sglang.launch_server; IMPORT_S is that import.
STAND_IN = """\
import logging, os, sys, threading, time

if __name__ == "__mp_main__":
    time.sleep(float(os.environ["IMPORT_S"]))
logging.basicConfig(level=logging.INFO, format="[%(asctime)s] %(message)s", stream=sys.stderr)
log = logging.getLogger("stand_in")


async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                log.info("Start multi-tokenizer worker process %d, ipc_name=ipc:///tmp/stand-in", os.getpid())
                await send({"type": "lifespan.startup.complete"})
            else:
                await send({"type": "lifespan.shutdown.complete"})
                return
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


if __name__ == "__main__":
    import uvicorn

    log.info("server_args=ServerArgs(tokenizer_worker_num=2, detokenizer_worker_num=1)")
    threading.Timer(0.5, log.info, ("The server is fired up and ready to roll!",)).start()
    uvicorn.run(
        "stand_in:app", host="127.0.0.1", port=0, workers=2, log_level="info",
        timeout_worker_healthcheck=int(os.environ["HEALTHCHECK_S"]),
    )
"""


def serve_until(tmp_path: Path, import_s: float, healthcheck_s: int, enough: re.Pattern[str], count: int) -> list[str]:
    """Run the stand-in until its log holds `count` lines matching `enough` (at most 120 s), stop its process group,
    and return its log."""
    (tmp_path / "stand_in.py").write_text(STAND_IN, encoding="utf-8")
    log = tmp_path / "server.log"
    env = {**os.environ, "IMPORT_S": str(import_s), "HEALTHCHECK_S": str(healthcheck_s)}
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, str(tmp_path / "stand_in.py")], cwd=tmp_path, env=env, stdout=sink,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while len(enough.findall(log.read_text(errors="replace"))) < count:
            assert proc.poll() is None, log.read_text(errors="replace")
            assert time.monotonic() < deadline, f"no {count} x {enough.pattern} within 120 s:\n" + log.read_text()
            time.sleep(0.2)
    finally:
        server_pids.stop_group(proc.pid)
        proc.wait(timeout=10)  # the leader, reaped
    return log.read_text(errors="replace").splitlines()


def test_uvicorn_kills_workers_slower_than_its_health_check_and_the_scan_says_so(tmp_path: Path) -> None:
    lines = serve_until(
        tmp_path, import_s=6, healthcheck_s=1, enough=re.compile(r"Child process \[\d+\] died"), count=5
    )
    workers = http_workers.scan(lines)
    assert workers is not None and workers.asked == 2 and workers.ready
    assert workers.serving == 0 and workers.started == ()  # no worker lived to log its start
    assert workers.killed_after_ready >= 3, lines  # five kills, at most one a worker dropped as the stop's
    assert http_workers.HEALTHCHECK_ENV in workers.problem and "0 of the 2 launched serve" in workers.problem
    assert f"killed {workers.killed_after_ready} after the server was ready" in workers.problem


def test_the_same_workers_serve_once_the_health_check_outlasts_their_start(tmp_path: Path) -> None:
    started = re.compile(r"Start multi-tokenizer worker process \d+")
    lines = serve_until(tmp_path, import_s=2, healthcheck_s=60, enough=started, count=2)
    workers = http_workers.scan(lines)
    assert workers is not None and workers.serving == 2 and workers.killed == ()
    assert workers.problem == "" and workers.note == "HTTP processes: 2 launched, 2 serving"
    assert any("Stopping parent process" in line or "Received SIGTERM" in line for line in lines)  # the stop ran


def record_log(name: str) -> list[str]:
    return gzip.decompress((RECORD / name).read_bytes()).decode().splitlines()


def test_the_records_first_policy_start_lost_a_worker_and_its_second_did_not() -> None:
    first = http_workers.scan(record_log("envelope-policy.log.gz"))
    assert first is not None and first.asked == 4 and first.serving == 3
    assert first.killed_after_ready == 11 and len(first.killed) == 13  # the stop's three deaths are not kills
    assert "3 of the 4 launched serve" in first.problem
    second = http_workers.scan(record_log("envelope-policy-s2.log.gz"))
    assert second is not None and second.serving == 4 and second.killed_after_ready == 0 and second.problem == ""
    assert (
        second.note == "HTTP processes: 4 launched, 4 serving; uvicorn's health check killed 1 while the server started"
    )


def test_one_http_process_is_no_finding() -> None:
    lines = [f"{LOG_PREFIX}server_args=ServerArgs(tokenizer_worker_num=1, detokenizer_worker_num=1)",
             "INFO:     Child process [12] died"]  # fmt: skip
    assert http_workers.scan(lines) is None
    assert http_workers.scan(["no server start here"]) is None


def test_deaths_that_the_stop_caused_are_no_kills_whatever_uvicorn_logs_between() -> None:
    """A stopped unit signals every process: workers may die, and other workers log their shutdown, before the
    supervisor handles its own signal."""
    lines = [
        "server_args=ServerArgs(tokenizer_worker_num=2)", "The server is fired up and ready to roll!",
        "Start multi-tokenizer worker process 5, ipc", "Start multi-tokenizer worker process 6, ipc", "a request",
        "INFO:     Waiting for child process [5]", "INFO:     Child process [5] died", "INFO:     Shutting down",
        "INFO:     Waiting for application shutdown.", "INFO:     Application shutdown complete.",
        "INFO:     Finished server process [6]", "INFO:     Received SIGTERM, exiting.",
        "INFO:     Terminated child process [9]", "INFO:     Stopping parent process [1]",
    ]  # fmt: skip
    workers = http_workers.scan(lines)
    assert workers is not None and workers.killed == () and workers.problem == ""
    lines[7:7] = ["a request"]  # a request after the death: the server served on without the worker
    assert http_workers.scan(lines).killed == (5,)  # type: ignore[union-attr]


def test_only_the_last_run_counts(tmp_path: Path) -> None:
    lines = [
        "server_args=ServerArgs(tokenizer_worker_num=2)", "The server is fired up and ready to roll!",
        "INFO:     Waiting for child process [11]", "INFO:     Child process [11] died", "a request",
        "server_args=ServerArgs(tokenizer_worker_num=2)", "Start multi-tokenizer worker process 21, ipc_name=x",
        "Start multi-tokenizer worker process 22, ipc_name=x", "The server is fired up and ready to roll!",
    ]  # fmt: skip
    workers = http_workers.scan(lines)
    assert workers is not None and workers.killed == () and workers.serving == 2 and workers.problem == ""


@pytest.mark.slow
@pytest.mark.parametrize("version", ["0.5.13", "0.5.16", "0.5.23"])
def test_the_fix_names_the_variable_the_release_reads(version: str) -> None:
    root = release_dir(version) / "sglang/srt"
    assert re.search(rf"\b{http_workers.HEALTHCHECK_ENV} = EnvInt\(", (root / "environ.py").read_text())
    assert f"envs.{http_workers.HEALTHCHECK_ENV}.get()" in (root / "entrypoints/http_server.py").read_text()
    formats = [f for f in log_formats(release_dir(version), ("srt/entrypoints/http_server.py",))
               if "Start multi-tokenizer worker process" in f.text]  # fmt: skip
    assert formats, version
    printed = LOG_PREFIX + render(formats[0], {}, "4242")
    assert http_workers.scan(["server_args=ServerArgs(tokenizer_worker_num=2)", printed]).started == (4242,)  # type: ignore[union-attr]


@pytest.mark.slow
def test_before_0_5_13_the_variable_does_not_exist() -> None:
    assert http_workers.HEALTHCHECK_ENV not in (release_dir("0.5.10") / "sglang/srt/environ.py").read_text()
