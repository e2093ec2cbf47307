"""The doctor's remedies run as printed: parts of a converged core node removed, each playbook remedy the doctor
prints run with exactly its tags, and the doctor's checks passing afterwards.

A converged node hides the bug this catches: there every task a single-tag run depends on (preflight's fact
gathering) is skipped or already done. Here the toolkit tree, the loader entry and the venv hook are gone, so
`--tags cuda_toolkit` must gather facts itself (it stopped with "object of type 'dict' has no attribute
'architecture'" when only preflight gathered them, under its own tags).

Removed too, one part per role the core profile installs and a core node's doctor judges: a pinned wheel of the
profile (python_stack: `stack` fails) and the node manifest (sm120check: `manifest` warns, `stack` skips until it is
back, then fails for the wheel). Not covered here: the nccl role's wheel and loader entry, since on a core node no
check reads NCCL (torch loads it: `torch` and `abi_libs` skip without torch, the level-3 checks need GPUs), and the
flashinfer_jit role, which the core profile does not install (its check skips without FlashInfer).
"""

from __future__ import annotations

import json
import re
import shlex
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lab.converge import ConvergedNode, site_argv
from lab.playbook import REPO_ROOT, run_playbook, write_inventory
from lab.podman import Mount, Node, node_exec, podman, running_node

pytestmark = pytest.mark.container

# The whole tag list: `[a-z_]+` alone ran `--tags sm` for sm120check, which selects nothing and exits 0.
PLAYBOOK_REMEDY = re.compile(r"ansible-playbook site\.yml --tags [a-z0-9_]+(?:,[a-z0-9_]+)*(?![\w-])")
CHECKS = ("toolkit", "nvrtc", "env", "nvcc_sm120", "sm120_jit", "manifest", "stack")
PROFILE_WHEEL = "nvidia-ml-py"  # the core profile's one pin (inventory/group_vars/all/stack.yml)
MANIFEST = "/etc/sm120kit/manifest.json"  # what the sm120check role writes
ROLES = frozenset(path.name for path in (REPO_ROOT / "roles").iterdir() if path.is_dir())


def doctor(node: Node) -> dict[str, dict[str, Any]]:
    result = node_exec(node, ["sm120check", "doctor", "--level", "2", "--json"], timeout=300)
    assert result.returncode in (0, 1), result.stdout + result.stderr
    return {r["id"]: r for r in json.loads(result.stdout)["results"]}


@pytest.fixture(scope="module")
def stripped_node(core_node: ConvergedNode, core_wheelhouse: Mount) -> Iterator[Node]:
    if core_node.first.rc != 0:
        pytest.fail(f"the core converge failed:\n{core_node.first.tail()}", pytrace=False)
    image = f"localhost/sm120kit-stripped:{uuid.uuid4().hex[:8]}"
    podman("commit", "--quiet", core_node.node.name, image, timeout=600)
    try:
        with running_node("stripped", image, [core_wheelhouse]) as node:  # the remedies install from it
            purelib = node_exec(
                node, ["/opt/sm120kit/venv/bin/python", "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"]
            ).stdout.strip()
            for command in (
                'rm -rf "$(readlink -f /opt/cuda)"',  # the toolkit tree the stable CUDA_HOME points at
                "rm /etc/ld.so.conf.d/sm120kit-cuda.conf && ldconfig",  # the loader entry for libnvrtc.so.13
                f"rm {purelib}/sm120kit_env.pth {purelib}/sm120kit_env.py",  # the venv's CUDA 13 hook
                f"/opt/sm120kit/venv/bin/pip uninstall --quiet -y {PROFILE_WHEEL}",  # a pinned wheel of the profile
                f"rm {MANIFEST}",  # the node manifest
            ):
                done = node_exec(node, ["sh", "-c", command], timeout=300)
                assert done.returncode == 0, (command, done.stderr)
            yield node
    finally:
        podman("rmi", "--force", image, check=False)


def test_every_playbook_remedy_the_doctor_prints_runs_as_printed_and_fixes_its_check(
    stripped_node: Node, tmp_path: Path
) -> None:
    inventory = write_inventory(tmp_path, [stripped_node])
    before = doctor(stripped_node)
    broken = {c for c in CHECKS if before[c]["status"] != "pass"}
    assert {"toolkit", "nvrtc", "env"} <= broken, {c: before[c]["summary"] for c in CHECKS}
    assert before["manifest"]["status"] == "warn" and MANIFEST in before["manifest"]["details"], before["manifest"]
    ran: list[str] = []
    seen: list[tuple[str, str, str]] = []  # (check, status, remedy) of every check that did not pass, each round
    results = before
    for _ in range(3):  # a fix can reveal the next failure; three rounds bound it
        remedies = []
        for check in CHECKS:
            found = PLAYBOOK_REMEDY.search(results[check]["remedy"]) if results[check]["status"] != "pass" else None
            assert results[check]["status"] == "pass" or found, (check, results[check])
            if found:
                seen.append((check, results[check]["status"], found.group(0)))
            if found and found.group(0) not in remedies:
                remedies.append(found.group(0))
        if not remedies:
            break
        for remedy in remedies:
            tags = shlex.split(remedy)[2:]  # `--tags X`, as printed; the inventory and its vars are the user's
            run = run_playbook([*site_argv(inventory), *tags], timeout=1200)
            assert run.rc == 0, f"`{remedy}` failed as printed:\n{run.tail()}"
            quiet = [t for t in tags[1].split(",") if t in ROLES and f"TASK [{t} : " not in run.output]
            assert not quiet, f"`{remedy}` ran no task of role {quiet}:\n{run.tail()}"
            ran.append(remedy)
        results = doctor(stripped_node)
    assert "ansible-playbook site.yml --tags cuda_toolkit" in ran
    assert ("manifest", "warn", "ansible-playbook site.yml --tags sm120check") in seen, seen
    assert ("stack", "fail", "ansible-playbook site.yml --tags python_stack") in seen, seen
    assert {c: results[c]["status"] for c in CHECKS} == dict.fromkeys(CHECKS, "pass"), ran
