"""Parsing recorded `nvidia-smi topo` outputs, kernel command lines and lspci ACS lines (tests/fixtures/comm); the
last two by the one PCIe parser (doctor/pcie/) whose facts the `topology` check judges."""

from __future__ import annotations

from pathlib import Path

import pytest

from sm120check.doctor.comm import topology_parse
from sm120check.doctor.pcie import cmdline as kernel_cmdline
from sm120check.doctor.pcie import lspci

FIXTURES = Path(__file__).parents[2] / "fixtures" / "comm"


def read(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_nvswitch_h100_pairs_are_nvlink_x18() -> None:
    matrix = topology_parse.parse_topo_matrix(read("topo_m_8xh100_nv18.txt"))
    assert matrix.gpus == tuple(range(8))
    assert len(matrix.pairs()) == 28
    assert {matrix.link(a, b).code for a, b in matrix.pairs()} == {"NV18"}
    assert matrix.link(0, 7).kind == "nvlink" and matrix.link(0, 7).nvlink == 18


def test_geforce_pair_behind_host_bridge_is_pcie_phb() -> None:
    matrix = topology_parse.parse_topo_matrix(read("topo_m_2x5090_phb.txt"))
    assert matrix.link(0, 1).code == "PHB" and matrix.link(0, 1).kind == "pcie"
    assert matrix.cpu_affinity == {0: "0-63", 1: "0-63"}
    assert matrix.numa_affinity == {0: "0", 1: "0"}


def test_mixed_node_and_phb_links_are_read_per_pair() -> None:
    matrix = topology_parse.parse_topo_matrix(read("topo_m_5gpu_node_phb.txt"))
    assert matrix.link(3, 4).code == "PHB"
    assert matrix.link(0, 4).code == "NODE"
    assert matrix.link(4, 3) == matrix.link(3, 4)


def test_empty_cpu_affinity_cells_keep_numa_columns_aligned() -> None:
    matrix = topology_parse.parse_topo_matrix(read("topo_m_4gpu_nv18_two_numa.txt"))
    assert matrix.cpu_affinity[1] == ""
    assert matrix.numa_affinity == {0: "0", 1: "1", 2: "1", 3: "1"}


def test_p2p_matrix_reports_driver_disabled_geforce_p2p() -> None:
    status = topology_parse.parse_p2p_matrix(read("topo_p2p_rw_2x5090_gns.txt"))
    assert status == {(0, 1): "GNS", (1, 0): "GNS"}
    assert "driver disables" in topology_parse.P2P_MEANING["GNS"]


def test_p2p_matrix_all_ok_on_five_gpus() -> None:
    status = topology_parse.parse_p2p_matrix(read("topo_p2p_p_5gpu_ok.txt"))
    assert len(status) == 20 and set(status.values()) == {"OK"}


def test_text_without_a_matrix_is_refused_with_what_was_expected() -> None:
    with pytest.raises(ValueError, match="header"):
        topology_parse.parse_topo_matrix(
            "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
        )


@pytest.mark.parametrize(
    ("cmdline", "mode"),
    [
        ("BOOT_IMAGE=/vmlinuz-6.8.0 root=/dev/sda1 ro quiet intel_iommu=on iommu=pt", "passthrough"),
        ("BOOT_IMAGE=/vmlinuz-6.8.0 root=/dev/sda1 ro amd_iommu=on", "translated"),
        ("BOOT_IMAGE=/vmlinuz root=/dev/nvme0n1p2 ro amd_iommu=off iommu=pt pcie_aspm=off", "passthrough"),
        ("BOOT_IMAGE=/vmlinuz root=/dev/nvme0n1p2 ro intel_iommu=off", "off"),
        ("BOOT_IMAGE=/vmlinuz root=/dev/nvme0n1p2 ro quiet splash", "unknown"),
    ],
)
def test_iommu_mode_from_the_kernel_command_line(cmdline: str, mode: str) -> None:
    assert kernel_cmdline.iommu_mode(cmdline).mode == mode


def test_sysfs_group_type_outranks_the_command_line() -> None:
    judged = kernel_cmdline.iommu_mode("ro quiet iommu=pt", ["DMA-FQ"])
    assert judged.mode == "translated" and judged.blocks_p2p
    assert kernel_cmdline.iommu_mode("ro amd_iommu=on", ["identity", "identity"]).mode == "passthrough"


def test_acs_redirect_found_on_amd_root_ports() -> None:
    ports, readable = lspci.parse_all(read("lspci_acs_amd_gpp.txt"))
    assert readable
    assert [p.bdf for p in ports] == ["00:01.1", "00:01.2"]
    assert all(p.redirects for p in ports)


def test_acs_unreadable_without_root_is_said() -> None:
    _, readable = lspci.parse_all("01:00.0 VGA compatible controller: NVIDIA\n\tCapabilities: <access denied>\n")
    assert not readable


@pytest.mark.parametrize(
    ("name", "disabled"),
    [
        ("NVIDIA GeForce RTX 5090", True),
        ("NVIDIA GeForce RTX 4090", True),
        ("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", False),
        ("NVIDIA H200", False),
    ],
)
def test_geforce_parts_are_known_to_have_p2p_disabled(name: str, disabled: bool) -> None:
    assert topology_parse.driver_disables_p2p(name) is disabled
