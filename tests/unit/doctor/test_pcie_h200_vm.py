"""The PCIe readers on what the lent GPU machine recorded (docs/validation/2026-12-02-h200-sglang-server): a Firecracker
VM with one H200 at 0000:00:06.0 on its root bus, no bridge, no IOMMU unit, no IOMMU group, its real /proc/cmdline
(tests/fixtures/pcie/cmdline-h200-firecracker-vm.txt) and its one IOMMU kernel-log line, "iommu: Default domain type:
Translated", which the kernel prints with or without an IOMMU.

The sysfs tree is rebuilt here from what that run's doctor report says (the GPU's address, no bridge, no group):
the device paths themselves did not come back from the machine.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from doctor_helpers import facts_for
from pcie_trees import ACS_OFF, FakeLspci, Tree, plx_switch, recorded

from sm120check.doctor import runner
from sm120check.doctor.model import Context, Result, Status
from sm120check.doctor.pcie import cmdline, kernel_log, node
from sm120check.doctor.pcie_p2p import fabric as pcie

RECORD = Path(__file__).resolve().parents[3] / "docs/validation/2026-12-02-h200-sglang-server/pcie-doctor-run1.json"
H200 = "0000:00:06.0"


def vm(root: Path) -> node.PcieFacts:
    tree = Tree(root)
    tree.cmdline(recorded("cmdline-h200-firecracker-vm.txt")[0])
    tree.device(["pci0000:00", H200])
    return tree.read(FakeLspci(), recorded("dmesg-h200-firecracker-vm.txt"))


def run(facts: node.PcieFacts) -> dict[str, Result]:
    ctx = Context(facts=replace(facts_for(None), pcie_read=facts))
    return {r.id: r for r in runner.run([pcie.IommuCheck(), pcie.AcsCheck()], ctx)}


def test_the_vms_cmdline_has_no_iommu_parameter_and_only_pci_realloc() -> None:
    params = cmdline.parse(recorded("cmdline-h200-firecracker-vm.txt")[0])
    assert (params.iommu, params.intel_iommu, params.amd_iommu, params.iommu_passthrough) == ("", "", "", "")
    assert (params.passthrough, params.off, params.noacs) == (False, False, False)
    assert params.pci == ("realloc=off",) and params.relevant == ("pci=realloc=off",)


def test_the_vms_log_line_is_read_as_logged() -> None:
    log = kernel_log.parse(recorded("dmesg-h200-firecracker-vm.txt"))
    assert log.default_domain == "Translated" and log.kind == ""


def test_the_rebuilt_vm_gives_the_verdicts_the_real_vm_gave(tmp_path: Path) -> None:
    recorded_results = {r["id"]: r for r in json.loads(RECORD.read_text(encoding="utf-8"))["results"]}
    got = run(vm(tmp_path))
    for check in ("iommu", "pcie_acs"):
        assert (got[check].status.value, got[check].summary) == (
            recorded_results[check]["status"],
            recorded_results[check]["summary"],
        )
    assert got["iommu"].summary == "one NVIDIA GPU (0000:00:06.0): P2P does not matter with one GPU; IOMMU none"
    assert got["iommu"].data["mode"] == "none" and got["iommu"].data["cmdline"] == ["pci=realloc=off"]
    assert got["pcie_acs"].data["gpus"] == [
        {
            "bdf": H200,
            "name": "",
            "geforce": False,
            "iommu_group": "",
            "group_type": "",
            "bridges": [],
            "root_complex": "pci0000:00",
        }
    ]


def test_a_default_domain_logged_without_any_iommu_is_not_reported_as_translated(tmp_path: Path) -> None:
    recorded_iommu = next(r for r in json.loads(RECORD.read_text(encoding="utf-8"))["results"] if r["id"] == "iommu")
    assert recorded_iommu["data"]["default_domain"] == "Translated"  # what the doctor said before the fix
    iommu = run(vm(tmp_path))["iommu"]
    assert iommu.data["default_domain"] == ""
    assert (
        "default domain Translated: the kernel's built-in default, logged with or without an IOMMU: "
        "no IOMMU unit or group here"
    ) in iommu.details.splitlines()


def test_two_gpus_on_the_vms_flat_bus_without_an_iommu_pass_iommu_none(tmp_path: Path) -> None:
    tree = Tree(tmp_path)
    tree.cmdline(recorded("cmdline-h200-firecracker-vm.txt")[0])
    for bdf in ("0000:00:05.0", H200):
        tree.device(["pci0000:00", bdf])
    iommu = run(tree.read(FakeLspci(), recorded("dmesg-h200-firecracker-vm.txt")))["iommu"]
    assert (iommu.status, iommu.summary) == (Status.PASS, "no IOMMU translates the 2 GPUs' DMA (none)")
    assert iommu.data["default_domain"] == ""


def test_the_logged_default_domain_still_counts_where_an_iommu_is_there(tmp_path: Path) -> None:
    tree, fake = plx_switch(tmp_path, ACS_OFF, group_type="")
    tree.cmdline("ro quiet")
    iommu = run(tree.read(fake, recorded("dmesg-h200-firecracker-vm.txt")))["iommu"]
    assert iommu.status is Status.WARN and iommu.data["default_domain"] == "Translated"
    assert iommu.summary.startswith("Intel VT-d translates the 2 GPUs' DMA (default domain Translated)")
