"""SGLang's own PcieIpcCommunicator in the `sglang_comm` check (issue 38, item 1): the probe calls only what SGLang
0.5.22 and 0.5.23 define (read from the release sources), the payload reads strictly, and the judge turns the ranks'
runs into the verdict the launch role reads. The two-rank answers are shaped as the probe
(doctor/sglang_sm120/sglang_pcie_ipc_probe.py) writes them, with SGLang's own log lines from pcie_ipc_ar.py; the
two-GPU run itself is in docs/validation/not-yet-run.md."""

from __future__ import annotations

import ast
import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any, ClassVar

import pytest

from lab.sglang_releases import release_dir
from sm120check.doctor import remedies
from sm120check.doctor.model import Status
from sm120check.doctor.payload import Fields, PayloadError
from sm120check.doctor.sglang_sm120 import sglang_pcie_ipc_probe as sglang_pcie_ipc
from sm120check.doctor.sglang_sm120.sglang_comm import judge_sglang_comm
from sm120check.doctor.sglang_sm120.sglang_comm_payload import PcieIpcRun, SglangCommAnswer

ROOT = Path(__file__).resolve().parents[3]
RECORD = ROOT / "docs/validation/2026-12-01-h200-sglang-preflight/sglang_preflight.json"
SRC = ROOT / "python" / "sm120check" / "src"
BUILT = "INFO: FlashInfer PCIe-IPC workspace built (world=2, max_numel=1835008, hidden=7168)"
FAILED = (
    "WARNING: FlashInfer PCIe-IPC workspace (max_numel=1835008) failed: CUDA error: peer access is not supported "
    "between these two devices; reductions stay on NCCL"
)


def ipc_run(**changes: Any) -> dict[str, Any]:
    """One rank's run as the probe writes it: built for 256 rows, exact at 1, 3, 8 and 256 rows."""
    checks = [
        {"tokens": t, "taken": True, "exact": True, "pcie_ipc_us": us, "nccl_us": nccl}
        for t, us, nccl in ((1, 5.3, 61.0), (3, 6.1, 66.5), (8, 8.4, 80.2), (256, 41.0, 390.0))
    ]
    run: dict[str, Any] = {"present": True, "disabled": False, "rows": 256, "max_numel": 1835008, "checks": checks}
    return run | {"log": [BUILT]} | changes


def answer(*runs: dict[str, Any] | None) -> dict[str, Any]:
    """Two ranks of the recorded patched SGLang (H200 record), with symmetric memory and fusion working, each with
    the given PcieIpcCommunicator run."""
    data: dict[str, Any] = copy.deepcopy(json.loads(RECORD.read_text(encoding="utf-8"))["patched"])
    rank = data["ranks"][0]
    symm = [{"elements": n, "ran": True, "max_abs_diff": 0.0, "ok": True} for n in (7168, 57344, 262144, 1048576)]
    rank["symm_mem"] = {"disabled": False, "log": [], "checks": symm}
    rank["fusion"] = {"ran": True, "max_rel_err": {"1": 0.004, "3": 0.005, "8": 0.006}, "log": []}
    ranks = []
    for i, run in enumerate(runs):
        one = dict(copy.deepcopy(rank), rank=i)
        if run is not None:
            one["pcie_ipc"] = run
        ranks.append(one)
    data["ranks"] = ranks
    return data


def judged(*runs: dict[str, Any] | None) -> Any:
    return judge_sglang_comm(SglangCommAnswer.from_json(answer(*runs)))


def test_an_exact_communicator_passes_with_its_latency_against_nccl() -> None:
    slow = ipc_run(checks=[{"tokens": 256, "taken": True, "exact": True, "pcie_ipc_us": 44.5, "nccl_us": 385.0}])
    result = judged(ipc_run(), slow)
    assert result.status is Status.PASS, result.summary
    assert (
        "PCIe-IPC all-reduce (opt-in) works (exact at 1/3/8/256 rows; 44.5 us against NCCL's 390 us" in result.summary
    )
    ipc = result.data["pcie_ipc"]
    assert ipc["state"] == "ok" and ipc["rows_taken"] == [1, 3, 8, 256] and ipc["max_numel"] == 1835008
    assert ipc["pcie_ipc_us"][256] == 44.5 and ipc["nccl_us"][256] == 390.0  # the slowest rank per row count
    assert BUILT in result.details


