"""Fleet outliers: a node's measured figures against the fleet median of the same GPU model (issue #16).

The nodes are the real level-3 report of a 2x H200 machine (fixtures/h200x2-level3.json: driver, nccl_allreduce,
symm_mem as recorded) with the figures of each node edited, plus `pcie_link` and `gpu_copy_bandwidth` results in the
shape those checks write (Gen5 x16 under load, H2D 54.92 / D2H 54.98 GB/s: the H200 recorded in
tests/fixtures/health/h200-2026-12-01-busy.json).
"""

from __future__ import annotations

import copy
import json
import math
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from lab.fleet_files import FIXTURES, write_nodes
from sm120check.cli import main
from sm120check.fleet import outliers, render
from sm120check.fleet.load import load
from sm120check.fleet.model import Fleet, NodeReport, NodeState

H200X2: dict[str, Any] = json.loads((FIXTURES / "h200x2-level3.json").read_text(encoding="utf-8"))
H200 = "NVIDIA H200"
WORKSTATION = "NVIDIA RTX PRO 6000 Blackwell Workstation Edition"
MAX_Q = "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition"
Edit = Callable[[dict[str, Any]], None]


def result(report: dict[str, Any], check: str) -> dict[str, Any]:
    found: dict[str, Any] = next(r for r in report["results"] if r["id"] == check)
    return found


def node(
    h2d: tuple[float, ...] = (54.92, 54.9),
    d2h: tuple[float, ...] = (54.98, 54.95),
    width: tuple[int, ...] = (16, 16),
    model: str = H200,
    latency: float = 62.35,
    busbw: float = 269.61,
    edit: Edit | None = None,
) -> str:
    """The recorded report with this node's figures: per GPU copy rates and link width, allreduce latency (1 token;
    3 and 8 tokens scaled as recorded) and bus bandwidth."""
    report = copy.deepcopy(H200X2)
    gpus = result(report, "driver")["data"]["gpus"]
    gpus[:] = [dict(gpus[0], index=i, name=model, bus_id=f"00000000:00:{6 + i:02x}.0") for i in range(len(h2d))]
    result(report, "driver")["data"]["gpu_count"] = len(gpus)
    nccl = result(report, "nccl_allreduce")["data"]
    nccl["latency_us"] = {"1": latency, "3": round(latency * 63.42 / 62.35, 2), "8": round(latency * 64.48 / 62.35, 2)}
    nccl["busbw_gbps"] = busbw
    link = [
        {"index": g["index"], "name": model, "bus_id": g["bus_id"], "gen": 5, "width": w, "gen_max": 5,
         "width_max": 16, "busy": True}
        for g, w in zip(gpus, width, strict=True)
    ]  # fmt: skip
    copies = [
        {"index": g["index"], "name": model, "h2d_gbps": up, "d2h_gbps": down, "link_gbps": 63.02}
        for g, up, down in zip(gpus, h2d, d2h, strict=True)
    ]
    report["results"] += [
        {"id": "pcie_link", "family": "gpu_health", "level": 2, "status": "pass", "summary": "Gen5 x16 under load",
         "details": "", "remedy": "", "data": {"gpus": link}, "seconds": 1.5},
        {"id": "gpu_copy_bandwidth", "family": "gpu_health", "level": 2, "status": "pass", "summary": "H2D / D2H",
         "details": "", "remedy": "", "data": {"gpus": copies}, "seconds": 1.5},
    ]  # fmt: skip
    if edit is not None:
        edit(report)
    return json.dumps(report)


def fleet_of(tmp_path: Path, nodes: dict[str, str]) -> Path:
    return write_nodes(tmp_path / "run", nodes)


def five_nodes(tmp_path: Path) -> Path:
    """Five H200 nodes with the small spread real runs have; gpu-3's GPU 1 copies host-to-device at 31 GB/s."""
    return fleet_of(
        tmp_path,
        {
            "gpu-1": node(h2d=(54.92, 54.9), latency=62.35, busbw=269.6),
            "gpu-2": node(h2d=(55.1, 54.7), latency=63.1, busbw=268.2),
            "gpu-3": node(h2d=(54.8, 31.2), latency=61.9, busbw=270.4),
            "gpu-4": node(h2d=(54.6, 55.0), latency=64.0, busbw=266.9),
            "gpu-5": node(h2d=(54.95, 54.85), latency=62.8, busbw=271.0),
        },
    )


