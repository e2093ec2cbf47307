"""The TP-group suggestion (doctor/pcie/tp_groups.py) in the `pcie_acs` check's data and details: the
CUDA_VISIBLE_DEVICES order that keeps each tensor-parallel group behind one root complex, and where none can.

Topologies: the fixture fabrics of pcie_trees.py (NVIDIA/nccl#2079's two AMD root complexes, the PEX 8747 switch
under one Intel root port), and sysfs trees built here in the shape of /sys/devices/pci0000:00/0000:00:01.0/
0000:01:00.0: two root complexes of four GPUs each (a two-socket 8-GPU box), and three of 2, 4 and 2 where the PCI
bus order splits both groups of four. No multi-GPU PCIe machine has given a tree: these are built, not recorded.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from doctor_helpers import facts_for
from pcie_trees import ACS_OFF, FakeLspci, Tree, amd_root_ports, plx_switch, root_complexes

from sm120check.doctor import runner
from sm120check.doctor.model import Context, Result
from sm120check.doctor.payload import PayloadError
from sm120check.doctor.pcie import node, sysfs, tp_groups
from sm120check.doctor.pcie_p2p import fabric as pcie
from sm120check.doctor.report import RunInfo, to_json
from sm120check.fleet import render
from sm120check.fleet.load import node_from_document
from sm120check.fleet.model import build_fleet


def acs(facts: node.PcieFacts) -> Result:
    ctx = Context(facts=replace(facts_for(None), pcie_read=facts))
    return runner.run([pcie.AcsCheck()], ctx)[0]


def test_the_sysfs_reader_gives_each_gpu_its_root_complex(tmp_path: Path) -> None:
    tree, _ = root_complexes(tmp_path, {"00": 1, "80": 1})
    view = sysfs.read(tree.root)
    assert [(g.bdf, g.bridges, g.host_bridge) for g in view.gpus] == [
        ("0000:01:00.0", ("0000:00:01.0",), "pci0000:00"),
        ("0000:81:00.0", ("0000:80:01.0",), "pci0000:80"),
    ]


def test_two_root_complexes_of_four_keep_tp4_and_tp2_in_bus_order_and_tp8_must_cross(tmp_path: Path) -> None:
    tree, fake = root_complexes(tmp_path, {"00": 4, "80": 4})
    result = acs(tree.read(fake))
    plan = tp_groups.TpPlan.from_json(result.data["tp_groups"])
    assert plan.roots == ("pci0000:00", "pci0000:80") and [g.index for g in plan.gpus] == list(range(8))
    assert [(s.tp, s.fit, s.visible_devices) for s in plan.suggestions] == [
        (2, tp_groups.Fit.KEPT, "0,1,2,3,4,5,6,7"),
        (4, tp_groups.Fit.KEPT, "0,1,2,3,4,5,6,7"),
        (8, tp_groups.Fit.CROSSES, "0,1,2,3,4,5,6,7"),
    ]
    details = result.details.splitlines()
    assert (
        "TP groups (CUDA indices with CUDA_DEVICE_ORDER=PCI_BUS_ID): 8 GPUs behind 2 root complexes "
        "(4 behind pci0000:00, 4 behind pci0000:80)"
    ) in details
    assert (
        "  tp 4: CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7 (the PCI bus order) keeps each group behind one root complex: "
        "0,1,2,3 behind pci0000:00; 4,5,6,7 behind pci0000:80"
    ) in details
    assert (
        "  tp 8: no order keeps the group behind one root complex: it must cross "
        "(0,1,2,3,4,5,6,7 across pci0000:00 + pci0000:80); CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7"
    ) in details


def test_where_bus_order_splits_both_groups_the_suggestion_keeps_one_whole(tmp_path: Path) -> None:
    tree, fake = root_complexes(tmp_path, {"00": 2, "40": 4, "80": 2})
    suggestion = tp_groups.TpPlan.from_json(acs(tree.read(fake)).data["tp_groups"]).suggestion(4)
    assert suggestion is not None and suggestion.fit is tp_groups.Fit.CROSSES and suggestion.reordered
    assert suggestion.visible_devices == "2,3,4,5,0,1,6,7"
    assert suggestion.line == (
        "tp 4: 1 of 2 groups must cross root complexes, whatever the order (0,1,6,7 across pci0000:00 + pci0000:80); "
        "CUDA_VISIBLE_DEVICES=2,3,4,5,0,1,6,7 keeps the other 1 behind one"
    )


def test_nccl_2079s_two_amd_root_complexes_cannot_keep_a_pair(tmp_path: Path) -> None:
    tree, fake = amd_root_ports(tmp_path)
    result = acs(tree.read(fake))
    assert (
        "  tp 2: no order keeps the group behind one root complex: it must cross "
        "(0,1 across pci0000:40 + pci0000:60); CUDA_VISIBLE_DEVICES=0,1"
    ) in result.details.splitlines()


def test_a_switch_under_one_root_port_is_one_root_complex(tmp_path: Path) -> None:
    tree, fake = plx_switch(tmp_path, ACS_OFF)
    plan = tp_groups.TpPlan.from_json(acs(tree.read(fake)).data["tp_groups"])
    assert [(s.tp, s.fit) for s in plan.suggestions] == [(2, tp_groups.Fit.ONE_ROOT)]
    assert plan.suggestions[0].line == "tp 2: every GPU is behind pci0000:00: any order keeps each group behind it"


def test_one_gpu_gets_no_suggestion(tmp_path: Path) -> None:
    tree = Tree(tmp_path)
    tree.cmdline("ro")
    tree.device(["pci0000:00", "0000:00:06.0"])
    result = acs(tree.read(FakeLspci()))
    assert result.data["tp_groups"] == {
        "assumes": "CUDA_DEVICE_ORDER=PCI_BUS_ID",
        "gpus": [{"index": 0, "bdf": "0000:00:06.0", "root": "pci0000:00"}],
        "roots": ["pci0000:00"],
        "suggestions": [],
    }
    assert "TP groups" not in result.details


def test_a_given_tp_larger_than_the_node_says_it_does_not_fit() -> None:
    gpus = [tp_groups.GpuPlace(i, f"0000:0{i + 1}:00.0", "pci0000:00") for i in range(4)]
    (suggestion,) = tp_groups.plan(gpus, wanted=(8,)).suggestions
    assert suggestion.fit is tp_groups.Fit.TOO_FEW
    assert suggestion.line == "tp 8: needs 8 GPUs, the node has 4: no group of 8 fits"


def test_six_gpus_with_tp4_leave_two_in_no_group() -> None:
    gpus = [tp_groups.GpuPlace(i, f"0000:{i + 1:02x}:00.0", "pci0000:00" if i < 4 else "pci0000:80") for i in range(6)]
    suggestion = tp_groups.plan(gpus).suggestion(4)
    assert suggestion is not None and suggestion.fit is tp_groups.Fit.KEPT
    assert suggestion.line.endswith("0,1,2,3 behind pci0000:00; 4,5 in no group")


def test_cuda_numbers_the_gpus_in_pci_bus_order_not_sysfs_listing_order(tmp_path: Path) -> None:
    tree, _ = root_complexes(tmp_path, {"80": 1, "00": 1})
    places = tp_groups.places(reversed(sysfs.read(tree.root).gpus))
    assert [(p.index, p.bdf) for p in places] == [(0, "0000:01:00.0"), (1, "0000:81:00.0")]


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        (("suggestions", 0, "fit"), "perfect", "suggestions[0].fit"),
        (("suggestions", 0, "cuda_visible_devices"), "0,1;rm -rf /", "suggestions[0].cuda_visible_devices"),
        (("gpus", 0, "index"), "zero", "gpus[0].index"),
        (("roots",), "pci0000:00", "roots"),
    ],
)
def test_a_hostile_suggestion_is_refused_naming_the_field(path: tuple[object, ...], value: object, field: str) -> None:
    gpus = [tp_groups.GpuPlace(i, f"0000:0{i + 1}:00.0", "pci0000:00") for i in range(2)]
    data = tp_groups.plan(gpus).to_json()
    target: object = data
    for step in path[:-1]:
        target = target[step]  # type: ignore[index]
    target[path[-1]] = value  # type: ignore[index]
    with pytest.raises(PayloadError) as caught:
        tp_groups.TpPlan.from_json(data)
    assert caught.value.field == field


def node_report(host: str, facts: node.PcieFacts) -> object:
    """The doctor's JSON report of a node that ran the pcie_acs check, as the fleet reads it."""
    info = RunInfo(host=host, version="test", started="2026-12-01T00:00:00Z", seconds=1.0, level=1, manifest="")
    return json.loads(to_json([acs(facts)], info))


