"""The cache key: what must agree between two hosts for one's FlashInfer JIT modules to load on the other unbuilt.

`flashinfer`, `cuda` (the nvcc release FlashInfer compiles with), `arch` (FlashInfer's target directory, e.g. "120f")
and `torch` name the stack. `context` is a digest of what FlashInfer writes into its ninja files and what ninja
records as header dependencies: the FlashInfer and TVM-FFI package paths, Python's include directory, CUDA_HOME, the
cache directory, the host C++ compiler, the FlashInfer build variables set (COMMAND_ENV) and ninja's version (its log
format). Nodes provisioned alike share all five; a node that differs in any of them would rebuild a copied module on
first load, so it builds its own.

Nothing here imports FlashInfer or torch: versions come from package metadata, paths from import specs.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sysconfig
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from importlib import metadata
from pathlib import Path

from sm120check import versions
from sm120check.jitcache import layout
from sm120check.jitcache.layout import ARCH_LIST_ENV
from sm120check.jitcache.ninja import find_ninja, ninja_version

KEY_FIELDS = ("flashinfer", "cuda", "arch", "torch", "context")
# Environment FlashInfer writes into its build commands (flashinfer/jit/cpp_ext.py, core.py).
COMMAND_ENV = (
    "CC",
    "CXX",
    "FLASHINFER_NVCC",
    "FLASHINFER_CXX_LAUNCHER",
    "FLASHINFER_NVCC_LAUNCHER",
    "FLASHINFER_EXTRA_CFLAGS",
    "FLASHINFER_EXTRA_CUDAFLAGS",
    "FLASHINFER_EXTRA_LDFLAGS",
    "FLASHINFER_JIT_LINEINFO",
)
_NVCC_RELEASE = re.compile(r"release (\d+)\.(\d+), V(\d+\.\d+\.\d+)")


class KeyProblem(ValueError):
    """A key cannot be computed or read; the message names the missing piece and the fix."""


@dataclass(frozen=True)
class BuildContext:
    """What FlashInfer's build commands and ninja's recorded header dependencies embed."""

    flashinfer_dir: str
    tvm_ffi_dir: str
    python_include: str
    cuda_home: str
    cache_root: str
    cxx: str
    command_env: str = ""  # the COMMAND_ENV variables set, "NAME=value" joined by spaces
    ninja: str = ""  # version of the ninja on PATH: its log format must match the bundle's

    def digest(self) -> str:
        text = json.dumps(asdict(self), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def differences(self, other: BuildContext) -> list[str]:
        return [
            f"{f.name}: {getattr(self, f.name)!r} here, {getattr(other, f.name)!r} there"
            for f in fields(self)
            if getattr(self, f.name) != getattr(other, f.name)
        ]


@dataclass(frozen=True)
class CacheKey:
    flashinfer: str
    cuda: str
    arch: str
    torch: str
    context: str

    def as_dict(self) -> dict[str, str]:
        return {name: getattr(self, name) for name in KEY_FIELDS}

    @classmethod
    def from_mapping(cls, data: Mapping[str, object], source: str) -> CacheKey:
        missing = [name for name in KEY_FIELDS if not isinstance(data.get(name), str)]
        if missing:
            raise KeyProblem(
                f"{source}: the cache key lacks {', '.join(missing)}; rebuild the bundle with this sm120check"
            )
        return cls(**{name: str(data[name]) for name in KEY_FIELDS})

    def slug(self) -> str:
        """A file-name-safe label: flashinfer-0.7.2_cuda-13.0.88_120f_torch-2.14.1_<context>."""
        raw = f"flashinfer-{self.flashinfer}_cuda-{self.cuda}_{self.arch}_torch-{self.torch}_{self.context}"
        return re.sub(r"[^A-Za-z0-9._-]", "-", raw)

    def differences(self, other: CacheKey, ignore: Sequence[str] = ()) -> list[str]:
        """Fields that differ, as "field: this vs other", except those in `ignore`."""
        return [
            f"{name}: {getattr(self, name)} vs {getattr(other, name)}"
            for name in KEY_FIELDS
            if name not in ignore and getattr(self, name) != getattr(other, name)
        ]


def jit_debug(env: Mapping[str, str]) -> bool:
    """FlashInfer compiles with -g -O0 --device-debug when FLASHINFER_JIT_DEBUG, else FLASHINFER_JIT_VERBOSE, is "1"."""
    return env.get("FLASHINFER_JIT_DEBUG", env.get("FLASHINFER_JIT_VERBOSE", "0")) == "1"


def parse_nvcc_release(text: str) -> str:
    """ "Cuda compilation tools, release 13.0, V13.0.88" -> "13.0.88"."""
    match = _NVCC_RELEASE.search(text)
    if match is None:
        raise KeyProblem(f"cannot read a CUDA release from nvcc's output: {text.strip()[-200:]!r}")
    return match.group(3)


def cuda_home(env: Mapping[str, str]) -> Path:
    """FlashInfer's order: CUDA_HOME, CUDA_PATH, the nvcc on PATH, /usr/local/cuda."""
    for name in ("CUDA_HOME", "CUDA_PATH"):
        if env.get(name):
            return Path(env[name])
    nvcc = shutil.which("nvcc", path=env.get("PATH"))
    return Path(nvcc).resolve().parent.parent if nvcc else Path("/usr/local/cuda")


