"""roles/pcie_p2p on a fixture sysfs tree: the ACS script clears exactly the redirect bits above NVIDIA devices, and
the role writes the GRUB drop-in, the boot unit, the nvidia_uvm option and the fact file, or refuses, or does nothing.

No PCIe hardware here: the sysfs tree is built by `sysfs_tree` (the layout of /sys/devices/pci*/ and
/sys/bus/pci/devices symlinks), and setpci is replaced by STAND-IN SETPCI, a script that keeps each bridge's ACS
Control register in a JSON file, answers reads and writes with setpci's syntax, and records every call. Its message
for a bridge without ACS is the one real setpci (pciutils 3.9.0, Debian 12) prints, with its exit status 1.
The role runs through a real `ansible-playbook` (connection local) with every destination under a temporary directory.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from lab.local_play import local_play

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "roles/pcie_p2p/files/pcie-acs-clear"
ANSIBLE = str(Path(sys.executable).parent / "ansible-playbook")
PLAY = "- hosts: localhost\n  connection: local\n  gather_facts: false\n  roles: [pcie_p2p]\n"

# (path of the device under devices/, vendor, class); bridges are every device with class 0x060400.
TOPOLOGY = [
    ("pci0000:00/0000:00:01.1", "0x1022", "0x060400"),  # root port (AMD)
    ("pci0000:00/0000:00:01.1/0000:01:00.0", "0x1000", "0x060400"),  # switch upstream port, no ACS
    ("pci0000:00/0000:00:01.1/0000:01:00.0/0000:02:00.0", "0x1000", "0x060400"),  # switch downstream port
    ("pci0000:00/0000:00:01.1/0000:01:00.0/0000:02:00.0/0000:03:00.0", "0x10de", "0x030000"),  # GPU (VGA)
    ("pci0000:00/0000:00:01.1/0000:01:00.0/0000:02:00.0/0000:03:00.1", "0x10de", "0x040300"),  # its audio
    ("pci0000:00/0000:00:03.1", "0x1022", "0x060400"),  # root port
    ("pci0000:00/0000:00:03.1/0000:04:00.0", "0x10de", "0x030200"),  # GPU (3D controller)
    ("pci0000:00/0000:00:08.1", "0x1022", "0x060400"),  # root port of a NIC: never touched
    ("pci0000:00/0000:00:08.1/0000:05:00.0", "0x15b3", "0x020000"),  # NIC (Mellanox)
]
# ACS Control (ECAP_ACS+6.w) per bridge; None: no ACS capability. 0x001f and 0x005d carry ReqRedir|CmpltRedir (0x000c).
ACS = {
    "0000:00:01.1": "001f",
    "0000:01:00.0": None,
    "0000:02:00.0": "005d",
    "0000:00:03.1": "0011",
    "0000:00:08.1": "001f",
}
NO_ACS_MESSAGE = (
    "setpci: {bdf}: Instance #0 of Extended capability 000d not found - there are no capabilities with that id."
)

STAND_IN_SETPCI = '''#!{python}
"""STAND-IN SETPCI (tests only): ACS Control registers from a JSON file; every call recorded."""
import json, sys
state_path, log_path = {state!r}, {log!r}
args = sys.argv[1:]
with open(log_path, "a") as log:
    log.write(json.dumps(args) + "\\n")
assert args[0] == "-s" and len(args) == 3, args
bdf, op = args[1], args[2]
state = json.load(open(state_path))
if state.get(bdf) is None:
    print({message!r}.format(bdf=bdf), file=sys.stderr)
    sys.exit(1)
if op == "ECAP_ACS+6.w":
    print(state[bdf])
elif op.startswith("ECAP_ACS+6.w="):
    state[bdf] = "%04x" % int(op.split("=", 1)[1], 16)
    json.dump(state, open(state_path, "w"))
else:
    sys.exit("stand-in setpci: unexpected operation " + op)
'''


def sysfs_tree(root: Path, topology: list[tuple[str, str, str]]) -> Path:
    """A sysfs tree: devices/pci*/<bdf>/{vendor,class} and bus/pci/devices/<bdf> -> ../../../devices/..."""
    links = root / "bus" / "pci" / "devices"
    links.mkdir(parents=True)
    for rel, vendor, pci_class in topology:
        device = root / "devices" / rel
        device.mkdir(parents=True)
        (device / "vendor").write_text(vendor + "\n")
        (device / "class").write_text(pci_class + "\n")
        (links / device.name).symlink_to(Path("../../../devices") / rel)
    return root


def stand_in_setpci(tmp: Path, acs: dict[str, str | None]) -> tuple[Path, Path, Path]:
    """The stand-in setpci, its register file and its call log."""
    state, log = tmp / "acs-state.json", tmp / "setpci-calls.jsonl"
    state.write_text(json.dumps(acs))
    log.write_text("")
    tool = tmp / "bin" / "setpci"
    tool.parent.mkdir(exist_ok=True)
    tool.write_text(
        STAND_IN_SETPCI.format(python=sys.executable, state=str(state), log=str(log), message=NO_ACS_MESSAGE)
    )
    tool.chmod(0o755)
    return tool, state, log


def calls(log: Path) -> list[list[str]]:
    return [json.loads(line) for line in log.read_text().splitlines()]


def writes(log: Path) -> list[list[str]]:
    return [call for call in calls(log) if "=" in call[2]]


def run_script(sysfs: Path, setpci: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--sysfs-root", str(sysfs), "--setpci", str(setpci), *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


def test_acs_script_clears_only_the_redirect_bits_above_nvidia_devices(tmp_path: Path) -> None:
    sysfs = sysfs_tree(tmp_path / "sys", TOPOLOGY)
    setpci, state, log = stand_in_setpci(tmp_path, ACS)
    result = run_script(sysfs, setpci)
    assert result.returncode == 0, result.stdout + result.stderr
    assert writes(log) == [["-s", "0000:00:01.1", "ECAP_ACS+6.w=0013"], ["-s", "0000:02:00.0", "ECAP_ACS+6.w=0051"]]
    after = json.loads(state.read_text())
    assert after == {**ACS, "0000:00:01.1": "0013", "0000:02:00.0": "0051"}  # the NIC's root port keeps 001f
    assert not any(call[1] == "0000:00:08.1" for call in calls(log)), "a bridge above no NVIDIA device was read"
    assert "0000:00:01.1: ACS control 001f -> 0013 (ReqRedir and CmpltRedir cleared)" in result.stdout
    assert "0000:01:00.0: no ACS capability; left alone" in result.stdout


def test_acs_script_rerun_changes_nothing(tmp_path: Path) -> None:
    sysfs = sysfs_tree(tmp_path / "sys", TOPOLOGY)
    setpci, _, log = stand_in_setpci(tmp_path, ACS)
    assert run_script(sysfs, setpci).returncode == 0
    log.write_text("")
    again = run_script(sysfs, setpci)
    assert again.returncode == 0, again.stdout + again.stderr
    assert writes(log) == []
    assert "redirects peer traffic; nothing to do" in again.stdout


def test_acs_script_dry_run_and_report_write_nothing(tmp_path: Path) -> None:
    sysfs = sysfs_tree(tmp_path / "sys", TOPOLOGY)
    setpci, _, log = stand_in_setpci(tmp_path, ACS)
    dry = run_script(sysfs, setpci, "--dry-run")
    assert "0000:02:00.0: would set ACS control 005d -> 0051" in dry.stdout
    report = json.loads(run_script(sysfs, setpci, "--report").stdout)
    assert writes(log) == []
    gpus = {d["bdf"]: d["bridges"] for d in report["devices"] if d["gpu"]}
    assert gpus == {"0000:03:00.0": ["0000:00:01.1", "0000:01:00.0", "0000:02:00.0"], "0000:04:00.0": ["0000:00:03.1"]}
    assert report["acs"] == {
        "0000:00:01.1": {"control": "001f", "redirect": True},
        "0000:01:00.0": None,
        "0000:02:00.0": {"control": "005d", "redirect": True},
        "0000:00:03.1": {"control": "0011", "redirect": False},
    }


def test_acs_script_fails_when_a_write_does_not_hold(tmp_path: Path) -> None:
    sysfs = sysfs_tree(tmp_path / "sys", TOPOLOGY)
    setpci, _, _ = stand_in_setpci(tmp_path, ACS)
    stuck = tmp_path / "bin" / "stuck-setpci"  # answers reads, ignores writes: a register that does not take them
    stuck.write_text(f'#!/bin/sh\ncase "$3" in *=*) exit 0 ;; esac\nexec {setpci} "$@"\n')
    stuck.chmod(0o755)
    result = run_script(sysfs, stuck)
    assert result.returncode == 1
    assert "0000:00:01.1: could not clear ACS redirect (001f)" in result.stdout


def test_acs_script_without_nvidia_devices_does_nothing(tmp_path: Path) -> None:
    sysfs = sysfs_tree(tmp_path / "sys", [t for t in TOPOLOGY if t[1] != "0x10de"])
    setpci, _, log = stand_in_setpci(tmp_path, ACS)
    result = run_script(sysfs, setpci)
    assert (result.returncode, calls(log)) == (0, [])
    assert "no NVIDIA devices; nothing to do" in result.stdout


CPUINFO = {
    "intel": "processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\n",
    "amd": "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\n",
}


def node(tmp: Path, vendor: str, cmdline: str, topology: list[tuple[str, str, str]] = TOPOLOGY) -> dict[str, Any]:
    """Role variables that point every path of the role into `tmp` (a fixture sysfs/procfs, stand-in tools)."""
    sysfs_tree(tmp / "sys", topology)
    proc = tmp / "proc"
    proc.mkdir()
    (proc / "cpuinfo").write_text(CPUINFO[vendor])
    (proc / "cmdline").write_text(cmdline + "\n")
    setpci, _, _ = stand_in_setpci(tmp, ACS)
    update_grub = tmp / "bin" / "update-grub"  # records its runs: the handler's only effect here
    update_grub.write_text(f"#!/bin/sh\necho run >> {tmp / 'update-grub.log'}\n")
    update_grub.chmod(0o755)
    (tmp / "units").mkdir()
    return {
        "pcie_p2p_sysfs_root": str(tmp / "sys"),
        "pcie_p2p_proc_root": str(proc),
        "pcie_p2p_setpci": str(setpci),
        "pcie_p2p_update_grub": str(update_grub),
        "pcie_p2p_grub_dropin": str(tmp / "etc/default/grub.d/99-sm120kit-pcie.cfg"),
        "pcie_p2p_fact_file": str(tmp / "var/lib/sm120kit/pcie-p2p.json"),
        "pcie_p2p_script": str(tmp / "lib/sm120kit/pcie-acs-clear"),
        "pcie_p2p_unit_dir": str(tmp / "units"),
        "pcie_p2p_modprobe_conf": str(tmp / "etc/modprobe.d/sm120kit-nvidia-uvm.conf"),
        "pcie_p2p_install_pciutils": False,
        "pcie_p2p_enable_unit": False,
        # This machine (and CI) may itself be a container: the role's container marks are looked for in tmp instead.
        "_pcie_p2p_container_markers": [str(tmp / "run/.containerenv")],
    }


def run_role(tmp: Path, variables: dict[str, Any], *args: str) -> subprocess.CompletedProcess[str]:
    return local_play(tmp, PLAY, variables, *args)


def changed(result: subprocess.CompletedProcess[str]) -> int:
    (recap,) = (line for line in result.stdout.splitlines() if line.startswith("localhost"))
    return int(recap.split("changed=")[1].split()[0])


def grub_runs(tmp: Path) -> int:
    log = tmp / "update-grub.log"
    return len(log.read_text().splitlines()) if log.exists() else 0


def test_role_on_an_amd_node_writes_the_dropin_unit_option_and_fact_file(tmp_path: Path) -> None:
    variables = node(tmp_path, "amd", "BOOT_IMAGE=/vmlinuz root=/dev/sda1 ro quiet")
    first = run_role(tmp_path, variables)
    assert first.returncode == 0, first.stdout[-4000:] + first.stderr[-2000:]
    dropin = Path(variables["pcie_p2p_grub_dropin"])
    assert 'GRUB_CMDLINE_LINUX_DEFAULT="${GRUB_CMDLINE_LINUX_DEFAULT} iommu=pt"' in dropin.read_text().splitlines()
    # update-grub sources the drop-in after /etc/default/grub: the parameters join what was there.
    sourced = subprocess.run(
        ["bash", "-c", f'GRUB_CMDLINE_LINUX_DEFAULT="quiet"; . {dropin}; printf %s "$GRUB_CMDLINE_LINUX_DEFAULT"'],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert sourced == "quiet iommu=pt"
    assert grub_runs(tmp_path) == 1
    assert (
        Path(variables["pcie_p2p_modprobe_conf"]).read_text().splitlines()[-1] == "options nvidia_uvm uvm_disable_hmm=1"
    )
    assert os.access(variables["pcie_p2p_script"], os.X_OK)
    fact = json.loads(Path(variables["pcie_p2p_fact_file"]).read_text())
    assert list(fact) == ["schema", "reboot_required", "changes", "kernel_params", "acs_bridges", "written_at"]
    assert fact["schema"] == 1 and fact["reboot_required"] is True
    assert fact["kernel_params"] == ["iommu=pt"]
    assert fact["acs_bridges"] == ["0000:00:01.1", "0000:00:03.1", "0000:02:00.0"]  # not the NIC's port
    assert fact["changes"] == [f"kernel parameters iommu=pt are in {dropin} and take effect at the next boot"]
    assert fact["written_at"].endswith("Z") and fact["written_at"][:4].isdigit()

    second = run_role(tmp_path, variables)
    assert second.returncode == 0 and changed(second) == 0, second.stdout[-4000:]
    assert grub_runs(tmp_path) == 1
    check = run_role(tmp_path, variables, "--check", "--diff")
    assert check.returncode == 0 and changed(check) == 0, check.stdout[-4000:]


def test_boot_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    variables = node(tmp_path, "amd", "ro quiet")
    result = run_role(tmp_path, variables)
    assert result.returncode == 0, result.stdout[-4000:]
    unit = tmp_path / "units" / "sm120kit-pcie-acs.service"
    text = unit.read_text()
    assert "Before=nvidia-persistenced.service sglang-server.service" in text
    assert "WantedBy=multi-user.target" in text and "Type=oneshot" in text
    assert f"ExecStart={variables['pcie_p2p_script']} --sysfs-root {variables['pcie_p2p_sysfs_root']}" in text
    if not shutil.which("systemd-analyze"):
        assert not os.environ.get("CI"), "CI must have systemd-analyze (Debian's systemd package) for this test"
        pytest.skip("systemd-analyze is not installed on this machine")
    verify = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, check=False, timeout=120
    )
    own = [line for line in verify.stderr.splitlines() if "sm120kit-pcie-acs" in line]
    assert verify.returncode == 0 and not own, verify.stderr


def test_role_on_an_intel_node_with_the_parameters_booted_needs_no_reboot(tmp_path: Path) -> None:
    variables = node(tmp_path, "intel", "ro quiet intel_iommu=on iommu=pt pci=noacs")
    result = run_role(tmp_path, {**variables, "pcie_p2p_pci_noacs": True, "pcie_p2p_uvm_disable_hmm": False})
    assert result.returncode == 0, result.stdout[-4000:]
    assert Path(variables["pcie_p2p_grub_dropin"]).read_text().splitlines()[-1] == (
        'GRUB_CMDLINE_LINUX_DEFAULT="${GRUB_CMDLINE_LINUX_DEFAULT} intel_iommu=on iommu=pt pci=noacs"'
    )
    fact = json.loads(Path(variables["pcie_p2p_fact_file"]).read_text())
    assert (fact["reboot_required"], fact["changes"]) == (False, [])
    assert fact["kernel_params"] == ["intel_iommu=on", "iommu=pt", "pci=noacs"]
    assert not Path(variables["pcie_p2p_modprobe_conf"]).exists()


def test_role_without_nvidia_gpus_changes_nothing_and_says_so(tmp_path: Path) -> None:
    variables = node(tmp_path, "amd", "ro quiet", [t for t in TOPOLOGY if t[1] != "0x10de"])
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    result = run_role(tmp_path, variables)
    assert result.returncode == 0 and changed(result) == 0, result.stdout[-4000:]
    assert "No NVIDIA GPU in" in result.stdout and "nothing was changed" in result.stdout
    after = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.name not in ("play.yml", "vars.json"))
    assert after == before


def test_role_refuses_gpus_without_bridges_above_them(tmp_path: Path) -> None:
    vm = [("pci0000:00/0000:00:05.0", "0x10de", "0x030200")]  # a passed-through GPU on the VM's root bus
    variables = node(tmp_path, "intel", "ro quiet", vm)
    result = run_role(tmp_path, variables)
    assert result.returncode != 0
    assert "NVIDIA GPUs 0000:00:05.0 have no PCIe bridge above them" in result.stdout
    assert "pcie_p2p_enabled=false" in result.stdout
    assert not (tmp_path / "etc").exists() and not (tmp_path / "var").exists()
    disabled = run_role(tmp_path, {**variables, "pcie_p2p_enabled": False})
    assert disabled.returncode == 0 and changed(disabled) == 0, disabled.stdout[-3000:]


def test_role_refuses_a_container_with_gpus(tmp_path: Path) -> None:
    variables = node(tmp_path, "amd", "ro quiet")
    marker = tmp_path / "run/.containerenv"
    marker.parent.mkdir()
    marker.write_text("")
    result = run_role(tmp_path, variables)
    assert result.returncode != 0
    assert f"{marker} exists: this is a container, and the kernel command line, ACS and nvidia_uvm" in result.stdout
    assert not (tmp_path / "etc").exists() and not (tmp_path / "var").exists()


def test_role_refuses_a_node_without_update_grub(tmp_path: Path) -> None:
    variables = node(tmp_path, "amd", "ro quiet")
    result = run_role(tmp_path, {**variables, "pcie_p2p_update_grub": str(tmp_path / "no/update-grub")})
    assert result.returncode != 0
    assert "does not exist: this node boots with another loader (systemd-boot, or grubby on" in result.stdout
    assert "pcie_p2p_manage_grub=false" in result.stdout
    assert not (tmp_path / "etc").exists()
    manual = run_role(
        tmp_path, {**variables, "pcie_p2p_update_grub": str(tmp_path / "no/update-grub"), "pcie_p2p_manage_grub": False}
    )
    assert manual.returncode == 0, manual.stdout[-3000:]
    assert not Path(variables["pcie_p2p_grub_dropin"]).exists()
    fact = json.loads(Path(variables["pcie_p2p_fact_file"]).read_text())
    assert fact["reboot_required"] is True and "pcie_p2p_manage_grub is false" in fact["changes"][0]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"pcie_p2p_iommu": "bogus"}, "value of pcie_p2p_iommu must be one of: passthrough, off, unchanged"),
        ({"pcie_p2p_pci_noacs": "maybe"}, "pcie_p2p_pci_noacs"),
        ({"pcie_p2p_extra_kernel_params": "pcie_aspm=off"}, "pcie_p2p_extra_kernel_params"),
        ({"pcie_p2p_extra_kernel_params": ['a" b']}, 'pcie_p2p_extra_kernel_params: "a\\" b"'),
        ({"pcie_p2p_reboot_timeout": "soon"}, "pcie_p2p_reboot_timeout"),
    ],
    ids=["iommu choice", "bool", "list", "parameter with a quote", "int"],
)
def test_role_refuses_bad_values_before_any_change(tmp_path: Path, overrides: dict[str, Any], message: str) -> None:
    variables = node(tmp_path, "amd", "ro quiet")
    result = run_role(tmp_path, {**variables, **overrides})
    assert result.returncode != 0
    assert message in result.stdout, result.stdout[-3000:]
    assert not (tmp_path / "etc").exists() and not (tmp_path / "var").exists()


def test_check_mode_on_a_fresh_gpu_node_shows_the_changes_and_writes_nothing(tmp_path: Path) -> None:
    variables = node(tmp_path, "intel", "ro quiet")
    result = run_role(tmp_path, variables, "--check", "--diff")
    assert result.returncode == 0, result.stdout[-4000:]
    assert changed(result) > 0
    assert '+GRUB_CMDLINE_LINUX_DEFAULT="${GRUB_CMDLINE_LINUX_DEFAULT} intel_iommu=on iommu=pt"' in result.stdout
    assert not (tmp_path / "etc").exists() and not (tmp_path / "var").exists() and not (tmp_path / "lib").exists()
    assert grub_runs(tmp_path) == 0


def test_rolling_back_through_the_role_removes_what_it_wrote(tmp_path: Path) -> None:
    variables = node(tmp_path, "amd", "ro quiet iommu=pt")
    assert run_role(tmp_path, variables).returncode == 0
    back = {
        **variables,
        "pcie_p2p_iommu": "unchanged",
        "pcie_p2p_acs_clear": False,
        "pcie_p2p_uvm_disable_hmm": False,
    }
    result = run_role(tmp_path, back)
    assert result.returncode == 0, result.stdout[-4000:]
    assert grub_runs(tmp_path) == 2  # update-grub again, without the drop-in
    for path in ("pcie_p2p_grub_dropin", "pcie_p2p_modprobe_conf", "pcie_p2p_script"):
        assert not Path(variables[path]).exists(), path
    assert not (tmp_path / "units" / "sm120kit-pcie-acs.service").exists()
    fact = json.loads(Path(variables["pcie_p2p_fact_file"]).read_text())
    assert (fact["kernel_params"], fact["reboot_required"], fact["changes"]) == ([], False, [])