def test_a_wrong_sum_fails_and_names_the_rows() -> None:
    bad = ipc_run()
    bad["checks"][2] = {"tokens": 8, "taken": True, "exact": False}
    result = judged(ipc_run(), bad)
    assert result.status is Status.FAIL
    assert "PCIe-IPC all-reduce (opt-in) WRONG (all-reduce differs from the exact sum at 8 rows)" in result.summary
    assert result.data["pcie_ipc"] == {"rows": 256, "max_numel": 1835008, "state": "wrong", "wrong_rows": [8]}
    assert remedies.SGLANG_PCIE_IPC_WRONG in result.remedy


def test_a_workspace_that_did_not_build_warns_with_sglangs_line() -> None:
    off = ipc_run(disabled=True, max_numel=0, checks=[], log=[FAILED])
    result = judged(off, off)
    assert result.status is Status.WARN, result.summary
    assert "PCIe-IPC all-reduce (opt-in) OFF (SGLang: WARNING: FlashInfer PCIe-IPC workspace" in result.summary
    assert (
        result.data["pcie_ipc"]["state"] == "off"
        and "peer access is not supported" in result.data["pcie_ipc"]["reason"]
    )
    assert result.remedy == remedies.SGLANG_PCIE_IPC_OFF


def test_a_world_size_its_kernels_lack_is_named() -> None:
    """Three ranks: SGLang disables the communicator with a debug line only (not captured), so the judge names why."""
    three = ipc_run(disabled=True, max_numel=0, checks=[], log=[])
    result = judged(three, three, three)
    assert result.status is Status.WARN
    assert "OFF (SGLang: world size 3: its kernels build for 2, 4 or 8 ranks only)" in result.summary


def test_a_communicator_that_took_nothing_is_off() -> None:
    none_taken = ipc_run(checks=[{"tokens": t, "taken": False} for t in (1, 3, 8, 256)])
    result = judged(none_taken, none_taken)
    assert result.status is Status.WARN and result.data["pcie_ipc"]["state"] == "off"
    assert "took no reduction" in result.summary


def test_a_release_without_it_keeps_the_verdict_and_says_absent() -> None:
    absent = {
        "present": False,
        "reason": "ModuleNotFoundError: No module named 'sglang.srt.distributed.device_communicators.pcie_ipc_ar'",
    }
    result = judged(absent, absent)
    assert result.status is Status.PASS and result.data["pcie_ipc"] == {"state": "absent"}
    without = judged(None, None)  # an answer written before the probe ran it: no pcie_ipc key at all
    assert "pcie_ipc" not in without.data and "PCIe-IPC" not in without.summary


def test_the_payload_round_trips_and_reads_strictly() -> None:
    rank = SglangCommAnswer.from_json(answer(ipc_run(), ipc_run())).ranks[0]
    assert rank.pcie_ipc is not None and rank.pcie_ipc.to_json() == ipc_run()
    assert PcieIpcRun.from_json(Fields("sglang_comm", {"present": False})).to_json() == {"present": False}
    for hostile in ({"taken": "yes"}, {"tokens": "8"}, {"exact": 1}):
        bad = ipc_run()
        bad["checks"][0] = bad["checks"][0] | hostile
        with pytest.raises(PayloadError):
            SglangCommAnswer.from_json(answer(bad, ipc_run()))


def test_a_bad_row_count_is_refused_before_any_rank_starts() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "sm120check.doctor.sglang_sm120.sglang_comm_probe", "--pcie-ipc-rows", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"},
    )
    assert run.returncode == 1 and "--pcie-ipc-rows 0: expected a row count of 1 or more" in run.stderr


# --- the probe against the release sources -----------------------------------------------------------------------


def _methods(version: str) -> dict[str, ast.FunctionDef]:
    source = release_dir(version) / "sglang" / "srt" / "distributed" / "device_communicators" / "pcie_ipc_ar.py"
    tree = ast.parse(source.read_text(encoding="utf-8"))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "PcieIpcCommunicator")
    return {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)}


def _attributes(method: ast.FunctionDef) -> set[str]:
    return {
        t.attr
        for node in ast.walk(method)
        if isinstance(node, ast.Assign)
        for t in node.targets
        if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"
    }


