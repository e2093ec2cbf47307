"""The `sglang_server` role turns FlashInfer's PCIe-IPC all-reduce on (SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1 and a
decode-sized SGLANG_PCIE_IPC_MAX_NUMEL in the server's environment) exactly where the doctor's verdicts allow it:
SGLang >= 0.5.22, tp 2, 4 or 8, every GPU pair PCIe, iommu, pcie_acs and nccl_pairs passed, and the doctor's own
PcieIpcAllReduceWorkspace run summed correctly, and sglang_comm's run of SGLang's own PcieIpcCommunicator was exact;
off with the reason otherwise (no data is off).

Real check outputs: `iommu` and `pcie_acs` on the fixture fabrics (pcie_trees.py), `nccl_pairs` from its judge,
`topology` from its judge on recorded `nvidia-smi topo -m` outputs (tests/fixtures/comm), `allreduce_fusion` from its
judge on a probe answer built with the payload types (tests/unit/comm/comm_answers.py, H200 x2 figures), all written
by the doctor's own JSON writer. Stand-in: `sglang_sm120`'s data (the SGLang version; the real check needs SGLang
installed). Every case renders in one ansible-playbook run, a play per case.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from collections.abc import Callable
from dataclasses import replace
from types import ModuleType

import pytest
from test_launch_honours_p2p import ROOT, clean, nccl_pair_hangs, pcie_results, play_cases, translated
from test_sglang_pcie_ipc import FAILED, ipc_run, judged

from sm120check.doctor.comm import collectives as comm
from sm120check.doctor.comm import fusion_probe as fusion
from sm120check.doctor.model import Result, Status
from sm120check.doctor.nvml_api import Gpu
from sm120check.doctor.pcie_p2p import nccl_pairs as pairs
from sm120check.doctor.pcie_p2p.nccl_pair_payload import PairRun
from sm120check.jitcache.flashinfer_release import fusion_support


def _comm_answers() -> ModuleType:
    """tests/unit/comm/comm_answers.py: the level-3 probe answers the comm judges' own tests use."""
    path = ROOT / "tests" / "unit" / "comm" / "comm_answers.py"
    spec = importlib.util.spec_from_file_location("comm_answers", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("comm_answers", module)
    spec.loader.exec_module(module)
    return module


ANSWERS = _comm_answers()
ENABLE, MAX_NUMEL = "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE", "SGLANG_PCIE_IPC_MAX_NUMEL"


def nccl_pairs_pass() -> Result:
    """nccl_pairs' real verdict on a pair whose all-reduce finished with P2P and without."""
    on = PairRun((0, 1), True, finished=True, hung=False, seconds=3.1, busbw_gbps=24.0)
    off = PairRun((0, 1), False, finished=True, hung=False, seconds=4.2, busbw_gbps=9.8)
    return pairs.judge_pairs([pairs.PairOutcome((0, 1), on, off)])


def topology(topo_m: str) -> Result:
    """topology's real verdict on a recorded `nvidia-smi topo -m` of two GPUs with P2P OK."""
    evidence = ANSWERS.topology_evidence(topo_m, pairs=(ANSWERS.nvml_pair(0, 1),))
    gpus = [Gpu(i, ANSWERS.RTX_PRO, (12, 0), None, f"00000000:{i + 1:02x}:00.0") for i in (0, 1)]
    return comm.judge_topology(evidence, gpus, ANSWERS.fabric(cmdline="ro iommu=pt"))


def fusion_with_pcie_ipc(error: str | None = None) -> Result:
    """allreduce_fusion's real verdict; its data.pcie_ipc is the doctor's PcieIpcAllReduceWorkspace run."""
    ranks = [ANSWERS.fusion_rank(r) for r in (0, 1)]
    if error is not None:
        ranks = [replace(r, pcie_ipc=None, pcie_ipc_error=error) for r in ranks]
    answer = fusion.summarize(ANSWERS.launched(), ranks)
    return comm.judge_fusion(answer, fusion_support("0.7.2", ["9.0"], multicast=False), 120)


def sglang_sm120(version: str) -> Result:
    """Stand-in for the sglang_sm120 check's data on a node with that SGLang installed."""
    data = {"sglang_version": version, "cc": "12.0", "needs_patch": False, "failing": [], "wrapper_gaps": 0}
    return Result("sglang_sm120", Status.PASS, f"SGLang {version} admits compute capability 12.0", data=data)


def good(version: str = "0.5.23") -> list[Result]:
    return [nccl_pairs_pass(), topology("topo_m_2x5090_phb.txt"), fusion_with_pcie_ipc(), sglang_sm120(version)]


Case = tuple[Callable[[], list[Result]], dict[str, object]]
SIZED: dict[str, object] = {
    "sglang_server_tp_size": 2,
    "sglang_server_hidden_size": 7168,
    "sglang_server_max_running_requests": 48,
}
CASES: dict[str, Case] = {
    "safe-pcie": (lambda: [*good(), judged(ipc_run(), ipc_run())], SIZED),
    "on-unsized": (lambda: [*good(), judged(ipc_run(), ipc_run())], {"sglang_server_tp_size": 2}),
    "sglang-comm-not-run": (lambda: good(), SIZED),
    "forced-off": (lambda: good(), {**SIZED, "sglang_server_pcie_ipc_allreduce": "off"}),
    "sglang-0.5.16": (lambda: good("0.5.16"), SIZED),
    "no-sglang-version": (lambda: good()[:3], SIZED),
    "one-gpu": (lambda: good(), {**SIZED, "sglang_server_tp_size": 1}),
    "deterministic": (lambda: good(), {**SIZED, "sglang_server_extra_args": ["--enable-deterministic-inference"]}),
    "translated": (lambda: good(), SIZED),
    "nccl-pair-hangs": (lambda: [nccl_pair_hangs(), *good()[1:]], SIZED),
    "nccl-pairs-not-run": (lambda: good()[1:], SIZED),
    "nvlink": (lambda: [good()[0], topology("topo_m_8xh100_nv18.txt"), *good()[2:]], SIZED),
    "sglang-ipc-ok": (lambda: [*good(), judged(ipc_run(), ipc_run())], SIZED),
    "sglang-ipc-off": (lambda: [*good(), judged(*[ipc_run(disabled=True, checks=[], log=[FAILED])] * 2)], SIZED),
    "sglang-ipc-wrong": (
        lambda: [*good(), judged(ipc_run(), ipc_run(checks=[{"tokens": 8, "taken": True, "exact": False}]))],
        SIZED,
    ),
    "ipc-run-failed": (
        lambda: [*good()[:2], fusion_with_pcie_ipc("CUDA error: peer access is not supported"), good()[3]],
        SIZED,
    ),
}
FABRIC = {"translated": translated}


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[str, dict[str, str]]]:
    """{case: (its play's output as one line, the server's environment file as a dict)}, from one run."""
    tmp = tmp_path_factory.mktemp("launch-pcie-ipc")
    cases: dict[str, tuple[list[Result], dict[str, object]]] = {}
    for case, (results, overrides) in CASES.items():
        (tmp / case).mkdir()
        fabric = FABRIC.get(case, clean)(tmp / case / "node")
        doc = [Result("driver", Status.PASS, "driver 580.95.05"), *pcie_results(fabric), *results()]
        cases[case] = (doc, overrides)
    outputs = play_cases(tmp, cases)
    out: dict[str, tuple[str, dict[str, str]]] = {}
    for case in CASES:
        text = (tmp / case / "etc" / "environment").read_text(encoding="utf-8")
        env = dict(re.findall(r'^([A-Z_0-9]+)="(.*)"$', text, flags=re.MULTILINE))
        out[case] = (outputs[case], env)
    return out


