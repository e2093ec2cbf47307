"""A real FlashInfer JIT module built once in one container, carried to a second and loaded there without compiling.

Both nodes get the same stack the way a fleet does: FlashInfer 0.7.2 and torch 2.13.0+cpu from a local wheelhouse in
/opt/sm120kit/venv, the CUDA 13.0 toolkit at /usr/local/cuda (this machine's, mounted read-only), g++ from Debian,
and the same environment. Node A builds `api_log_stats` (FlashInfer's smallest module: two short .cu files) for
12.0f and packs it; node B verifies and installs the bundle, loses its C++ compiler, and loads the module through
FlashInfer: it can only succeed if nothing compiles, and FlashInfer's own ninja run says so.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from lab import in_ci
from lab.playbook import playbook_argv, run_playbook, write_inventory
from lab.podman import Mount, Node, NodeFactory, node_exec, podman

pytestmark = pytest.mark.container

ROOT = Path(__file__).resolve().parents[2]
WHEELHOUSE = ROOT / ".cache" / "jit-wheelhouse"
CUDA = Path("/usr/local/cuda-13.0")
VENV = "/opt/sm120kit/venv"
PACKAGES = ["torch==2.13.0+cpu", "apache-tvm-ffi>=0.1.11,<0.2", "numpy", "ninja", "click", "einops", "packaging",
            "requests", "tabulate", "tqdm", "nvidia-ml-py"]  # fmt: skip
ENV = {
    # FlashInfer runs `ninja` by name: the venv's pinned ninja must come first on PATH.
    "PATH": f"{VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "PYTHONPATH": "/src",
    "CUDA_HOME": "/usr/local/cuda",
    "FLASHINFER_CUDA_ARCH_LIST": "12.0f",
    "FLASHINFER_WORKSPACE_BASE": "/var/cache/sm120kit",
    "FLASHINFER_EXTRA_LDFLAGS": "-L/opt/sm120kit/stubs",  # no driver here: link against a libcuda stub
    "LD_LIBRARY_PATH": "/usr/local/cuda/lib64",
}
MODULE = "api_log_stats"
COMPILERS = "/usr/bin/x86_64-linux-gnu-g++-12 /usr/bin/x86_64-linux-gnu-gcc-12"
PLAY = """- name: Warm FlashInfer's JIT cache
  hosts: all
  gather_facts: false
  environment: {env}
  roles:
    - role: flashinfer_jit
"""
LOAD = (
    "import time; t = time.monotonic(); from flashinfer.jit.api_log_stats import gen_api_log_stats_module as g; "
    "g().build_and_load(); print(f'LOADED in {time.monotonic() - t:.2f} s')"
)


@pytest.fixture(scope="module")
def wheelhouse() -> Path:
    """torch (CPU) and FlashInfer wheels for the nodes, fetched once with this machine's pip configuration."""
    marker = WHEELHOUSE / "flashinfer_python-0.7.2-py3-none-any.whl"
    if not marker.exists():
        pip = [sys.executable, "-m", "pip", "download", "-q", "-d", str(WHEELHOUSE)]
        subprocess.run([*pip, *PACKAGES], check=True, timeout=900)
        subprocess.run([*pip, "--no-deps", "flashinfer-python==0.7.2"], check=True, timeout=900)
    return WHEELHOUSE


def sh(node: Node, script: str, timeout: float = 600, check: bool = True) -> str:
    env = " ".join(f"{k}={v}" for k, v in ENV.items())
    result = node_exec(node, ["bash", "-c", f"set -euo pipefail; export {env}; {script}"], timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"{node.name}: {script[:120]} failed:\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}")
    return result.stdout


def jit(node: Node, args: str, timeout: float = 600) -> dict[str, Any]:
    out = sh(node, f"{VENV}/bin/python -m sm120check.jitcache {args} --json", timeout)
    data: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return data


def provision(node: Node) -> None:
    """The stack a node of this fleet has: compiler, venv, FlashInfer; and a libcuda stub (no driver here)."""
    sh(node, "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -qq -y g++ python3-venv >/dev/null")
    sh(node, "ln -sfn /opt/cuda-13.0 /usr/local/cuda")
    sh(node, f"python3 -m venv {VENV} && {VENV}/bin/pip install -q --no-index -f /wh " + " ".join(map(repr, PACKAGES)))
    sh(node, f"{VENV}/bin/pip install -q --no-index --no-deps -f /wh flashinfer-python==0.7.2")
    sh(node, "mkdir -p /opt/sm120kit/stubs && echo 'void cuGetErrorString(void) {}' > /tmp/s.c && "
       "gcc -shared -fPIC -Wl,-soname,libcuda.so.1 -o /opt/sm120kit/stubs/libcuda.so /tmp/s.c")  # fmt: skip


