"""Scan and patch the real source of SGLang releases from PyPI (downloaded once into .cache/sglang)."""

from __future__ import annotations

import json

import pytest

from lab.sglang_releases import RELEASES, Json, PatchCycle, release_dir, run_cli

pytestmark = pytest.mark.slow

SIZES = "srt/distributed/device_communicators/all_reduce_utils.py"
MAP_NAMES = {
    "0.5.4": ("SYMM_MEM_ALL_REDUCE_MAX_SIZES", "SymmMemCommunicator._WORLD_SIZES_MULTIMEM"),
    **dict.fromkeys(
        RELEASES[1:], ("TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES", "TorchSymmMemCommunicator._WORLD_SIZES_MULTIMEM")
    ),
}
COMMUNICATOR = "srt/layers/communicator.py"
BACKEND = "srt/layers/flashinfer_comm_fusion.py"
ADD_NORM = "srt/layers/layer_boundary/residual/add_norm.py"
GATES = {
    "0.5.4": {(COMMUNICATOR, "_gather_hidden_states_and_residual", "runtime")},
    "0.5.9": {
        (COMMUNICATOR, "apply_flashinfer_allreduce_fusion", "runtime"),
        ("srt/server_args.py", "_handle_model_specific_adjustments", "auto-enable"),
    },
    "0.5.10": {
        (COMMUNICATOR, "apply_flashinfer_allreduce_fusion", "runtime"),
        ("srt/server_args.py", "_handle_model_specific_adjustments", "auto-enable"),
    },
    "0.5.14": {
        (COMMUNICATOR, "apply_flashinfer_allreduce_fusion", "runtime"),
        (BACKEND, "_resolve_backend", "backend"),
        ("srt/server_args.py", "_handle_model_specific_adjustments", "auto-enable"),
    },
    "0.5.16": {
        (COMMUNICATOR, "apply_flashinfer_allreduce_fusion", "runtime"),
        (BACKEND, "_resolve_backend", "backend"),
        ("srt/arg_groups/overrides.py", "_flashinfer_allreduce_fusion_auto_enable", "auto-enable"),
    },
    "0.5.23": {
        (ADD_NORM, "flashinfer_ar_fusion_applies", "runtime"),
        (BACKEND, "_resolve_backend", "backend"),
        ("srt/arg_groups/overrides.py", "_flashinfer_allreduce_fusion_auto_enable", "auto-enable"),
    },
}
CONTRACT = ["get_embed_and_head", "set_eagle3_layers_to_capture"]


def _gaps(scan: Json) -> dict[str, list[str]]:
    return {g["class"]: g["missing"] for g in scan["eagle3"]["wrapper_gaps"]}


@pytest.mark.parametrize("version", RELEASES)
def test_scan_names_the_capability_maps_of_each_release(scans: dict[str, Json], version: str) -> None:
    maps = scans[version]["capability_maps"]
    assert tuple(m["name"] for m in maps) == MAP_NAMES[version]
    assert maps[0]["path"] == SIZES


@pytest.mark.parametrize("version", RELEASES)
def test_scan_finds_majors_9_and_10_but_not_12(scans: dict[str, Json], version: str) -> None:
    assert [m["majors"] for m in scans[version]["capability_maps"]] == [[9, 10], [9, 10]]
    finding = next(f for f in scans[version]["findings"] if f["id"] == "capability-map")
    assert not finding["ok"]


@pytest.mark.parametrize("version", RELEASES)
def test_scan_finds_the_multicast_early_return(scans: dict[str, Json], version: str) -> None:
    communicator = scans[version]["communicator"]
    assert communicator["multicast_early_return"] and not communicator["multicast_relaxed"]


@pytest.mark.parametrize("version", RELEASES)
def test_scan_sees_a_keyerror_multimem_lookup_only_before_0_5_14(scans: dict[str, Json], version: str) -> None:
    tolerant = scans[version]["communicator"]["multimem_lookup_tolerant"]
    assert tolerant == (version in ("0.5.14", "0.5.16", "0.5.23"))


@pytest.mark.parametrize("version", RELEASES)
def test_scan_finds_the_fusion_gates_of_each_release(scans: dict[str, Json], version: str) -> None:
    gates = scans[version]["fusion_gates"]
    assert {(g["path"], g["function"], g["kind"]) for g in gates} == GATES[version]
    assert all(g["majors"] in ([9, 10], [10, 9]) for g in gates)


@pytest.mark.parametrize("version", RELEASES)
def test_eagle3_contract_is_derived_from_the_release_sources(scans: dict[str, Json], version: str) -> None:
    assert [c["name"] for c in scans[version]["eagle3"]["contract"]] == CONTRACT


def test_kimi_k25_gap_found_in_0_5_9(scans: dict[str, Json]) -> None:
    assert _gaps(scans["0.5.9"])["KimiK25ForConditionalGeneration"] == CONTRACT


