"""The `iommu` and `pcie_acs` checks (family pcie_p2p) through the doctor's runner, on fixture PCIe fabrics: the
shapes of NVIDIA/nccl#2079 (AMD root ports with ACS, AMD-Vi translating), a PEX switch fabric with and without ACS,
a pending reboot, GeForce, one GPU, a flat VM bus, no lspci, no root, no sysfs."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from doctor_helpers import facts_for, gpu
from pcie_trees import ACS_OFF, ACS_ON, AMD_GPP, GEFORCE, PLX, FakeLspci, Tree, amd_root_ports, plx_switch, recorded

from sm120check.doctor import remedies, runner
from sm120check.doctor.catalogue import all_checks
from sm120check.doctor.facts import needs_pcie, pcie_reader, read_pcie
from sm120check.doctor.model import Context, Result, Status
from sm120check.doctor.pcie import node
from sm120check.doctor.pcie_p2p import fabric as pcie


def run(facts: node.PcieFacts) -> dict[str, Result]:
    """Both checks through the real runner, with `facts` as the run's PCIe fact."""
    base = facts_for(None)
    ctx = Context(facts=replace(base, pcie_read=facts))
    results = runner.run([pcie.IommuCheck(), pcie.AcsCheck()], ctx)
    return {r.id: r for r in results}


def test_amd_root_ports_with_amd_vi_translating_and_acs_redirect_warn_both(tmp_path: Path) -> None:
    tree, fake = amd_root_ports(tmp_path)
    got = run(tree.read(fake, recorded("dmesg-amd-vi-rtl88x2bu-151.txt")))
    iommu, acs = got["iommu"], got["pcie_acs"]
    assert iommu.status is Status.WARN
    assert iommu.summary == (
        "AMD-Vi translates the 2 GPUs' DMA (DMA-FQ): PCIe P2P can hang NCCL on the first all-reduce"
    )
    assert iommu.remedy == remedies.IOMMU_PASSTHROUGH and "--tags pcie_p2p" in iommu.remedy
    assert "0000:41:00.0 (3D controller: NVIDIA Corporation GB202GL" in iommu.details
    assert "kernel log: [    0.378536] AMD-Vi: Interrupt remapping enabled" in iommu.details
    assert iommu.data["mode"] == "translated" and iommu.data["kind"] == "AMD-Vi"
    assert acs.status is Status.WARN and acs.remedy == remedies.ACS_REDIRECT
    assert acs.summary == (
        f"ACS redirects peer requests to the root complex on 2 bridge(s) above the GPUs: 0000:40:01.1 ({AMD_GPP}), "
        f"0000:60:01.1 ({AMD_GPP})"
    )
    assert acs.data["redirecting"] == ["0000:40:01.1", "0000:60:01.1"] and acs.data["p2p_expected"] is True


def test_plx_switch_in_vt_d_passthrough_with_acs_off_passes_both(tmp_path: Path) -> None:
    tree, fake = plx_switch(tmp_path, ACS_OFF)
    got = run(tree.read(fake, recorded("dmesg-dmar-gvt-linux-60.txt")))
    assert (got["iommu"].status, got["iommu"].summary) == (
        Status.PASS,
        "Intel VT-d in passthrough (identity) for the 2 GPUs' groups",
    )
    assert (got["pcie_acs"].status, got["pcie_acs"].summary) == (
        Status.PASS,
        "no ACS redirection on the 4 bridge(s) above the 2 GPUs",
    )
    assert "0000:03:00.0 " + PLX + ": ACSCtl no ACS capability" in got["pcie_acs"].details


def test_plx_downstream_ports_with_acs_on_are_named(tmp_path: Path) -> None:
    tree, fake = plx_switch(tmp_path, ACS_ON)
    acs = run(tree.read(fake))["pcie_acs"]
    assert acs.status is Status.WARN
    assert acs.summary.endswith(f"on 2 bridge(s) above the GPUs: 0000:04:08.0 ({PLX}), 0000:04:10.0 ({PLX})")
    assert [b["bdf"] for b in acs.data["bridges"] if b["redirect"]] == ["0000:04:08.0", "0000:04:10.0"]  # type: ignore[attr-defined,index]