def said(output: str) -> str:
    found = re.search(r"PCIe-IPC all-reduce (?:on|off)[^\"]*", output)
    assert found, output[-3000:]
    return found.group(0)


def kinds(result: Result) -> set[str]:
    found = result.data.get("pairs")
    assert isinstance(found, list)
    return {str(p["kind"]) for p in found if isinstance(p, dict)}


def test_the_real_verdicts_it_reads_are_what_they_claim() -> None:
    assert [r.status for r in good()[:3]] == [Status.PASS, Status.PASS, Status.PASS]
    assert kinds(topology("topo_m_2x5090_phb.txt")) == {"pcie"}
    assert kinds(topology("topo_m_8xh100_nv18.txt")) == {"nvlink"}
    assert fusion_with_pcie_ipc().data["pcie_ipc"]["correct"] is True  # type: ignore[index, call-overload]


def test_a_safe_pcie_node_on_0_5_23_turns_it_on_with_a_decode_sized_workspace(
    rendered: dict[str, tuple[str, dict[str, str]]],
) -> None:
    out, env = rendered["safe-pcie"]
    assert env[ENABLE] == "1"
    assert env[MAX_NUMEL] == str(48 * 4 * 7168)  # max bs x draft tokens x hidden
    assert (
        "PCIe-IPC all-reduce on: SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1, SGLANG_PCIE_IPC_MAX_NUMEL 1376256 (max bs 48"
        in out
    )


