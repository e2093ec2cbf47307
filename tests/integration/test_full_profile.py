"""The `full` profile (torch, FlashInfer, SGLang) converged into a container from a wheelhouse: `make test-full`.

Too large for CI's time (several GB of wheels): run by hand, recorded under docs/validation/. The container has
no GPU, so torch is checked for what a CPU can prove: a CUDA 13.0 build whose kernels include sm_120.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from lab.converge import NODE_GROUPS, ConvergedNode, site_argv
from lab.playbook import REPO_ROOT, run_playbook, write_inventory
from lab.podman import Mount, node_exec, running_node
from lab.wheelhouse import NODE_PATH, WheelhouseError, build_wheelhouse

pytestmark = [pytest.mark.container, pytest.mark.full, pytest.mark.slow]

MANIFEST = yaml.safe_load((REPO_ROOT / "inventory/group_vars/all/stack.yml").read_text())
PINS = MANIFEST["sm120kit_profiles"]["full"]["python_packages"]
VENV_PYTHON = f"{MANIFEST['sm120kit_venv']}/bin/python"
# No GPU here: the flashinfer_jit role (tested on its own in tests/jitcache) would cross-compile for an hour on two
# cores and then miss libcuda.so at link time; the doctor's torch check fails for want of a GPU.
# Installing ~4 GB of wheels through the podman connection on two cores takes well over CI's per-run budget.
FULL_CONVERGE_TIMEOUT = 4800
FULL = {"sm120kit_profile": "full", "sm120kit_doctor_fail_on_error": False, "flashinfer_jit_enabled": False}

PROBE = """
import json, importlib.metadata as md, torch
print(json.dumps({
    "torch": torch.__version__, "cuda": torch.version.cuda, "arch_flags": torch._C._cuda_getArchFlags(),
    "versions": {name: md.version(name) for name in %s},
}))
"""


@pytest.fixture(scope="module")
def full_node(lab: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConvergedNode]:
    try:
        directory, _ = build_wheelhouse("full", timeout=3600)
    except WheelhouseError as error:
        pytest.fail(str(error), pytrace=False)
    with running_node("full", lab, [Mount(directory, NODE_PATH)]) as node:
        inventory = write_inventory(tmp_path_factory.mktemp("full-inventory"), [node], NODE_GROUPS)
        run = run_playbook(site_argv(inventory, check=False, **FULL), timeout=FULL_CONVERGE_TIMEOUT)
        if run.rc != 0:
            pytest.fail(f"the full converge failed:\n{run.tail(120)}", pytrace=False)
        yield ConvergedNode(node, inventory, run)


def probe(node: ConvergedNode) -> dict[str, Any]:
    script = PROBE % json.dumps(sorted(PINS))
    done = node_exec(node.node, [VENV_PYTHON, "-c", script], timeout=300)
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def test_torch_is_the_pinned_cuda_13_build_with_sm120_kernels(full_node: ConvergedNode) -> None:
    found = probe(full_node)
    assert found["torch"].split("+")[0] == PINS["torch"]
    assert found["cuda"] == "13.0"
    assert "sm_120" in found["arch_flags"].split(), found["arch_flags"]


def test_every_pinned_package_has_its_version(full_node: ConvergedNode) -> None:
    versions = probe(full_node)["versions"]
    assert {name: versions[name].split("+")[0] for name in PINS} == PINS


def test_full_node_doctor_names_the_missing_gpu_and_nothing_else(full_node: ConvergedNode) -> None:
    done = node_exec(full_node.node, ["sm120check", "doctor", "--level", "2", "--json"], timeout=600)
    results = {r["id"]: r for r in json.loads(done.stdout)["results"]}
    for check in ("nvrtc", "toolkit", "abi_wheels", "env", "stack", "sm120_jit", "nvcc_sm120", "sglang_sm120"):
        assert results[check]["status"] == "pass", (check, results[check])
    assert results["driver"]["status"] == "skip"
