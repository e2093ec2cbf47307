"""`sm120check soak` on the lent GPU against the real SGLang server (issue #37's record), one phase per call:

- TestSoakBase: the base server (base.txt) held at SOAK_C (default 64) for SOAK_S seconds (default 300), every
  verdict recorded; the soak must pass (no Xid, no throttling finding that fails, the server alive throughout);
- TestSoakKilled: the base server killed (SIGKILL to its process group) SOAK_KILL_AT s into a 90 s soak: the soak
  must report the server as dead at that time, with the samples before it kept;
- TestSoakSpec: the EAGLE-3 server (spec.txt) at SOAK_SPEC_C (default 8, its crossover side) for SOAK_S seconds;
- TestSoakSmLoad: no server, `--sm-load` (the doctor's FMA kernel on every GPU) for 60 s.

`scripts/device/sglang-server.sh venv soak-base` (then `soak-killed`, `soak-spec`, `soak-load`) runs them; each
soak's folder (soak.jsonl, soak.json, soak.junit.xml, soak.prom, soak.png) and its stdout land in $SM120KIT_GPU_OUT.
"""

from __future__ import annotations

import json
import os
import signal
import threading
from pathlib import Path
from typing import Any

import pytest

from lab.sglang_gpu import LAUNCH, MARKS, OUT, Patched, Server, patch_tree, save, sm120check, start, write_models

pytestmark = MARKS
SOAK_S = int(os.environ.get("SOAK_S", "300"))
SOAK_C = int(os.environ.get("SOAK_C", "64"))
SOAK_SPEC_C = int(os.environ.get("SOAK_SPEC_C", "8"))
SOAK_KILL_AT = float(os.environ.get("SOAK_KILL_AT", "40"))


@pytest.fixture(scope="module")
def patched() -> Patched:
    return patch_tree()


def soak(server: Server, name: str, concurrency: int, seconds: int) -> tuple[int, dict[str, dict[str, Any]], Path]:
    folder = OUT / name
    run = sm120check(
        "soak", "--url", server.url, "--concurrency", str(concurrency), "--duration", str(seconds), "--out",
        str(folder), timeout=seconds + 120,
    )  # fmt: skip
    save(f"{name}-stdout.txt", run.stdout + "\n--- stderr\n" + run.stderr)
    report = json.loads((folder / "soak.json").read_text())
    return run.returncode, {r["id"]: r for r in report["results"]}, folder


def gpu_lines(folder: Path) -> int:
    return sum(1 for line in (folder / "soak.jsonl").read_text().splitlines() if '"kind": "gpu"' in line)


class TestSoakBase:
    def test_base_server_soak(self, patched: Patched) -> None:
        write_models("base.txt")
        for server in start("soak-base", LAUNCH / "base.txt"):
            code, results, folder = soak(server, "soak-base", SOAK_C, SOAK_S)
            assert results["soak_server"]["status"] == "pass", results["soak_server"]["summary"]
            assert results["soak_nvml"]["status"] == "pass", results["soak_nvml"]["summary"]
            assert gpu_lines(folder) >= SOAK_S * 0.8
            assert (folder / "soak.png").exists()
            assert code == 0, {k: r["summary"] for k, r in results.items() if r["status"] == "fail"}


class TestSoakKilled:
    def test_server_killed_mid_soak_is_reported_with_the_records_kept(self, patched: Patched) -> None:
        write_models("base.txt")
        for server in start("soak-killed", LAUNCH / "base.txt"):
            killer = threading.Timer(SOAK_KILL_AT, os.killpg, (server.proc.pid, signal.SIGKILL))
            killer.start()
            try:
                code, results, folder = soak(server, "soak-killed", SOAK_C, 90)
            finally:
                killer.cancel()
            assert code == 1
            assert results["soak_server"]["status"] == "fail"
            assert "the server died" in results["soak_server"]["summary"]
            assert gpu_lines(folder) >= 60


class TestSoakSpec:
    def test_eagle3_server_soak_at_its_crossover_side(self, patched: Patched) -> None:
        write_models("spec.txt")
        for server in start("soak-spec", LAUNCH / "spec.txt"):
            code, results, folder = soak(server, "soak-spec", SOAK_SPEC_C, SOAK_S)
            assert results["soak_server"]["status"] == "pass", results["soak_server"]["summary"]
            assert gpu_lines(folder) >= SOAK_S * 0.8
            assert code == 0, {k: r["summary"] for k, r in results.items() if r["status"] == "fail"}


class TestSoakSmLoad:
    def test_sm_load_soak_without_a_server(self) -> None:
        folder = OUT / "soak-sm-load"
        run = sm120check("soak", "--sm-load", "--duration", "60", "--out", str(folder), timeout=200)
        save("soak-sm-load-stdout.txt", run.stdout + "\n--- stderr\n" + run.stderr)
        results = {r["id"]: r for r in json.loads((folder / "soak.json").read_text())["results"]}
        assert results["soak_nvml"]["status"] == "pass", results["soak_nvml"]["summary"]
        assert "the SM load ran" in results["soak_nvml"]["summary"]
        busy = [json.loads(line).get("utilization") for line in (folder / "soak.jsonl").read_text().splitlines()]
        assert sum(1 for u in busy if isinstance(u, int) and u >= 90) >= 30
