"""The envelope verdict of tests/gpu/test_sglang_envelope.py run here on sweeps written as the bench writes them: the
verdict reads only files, so what it concludes from a record (misses, the launch the policy shares with a curve, the
spread between server starts) is tested without a GPU."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import lab.gpu_clocks
import lab.sglang_gpu
from sm120check.sglang.http_workers import HEALTHCHECK_ENV

HARNESS = Path(__file__).parents[1] / "gpu" / "test_sglang_envelope.py"
LEVELS = (1, 2, 5, 10, 30, 70, 100, 250)


@pytest.fixture
def envelope(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    spec = importlib.util.spec_from_file_location("envelope_verdict_under_test", HARNESS)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "SWEEPS", tmp_path / "sweeps")
    monkeypatch.setattr(module, "OUT", tmp_path / "out")
    monkeypatch.setattr(lab.sglang_gpu, "OUT", tmp_path / "out")
    (tmp_path / "sweeps").mkdir()
    (tmp_path / "out").mkdir()
    return module


def rows(label: str, rates: dict[int, float]) -> list[dict[str, Any]]:
    """One sweep's bench lines: every level 8 s, its GPU busy 90 % of it in decode."""
    return [
        {
            "label": label,
            "concurrency": c,
            "throughput_tok_s": rate,
            "output_tokens": round(rate * 8),
            "level_started_epoch": 1000.0 + i * 10,
            "level_ended_epoch": 1008.0 + i * 10,
            "server_forward_seconds": {"decode": 7.2},
            "cohort_share": 0.2,
        }
        for i, (c, rate) in enumerate(rates.items())
    ]


def write(module: ModuleType, name: str, *sweeps: list[dict[str, Any]]) -> None:
    lines = [json.dumps(r) for sweep in sweeps for r in sweep]
    (module.SWEEPS / f"{name}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")


def policy_launch(module: ModuleType, threshold: int | None) -> None:
    """The policy server's files as test_sweep_the_policy_server writes them for the switch-7 launch."""
    env = (module.LAUNCH / "switch-7.env").read_text(encoding="utf-8")
    line = f'SGLANG_SM120KIT_PLAIN_DECODE_MIN_BS="{threshold}"' if threshold else ""
    shutil.copyfile(module.LAUNCH / "switch-7.txt", module.SWEEPS / "policy.txt")
    (module.SWEEPS / "policy.env").write_text(env.replace('SGLANG_SM120KIT_PLAIN_DECODE_MIN_BS="30"', line))
    for name in ("base", "policy"):
        (module.SWEEPS / f"{name}-steady.json").write_text("{}", encoding="utf-8")
    (module.SWEEPS / "policy-switch.json").write_text("null", encoding="utf-8")


def verdict(module: ModuleType) -> tuple[list[str], dict[str, Any]]:
    """The verdict's misses (empty when it passed) and the record it saved."""
    try:
        module.TestEnvelopePolicy().test_the_policy_is_on_the_envelope_and_beats_sglangs_adaptive()
        misses: list[str] = []
    except AssertionError:
        misses = json.loads((module.OUT / "envelope-verdict.json").read_text())["misses"]
    return misses, json.loads((module.OUT / "envelope-verdict.json").read_text())


def flat(rate: float) -> dict[int, float]:
    return dict.fromkeys(LEVELS, rate)


def test_a_policy_planned_as_the_7_step_launch_names_its_twin_and_its_misses_as_a_start_gap(
    envelope: ModuleType,
) -> None:
    write(envelope, "base", rows("base", flat(1000.0)))
    write(envelope, "spec-7", rows("spec-7", flat(2000.0)), rows("spec-7-r2", flat(2100.0)))
    write(envelope, "policy", rows("policy", {**flat(2050.0), 100: 1800.0}), rows("policy-r2", flat(2050.0)))
    policy_launch(envelope, threshold=None)
    misses, record = verdict(envelope)
    assert record["policy_same_launch_as"] == "spec-7"
    assert len(misses) == 1 and misses[0].startswith("C=100: policy 1925 < 95 % of the envelope 2050 (spec-7)")
    assert "(within the sweeps' spread: True)" in misses[0]  # 2050 reaches 95 % of 2000
    assert "(the same launch as spec-7: a gap between two starts of one server)" in misses[0]


