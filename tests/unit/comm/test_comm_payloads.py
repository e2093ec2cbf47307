"""The level-3 payloads: what a probe prints reads back as the same value, a malformed answer names its field, and
the probes' merges of their ranks (pure: no GPU) say what the judges read."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from comm_answers import (
    FIXTURES,
    KIB,
    MIB,
    fusion_answer,
    fusion_failed,
    launched,
    nccl_answer,
    nccl_hang,
    nccl_rank,
    nvml_pair,
    symm_answer,
    symm_rank,
    topology_evidence,
)

from sm120check.doctor.comm import nccl_probe as nccl
from sm120check.doctor.comm.fusion_payload import FusionAnswer, FusionWarm
from sm120check.doctor.comm.nccl_payload import NcclAnswer, NcclRank, size_label
from sm120check.doctor.comm.symm_mem_payload import SymmMemAnswer
from sm120check.doctor.comm.topology_payload import TopologyEvidence
from sm120check.doctor.payload import Fields, PayloadError

ANSWERS: list[tuple[object, Callable[[object], object]]] = [
    (topology_evidence("topo_m_2x5090_phb.txt", "topo_p2p_rw_2x5090_gns.txt"), TopologyEvidence.from_json),
    (topology_evidence("topo_m_8xh100_nv18.txt", pairs=(nvml_pair(0, 1),)), TopologyEvidence.from_json),
    (topology_evidence("topo_m_8xh100_nv18.txt"), TopologyEvidence.from_json),
    (nccl_answer(), NcclAnswer.from_json),
    (nccl_answer(nccl_rank(0, wrong={4 * MIB: 3}), nccl_rank(1)), NcclAnswer.from_json),
    (nccl_hang(), NcclAnswer.from_json),
    (symm_answer(), SymmMemAnswer.from_json),
    (symm_answer(symm_rank(0, multimem=True), symm_rank(1, multimem=True)), SymmMemAnswer.from_json),
    (
        symm_answer(launch=launched(False, problem="rank 1: RuntimeError: invalid device ordinal")),
        SymmMemAnswer.from_json,
    ),
    (fusion_answer(cached=False), FusionAnswer.from_json),
    (fusion_answer(pcie_ipc=False), FusionAnswer.from_json),
    (
        fusion_failed("ranks hung for 115 s (in create workspace) and were killed", timed_out=True, jit=True),
        FusionAnswer.from_json,
    ),
]


@pytest.mark.parametrize(("answer", "read"), ANSWERS)
def test_every_answer_reads_back_as_the_value_printed(answer: object, read: Callable[[object], object]) -> None:
    printed = json.loads(json.dumps(answer.to_json()))  # type: ignore[attr-defined]  # what child.emit writes
    assert read(printed) == answer


def test_the_fusion_warm_answer_reads_back() -> None:
    built = fusion_answer(cached=False).jit
    for warm in (FusionWarm(True, built), FusionWarm(False, problem="ImportError: no flashinfer")):
        assert FusionWarm.from_json(json.loads(json.dumps(warm.to_json()))) == warm


@pytest.mark.parametrize(
    ("read", "answer", "path", "value", "message"),
    [
        (
            TopologyEvidence.from_json,
            topology_evidence("topo_m_8xh100_nv18.txt").to_json(),
            ["topo_m", "ok"],
            "yes",
            "topology: topo_m.ok: expected true or false, got 'yes'",
        ),
        (
            TopologyEvidence.from_json,
            topology_evidence("topo_m_8xh100_nv18.txt", pairs=(nvml_pair(0, 1),)).to_json(),
            ["nvml", "pairs", 0, "pair"],
            [0, 1, 2],
            "topology: nvml.pairs[0].pair: expected [gpu, gpu], got [0, 1, 2]",
        ),
        (
            NcclAnswer.from_json,
            nccl_answer().to_json(),
            ["ranks", 0, "latency_us", "3", "median_us"],
            None,
            "nccl: ranks[0].latency_us.3.median_us: expected a number, got None",
        ),
        (NcclAnswer.from_json, nccl_answer().to_json(), ["sizes"], None, "nccl: sizes: expected a list, got None"),
        (
            SymmMemAnswer.from_json,
            symm_answer().to_json(),
            ["multicast_ptr"],
            ["0"],
            "symm_mem: multicast_ptr[0]: expected an integer, got '0'",
        ),
        (
            FusionAnswer.from_json,
            fusion_answer().to_json(),
            ["ranks", 1, "sizes", "1", "norm_rel_err"],
            "small",
            "fusion: ranks[1].sizes.1.norm_rel_err: expected a number, got 'small'",
        ),
        (
            FusionAnswer.from_json,
            fusion_answer().to_json(),
            ["pcie_ipc", "correct"],
            1,
            "fusion: pcie_ipc.correct: expected true or false, got 1",
        ),
    ],
)
def test_a_malformed_answer_names_the_probe_and_the_field(
    read: Callable[[object], object], answer: dict[str, object], path: list[str | int], value: object, message: str
) -> None:
    node: object = answer
    for key in path[:-1]:
        node = node[key]  # type: ignore[index]
    node[path[-1]] = value  # type: ignore[index]
    with pytest.raises(PayloadError) as raised:
        read(answer)
    assert str(raised.value) == message


def test_a_missing_field_is_named() -> None:
    answer = nccl_answer().to_json()
    del answer["links_error"]
    with pytest.raises(PayloadError, match=r"^nccl: links_error: missing$"):
        NcclAnswer.from_json(answer)


def test_a_killed_rank_reads_as_an_empty_rank() -> None:
    assert NcclRank.from_json(Fields("nccl", {}, "ranks[1]")) == NcclRank()


def test_size_labels() -> None:
    assert [size_label(n) for n in (112 * KIB, 512 * KIB, MIB, 64 * MIB, 1000)] == [
        "112 KiB",
        "512 KiB",
        "1 MiB",
        "64 MiB",
        "1000 B",
    ]


def test_the_nccl_probe_checks_from_512_kib_to_the_bandwidth_buffer() -> None:
    assert nccl.CHECK_BYTES == (512 * KIB, MIB, 4 * MIB, nccl.BANDWIDTH_BYTES)
    assert nccl.BANDWIDTH_BYTES == 64 * MIB


def test_the_nccl_merge_sums_mismatches_per_size_and_takes_the_slowest_rank() -> None:
    answer = nccl_answer(
        nccl_rank(0, wrong={MIB: 4}, busbw=20.0, latency=(10.0, 20.0, 30.0)),
        nccl_rank(1, wrong={MIB: 6}, busbw=18.5, latency=(12.0, 19.0, 31.0)),
    )
    assert answer.correct is False
    assert [(s.bytes, s.correct, s.mismatches) for s in answer.sizes if not s.correct] == [(MIB, False, 10)]
    assert answer.busbw_gbps == 18.5 and answer.latency_us == {"1": 12.0, "3": 20.0, "8": 31.0}
    assert answer.nccl == "2.28.9"


def test_the_nccl_probe_reads_each_pair_link_from_topo_m() -> None:
    pcie_box, why = nccl.links([0, 1], (FIXTURES / "topo_m_2x5090_phb.txt").read_text())
    assert why == "" and [(p.pair, p.code, p.kind) for p in pcie_box] == [((0, 1), "PHB", "pcie")]
    nvlink_box, _ = nccl.links([0, 1], (FIXTURES / "topo_m_8xh100_nv18.txt").read_text())
    assert [(p.code, p.kind) for p in nvlink_box] == [("NV18", "nvlink")]
    none, why = nccl.links([0, 1], "no matrix here")
    assert none == () and "unreadable" in why