def test_pending_reboot_after_pcie_p2p_is_a_warn_naming_the_change(tmp_path: Path) -> None:
    tree, fake = amd_root_ports(tmp_path)
    tree.fact(True, ["iommu=pt", "pci=noacs"], ["0000:40:01.1", "0000:60:01.1"])
    got = run(tree.read(fake))
    assert got["iommu"].status is Status.WARN and got["iommu"].remedy == remedies.PCIE_REBOOT
    assert got["iommu"].summary == (
        "reboot pending: pcie_p2p set iommu=pt pci=noacs, this boot's /proc/cmdline lacks it; AMD-Vi translated"
    )
    assert got["pcie_acs"].status is Status.WARN and got["pcie_acs"].remedy == remedies.PCIE_REBOOT
    assert got["iommu"].data["reboot_pending"] == ["iommu=pt", "pci=noacs"]
    assert "kernel_params iommu=pt pci=noacs" in got["iommu"].details


def test_after_the_reboot_the_params_are_on_the_cmdline_and_nothing_is_pending(tmp_path: Path) -> None:
    tree, fake = amd_root_ports(tmp_path, group_type="identity", ctl=ACS_OFF)
    tree.cmdline("BOOT_IMAGE=/vmlinuz ro iommu=pt pci=noacs")
    tree.fact(True, ["iommu=pt", "pci=noacs"])
    got = run(tree.read(fake))
    assert [got[i].status for i in ("iommu", "pcie_acs")] == [Status.PASS, Status.PASS]
    assert got["iommu"].summary == "AMD-Vi in passthrough (identity) for the 2 GPUs' groups"
    assert got["iommu"].data["provisioned"] is True and got["iommu"].data["reboot_pending"] == []


def test_geforce_gpus_pass_saying_p2p_is_off_by_design(tmp_path: Path) -> None:
    tree, fake = amd_root_ports(tmp_path)
    for bdf in ("0000:41:00.0", "0000:61:00.0"):
        fake.names[bdf] = GEFORCE
    got = run(tree.read(fake))
    assert got["pcie_acs"].status is Status.PASS and got["pcie_acs"].summary == pcie.GEFORCE_NOTE
    assert got["iommu"].summary == pcie.GEFORCE_NOTE + "; AMD-Vi translated"
    assert got["pcie_acs"].data["p2p_expected"] is False and got["iommu"].data["p2p_expected"] is False


def test_nvml_name_is_used_when_lspci_has_no_name(tmp_path: Path) -> None:
    tree, fake = amd_root_ports(tmp_path)
    del fake.names["0000:41:00.0"], fake.names["0000:61:00.0"]
    gpus = (replace(gpu(0, "NVIDIA GeForce RTX 5090"), bus_id="00000000:41:00.0"),)
    ctx = Context(facts=replace(facts_for(gpus), pcie_read=tree.read(fake)))
    result = runner.run([pcie.AcsCheck()], ctx)[0]
    assert result.data["gpus"][0]["name"] == "NVIDIA GeForce RTX 5090"  # type: ignore[index]
    assert result.summary == pcie.GEFORCE_NOTE


def test_one_gpu_passes_saying_p2p_does_not_matter(tmp_path: Path) -> None:
    tree = Tree(tmp_path)
    tree.cmdline("ro")
    tree.bridge(["pci0000:00", "0000:00:01.0"])
    tree.device(["pci0000:00", "0000:00:01.0", "0000:01:00.0"], group="3", group_type="DMA")
    fake = FakeLspci(names={"0000:01:00.0": "3D controller: NVIDIA Corporation GH100 [H200 NVL]"})
    got = run(tree.read(fake))
    assert got["iommu"].summary == "one NVIDIA GPU (0000:01:00.0): P2P does not matter with one GPU; IOMMU translated"
    assert got["pcie_acs"].summary == "one NVIDIA GPU (0000:01:00.0): P2P does not matter with one GPU"
    assert got["iommu"].status is Status.PASS and got["pcie_acs"].status is Status.PASS


def test_gpus_on_a_flat_vm_bus_skip_acs_saying_it_is_the_hosts(tmp_path: Path) -> None:
    tree = Tree(tmp_path)
    tree.cmdline("ro")
    for bdf in ("0000:00:05.0", "0000:00:06.0"):
        tree.device(["pci0000:00", bdf])
    got = run(tree.read(FakeLspci(names={"0000:00:05.0": "x", "0000:00:06.0": "x"})))
    assert got["pcie_acs"].status is Status.SKIP
    assert got["pcie_acs"].summary.startswith("no PCI bridge above the GPUs (a VM or container with a flat bus)")
    assert (got["iommu"].status, got["iommu"].summary) == (Status.PASS, "no IOMMU translates the 2 GPUs' DMA (none)")


def test_no_lspci_skips_acs_with_the_install(tmp_path: Path) -> None:
    tree, _ = plx_switch(tmp_path, ACS_ON)
    acs = run(tree.read(FakeLspci(missing=True)))["pcie_acs"]
    assert (acs.status, acs.summary, acs.remedy) == (
        Status.SKIP,
        "cannot read ACS: lspci not found (install pciutils)",
        remedies.LSPCI_MISSING,
    )