def test_the_fleet_view_lists_the_suggestion_of_nodes_behind_several_root_complexes(tmp_path: Path) -> None:
    two, two_fake = root_complexes(tmp_path / "two", {"00": 4, "80": 4})
    one, one_fake = plx_switch(tmp_path / "one", ACS_OFF)
    fleet = build_fleet(
        [
            node_from_document("box8", node_report("box8", two.read(two_fake))),
            node_from_document("box2", node_report("box2", one.read(one_fake))),
        ]
    )
    table = render.table(fleet).splitlines()
    heading = table.index("TP groups, on nodes whose GPUs are behind several root complexes:")
    assert table[heading + 1 : heading + 3] == [
        "box8",
        "  TP groups (CUDA indices with CUDA_DEVICE_ORDER=PCI_BUS_ID): 8 GPUs behind 2 root complexes "
        "(4 behind pci0000:00, 4 behind pci0000:80)",
    ]
    assert any(line.startswith("  tp 8: no order keeps the group behind one root complex") for line in table)
    assert "box2" not in table[heading:]
    nodes = {n["host"]: n for n in json.loads(render.to_json(fleet))["nodes"]}
    assert nodes["box2"]["tp_groups"] == [] and len(nodes["box8"]["tp_groups"]) == 4
    assert "## TP groups, on nodes whose GPUs are behind several root complexes" in render.markdown(fleet)