def nvcc_release(home: Path) -> str:
    nvcc = home / "bin" / "nvcc"
    try:
        out = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError) as exc:
        raise KeyProblem(
            f"{nvcc} --version failed ({exc}); set CUDA_HOME to the CUDA 13 toolkit (e.g. /opt/cuda)"
        ) from None
    return parse_nvcc_release(out.stdout)


def cxx_identity(env: Mapping[str, str]) -> str:
    """The host compiler ninja's header dependencies come from, e.g. "c++ 12.2.0" ("c++ absent" when missing)."""
    cxx = env.get("CXX") or "c++"
    try:
        out = subprocess.run([cxx, "-dumpfullversion", "-dumpversion"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return f"{cxx} absent"
    return f"{cxx} {out.stdout.strip() or 'unknown'}"


def gpu_capabilities(timeout: float = 30.0) -> list[str]:
    """Compute capabilities of the visible GPUs ("9.0", "12.0"), from nvidia-smi; empty without a driver."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        out = subprocess.run(
            [smi, "--query-gpu=compute_cap", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.stdout.splitlines() if line.strip()]


def arch_dir(arch_list: str | None, capabilities: Sequence[str], cuda_release: str) -> str:
    """FlashInfer's target directory ("90a", "120f", "90a_120f") for a declared list or the GPUs seen."""
    if not (arch_list or "").strip() and not capabilities:
        raise KeyProblem(
            f"no GPU visible and {ARCH_LIST_ENV} unset: declare the JIT target, e.g. --arch-list 12.0f "
            f"(role variable flashinfer_jit_arch_list)"
        )
    major, minor = versions.parse(cuda_release)[:2]
    return layout.arch_dir(layout.jit_targets(capabilities, arch_list or None, (major, minor)))


def package_dir(name: str) -> str:
    """Where a package would be imported from, without importing it ("" when absent)."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return ""
    return str(Path(next(iter(spec.submodule_search_locations))).resolve())


def package_version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return ""


def compute(
    env: Mapping[str, str] | None = None,
    arch_list: str | None = None,
    capabilities: Sequence[str] | None = None,
) -> tuple[CacheKey, BuildContext]:
    """This interpreter's key: run it with the stack venv's python, the one that serves."""
    env = dict(os.environ if env is None else env)
    flashinfer = package_version("flashinfer-python")
    if not flashinfer:
        raise KeyProblem(
            "flashinfer-python is not installed for this interpreter; run with the stack venv's python "
            "(e.g. /opt/sm120kit/venv/bin/python -m sm120check.jitcache key)"
        )
    home = cuda_home(env)
    release = nvcc_release(home)
    declared = arch_list if arch_list is not None else env.get(ARCH_LIST_ENV)
    caps = list(capabilities) if capabilities is not None else ([] if declared else gpu_capabilities())
    context = BuildContext(
        flashinfer_dir=package_dir("flashinfer"),
        tvm_ffi_dir=package_dir("tvm_ffi"),
        python_include=sysconfig.get_path("include"),
        cuda_home=str(home),
        cache_root=str(layout.cache_root(env)),
        cxx=cxx_identity(env),
        command_env=" ".join(
            [f"{name}={env[name]}" for name in COMMAND_ENV if env.get(name)] + (["jit_debug"] if jit_debug(env) else [])
        ),
        ninja=ninja_version(find_ninja(env)),
    )
    key = CacheKey(
        flashinfer=flashinfer,
        cuda=release,
        arch=arch_dir(declared, caps, release),
        torch=package_version("torch") or "absent",
        context=context.digest(),
    )
    return key, context
