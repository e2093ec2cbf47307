"""The `sglang_server` role's launch honours the doctor's PCIe verdicts: on a multi-GPU node where P2P is not expected
(GeForce) or not safe (AMD-Vi translating with ACS redirect on the root ports, a reboot still due), custom all-reduce,
FlashInfer's allreduce fusion and torch symmetric memory stay off, and the play says why and what fixes it; on a
clean fabric and on one GPU they follow their own verdicts. The play also says the CUDA_VISIBLE_DEVICES order the
doctor suggests for the role's tp size, and the server's environment sets CUDA_DEVICE_ORDER=PCI_BUS_ID.

The `iommu` and `pcie_acs` results are the real checks' output on the fixture fabrics (pcie_trees.py, built around
the recorded fragments of tests/fixtures/pcie, and the lent H200 VM's cmdline), written by the doctor's own JSON
writer. Stand-ins: the level-3 verdicts that would turn the features on (allreduce_fusion and symm_mem pass,
sglang_comm's data says SGLang turns both on), since this machine has no GPU. Every case renders in one
ansible-playbook run, a play per case.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from doctor_helpers import facts_for
from pcie_trees import ACS_OFF, GEFORCE, FakeLspci, Tree, amd_root_ports, recorded, root_complexes

from sm120check.doctor import remedies, runner
from sm120check.doctor.model import Context, Result, Status
from sm120check.doctor.pcie import node
from sm120check.doctor.pcie_p2p import fabric as pcie
from sm120check.doctor.pcie_p2p import nccl_pairs as pairs
from sm120check.doctor.pcie_p2p.nccl_pair_payload import PairRun
from sm120check.doctor.report import RunInfo, to_json

ROOT = Path(__file__).resolve().parents[3]
ANSIBLE = str(Path(sys.executable).parent / "ansible-playbook")
PLAY = """- name: {case}
  hosts: localhost
  connection: local
  gather_facts: false
  vars_files: [{vars_file}]
  roles: [sglang_server]
"""
FEATURES_OFF = (
    "custom all-reduce (--disable-custom-all-reduce), FlashInfer allreduce fusion and torch symmetric memory off"
)


def pcie_results(facts: node.PcieFacts) -> list[Result]:
    ctx = Context(facts=replace(facts_for(None), pcie_read=facts))
    return runner.run([pcie.IommuCheck(), pcie.AcsCheck()], ctx)


def level3_passes() -> list[Result]:
    """Stand-ins for what a GPU node's level 3 said: both features work and SGLang itself would turn them on."""
    on = {"allreduce_fusion": "on", "symmetric_memory": "on"}
    return [
        Result("allreduce_fusion", Status.PASS, "allreduce_fusion passed", level=3),
        Result("symm_mem", Status.PASS, "symm_mem passed", level=3),
        Result("sglang_comm", Status.PASS, "SGLang turns both on", level=3, data=on),
    ]


def geforce(root: Path) -> node.PcieFacts:
    tree, fake = amd_root_ports(root)
    for bdf in ("0000:41:00.0", "0000:61:00.0"):
        fake.names[bdf] = GEFORCE
    return tree.read(fake)


def translated(root: Path) -> node.PcieFacts:
    tree, fake = amd_root_ports(root)
    return tree.read(fake, recorded("dmesg-amd-vi-rtl88x2bu-151.txt"))


def reboot_due(root: Path) -> node.PcieFacts:
    tree, fake = amd_root_ports(root)
    tree.fact(True, ["iommu=pt"], ["0000:40:01.1", "0000:60:01.1"])
    return tree.read(fake)


def clean(root: Path) -> node.PcieFacts:
    tree, fake = amd_root_ports(root, group_type="identity", ctl=ACS_OFF)
    tree.cmdline("BOOT_IMAGE=/vmlinuz ro iommu=pt")
    return tree.read(fake)


def h200_vm(root: Path) -> node.PcieFacts:
    tree = Tree(root)
    tree.cmdline(recorded("cmdline-h200-firecracker-vm.txt")[0])
    tree.device(["pci0000:00", "0000:00:06.0"])
    return tree.read(FakeLspci(), recorded("dmesg-h200-firecracker-vm.txt"))


def three_roots(root: Path) -> node.PcieFacts:
    tree, fake = root_complexes(root, {"00": 2, "40": 4, "80": 2})
    return tree.read(fake)


CASES: dict[str, tuple[Callable[[Path], node.PcieFacts], dict[str, object]]] = {
    "geforce": (geforce, {"sglang_server_tp_size": 2}),
    "translated-acs-redirect": (translated, {"sglang_server_tp_size": 2}),
    "reboot-due": (reboot_due, {"sglang_server_tp_size": 2}),
    "clean-two-roots": (clean, {"sglang_server_tp_size": 2}),
    "one-gpu-h200-vm": (h200_vm, {"sglang_server_tp_size": 1}),
    "geforce-forced-on": (geforce, {"sglang_server_tp_size": 2, "sglang_server_allreduce_fusion": "on"}),
    "three-roots-tp4": (three_roots, {"sglang_server_tp_size": 4}),
    "clean-but-nccl-pair-hangs": (clean, {"sglang_server_tp_size": 2}),
}