def test_a_policy_with_a_plain_tier_has_no_twin_and_passes_on_the_envelope(envelope: ModuleType) -> None:
    write(envelope, "base", rows("base", {**flat(1000.0), 250: 3000.0}))
    write(envelope, "spec-7", rows("spec-7", flat(2000.0)))
    write(envelope, "policy", rows("policy", {**flat(1990.0), 250: 2900.0}))
    policy_launch(envelope, threshold=57)
    clocks = [{"label": "policy", "concurrency": 250, "samples": 8, "sm_mhz_mean": 1755, "reasons": ["SW power cap"]}]
    (envelope.SWEEPS / "policy-gpu.json").write_text(json.dumps(clocks), encoding="utf-8")
    misses, record = verdict(envelope)
    assert misses == [] and record["policy_same_launch_as"] is None
    assert record["gpu_clocks"] == {"policy": clocks}  # the servers swept with the sampler, as they were sampled


def test_two_starts_per_server_join_the_spread_test_and_the_adaptive_miss_says_if_a_sweep_reaches(
    envelope: ModuleType,
) -> None:
    write(envelope, "base", rows("base", flat(1000.0)), rows("base-s2", flat(1000.0)))
    write(envelope, "spec-7", rows("spec-7", flat(2000.0)), rows("spec-7-s2", flat(2400.0)))
    # the policy's starts: 2000 and 2300 at C=1; against one start of spec-7 at 2400 it would miss outside the spread
    write(envelope, "policy", rows("policy", flat(2000.0)), rows("policy-s2", flat(2300.0)))
    write(envelope, "sglang-adaptive", rows("sglang-adaptive", flat(2200.0)))
    policy_launch(envelope, threshold=57)
    misses, record = verdict(envelope)
    assert record["starts_per_server"] == {"base": 2, "spec-7": 2, "sglang-adaptive": 1, "policy": 2}
    assert record["start_spread"]["spec-7"]["1"] == pytest.approx(400 / 2200, abs=1e-4)
    assert record["sweeps_by_start"]["policy"]["2"]["1"] == [2300.0]
    assert not any("envelope" in m for m in misses)  # 2150 is 0.98 x the envelope 2200
    assert "C=1: policy 2150 < SGLang adaptive 2200 (the policy's best sweep reaches its worst: True)" in misses


def test_the_gpu_sampler_around_a_sweep_ends_with_it_and_leaves_its_file(envelope: ModuleType, tmp_path: Path) -> None:
    """The real sampler (sm120check.soak.sampler): here, without NVML, its file says why it read nothing; the block
    ends it either way, so no sampler outlives a sweep."""
    path = tmp_path / "gpu-samples-base.jsonl"
    with envelope.gpu_sampled(path):
        pass
    assert path.with_suffix(".stop").exists()
    lines = path.read_text(encoding="utf-8").splitlines()
    first = json.loads(lines[0])
    assert first["kind"] == "sampler" and first["event"] in ("start", "failed"), first
    if first["event"] == "failed":  # no NVIDIA driver: the note names the library, and no sample is made up
        assert "libnvidia-ml" in first["text"] and lab.gpu_clocks.samples(lines) == []
    else:
        assert all(s.sm_mhz for s in lab.gpu_clocks.samples(lines))


