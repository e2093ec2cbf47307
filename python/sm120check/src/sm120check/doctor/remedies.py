"""Remedies named once: the playbook tag, variable or command that fixes a family of problems."""

from __future__ import annotations

PLAYBOOK = "ansible-playbook site.yml"


def tags(tag: str, extra: str = "") -> str:
    return f"{PLAYBOOK} --tags {tag}" + (f" {extra}" if extra else "")


CUDA_TOOLKIT = tags("cuda_toolkit")  # installs the pinned toolkit (cuda_toolkit_version)
CUDA_ENV = tags("cuda_env")  # sitecustomize hook, profile.d, ld.so.conf.d + ldconfig
NCCL = tags("nccl")
PYTHON_STACK = tags("python_stack")  # the venv's pinned wheels
SM120CHECK = tags("sm120check")  # installs the checker and writes the manifest
PREFLIGHT = tags("preflight")
DRIVER = (
    "install an NVIDIA driver >= the manifest's driver_min with the open kernel modules "
    "(for example `apt install nvidia-open-580`), reboot; the preflight role checks it: " + PREFLIGHT
)
# Every message about a cold FlashInfer JIT cache (flashinfer_jit and allreduce_fusion checks) gives this one.
FLASHINFER_JIT = tags(
    "flashinfer_jit",
    "(builds once per cache key and copies the cache to every node of that key; one node without Ansible: "
    "the stack venv's python -m sm120check.jitcache build)",
)