def report(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = main(["fleet", "report", *args])
    return code, capsys.readouterr().out


def the(fleet: Fleet, host: str) -> NodeReport:
    found = fleet.node(host)
    assert found is not None, f"no node {host}"
    return found


def flagged(fleet: Fleet) -> list[tuple[str, int | None, str]]:
    return [(o.figure.node, o.figure.gpu, o.figure.metric) for o in fleet.review.outliers]


def test_the_one_slow_host_to_device_gpu_of_five_nodes_is_the_only_outlier(tmp_path: Path) -> None:
    fleet = load(five_nodes(tmp_path))
    assert flagged(fleet) == [("gpu-3", 1, "gpu_copy_bandwidth.h2d_gbps")]
    outlier = fleet.review.outliers[0]
    assert outlier.figure.value == 31.2 and outlier.size == 10  # all ten H200s of the fleet
    assert outlier.median == pytest.approx(54.875)
    assert outlier.deviation == pytest.approx((31.2 - 54.875) / 54.875)
    assert [n.state for n in fleet.nodes] == [NodeState.READY] * 5  # a warning, not a failed check
    assert fleet.ok


def test_the_table_marks_the_node_and_lists_the_outlier_with_median_and_deviation(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, table = report(capsys, str(five_nodes(tmp_path)))
    assert code == 0  # outliers are warnings: every node is ready
    assert table.splitlines()[0].endswith("; outliers on 1 node")
    header = table.splitlines()[1].split()
    rows = {line.split()[0]: dict(zip(header, line.split(), strict=False)) for line in table.splitlines()[2:7]}
    assert rows["gpu-3"]["OUTLIERS"] == "1" and rows["gpu-1"]["OUTLIERS"] == "0"
    line = next(x for x in table.splitlines() if x.strip().startswith("gpu-3  GPU 1"))
    assert line.split()[3:] == ["gpu_copy_bandwidth.h2d_gbps", "31.2", "GB/s", "54.88", "GB/s", "-43", "%",
                                "NVIDIA", "H200", "(10", "GPUs)"]  # fmt: skip
    assert "bandwidth 15 % below, latency 25 % above, link below the median" in table
    assert "next: an outlier is a warning" in table


def test_fail_on_outlier_makes_the_report_exit_1(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert report(capsys, str(five_nodes(tmp_path)), "--fail-on-outlier")[0] == 1
    run = fleet_of(tmp_path / "even", {f"n{i}": node() for i in range(3)})
    assert report(capsys, str(run), "--fail-on-outlier")[0] == 0  # no outlier: nothing to fail on


def test_two_gpu_models_are_never_compared_with_each_other(tmp_path: Path) -> None:
    """Three Workstation Edition nodes copy at half the H200s' rate, three Max-Q at a third: each model is its own
    group, so nothing is an outlier."""
    nodes = {f"h200-{i}": node() for i in range(3)}
    nodes |= {f"ws-{i}": node(h2d=(27.5, 27.4), d2h=(27.6, 27.5), model=WORKSTATION) for i in range(3)}
    nodes |= {f"maxq-{i}": node(h2d=(18.1, 18.2), d2h=(18.0, 18.1), model=MAX_Q) for i in range(3)}
    fleet = load(fleet_of(tmp_path, nodes))
    assert fleet.review.outliers == ()
    h2d = {g.group: g.median for g in fleet.review.groups if g.metric == "gpu_copy_bandwidth.h2d_gbps"}
    assert h2d == {H200: 54.91, WORKSTATION: 27.45, MAX_Q: 18.15}


def test_two_nodes_are_too_few_to_judge_their_allreduce(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Node-level figures (one per node) need three nodes; the four GPUs of two nodes are enough for per-GPU ones."""
    run = fleet_of(tmp_path, {"a": node(latency=62.0), "b": node(latency=190.0, busbw=90.0)})
    fleet = load(run)
    assert fleet.review.outliers == ()  # b's allreduce is three times slower, but against one other node
    too_few = {g.metric for g in fleet.review.too_few}
    assert {"nccl_allreduce.busbw_gbps", "nccl_allreduce.latency_us.1", "symm_mem.latency_us.one_shot.8"} <= too_few
    assert not any(m.startswith(("pcie_link", "gpu_copy")) for m in too_few)
    _, table = report(capsys, str(run))
    assert "too few to compare (fewer than 3 values, not judged):" in table
    assert "NVIDIA H200 x2 (2 values): nccl_allreduce.busbw_gbps, nccl_allreduce.latency_us.1" in table


def test_two_single_gpu_nodes_judge_nothing(tmp_path: Path) -> None:
    run = fleet_of(tmp_path, {"a": node(h2d=(54.9,), d2h=(55.0,), width=(16,)), "b": node(h2d=(20.0,), d2h=(20.0,),
                                                                                            width=(8,))})  # fmt: skip
    review = load(run).review
    assert review.outliers == () and review.groups and all(not g.judged for g in review.groups)


def test_a_gpu_at_x8_among_x16_is_flagged(tmp_path: Path) -> None:
    nodes = {f"n{i}": node() for i in range(3)} | {"n3": node(width=(16, 8))}
    fleet = load(fleet_of(tmp_path, nodes))
    assert flagged(fleet) == [("n3", 1, "pcie_link.width")]
    assert fleet.review.outliers[0].median == 16


def test_an_allreduce_a_third_slower_than_its_peers_is_flagged(tmp_path: Path) -> None:
    nodes = {f"n{i}": node(latency=62.0 + i) for i in range(4)} | {"slow": node(latency=85.0)}
    assert flagged(load(fleet_of(tmp_path, nodes))) == [
        ("slow", None, "nccl_allreduce.latency_us.1"),
        ("slow", None, "nccl_allreduce.latency_us.3"),
        ("slow", None, "nccl_allreduce.latency_us.8"),
    ]


def _set_copy(key: str, value: object) -> Edit:
    def edit(report: dict[str, Any]) -> None:
        result(report, "gpu_copy_bandwidth")["data"]["gpus"][1][key] = value

    return edit


def _huge_gpus(report: dict[str, Any]) -> None:
    row = result(report, "gpu_copy_bandwidth")["data"]["gpus"][0]
    result(report, "gpu_copy_bandwidth")["data"]["gpus"] = [dict(row, index=i) for i in range(100_000)]


def _huge_latency(report: dict[str, Any]) -> None:
    result(report, "nccl_allreduce")["data"]["latency_us"] = {str(i): 60.0 for i in range(10_000)}


def _twice_8(report: dict[str, Any]) -> None:
    result(report, "nccl_allreduce")["data"]["latency_us"] = {"8": 64.0, "08": 1.0}


def _wild(report: dict[str, Any]) -> None:
    data = result(report, "nccl_allreduce")["data"]
    data["world_size"] = "2"
    result(report, "symm_mem")["data"]["latency_us"] = {"one_shot": {"../../etc": 1.0, "8": -3.0}, "Bad Op": {}}
    result(report, "pcie_link")["data"]["gpus"] = [{"index": True, "gen": 5}, "x16", {"index": 0, "width": 16.5,
                                                   "gen": None, "busy": True}]  # fmt: skip
    result(report, "driver")["data"]["gpus"] = {"0": H200}


@pytest.mark.parametrize(
    ("edit", "noted"),
    [
        (_set_copy("h2d_gbps", "fast"), "gpu_copy_bandwidth.gpus[1].h2d_gbps: 'fast' is not a number"),
        (_set_copy("h2d_gbps", math.nan), "gpu_copy_bandwidth.gpus[1].h2d_gbps: nan is not a finite number"),
        (_set_copy("h2d_gbps", math.inf), "gpu_copy_bandwidth.gpus[1].h2d_gbps: inf is not a finite number"),
        (_set_copy("h2d_gbps", -54.9), "gpu_copy_bandwidth.gpus[1].h2d_gbps: -54.9 is not a non-negative number"),
        (_set_copy("index", 0), "gpu_copy_bandwidth.gpus[1]: GPU 0 is listed twice; the first row is used"),
        (_huge_gpus, "gpu_copy_bandwidth.gpus: 100000 rows; only the first 64 are read"),
        (_huge_latency, "nccl_allreduce.latency_us: 10000 sizes; only the first 32 are read"),
        (_twice_8, "nccl_allreduce.latency_us.08: 8 tokens given twice; the first is used"),
        (_wild, "nccl_allreduce.world_size: '2' is not a GPU count: the node's allreduce figures are not compared"),
    ],
    ids=["string", "nan", "inf", "negative", "twice", "huge-gpu-list", "huge-latency-map", "same-size-twice", "wild"],
)
def test_hostile_figures_are_ignored_and_noted_never_made_up(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], edit: Edit, noted: str
) -> None:
    nodes = {f"n{i}": node() for i in range(3)} | {"odd": node(edit=edit)}
    run = fleet_of(tmp_path, nodes)
    fleet = load(run)
    assert the(fleet, "odd").state is NodeState.READY
    assert noted in [f"{i.node}: {i.where}: {i.why}".removeprefix("odd: ") for i in fleet.review.ignored]
    assert all(math.isfinite(f.value) and f.value >= 0 for n in fleet.nodes for f in n.figures)
    assert len([f for f in the(fleet, "odd").figures if f.gpu is not None]) <= 4 * 64
    code, table = report(capsys, str(run))
    assert code == 0 and "ignored (the report gave them, but not as usable numbers):" in table
    for fmt in ("json", "junit", "md"):
        assert report(capsys, str(run), "--format", fmt)[0] == 0
    document = json.loads(render.to_json(fleet), parse_constant=_refuse)  # no NaN or Infinity leaks out
    assert document["outliers"]["ignored"]


def _refuse(constant: str) -> float:
    raise AssertionError(f"fleet.json holds {constant}, which JSON does not allow")


def test_the_wild_report_gives_no_figure_at_all_from_what_is_broken(tmp_path: Path) -> None:
    figures = load(fleet_of(tmp_path, {"odd": node(edit=_wild)})).nodes[0].figures
    metrics = {f.metric for f in figures}
    assert not any(m.startswith(("nccl_allreduce", "symm_mem")) for m in metrics)  # no world size, no GPU names
    assert "pcie_link.width" not in metrics  # 16.5 lanes is no width


def test_a_failed_checks_figures_are_not_compared(tmp_path: Path) -> None:
    def wrong(report: dict[str, Any]) -> None:
        result(report, "nccl_allreduce")["status"] = "fail"

    fleet = load(fleet_of(tmp_path, {f"n{i}": node() for i in range(3)} | {"bad": node(latency=400.0, edit=wrong)}))
    assert the(fleet, "bad").state is NodeState.FAILED
    assert not any(o.figure.node == "bad" for o in fleet.review.outliers)
    assert ("bad", "nccl_allreduce", "the check failed: its figures are not compared") in [
        (i.node, i.where, i.why) for i in fleet.review.ignored
    ]


def test_thresholds_from_the_command_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    run = str(five_nodes(tmp_path))
    assert report(capsys, run, "--fail-on-outlier", "--outlier-threshold", "bandwidth=0.5")[0] == 0  # -43 % is within
    code, _ = report(capsys, run, "--fail-on-outlier", "--outlier-threshold", "gpu_copy_bandwidth.h2d_gbps=0.45")
    assert code == 0
    code, text = report(
        capsys, run, "--format", "json", "--outlier-threshold", "bandwidth=0.5", "--outlier-threshold", "latency=0.01"
    )
    document = json.loads(text)
    assert document["outliers"]["thresholds"] == {"bandwidth": 0.5, "latency": 0.01, "link": 0.0}
    assert {f["metric"] for f in document["outliers"]["found"]} >= {"nccl_allreduce.latency_us.1"}


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ("bandwidth=15", "15 is not a fraction from 0 to below 1 for bandwidth; write 0.15 for 15 %"),
        ("speed=0.1", "'speed' is no metric; give a family (bandwidth, latency, link)"),
        ("bandwidth", "'bandwidth' is not METRIC=FRACTION"),
        ("latency=fast", "'fast' is not a number"),
        ("latency=-0.1", "-0.1 is not a fraction from 0 to below 10 for latency"),
        ("pcie_link.width=nan", "nan is not a fraction"),
    ],
)
def test_a_bad_threshold_is_a_usage_error_naming_it_and_the_fix(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, given: str, said: str
) -> None:
    code = main(["fleet", "report", str(five_nodes(tmp_path)), "--outlier-threshold", given])
    err = capsys.readouterr().err
    assert code == 2
    assert f"--outlier-threshold {given!r}" in err and said in err


def test_a_metric_threshold_wins_over_its_family() -> None:
    limits = outliers.thresholds(["bandwidth=0.3", "gpu_copy_bandwidth.d2h_gbps=0.05"])
    assert limits.of("gpu_copy_bandwidth.d2h_gbps") == 0.05
    assert limits.of("gpu_copy_bandwidth.h2d_gbps") == 0.3
    assert limits.of("symm_mem.latency_us.one_shot.8") == 0.25
    assert limits.of("pcie_link.gen") == 0.0


def test_json_lists_outliers_per_node_and_for_the_fleet(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, text = report(capsys, str(five_nodes(tmp_path)), "--format", "json")
    document = json.loads(text, parse_constant=_refuse)
    assert code == 0 and document["ok"] is True
    found = document["outliers"]["found"]
    assert [(f["node"], f["gpu"], f["metric"], f["group_size"]) for f in found] == [
        ("gpu-3", 1, "gpu_copy_bandwidth.h2d_gbps", 10)
    ]
    assert found[0]["median"] == pytest.approx(54.875) and found[0]["deviation"] == pytest.approx(-0.4314, abs=1e-4)
    assert document["outliers"]["nodes"] == ["gpu-3"] and document["outliers"]["min_group"] == 3
    nodes = {n["host"]: n for n in document["nodes"]}
    assert len(nodes["gpu-3"]["outliers"]) == 1 and nodes["gpu-1"]["outliers"] == []


def test_junit_carries_the_outlier_as_a_warning_or_with_fail_on_outlier_a_failure(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    run = str(five_nodes(tmp_path))
    suites = {s.get("name"): s for s in ET.fromstring(report(capsys, run, "--format", "junit")[1]).iter("testsuite")}
    case = next(c for c in suites["gpu-3"].iter("testcase") if c.get("name") == "fleet_outliers")
    assert case.find("failure") is None and "gpu_copy_bandwidth.h2d_gbps 31.2 GB/s" in (
        case.findtext("system-out") or ""
    )
    assert suites["gpu-3"].get("failures") == "0"
    strict = ET.fromstring(report(capsys, run, "--format", "junit", "--fail-on-outlier")[1])
    suites = {s.get("name"): s for s in strict.iter("testsuite")}
    failure = next(c for c in suites["gpu-3"].iter("testcase") if c.get("name") == "fleet_outliers").find("failure")
    assert failure is not None and failure.get("type") == "outlier"
    assert suites["gpu-3"].get("failures") == "1" and suites["gpu-1"].get("failures") == "0"
    assert strict.get("failures") == "1"


def test_markdown_has_the_outlier_column_and_section(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    _, md = report(capsys, str(five_nodes(tmp_path)), "--format", "md")
    assert "| node | state | outliers |" in md
    row = next(line for line in md.splitlines() if line.startswith("| gpu-3 |"))
    assert row.split("|")[3].strip() == "1"
    assert "## Outliers" in md
    assert (
        "| gpu-3 | GPU 1 | `gpu_copy_bandwidth.h2d_gbps` | 31.2 GB/s | 54.88 GB/s | -43 % | NVIDIA H200 (10 GPUs) |"
        in md
    )


def test_a_fleet_without_figures_renders_as_before() -> None:
    """The recorded level-2 runs measured nothing: no outlier column, no section."""
    fleet = load(FIXTURES / "run-broken")
    assert fleet.review.groups == () and fleet.review.ignored == ()
    for fmt in ("table", "md"):
        text = render.render(fleet, fmt)
        assert "outlier" not in text.lower()


REAL_H200_LEVEL2: dict[str, Any] = json.loads((FIXTURES / "h200-level2-health.json").read_text(encoding="utf-8"))


def test_the_real_health_checks_data_reads_as_figures_and_a_slow_node_is_flagged(tmp_path: Path) -> None:
    """The doctor's own level-2 report from the H200 (docs/validation/2026-12-01-h200-health-checks), four copies,
    one with its copy bandwidth and link as a GPU in a x8 slot would give: the figures the real checks write are read
    (not only the shape this file builds) and that node alone is flagged."""
    nodes = {}
    for host in ("h1", "h2", "h3", "h4"):
        doc = copy.deepcopy(REAL_H200_LEVEL2)
        doc["host"] = host
        if host == "h3":
            result(doc, "gpu_copy_bandwidth")["data"]["gpus"][0].update(h2d_gbps=27.1, d2h_gbps=27.3)
            result(doc, "pcie_link")["data"]["gpus"][0]["width"] = 8
        nodes[host] = json.dumps(doc)
    fleet = load(fleet_of(tmp_path, nodes))
    assert sorted(flagged(fleet)) == [
        ("h3", 0, "gpu_copy_bandwidth.d2h_gbps"),
        ("h3", 0, "gpu_copy_bandwidth.h2d_gbps"),
        ("h3", 0, "pcie_link.width"),
    ]
    assert not fleet.review.ignored, fleet.review.ignored  # every real figure parsed


def _with_peers(doc: dict[str, Any], gbps: dict[tuple[int, int], object]) -> dict[str, Any]:
    """The real report as a 2-GPU node: the driver lists GPU 1 too, and a gpu_peer_bandwidth result in the shape
    the check writes ({"pairs": [{src, dst, p2p, gbps, latency_us, floor_gbps}]})."""
    driver = result(doc, "driver")["data"]["gpus"]
    driver.append(dict(driver[0], index=1, bus_id="00000000:00:07.0"))
    pairs = [
        {"src": s, "dst": d, "p2p": True, "gbps": v, "latency_us": 2.5, "floor_gbps": 44.1}
        for (s, d), v in gbps.items()
    ]
    doc["results"].append(
        {"id": "gpu_peer_bandwidth", "family": "comm", "level": 3, "status": "pass", "summary": "", "details": "",
         "remedy": "", "data": {"pairs": pairs}, "seconds": 1.2}
    )  # fmt: skip
    return doc


def test_a_slow_gpu_pair_is_compared_with_the_same_pair_of_the_other_nodes(tmp_path: Path) -> None:
    nodes = {}
    for host, forward in (("h1", 52.0), ("h2", 51.5), ("h3", 20.3), ("h4", 52.4)):
        doc = copy.deepcopy(REAL_H200_LEVEL2)
        doc["host"] = host
        nodes[host] = json.dumps(_with_peers(doc, {(0, 1): forward, (1, 0): 52.1}))
    fleet = load(fleet_of(tmp_path, nodes))
    assert flagged(fleet) == [("h3", 0, "gpu_peer_bandwidth.gbps.0-1")]
    outlier = fleet.review.outliers[0]
    assert outlier.size == 4 and outlier.median == pytest.approx(51.75)


def test_hostile_peer_rows_are_ignored_and_noted(tmp_path: Path) -> None:
    nodes = {}
    for host in ("h1", "h2", "h3"):
        doc = _with_peers(copy.deepcopy(REAL_H200_LEVEL2), {(0, 1): "fast", (1, 0): float("nan")})
        doc["host"] = host
        result(doc, "gpu_peer_bandwidth")["data"]["pairs"] += [{"src": True, "dst": 1}, {"src": 0, "dst": 0}, 7]
        nodes[host] = json.dumps(doc)
    fleet = load(fleet_of(tmp_path, nodes))
    assert not [f for f in fleet.review.outliers if f.figure.metric.startswith("gpu_peer_bandwidth")]
    noted = {i.where for i in fleet.review.ignored if i.where.startswith("gpu_peer_bandwidth")}
    assert noted >= {
        "gpu_peer_bandwidth.pairs[0].gbps",
        "gpu_peer_bandwidth.pairs[1].gbps",
        "gpu_peer_bandwidth.pairs[2]",
        "gpu_peer_bandwidth.pairs[3]",
        "gpu_peer_bandwidth.pairs[4]",
    }, noted
