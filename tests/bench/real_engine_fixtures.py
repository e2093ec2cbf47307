"""Session fixtures for the tests against a real engine: llama.cpp's llama-server (BASE and SPEC) on CPU.

The binary comes from tests/lab/llamacpp.py's cache (built on first use; CI starts that build in the background
early and this waits on its lock). Without cmake/ninja/g++ the tests skip with the reason, except in CI (CI=true),
where a missing or failed build fails them with the build log's tail: CI never passes by skipping them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from lab.gguf_models import ModelPair, ModelParams, cached_models
from lab.llama_server import (
    LevelTruth,
    LlamaServer,
    Metrics,
    level_spans,
    parse_log,
    start_server,
    stop_server,
    sweep_truth,
)
from lab.llama_server import wait_idle as wait_server_idle
from lab.llamacpp import BuildError, LlamaServerBuild, build, cached_build, failure_path, log_tail, missing_tools

DRAFT_NOISE = 0.1  # about half the drafted tokens accepted: speculation wins at C=1 and loses at high C
SWEEP_TIMEOUT_S = 900.0


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"true", "1", "yes"}


def require_llama_server() -> LlamaServerBuild:
    """The cached llama-server build, building it (or waiting for the build in progress) when needed."""
    if (found := cached_build()) is not None:
        return found
    missing = missing_tools()
    if missing and not _in_ci():
        pytest.skip(f"llama-server is not built and building it needs {', '.join(missing)} (apt-get install)")
    failed = failure_path()
    if _in_ci() and failed.is_file() and cached_build() is None:  # CI's background build failed: do not retry it
        pytest.fail(f"llama-server build failed (CI never skips the real-engine tests): {failed.read_text()}")
    try:
        return build(say=lambda line: print(line, file=sys.stderr, flush=True))
    except BuildError as exc:
        pytest.fail(f"llama-server build failed (CI never skips the real-engine tests): {exc}\n{log_tail()}")


@pytest.fixture(scope="session")
def llama_build() -> LlamaServerBuild:
    return require_llama_server()


@pytest.fixture(scope="session")
def llama_models(llama_build: LlamaServerBuild) -> ModelPair:
    return cached_models(llama_build, ModelParams(draft_noise=DRAFT_NOISE))


def _server(
    build_: LlamaServerBuild, models: ModelPair, logs: Path, speculative: bool, name: str
) -> Iterator[LlamaServer]:
    server = start_server(build_, models, logs / f"{name}.log", speculative)
    try:
        yield server
    finally:
        stop_server(server)


@pytest.fixture(scope="session")
def base_server(
    llama_build: LlamaServerBuild, llama_models: ModelPair, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LlamaServer]:
    yield from _server(llama_build, llama_models, tmp_path_factory.mktemp("llama-logs"), False, "base")


@pytest.fixture(scope="session")
def spec_server(
    llama_build: LlamaServerBuild, llama_models: ModelPair, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LlamaServer]:
    yield from _server(llama_build, llama_models, tmp_path_factory.mktemp("llama-logs"), True, "spec")


@dataclass(frozen=True)
class Sweep:
    """One `sm120check bench` run against a llama-server, with the server's own account of it."""

    rc: int
    stdout: str
    stderr: str
    out: Path
    records: tuple[dict[str, object], ...]  # the JSONL lines as written (what a user's tools read)
    truth: tuple[LevelTruth, ...]
    before: Metrics
    after: Metrics

    def delta(self, name: str) -> float:
        return self.after.get(name) - self.before.get(name)


def bench_cli(*argv: str, timeout: float = SWEEP_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    """`sm120check <argv>` as a user runs it, in a subprocess, bounded."""
    return subprocess.run(
        [sys.executable, "-m", "sm120check", *argv], capture_output=True, text=True, timeout=timeout, check=False
    )


def run_sweep(server: LlamaServer, out: Path, levels: Sequence[int], *extra: str, warmup: int = 1) -> Sweep:
    """Run a bench sweep against `server` and rebuild every level from the server's log."""
    before = wait_server_idle(server)
    skip = len(parse_log(server.log_text()))
    argv = ["bench", "--url", server.url, "--concurrency", ",".join(map(str, levels)), "--warmup", str(warmup)]
    proc = bench_cli(*argv, "--out", str(out), "--quiet", *extra)
    after = wait_server_idle(server)
    lines = out.read_text().splitlines() if out.exists() else []
    records = tuple(json.loads(line) for line in lines if line.strip())
    if proc.returncode != 0 or len(records) != len(levels):
        raise AssertionError(
            f"bench exited {proc.returncode} with {len(records)} of {len(levels)} records\n{proc.stderr[-3000:]}"
        )
    measured = [int(str(r["requests"])) for r in records]
    spans = level_spans(records)
    truth = sweep_truth(server.log_text(), levels, measured, warmup, skip, spans, server.started_at)
    return Sweep(proc.returncode, proc.stdout, proc.stderr, out, records, tuple(truth), before, after)
