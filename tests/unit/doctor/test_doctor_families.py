"""A check's family is the role that owns what it checks, so a report's family names the role to run."""

from __future__ import annotations

from pathlib import Path

from sm120check.doctor.catalogue import all_checks

ROLES = {path.name for path in (Path(__file__).parents[3] / "roles").iterdir() if path.is_dir()}
NO_ROLE = {"comm", "node_health"}  # the GPUs together (comm) and their hardware (node_health): no role owns either


def test_every_family_is_a_role_or_the_communication_family() -> None:
    families = {check.id: check.family for check in all_checks()}
    assert {family for family in families.values() if family not in ROLES} <= NO_ROLE, families


def test_families_name_the_role_that_fixes_the_part() -> None:
    families = {check.id: check.family for check in all_checks()}
    assert families["toolkit"] == families["nvcc_sm120"] == families["sm120_jit"] == "cuda_toolkit"
    assert families["env"] == "cuda_env" and families["manifest"] == "sm120check"
    assert families["torch"] == families["stack"] == families["abi_wheels"] == "python_stack"
    assert families["sglang_sm120"] == families["sglang_comm"] == "sglang_sm120"
    assert families["driver"] == families["platform"] == "preflight"


def test_node_health_checks_are_their_own_family() -> None:
    families = {check.id: check.family for check in all_checks()}
    health = ("pcie_link", "pcie_replay", "gpu_ecc", "gpu_clocks", "gpu_mig", "gpu_bar1", "gpu_processes")
    assert {families[i] for i in (*health, "gpu_copy_bandwidth", "gpu_xid", "gpu_product")} == {"node_health"}