@pytest.mark.slow
@pytest.mark.parametrize("version", ["0.5.22", "0.5.23"])
def test_the_probe_calls_only_what_the_release_defines(version: str) -> None:
    methods = _methods(version)
    init = methods["__init__"]
    assert [a.arg for a in init.args.args] == ["self", "group", "device", "cpu_group"]
    prepare = methods["prepare"]
    assert [a.arg for a in prepare.args.kwonlyargs] == ["hidden", "max_rows"]
    assert {"should_pcie_ipc_ar", "pcie_ipc_all_reduce", "destroy"} <= methods.keys()
    assert {"disabled", "max_numel"} <= _attributes(init) and "max_numel" in _attributes(methods["_ensure_workspace"])
    probe = Path(sglang_pcie_ipc.__file__).read_text(encoding="utf-8")
    for call in (
        "PcieIpcCommunicator(",
        ".prepare(hidden=",
        ".should_pcie_ipc_ar(",
        ".pcie_ipc_all_reduce(",
        ".destroy()",
    ):
        assert call in probe
    module = sglang_pcie_ipc.MODULE.replace(".", "/") + ".py"
    assert (release_dir(version) / module).is_file()


@pytest.mark.slow
@pytest.mark.parametrize("version", ["0.5.22", "0.5.23"])
def test_the_lines_the_judge_quotes_are_sglangs_own(version: str) -> None:
    """The judge picks the line with 'failed' or 'no pcie_ipc_comm' as the reason: both are in the release."""
    source = release_dir(version) / "sglang" / "srt" / "distributed" / "device_communicators" / "pcie_ipc_ar.py"
    text = source.read_text(encoding="utf-8")
    assert '"FlashInfer PCIe-IPC workspace (max_numel=%d) failed: %s; "' in text
    assert '"no pcie_ipc_comm; falling back to NCCL all-reduce."' in text
    assert '"FlashInfer PCIe-IPC workspace built (world=%d, max_numel=%d, hidden=%d)"' in text


def test_a_build_that_raised_warns_off_with_the_exception() -> None:
    raised = {"present": True, "disabled": True, "rows": 256, "error": "RuntimeError: nvcc failed", "log": []}
    result = judged(raised, ipc_run())
    assert result.status is Status.WARN, result.summary
    assert "OFF (SGLang: building it raised RuntimeError: nvcc failed)" in result.summary
    assert result.data["pcie_ipc"]["state"] == "off"  # the launch role keeps it off: only "ok" turns it on
    assert PcieIpcRun.from_json(Fields("sglang_comm", raised)).to_json() == raised | {"checks": []}


def test_a_reduction_that_raised_fails_and_names_the_exception_and_rows() -> None:
    faulted = ipc_run()
    faulted["checks"] = [
        faulted["checks"][0],
        {"tokens": 3, "taken": True, "exact": False, "error": "CUDA error: an illegal memory access was encountered"},
    ]
    result = judged(ipc_run(), faulted)
    assert result.status is Status.FAIL
    assert "WRONG (all-reduce raised CUDA error: an illegal memory access was encountered at 3 rows)" in result.summary
    assert result.data["pcie_ipc"]["state"] == "wrong" and result.data["pcie_ipc"]["wrong_rows"] == [3]


class _Raising:
    """Stand-in for SGLang's PcieIpcCommunicator (no second GPU here): the one call that raises, nothing else."""

    disabled = False
    max_numel = 1835008
    destroyed = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def prepare(self, hidden: int, max_rows: int) -> None:
        raise RuntimeError("pcie_ipc_comm JIT build failed")

    def destroy(self) -> None:
        _Raising.destroyed += 1


def test_the_rank_side_answers_when_sglang_raises_instead_of_failing_the_whole_probe(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import contextlib
    import types

    module = types.ModuleType(sglang_pcie_ipc.MODULE)
    module.PcieIpcCommunicator = _Raising  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, sglang_pcie_ipc.MODULE, module)

    class Log:
        lines: ClassVar[list[str]] = []

    @contextlib.contextmanager
    def captured(name: str) -> Any:
        yield Log()

    class Ctx:
        args: ClassVar[dict[str, Any]] = {"hidden": 64, "tokens": [1, 3], "pcie_ipc_rows": 8}

        def phase(self, name: str) -> None:
            pass

    out = sglang_pcie_ipc.run(Ctx(), "cpu", None, captured)  # type: ignore[arg-type]
    assert out["disabled"] is True and out["error"] == "RuntimeError: pcie_ipc_comm JIT build failed"
    assert _Raising.destroyed == 1  # released, though prepare raised
    assert PcieIpcRun.from_json(Fields("sglang_comm", out)).error == out["error"]


def test_what_sglang_raised_outranks_the_world_size_guess() -> None:
    raised = {"present": True, "disabled": True, "rows": 256, "error": "RuntimeError: nvcc failed", "log": []}
    result = judged(raised, raised, raised)
    assert "OFF (SGLang: building it raised RuntimeError: nvcc failed)" in result.summary, result.summary