def nccl_pair_hangs() -> Result:
    """nccl_pairs' real verdict on a pair whose all-reduce hangs with P2P and finishes with NCCL_P2P_DISABLE=1 (the
    runs are what its watchdog would report; no GPU here)."""
    hung = PairRun((0, 1), True, finished=False, hung=True, seconds=60.0, problem="all_reduce")
    done = PairRun((0, 1), False, finished=True, hung=False, seconds=4.2, busbw_gbps=9.8)
    return pairs.judge_pairs([pairs.PairOutcome((0, 1), hung, done)])


EXTRA: dict[str, Callable[[], list[Result]]] = {"clean-but-nccl-pair-hangs": lambda: [nccl_pair_hangs()]}


def play_cases(tmp: Path, cases: dict[str, tuple[list[Result], dict[str, object]]]) -> dict[str, str]:
    """Each case's doctor results and role variables as one play of the sglang_server role's configure tags, all in
    one ansible-playbook run: {case: its play's output as one line}; each case's rendered files in tmp/CASE/etc."""
    plays = []
    for case, (results, overrides) in cases.items():
        work = tmp / case
        work.mkdir(exist_ok=True)
        info = RunInfo(host="node", version="test", started="2026-12-01T00:00:00Z", seconds=3.0, level=3, manifest="")
        (work / "doctor.json").write_text(to_json(results, info), encoding="utf-8")
        (work / "units").mkdir()
        variables: dict[str, object] = {
            "sglang_server_model_path": "/models/Kimi-K2.5-NVFP4",
            "sglang_server_draft_model_path": "/models/Kimi-K2.5-EAGLE3",
            "sglang_server_python": "/opt/sm120kit/venv/bin/python",
            "sglang_server_config_dir": str(work / "etc"),
            "sglang_server_unit_dir": str(work / "units"),
            "sglang_server_doctor_report": str(work / "doctor.json"),
            **overrides,
        }
        (work / "vars.json").write_text(json.dumps(variables), encoding="utf-8")
        plays.append(PLAY.format(case=case, vars_file=json.dumps(str(work / "vars.json"))))
    (tmp / "play.yml").write_text("".join(plays), encoding="utf-8")
    run = subprocess.run(
        [ANSIBLE, str(tmp / "play.yml"), "-i", "localhost,", "--tags", "sglang_server_configure",
         "-e", f"ansible_python_interpreter={sys.executable}"],
        cwd=ROOT, capture_output=True, text=True, check=False, timeout=300,
        env={**os.environ, "ANSIBLE_ROLES_PATH": str(ROOT / "roles"), "ANSIBLE_NOCOLOR": "1"},
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-5000:] + run.stderr[-2000:]
    # ansible.cfg's YAML result format wraps a long message at spaces and doubles a quote: one line per play here.
    parts = re.split(r"^PLAY \[", run.stdout, flags=re.MULTILINE)[1:]
    return {part.split("]", 1)[0]: " ".join(part.split()).replace("''", "'") for part in parts}


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, str, Path]]:
    """{case: (its play's output as one line, launch-command.txt, its config dir)}, from one ansible-playbook run."""
    tmp = tmp_path_factory.mktemp("launch-p2p")
    cases: dict[str, tuple[list[Result], dict[str, object]]] = {}
    for case, (fabric, overrides) in CASES.items():
        (tmp / case).mkdir()
        results = [Result("driver", Status.PASS, "driver 580.95.05"), *pcie_results(fabric(tmp / case / "node"))]
        extra = EXTRA[case]() if case in EXTRA else []
        cases[case] = ([*results, *level3_passes(), *extra], overrides)
    outputs = play_cases(tmp, cases)
    return {
        case: (outputs[case], (tmp / case / "etc" / "launch-command.txt").read_text(), tmp / case / "etc")
        for case in CASES
    }


def test_geforce_gpus_launch_with_every_p2p_feature_off_saying_why(rendered: dict[str, tuple[str, str, Path]]) -> None:
    out, cmd, _ = rendered["geforce"]
    assert "--disable-custom-all-reduce" in cmd and "--enforce-disable-flashinfer-allreduce-fusion" in cmd
    assert "--flashinfer-allreduce-fusion-backend" not in cmd and "--enable-torch-symm-mem" not in cmd
    assert f"PCIe: iommu pass, pcie_acs pass -> P2P is not expected here (iommu: {pcie.GEFORCE_NOTE}" in out
    assert FEATURES_OFF in out


