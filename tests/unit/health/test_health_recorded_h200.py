"""The verdicts on the payloads the probe really emitted on the lent H200 (docs/validation/2026-12-01-h200-node-health):
a healthy Gen5 x16 GPU at 87 % of the link's raw copy rate passes every check, read idle and busy."""

from __future__ import annotations

import json
from pathlib import Path

from sm120check.doctor.health.payloads import NodeHealth
from sm120check.doctor.health.show import judge

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "health"


def _load(name: str) -> NodeHealth:
    return NodeHealth.from_json(json.loads((FIXTURES / name).read_text(encoding="utf-8")))


def test_the_recorded_busy_h200_passes_every_health_verdict() -> None:
    health = _load("h200-2026-12-01-busy.json")
    (gpu,) = health.gpus
    assert gpu.name == "NVIDIA H200" and health.driver == "580.159.04"
    verdicts = {v.id: v for v in judge(health)}
    assert {i: v.status for i, v in verdicts.items()} == dict.fromkeys(verdicts, "pass"), verdicts
    assert "Gen5 x16 under load" in verdicts["pcie_link"].summary
    assert "H2D 54.92 / D2H 54.98 GB/s on Gen5 x16" in verdicts["gpu_copy_bandwidth"].summary


def test_the_recorded_idle_h200_skips_only_the_bandwidth_it_did_not_measure() -> None:
    verdicts = {v.id: v.status for v in judge(_load("h200-2026-12-01-idle.json"))}
    assert verdicts.pop("gpu_copy_bandwidth") == "skip"
    assert set(verdicts.values()) == {"pass"}