def test_sglangs_own_exact_communicator_keeps_it_on(rendered: dict[str, tuple[str, dict[str, str]]]) -> None:
    out, env = rendered["sglang-ipc-ok"]
    assert env[ENABLE] == "1" and env[MAX_NUMEL] == str(48 * 4 * 7168), said(out)


def test_without_a_hidden_size_sglang_sizes_the_workspace_itself(
    rendered: dict[str, tuple[str, dict[str, str]]],
) -> None:
    out, env = rendered["on-unsized"]
    assert env[ENABLE] == "1" and MAX_NUMEL not in env
    assert "SGLANG_PCIE_IPC_MAX_NUMEL unset: SGLang sizes it from its captured decode batch" in said(out)


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        ("forced-off", "PCIe-IPC all-reduce off (sglang_server_pcie_ipc_allreduce: off)"),
        ("sglang-0.5.16", "(SGLang 0.5.16 has no PCIe-IPC all-reduce (0.5.22+))"),
        ("no-sglang-version", "(sglang_sm120 gave no SGLang version (not run): no data is off)"),
        ("one-gpu", "(tp size 1: its kernels build for 2, 4 or 8 ranks only)"),
        ("deterministic", "(the launch asks for --enable-deterministic-inference"),
        ("translated", "(iommu warn, pcie_acs warn, nccl_pairs pass: P2P is not shown safe (all three must pass))"),
        ("nccl-pair-hangs", "nccl_pairs fail: P2P is not shown safe"),
        ("nccl-pairs-not-run", "nccl_pairs not run: P2P is not shown safe"),
        ("nvlink", "(topology: the GPU pairs are nvlink, not PCIe only)"),
        ("ipc-run-failed", "(the doctor's PcieIpcAllReduceWorkspace run failed: CUDA error: peer access is not"),
        ("sglang-comm-not-run", "(sglang_comm ran no PcieIpcCommunicator (SGLang's own, two GPUs or more; not run"),
        ("sglang-ipc-off", "(sglang_comm: SGLang's PcieIpcCommunicator off: WARNING: FlashInfer PCIe-IPC workspace"),
        ("sglang-ipc-wrong", "(sglang_comm: SGLang's PcieIpcCommunicator wrong at 8 rows)"),
    ],
)
def test_it_stays_off_with_the_reason_where_a_verdict_does_not_allow_it(
    rendered: dict[str, tuple[str, dict[str, str]]], case: str, reason: str
) -> None:
    out, env = rendered[case]
    assert ENABLE not in env and MAX_NUMEL not in env
    assert said(out).startswith("PCIe-IPC all-reduce off") and reason in said(out), said(out)


def test_never_on_beside_nccl_p2p_turned_off(rendered: dict[str, tuple[str, dict[str, str]]]) -> None:
    _, env = rendered["nccl-pair-hangs"]
    assert env["NCCL_P2P_DISABLE"] == "1" and ENABLE not in env
