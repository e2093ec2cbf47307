"""The fleet view of soaks: each node's verdict, and clocks or tokens/s below the fleet median of the same GPU model."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from sm120check import cli
from sm120check.doctor import report
from sm120check.exitcodes import Exit
from sm120check.soak import fleet, verdicts
from sm120check.soak.samples import Sample, ServerInterval
from unit.soak.test_soak_verdicts import HEALTHY, START

MODEL = HEALTHY.name


def node_report(tmp: Path, host: str, sm_mhz: int = 2400, tokens: int = 1000, server_dies: bool = False) -> Path:
    samples: list[Sample] = [replace(HEALTHY, t=START + i, sm_mhz=sm_mhz) for i in range(120)]
    for i in range(120):
        dead = server_dies and i >= 60
        samples.append(ServerInterval(START + i, 1.0, 0 if dead else tokens, 4, 3 if dead else 0, 0 if dead else 16))
    results = verdicts.judge(verdicts.Soak(tuple(sorted(samples, key=lambda s: s.t)), START, server=True))
    info = report.RunInfo(host, "0.1.0", "2027-01-15T08:00:00+00:00", 120.0, verdicts.LEVEL, "", START)
    path = tmp / f"{host}.json"
    path.write_text(report.to_json(results, info))
    return path


def test_slow_clock_and_low_tokens_are_outliers_by_gpu_model(tmp_path: Path) -> None:
    for host in ("n1", "n2", "n3"):
        node_report(tmp_path, host)
    node_report(tmp_path, "n4", sm_mhz=2000, tokens=700)
    view = fleet.load([tmp_path])
    assert [n.status.value for n in view.nodes] == ["pass"] * 4
    flagged = {(o.figure.node, o.figure.metric) for o in view.review.outliers}
    assert flagged == {("n4", fleet.CLOCKS), ("n4", fleet.TOKENS)}
    assert all(o.figure.model.startswith(MODEL) for o in view.review.outliers)


def test_a_node_whose_server_died_fails_the_fleet_view(tmp_path: Path) -> None:
    for host in ("n1", "n2"):
        node_report(tmp_path, host)
    node_report(tmp_path, "n3", server_dies=True)
    assert cli.main(["soak", "--fleet", str(tmp_path)]) == Exit.FOUND
    text = fleet.render(fleet.load([tmp_path]))
    assert "n3  FAIL  soak_server: the server died" in text


def test_an_unreadable_node_file_is_that_node_failing(tmp_path: Path) -> None:
    node_report(tmp_path, "n1")
    (tmp_path / "n2.json").write_text("{not json")
    view = fleet.load([tmp_path])
    bad = next(n for n in view.nodes if n.host.endswith("n2.json"))
    assert bad.status.value == "fail" and bad.error