def test_translating_iommu_and_acs_redirect_keep_them_off_naming_the_pcie_p2p_fix(
    rendered: dict[str, tuple[str, str, Path]],
) -> None:
    out, cmd, _ = rendered["translated-acs-redirect"]
    assert "--disable-custom-all-reduce" in cmd and "--enforce-disable-flashinfer-allreduce-fusion" in cmd
    assert "--enable-torch-symm-mem" not in cmd
    said = "PCIe: iommu warn, pcie_acs warn -> P2P is not safe here (iommu warn: AMD-Vi translates the 2 GPUs' DMA"
    assert said in out
    assert "; pcie_acs warn: ACS redirects peer requests to the root complex on 2 bridge(s)" in out
    assert f"{FEATURES_OFF}; fix: {remedies.IOMMU_PASSTHROUGH}; {remedies.ACS_REDIRECT}, then run the doctor" in out
    assert "ansible-playbook site.yml --tags pcie_p2p" in out


def test_a_reboot_still_due_keeps_them_off_until_the_node_reboots(rendered: dict[str, tuple[str, str, Path]]) -> None:
    out, cmd, _ = rendered["reboot-due"]
    assert "--disable-custom-all-reduce" in cmd and "--enable-torch-symm-mem" not in cmd
    assert "iommu warn: reboot pending: pcie_p2p set iommu=pt" in out and f"fix: {remedies.PCIE_REBOOT}" in out


def test_a_clean_fabric_lets_the_features_follow_their_own_verdicts(rendered: dict[str, tuple[str, str, Path]]) -> None:
    out, cmd, _ = rendered["clean-two-roots"]
    assert "--flashinfer-allreduce-fusion-backend auto" in cmd and "--enable-torch-symm-mem" in cmd
    assert "--disable-custom-all-reduce" not in cmd and "enforce-disable" not in cmd
    assert "PCIe: iommu pass, pcie_acs pass -> the P2P features follow their own verdicts" in out


def test_one_gpu_is_not_held_back_by_p2p_not_mattering(rendered: dict[str, tuple[str, str, Path]]) -> None:
    """The lent H200 VM's verdicts: p2p_expected is false there because there is one GPU, not because P2P is off."""
    out, cmd, _ = rendered["one-gpu-h200-vm"]
    assert "--disable-custom-all-reduce" not in cmd and "--enable-torch-symm-mem" in cmd
    assert "-> the P2P features follow their own verdicts" in out
    assert "TP groups" not in out


def test_a_feature_forced_on_is_said_to_be_against_the_pcie_verdict(rendered: dict[str, tuple[str, str, Path]]) -> None:
    out, cmd, _ = rendered["geforce-forced-on"]
    assert "--flashinfer-allreduce-fusion-backend auto" in cmd and "--disable-custom-all-reduce" in cmd
    assert "; forced on by sglang_server_allreduce_fusion: on despite it" in out


def test_the_play_says_the_tp_groups_order_and_how_to_use_it(rendered: dict[str, tuple[str, str, Path]]) -> None:
    out, _, _ = rendered["three-roots-tp4"]
    assert (
        "TP groups (CUDA_DEVICE_ORDER=PCI_BUS_ID, which the server's environment sets): tp 4: 1 of 2 groups must "
        "cross root complexes, whatever the order (0,1,6,7 across pci0000:00 + pci0000:80); "
        "CUDA_VISIBLE_DEVICES=2,3,4,5,0,1,6,7 keeps the other 1 behind one; to use it, set "
        "sglang_server_env.CUDA_VISIBLE_DEVICES to 2,3,4,5,0,1,6,7"
    ) in out
    two, _, _ = rendered["clean-two-roots"]
    assert "tp 2: no order keeps the group behind one root complex: it must cross" in two


def test_the_server_environment_numbers_gpus_in_pci_bus_order(rendered: dict[str, tuple[str, str, Path]]) -> None:
    _, _, etc = rendered["clean-two-roots"]
    assert 'CUDA_DEVICE_ORDER="PCI_BUS_ID"' in (etc / "environment").read_text().splitlines()


def test_a_pair_whose_nccl_all_reduce_hangs_with_p2p_keeps_them_off_on_a_clean_looking_fabric(
    rendered: dict[str, tuple[str, str, Path]],
) -> None:
    """iommu and pcie_acs pass, but level 3 saw the hang itself: the launch must not start a server that hangs there."""
    out, cmd, etc = rendered["clean-but-nccl-pair-hangs"]
    assert "--disable-custom-all-reduce" in cmd and "--enforce-disable-flashinfer-allreduce-fusion" in cmd
    assert "--enable-torch-symm-mem" not in cmd
    assert "P2P is not safe here (nccl_pairs fail: GPU 0-1: NCCL all-reduce" in out
    assert "PCIe P2P between them is blocked (IOMMU translation or ACS redirect)" in out
    assert remedies.NCCL_PAIR_P2P_BLOCKED.split(":")[0] in out
    # its NCCL must not use P2P either: SGLang's features off would still leave NCCL's own P2P, which hangs there
    assert "nccl_pairs failed, so the server runs with NCCL_P2P_DISABLE=1" in out
    assert 'NCCL_P2P_DISABLE="1"' in (etc / "environment").read_text().splitlines()
    _, _, clean_etc = rendered["clean-two-roots"]
    assert "NCCL_P2P_DISABLE" not in (clean_etc / "environment").read_text()