def test_not_root_skips_acs_naming_the_bridges(tmp_path: Path) -> None:
    tree, fake = plx_switch(tmp_path, ACS_ON)
    fake.denied = True
    acs = run(tree.read(fake))["pcie_acs"]
    assert acs.status is Status.SKIP and acs.remedy == remedies.LSPCI_ROOT
    assert acs.summary == (
        "ACS control of 4 bridge(s) above the GPUs is unreadable (0000:04:08.0, 0000:03:00.0, 0000:00:03.0, "
        "0000:04:10.0)"
    )


def test_no_sysfs_skips_both(tmp_path: Path) -> None:
    got = run(node.read(tmp_path, FakeLspci(), lambda: [], tmp_path / "none.json"))
    assert [got[i].status for i in ("iommu", "pcie_acs")] == [Status.SKIP, Status.SKIP]
    assert got["pcie_acs"].summary.startswith("the PCI topology is not readable:")


def test_iommu_on_with_no_readable_mode_warns(tmp_path: Path) -> None:
    tree, fake = plx_switch(tmp_path, ACS_OFF, group_type="")
    tree.cmdline("ro quiet")
    iommu = run(tree.read(fake))["iommu"]
    assert iommu.status is Status.WARN and iommu.summary.startswith(
        "Intel VT-d is on but its mode for the GPUs cannot be read"
    )


def test_translated_default_domain_in_the_log_warns_without_group_types(tmp_path: Path) -> None:
    tree, fake = plx_switch(tmp_path, ACS_OFF, group_type="")
    tree.cmdline("ro quiet")
    iommu = run(tree.read(fake, recorded("dmesg-translated-dev-vm.txt")))["iommu"]
    assert iommu.status is Status.WARN
    assert iommu.summary.startswith("Intel VT-d translates the 2 GPUs' DMA (default domain Translated)")


def test_a_malformed_fact_file_warns_naming_the_field(tmp_path: Path) -> None:
    tree, fake = plx_switch(tmp_path, ACS_OFF)
    path = tree.fact(True, ["iommu=pt"])
    path.write_text(path.read_text().replace('"schema": 1', '"schema": "1"'))
    iommu = run(tree.read(fake))["iommu"]
    assert iommu.status is Status.WARN and iommu.remedy == remedies.PCIE_FACT_FILE
    assert 'field `schema` is "1", this doctor reads schema 1' in iommu.summary


def test_both_checks_are_level_1_in_the_catalogue_under_pcie_p2p() -> None:
    found = {c.id: (c.level, c.family, c.requires) for c in all_checks() if c.family == "pcie_p2p" and c.level < 3}
    assert found == {"iommu": (1, "pcie_p2p", ()), "pcie_acs": (1, "pcie_p2p", ())}  # nccl_pairs: level 3


def test_the_run_reads_the_fabric_once_only_when_a_check_that_needs_it_is_chosen() -> None:
    assert pcie_reader([pcie.IommuCheck()]) is node.read
    needing = {c.id for c in all_checks() if needs_pcie(c)}
    assert needing == {"iommu", "pcie_acs", "topology", "gpu_peer_bandwidth", "gpu_peer_stress"}
    assert pcie_reader([c for c in all_checks() if c.id not in needing]) is None


def test_bridges_the_role_cleared_that_still_redirect_are_named(tmp_path: Path) -> None:
    tree, fake = amd_root_ports(tmp_path)
    tree.fact(False, [], ["40:01.1"])
    acs = run(tree.read(fake))["pcie_acs"]
    assert acs.status is Status.WARN and acs.remedy == remedies.ACS_REDIRECT
    assert "pcie_p2p cleared ACS on 0000:40:01.1 (its fact file), yet lspci shows redirection there now" in acs.details


def test_the_pex_switch_name_is_the_recorded_one() -> None:
    assert (
        PLX == "PCI bridge: PLX Technology, Inc. PEX 8747 48-Lane, 5-Port PCI Express Gen 3 (8.0 GT/s) Switch (rev ca)"
    )


def test_a_fabric_read_that_raises_is_an_unreadable_fabric_not_a_crash() -> None:
    def hostile() -> node.PcieFacts:
        raise PermissionError(13, "Permission denied", "/sys/bus/pci/devices")

    got = run(read_pcie(hostile))
    assert got["iommu"].status is Status.SKIP and got["pcie_acs"].status is Status.SKIP
    assert "the PCIe fabric read failed: PermissionError" in got["iommu"].summary