def test_a_miss_whose_sweeps_lost_http_processes_names_the_start(envelope: ModuleType) -> None:
    write(envelope, "base", rows("base", flat(1000.0)))
    write(envelope, "spec-7", rows("spec-7", flat(2000.0)))
    write(envelope, "policy", rows("policy", {**flat(2000.0), 10: 1500.0}), rows("policy-s2", flat(2000.0)))
    policy_launch(envelope, threshold=None)
    starts = [
        {"start": 1, "asked": 4, "serving": 3, "killed_during_sweeps": 11},
        {"start": 2, "asked": 4, "serving": 4, "killed_during_sweeps": 0},
    ]
    (envelope.SWEEPS / "policy-http.json").write_text(json.dumps(starts), encoding="utf-8")
    misses, record = verdict(envelope)
    assert len(misses) == 1 and misses[0].startswith("C=10: policy 1750")
    assert "(policy lost HTTP processes during its sweeps: start 1: 11 killed, 3 of 4 serving)" in misses[0]
    assert record["http_workers"] == {"policy": starts}


def test_served_copies_ask_for_the_http_processes_with_the_roles_health_check(
    envelope: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(envelope, "TOKENIZER_WORKERS", 4)
    launch = envelope.LAUNCH / "base.txt"
    copy = envelope.served(launch)
    assert copy.read_text().split()[-2:] == ["--tokenizer-worker-num", "4"]
    env = lab.sglang_gpu.environment_file(copy.with_suffix(".env"))  # the unit's own file format
    assert env == {**lab.sglang_gpu.environment_file(launch.with_suffix(".env")), HEALTHCHECK_ENV: "120"}


class LoggedServer:
    """What wait_for_http_workers reads of a server: its name and its log's lines."""

    def __init__(self, lines: list[str]) -> None:
        self.name, self._lines = "stand-in", lines

    def lines(self) -> list[str]:
        return self._lines


def test_the_start_waits_for_every_http_process_and_names_a_kill_after_ready() -> None:
    start = ["server_args=ServerArgs(tokenizer_worker_num=2)", "The server is fired up and ready to roll!"]
    both = [*start, "Start multi-tokenizer worker process 5, ipc", "Start multi-tokenizer worker process 6, ipc"]
    lab.sglang_gpu.wait_for_http_workers(LoggedServer(both), deadline=0.0)  # type: ignore[arg-type]  # returns
    killed = [*start, "Start multi-tokenizer worker process 5, ipc", "INFO:     Child process [7] died", "a request"]
    with pytest.raises(pytest.fail.Exception, match=r"killed 1 after the server was ready.*1 of the 2 launched serve"):
        lab.sglang_gpu.wait_for_http_workers(LoggedServer(killed), deadline=float("inf"))  # type: ignore[arg-type]
    slow = [*start, "Start multi-tokenizer worker process 5, ipc"]
    with pytest.raises(
        pytest.fail.Exception, match="within the role's bound only HTTP processes: 2 launched, 1 serving"
    ):
        lab.sglang_gpu.wait_for_http_workers(LoggedServer(slow), deadline=0.0)  # type: ignore[arg-type]


def test_the_verdict_keeps_each_servers_prefill_batching_and_a_miss_compares_them(envelope: ModuleType) -> None:
    write(envelope, "base", rows("base", flat(1000.0)))
    write(envelope, "spec-7", rows("spec-7", flat(2000.0)))
    write(envelope, "policy", rows("policy", {**flat(2000.0), 250: 1500.0}))
    policy_launch(envelope, threshold=None)
    for name, per in (("policy", 2), ("spec-7", 6)):
        starts = [
            {"start": s, "concurrency": c, "batches": 10, "requests": 10 * per + s - 1, "per_batch": None}
            for s in (1, 2) for c in LEVELS
        ]  # fmt: skip
        (envelope.SWEEPS / f"{name}-prefills.json").write_text(json.dumps(starts), encoding="utf-8")
    misses, record = verdict(envelope)
    assert len(misses) == 1 and misses[0].startswith("C=250: policy 1500")
    assert "; prefills: 2.05 requests a batch against 6.05" in misses[0]  # both starts' batches and requests summed
    assert record["prefill_batching"]["spec-7"]["250"] == 6.05 and record["prefill_batching"]["base"] == {}
