"""The verdicts on the payloads the probe really emitted on the lent H200 (docs/validation/2026-12-01-h200-node-health):
a healthy Gen5 x16 GPU at 87 % of the link's raw copy rate passes every check, read idle and busy."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

from sm120check.doctor.gpu.payloads import NodeHealth

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "health"
_SHOW = Path(__file__).resolve().parents[3] / "scripts" / "device" / "health_show.py"
_spec = importlib.util.spec_from_file_location("health_show", _SHOW)
assert _spec is not None and _spec.loader is not None
health_show = importlib.util.module_from_spec(_spec)
sys.modules["health_show"] = health_show
_spec.loader.exec_module(health_show)
judge = health_show.judge


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