@pytest.fixture(scope="module")
def fleet(make_module_node: NodeFactory, wheelhouse: Path) -> tuple[Node, Node]:
    if not CUDA.is_dir():
        # the lab's rule (tests/conftest.py `lab`): skip with the reason here, fail in CI, which never skips these
        missing = f"{CUDA} (the CUDA 13.0 toolkit to mount into the nodes) is not on this machine"
        if in_ci():
            pytest.fail(f"{missing} (CI=true never skips the container tests)", pytrace=False)
        pytest.skip(missing)
    mounts = [
        Mount(wheelhouse, "/wh"),
        Mount(CUDA, "/opt/cuda-13.0"),
        Mount(ROOT / "python" / "sm120check" / "src", "/src"),
    ]
    nodes = (make_module_node("jit-build", mounts=mounts), make_module_node("jit-receive", mounts=mounts))
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(provision, nodes))
    return nodes


@pytest.fixture(scope="module")
def carried(fleet: tuple[Node, Node], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Build on A, copy the bundle to B through this machine (as Ansible does through the control node)."""
    a, b = fleet
    start = time.monotonic()
    built = jit(a, f"build --modules {MODULE} --bundle /tmp/{MODULE}.tar.gz", timeout=900)
    build_seconds = time.monotonic() - start
    local = tmp_path_factory.mktemp("bundle") / f"{MODULE}.tar.gz"
    podman("cp", f"{a.name}:/tmp/{MODULE}.tar.gz", str(local))
    podman("cp", str(local), f"{b.name}:/tmp/{MODULE}.tar.gz")
    before = jit(b, f"status --modules {MODULE}")
    unpacked = jit(b, f"unpack /tmp/{MODULE}.tar.gz")
    after = jit(b, f"status --modules {MODULE}")
    return {"built": built, "build_seconds": build_seconds, "before": before, "unpacked": unpacked, "after": after}


def test_nodes_provisioned_alike_share_one_key(fleet: tuple[Node, Node]) -> None:
    a, b = fleet
    assert jit(a, "key")["slug"] == jit(b, "key")["slug"]


def test_module_is_built_once_on_the_build_node(carried: dict[str, Any]) -> None:
    (module,) = carried["built"]["modules"]
    assert module["built"] and not module["cached_before"]
    assert "no work" in module["verdict_after"]


def test_receiving_node_lacks_the_module_until_the_bundle_arrives(carried: dict[str, Any]) -> None:
    assert not carried["before"]["modules"][0]["cached"]
    assert carried["unpacked"]["ok"] and carried["unpacked"]["modules"] == [MODULE]
    assert carried["after"]["modules"][0]["cached"]


def test_receiving_node_loads_the_module_without_any_compiler(
    fleet: tuple[Node, Node], carried: dict[str, Any]
) -> None:
    _, b = fleet
    moddir = carried["after"]["modules"][0]["dir"]
    log_before = sh(b, f"sha256sum {moddir}/.ninja_log; stat -c '%n %Y' {moddir}/*")
    # No C++ compiler on B while it loads: nvcc and the link step would both fail.
    sh(b, f"for c in {COMPILERS}; do mv $c $c.off; done")
    try:
        # VERBOSE shows FlashInfer's own ninja output; DEBUG=0 keeps its compile flags (VERBOSE alone means debug).
        out = sh(b, f"FLASHINFER_JIT_VERBOSE=1 FLASHINFER_JIT_DEBUG=0 {VENV}/bin/python -c {LOAD!r} 2>&1", timeout=300)
    finally:
        sh(b, f"for c in {COMPILERS}; do mv $c.off $c; done")
    assert "LOADED in" in out, out
    assert "ninja: no work to do." in out  # FlashInfer's own ninja run on load
    assert sh(b, f"sha256sum {moddir}/.ninja_log; stat -c '%n %Y' {moddir}/*") == log_before


def test_role_builds_once_per_key_and_copies_the_cache_to_the_other_node(
    fleet: tuple[Node, Node], carried: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A key neither node has yet (target 9.0a): the first node builds, the second receives, a rerun changes nothing."""
    a, b = fleet
    work = tmp_path_factory.mktemp("role")
    inventory = write_inventory(work, [a, b])
    play = work / "jit.yml"
    play.write_text(PLAY.format(env=json.dumps(ENV)))
    bundles = work / "bundles"
    extra = {"flashinfer_jit_modules": [MODULE], "flashinfer_jit_arch_list": ["9.0a"],
             "flashinfer_jit_bundle_dir": str(bundles), "sm120kit_profile": "full"}  # fmt: skip
    first = run_playbook(playbook_argv(play, inventory, extra), timeout=1200)
    assert first.rc == 0, first.tail()
    assert [p.name for p in bundles.iterdir()] == [f"{jit(a, 'key --arch-list 9.0a')['slug']}.tar.gz"]
    for node in (a, b):
        assert jit(node, f"status --modules {MODULE} --arch-list 9.0a")["modules"][0]["cached"], node.name
    assert jit(b, f"status --modules {MODULE} --arch-list 9.0a")["modules"][0]["stamp"]["built_on"] == a.name
    again = run_playbook(playbook_argv(play, inventory, extra), timeout=600)
    assert again.rc == 0 and again.host(a.name).changed == 0 and again.host(b.name).changed == 0, again.tail()
