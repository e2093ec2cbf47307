"""The PCIe fabric readers of the `iommu` and `pcie_acs` checks (doctor/pcie/): recorded fragments, fixture sysfs
trees, and hostile files from another machine (huge, binary, a FIFO, links out of the tree, malformed fact files)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from pcie_trees import ACS_OFF, ACS_ON, PLX, FakeLspci, Tree, amd_root_ports, device_block, plx_switch, recorded

from sm120check.bounded import Unreadable, read_text
from sm120check.doctor.pcie import cmdline, fact_file, kernel_log, lspci, node, sysfs


def test_cmdline_with_amd_iommu_on_and_iommu_pt_is_passthrough() -> None:
    params = cmdline.parse(recorded("cmdline-aikitoria-25-grub.txt")[0])
    assert (params.amd_iommu, params.iommu, params.passthrough, params.off, params.noacs) == (
        "on",
        "pt",
        True,
        False,
        False,
    )
    assert params.relevant == ("amd_iommu=on", "iommu=pt")


def test_cmdline_reads_off_noacs_lists_and_the_last_value_wins() -> None:
    params = cmdline.parse("ro intel_iommu=on,sm_on iommu=force iommu=off pci=realloc,noacs iommu.passthrough=1")
    assert (params.intel_iommu, params.iommu, params.iommu_passthrough) == ("on", "off", "1")
    assert params.off and params.noacs and params.passthrough
    assert params.has("pci=noacs") and params.has("iommu=off") and not params.has("iommu=pt")


def test_cmdline_of_garbage_is_no_parameter_not_an_error() -> None:
    params = cmdline.parse("\x1b[31m === iommu pci= amd_iommu =pt " + "x" * 10000)
    assert (params.iommu, params.amd_iommu, params.pci, params.passthrough) == ("", "", (), False)


def test_kernel_log_amd_vi_lines_name_amd_vi() -> None:
    log = kernel_log.parse(recorded("dmesg-amd-vi-rtl88x2bu-151.txt"), "dmesg")
    assert log.kind == "AMD-Vi" and log.default_domain == ""
    assert log.lines == (
        "[    0.378536] AMD-Vi: Interrupt remapping enabled",
        "[    0.378536] AMD-Vi: Virtual APIC enabled",
    )


def test_kernel_log_dmar_lines_name_intel_vt_d() -> None:
    log = kernel_log.parse(recorded("dmesg-dmar-sof-test-744.txt") + recorded("dmesg-dmar-gvt-linux-60.txt"))
    assert log.kind == "Intel VT-d"
    assert [line.split("DMAR: ")[1] for line in log.lines] == [
        "Intel-IOMMU force enabled due to platform opt in",
        "Intel(R) Virtualization Technology for Directed I/O",
    ]


def test_kernel_log_default_domain_translated_is_read() -> None:
    log = kernel_log.parse(recorded("dmesg-translated-dev-vm.txt"))
    assert (log.default_domain, log.kind, log.lines) == (
        "Translated",
        "",
        ("[    0.281932] iommu: Default domain type: Translated",),
    )


def test_kernel_log_keeps_an_nvidia_io_page_fault_as_evidence() -> None:
    log = kernel_log.parse(recorded("dmesg-amd-vi-io-page-fault-cuda-samples-48.txt"))
    assert log.kind == "AMD-Vi" and len(log.lines) == 1 and "IO_PAGE_FAULT" in log.lines[0]


def test_recorded_acsctl_lines_redirect_exactly_where_req_or_cmplt_redir_is_on() -> None:
    lines = recorded("nccl-523-acsctl-grep.txt")
    states = [
        lspci.parse_device(f"0000:0{i:x}:00.0", device_block("0000:01:00.0", PLX, line)) for i, line in enumerate(lines)
    ]
    assert [s.redirects for s in states] == [
        True,
        False,
        False,
        False,
        False,
        False,
        False,
        False,
        True,
        True,
        True,
        True,
    ]
    assert [s.req_redir and s.cmplt_redir for s in states if s.redirects] == [True] * 5


def test_tab_separated_acsctl_is_read_like_spaces() -> None:
    lines = recorded("nccl-629-acsctl-tabs.txt")
    states = [lspci.parse_device("0000:01:00.0", f"01:00.0 {PLX}\n{line}\n") for line in lines]
    assert [s.redirects for s in states] == [False, False, False, True]
    assert states[3].ctl == "SrcValid+ TransBlk- ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans-"


def test_lspci_block_gives_name_cap_and_ctl() -> None:
    state = lspci.parse_device("0000:04:08.0", device_block("0000:04:08.0", PLX, ACS_ON))
    assert state.name == PLX and state.readable and state.has_acs and state.redirects
    assert state.cap.startswith("SrcValid+ TransBlk+ ReqRedir+")


def test_lspci_without_root_is_unreadable_not_clean() -> None:
    state = lspci.parse_device("0000:04:08.0", device_block("0000:04:08.0", PLX, None, denied=True))
    assert (state.readable, state.has_acs, state.redirects) == (False, False, False)


def test_lspci_binary_garbage_is_no_acs_and_no_traceback() -> None:
    garbage = bytes(range(256)).decode("latin-1") * 50 + "\n\tACSCtl: \x00\x01 ReqRedir+++ ;rm -rf\n"
    state = lspci.parse_device("0000:00:01.0", garbage)
    assert not state.redirects and len(state.name) <= 200


def test_lspci_that_fails_is_an_error_state() -> None:
    state = lspci.acs_of("0000:00:01.0", lambda args: lspci.CommandText(False, error="lspci -vvv exited 1: boom"))
    assert (state.readable, state.error) == (False, "lspci -vvv exited 1: boom")


def test_bridge_chain_walks_a_switch_fabric_nearest_first(tmp_path: Path) -> None:
    plx_switch(tmp_path, ACS_OFF)
    assert sysfs.bridge_chain(tmp_path, "0000:05:00.0") == ("0000:04:08.0", "0000:03:00.0", "0000:00:03.0")


def test_sysfs_lists_nvidia_gpus_with_groups_not_their_audio_or_bridges(tmp_path: Path) -> None:
    tree, _ = amd_root_ports(tmp_path)
    tree.device(["pci0000:40", "0000:40:01.1", "0000:41:00.1"], pci_class="0x040300", device="0x22e8")  # HDMI audio
    view = sysfs.read(tmp_path)
    assert [(g.bdf, g.bridges, g.iommu_group, g.group_type) for g in view.gpus] == [
        ("0000:41:00.0", ("0000:40:01.1",), "30", "DMA-FQ"),
        ("0000:61:00.0", ("0000:60:01.1",), "31", "DMA-FQ"),
    ]
    assert [(u.name, u.kind) for u in view.units] == [("ivhd0", "AMD-Vi")]


def test_iommu_unit_names_give_the_vendor() -> None:
    assert [sysfs.unit_kind(n) for n in ("dmar0", "ivhd1", "smmu3.0x0")] == ["Intel VT-d", "AMD-Vi", "other"]


def test_no_sysfs_is_an_error_naming_the_path(tmp_path: Path) -> None:
    view = sysfs.read(tmp_path)
    assert view.gpus == () and str(tmp_path / "sys" / "bus" / "pci" / "devices") in view.error


def test_a_device_linked_outside_the_tree_is_skipped(tmp_path: Path) -> None:
    bus = tmp_path / "sys" / "bus" / "pci" / "devices"
    bus.mkdir(parents=True)
    outside = tmp_path.parent / f"{tmp_path.name}-outside" / "0000:41:00.0"
    outside.mkdir(parents=True)
    for name, value in (("vendor", "0x10de"), ("class", "0x030200"), ("device", "0x2bb5")):
        (outside / name).write_text(value)
    (bus / "0000:41:00.0").symlink_to(outside)
    view = sysfs.read(tmp_path)
    assert view.gpus == () and "leads outside" in view.skipped[0]


def test_garbage_class_or_group_type_is_skipped_not_a_traceback(tmp_path: Path) -> None:
    tree = Tree(tmp_path)
    tree.device(["pci0000:00", "0000:00:01.0", "0000:01:00.0"], group="5", group_type="\x00\x01binary")
    tree.device(["pci0000:00", "0000:00:02.0", "0000:02:00.0"], pci_class="0x03\xff")
    tree.device(["pci0000:00", "0000:00:03.0", "0000:03:00.0"], group="7", group_type="$(reboot) DMA")
    view = sysfs.read(tmp_path)
    assert [(g.bdf, g.group_type) for g in view.gpus] == [("0000:01:00.0", ""), ("0000:03:00.0", "")]
    assert "binary" in view.gpus[0].problem and "not a group type" in view.gpus[1].problem


def test_read_text_refuses_a_huge_file(tmp_path: Path) -> None:
    path = tmp_path / "cmdline"
    path.write_bytes(b"a" * (1 << 20))
    with pytest.raises(Unreadable, match="larger than 64 KiB"):
        read_text(path, 64 << 10)


def test_read_text_refuses_binary_and_non_utf8(tmp_path: Path) -> None:
    (tmp_path / "bin").write_bytes(b"iommu=pt\x00\x01")
    (tmp_path / "latin").write_bytes(b"iommu=pt \xff\xfe")
    with pytest.raises(Unreadable, match="NUL bytes"):
        read_text(tmp_path / "bin", 64)
    with pytest.raises(Unreadable, match="not UTF-8"):
        read_text(tmp_path / "latin", 64)


def test_read_text_refuses_a_fifo_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "type"
    os.mkfifo(fifo)
    with pytest.raises(Unreadable, match="not a regular file"):
        read_text(fifo, 64)


def _fact(path: Path, **fields: object) -> fact_file.FactRead:
    doc: dict[str, object] = {
        "schema": 1,
        "reboot_required": True,
        "changes": ["GRUB_CMDLINE_LINUX: added iommu=pt"],
        "kernel_params": ["iommu=pt"],
        "acs_bridges": ["0000:40:01.1"],
        "written_at": "2026-12-01T22:00:00+00:00",
    }
    doc.update(fields)
    path.write_text(json.dumps({k: v for k, v in doc.items() if v is not _DROP}))
    return fact_file.read(path)


_DROP = object()


def test_fact_file_schema_1_is_read(tmp_path: Path) -> None:
    read = _fact(tmp_path / "f.json", written_at="2026-12-01T22:00:00Z")
    assert read.fact is not None and read.error == "" and not read.missing
    assert read.fact.to_json()["kernel_params"] == ["iommu=pt"] and read.fact.reboot_required


def test_missing_fact_file_means_not_provisioned(tmp_path: Path) -> None:
    read = fact_file.read(tmp_path / "absent.json")
    assert (read.missing, read.fact, read.error) == (True, None, "")


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"schema": 2}, "field `schema` is 2, this doctor reads schema 1"),
        ({"schema": True}, "field `schema` is true, this doctor reads schema 1"),
        ({"reboot_required": "yes"}, 'field `reboot_required` must be true or false, not "yes"'),
        ({"changes": "iommu=pt"}, 'field `changes` must be a list of sentences (at most 256), not "iommu=pt"'),
        ({"kernel_params": ["iommu=pt", 7]}, "field `kernel_params[1]` must be a kernel parameter"),
        ({"kernel_params": ["iommu=pt quiet"]}, "field `kernel_params[0]` must be a kernel parameter"),
        ({"acs_bridges": ["0000:40:01.1"] * 300}, "field `acs_bridges` has 300 items, more than 256"),
        ({"acs_bridges": ["x"]}, "field `acs_bridges[0]` must be a PCI address such as 0000:40:01.1"),
        ({"written_at": "yesterday"}, "field `written_at` must be an ISO-8601 time such as 2026-12-01T23:00:00Z"),
        ({"written_at": "2026-13-45T00:00:00Z"}, "field `written_at` is not a real time"),
        ({"written_at": _DROP}, "has no `written_at` field"),
        ({"extra": 1}, 'has an unknown field "extra" in `(top level)` (schema 1)'),
    ],
)
def test_malformed_fact_file_names_the_field(tmp_path: Path, fields: dict[str, object], message: str) -> None:
    read = _fact(tmp_path / "f.json", **fields)
    assert read.fact is None and message in read.error and str(tmp_path / "f.json") in read.error


def test_fact_file_not_json_huge_or_a_fifo_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "huge.json").write_text("[" * 70000)
    os.mkfifo(tmp_path / "fifo.json")
    (tmp_path / "list.json").write_text("[1, 2]")
    errors = [fact_file.read(tmp_path / n).error for n in ("bad.json", "huge.json", "fifo.json", "list.json")]
    assert "not JSON" in errors[0] and "larger than" in errors[1] and "not a regular file" in errors[2]
    assert "is a JSON list, not an object" in errors[3]


def test_node_read_asks_lspci_once_per_bridge_and_gpu(tmp_path: Path) -> None:
    tree, fake = plx_switch(tmp_path, ACS_ON)
    facts = tree.read(fake, recorded("dmesg-dmar-gvt-linux-60.txt"))
    vvv = sorted(c[-1] for c in fake.calls if c[0] == "-vvv")
    assert vvv == ["0000:00:03.0", "0000:03:00.0", "0000:04:08.0", "0000:04:10.0"]
    assert facts.names == {"0000:05:00.0": fake.names["0000:05:00.0"], "0000:06:00.0": fake.names["0000:06:00.0"]}
    assert json.loads(json.dumps(facts.to_json()))["acs"]["0000:04:08.0"]["redirect"] is True


def test_node_read_without_lspci_says_so(tmp_path: Path) -> None:
    tree, _ = plx_switch(tmp_path, ACS_ON)
    facts = tree.read(FakeLspci(missing=True))
    assert facts.lspci_error == "lspci not found (install pciutils)" and facts.acs == {}


def test_node_read_with_an_unreadable_cmdline_keeps_the_reason(tmp_path: Path) -> None:
    _, fake = plx_switch(tmp_path, ACS_OFF)
    (tmp_path / "proc" / "cmdline").unlink()
    os.mkfifo(tmp_path / "proc" / "cmdline")
    facts = node.read(tmp_path, fake, lambda: [], tmp_path / "none.json")
    assert facts.cmdline is None and "not a regular file" in facts.cmdline_error


def test_a_bus_listing_past_its_bound_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    amd_root_ports(tmp_path)
    bus = tmp_path / "sys" / "bus" / "pci" / "devices"
    for n in range(10):  # bridges and other devices beside the two GPUs
        (bus / f"0000:f0:{n:02x}.0").mkdir()
    monkeypatch.setattr(sysfs, "MAX_DEVICES", 8)
    view = sysfs.read(tmp_path)  # was silent: a GPU listed past the bound read as "no NVIDIA GPU" (probe 3 PC11)
    assert f"{bus}: more than 8 entries; only 8 of them were read" in view.skipped