@pytest.mark.parametrize("version", ["0.5.10", "0.5.14", "0.5.16", "0.5.23"])
def test_kimi_k25_not_flagged_from_0_5_10(scans: dict[str, Json], version: str) -> None:
    assert "KimiK25ForConditionalGeneration" not in _gaps(scans[version])
    assert scans[version]["eagle3"]["model_status"]["KimiK25ForConditionalGeneration"] == {
        "get_embed_and_head": "delegates",
        "set_eagle3_layers_to_capture": "delegates",
    }


def test_0_5_23_wrappers_still_lacking_eagle3_delegation(scans: dict[str, Json]) -> None:
    eagle3 = scans["0.5.23"]["eagle3"]
    gaps = _gaps(scans["0.5.23"])  # patchable: the inner model has the methods
    for name in (
        "KimiVLForConditionalGeneration",
        "PixtralForConditionalGeneration",
        "InternS1ForConditionalGeneration",
    ):
        assert "set_eagle3_layers_to_capture" in gaps[name]
    unsupported = {m["class"]: m for m in eagle3["unsupported"]}  # the inner model lacks them: not patchable
    for name, inner in (
        ("KimiK3ForConditionalGeneration", "KimiK3LinearForCausalLM"),
        ("MllamaForConditionalGeneration", "MllamaForCausalLM"),
    ):
        assert name not in gaps and unsupported[name]["inner"] == [inner]
        assert "set_eagle3_layers_to_capture" in unsupported[name]["lacks"][inner]
    runtime = {m["class"] for m in eagle3["runtime_inner"]}  # language_model_cls(...): cannot be checked
    assert "LlavaForConditionalGeneration" in runtime and "LlavaForConditionalGeneration" not in gaps


@pytest.mark.parametrize("version", RELEASES)
def test_unpatched_release_scan_exits_1(scans: dict[str, Json], version: str) -> None:
    assert scans[version]["status"] == 1 and scans[version]["needs_patch"]


@pytest.mark.parametrize("version", RELEASES)
def test_patch_changes_files_and_records_them_in_the_ledger(cycles: dict[str, PatchCycle], version: str) -> None:
    first = cycles[version].first
    assert first["changed"] and first["remaining"] == []
    paths = {f["path"] for f in first["files"]}
    assert {SIZES, MAP_NAMES and cycles[version].scan_after["communicator"]["path"]} <= paths


@pytest.mark.parametrize("version", RELEASES)
def test_scan_is_clean_after_patch(cycles: dict[str, PatchCycle], version: str) -> None:
    after = cycles[version].scan_after
    assert cycles[version].scan_after_status == 0
    # EAGLE-3 models whose inner model lacks the methods (or is chosen at run time) stay reported, never patched.
    left = ("eagle3-unsupported:", "eagle3-runtime:", "eagle3-partial:")
    assert [f for f in after["findings"] if not f["ok"] and not f["id"].startswith(left)] == []
    assert all(not f["patchable"] for f in after["findings"] if f["id"].startswith(left))
    assert [m["majors"] for m in after["capability_maps"]] == [[9, 10, 12], [9, 10]]
    assert after["communicator"]["multicast_relaxed"] and not after["communicator"]["multicast_early_return"]


@pytest.mark.parametrize("version", RELEASES)
def test_second_patch_changes_nothing(cycles: dict[str, PatchCycle], version: str) -> None:
    assert not cycles[version].second["changed"] and cycles[version].second["files"] == []
    assert cycles[version].check_after_status == 0


@pytest.mark.parametrize("version", RELEASES)
def test_revert_restores_every_file_byte_identical(cycles: dict[str, PatchCycle], version: str) -> None:
    assert cycles[version].reverted["changed"]
    assert cycles[version].hashes_after_revert == cycles[version].hashes_before


def test_fusion_gate_left_alone_when_flashinfer_predates_0_6_17() -> None:
    _status, text = run_cli(
        "scan", "--json", "--cc", "12.0", "--flashinfer-version", "0.6.12", "--source", str(release_dir("0.5.14"))
    )
    gates = [f for f in json.loads(text)["findings"] if f["id"].startswith("fusion-gate:")]
    assert len(gates) == 2 and all(not f["ok"] and not f["patchable"] and "0.6.12" in f["summary"] for f in gates)


def test_hopper_needs_only_the_multicast_relaxation_in_the_communicator() -> None:
    _status, text = run_cli("scan", "--json", "--cc", "9.0", "--source", str(release_dir("0.5.23")))
    findings = json.loads(text)["findings"]
    patchable = {f["id"] for f in findings if not f["ok"] and f["patchable"]}
    assert {f for f in patchable if not f.startswith("eagle3")} == {"multicast-early-return"}
    # without FlashInfer the workspace preflight is reported and left as is; with it, SM90 (TRT-LLM) gets the fix
    assert {f["id"] for f in findings if not f["ok"] and not f["patchable"]} >= {"fusion-preflight"}
    _status, text = run_cli(
        "scan", "--json", "--cc", "9.0", "--flashinfer-version", "0.7.2", "--source", str(release_dir("0.5.23"))
    )
    patchable = {f["id"] for f in json.loads(text)["findings"] if not f["ok"] and f["patchable"]}
    assert {f for f in patchable if not f.startswith("eagle3")} == {"multicast-early-return", "fusion-preflight"}
