"""Shared helpers of the doctor unit tests: fixture files, toy checks, finding a real NVRTC."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar, Protocol, cast

from sm120check.doctor import facts
from sm120check.doctor.model import Check, Context, Result, Status
from sm120check.doctor.nvml_api import Gpu, NvmlInfo

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "doctor"
SRC = Path(__file__).resolve().parents[3] / "python" / "sm120check" / "src"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")


def gpu(
    index: int,
    name: str = "NVIDIA RTX PRO 6000 Blackwell Workstation Edition",
    cc: tuple[int, int] = (12, 0),
    persistence: bool | None = True,
) -> Gpu:
    return Gpu(index, name, cc, persistence, f"00000000:{index + 1:02x}:00.0")


def facts_for(
    gpus: tuple[Gpu, ...] | None = None,
    *,
    nvml_error: str = "",
    driver: str = "580.95.05",
    **fields: Any,
) -> facts.NodeFacts:
    """Node facts for a test: these GPUs as NVML listed them (None with `nvml_error`: NVML did not load; None
    alone: NVML not asked), the other fields (toolkit_home, venv, distributions, flashinfer, manifest) as given,
    else the local ones of the interpreter running the tests."""
    nvml = None
    if gpus is not None:
        nvml = facts.NvmlFacts(NvmlInfo(driver, 13000, tuple(gpus), "ctypes"))
    elif nvml_error:
        nvml = facts.NvmlFacts(error=nvml_error)
    return replace(facts.local(fields.get("manifest")), nvml_read=nvml, **fields)


@dataclass
class ToyCheck:
    """A check whose verdict is given up front (or that raises), for runner tests."""

    id: str
    status: Status = Status.PASS
    level: int = 1
    requires: tuple[str, ...] = ()
    uses: tuple[str, ...] = ()
    family: str = "toy"
    raises: Exception | None = None
    ran: list[str] = field(default_factory=list)
    kind: ClassVar[str] = "toy"

    def run(self, ctx: Context) -> Result:
        self.ran.append(self.id)
        if self.raises is not None:
            raise self.raises
        return Result(self.id, self.status, f"{self.id} said {self.status.value}", remedy=f"fix {self.id}")


class CheckDouble(Protocol):
    """A runner test's stand-in check: a real check's shape, its id and graph set per instance."""

    id: str
    family: str
    level: int
    requires: tuple[str, ...]
    uses: tuple[str, ...]

    def run(self, ctx: Context) -> Result: ...


def as_checks(doubles: Iterable[CheckDouble]) -> list[Check]:
    """The stand-ins as the runner takes them: `Check` declares its fields class variables (one class per check),
    the stand-ins set them per instance; the runner only reads them, which is the same either way."""
    return cast("list[Check]", list(doubles))


def doctor(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run `python -m sm120check.doctor ARGS` as a user would, in a fresh interpreter."""
    child_env = dict(os.environ)
    child_env["PYTHONPATH"] = str(SRC)
    child_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "sm120check.doctor", *args],
        capture_output=True,
        text=True,
        env=child_env,
        timeout=timeout,
        check=False,
    )


def find_nvrtc_dir(tmp: Path) -> Path | None:
    """A directory holding a real libnvrtc.so.13 and its builtins: the CUDA tree, a CUDA wheel, or the wheel file."""
    candidates = [Path("/usr/local/cuda/lib"), Path("/usr/local/cuda/lib64")]
    candidates += [p.parent for p in Path(sys.prefix).glob("lib/python3*/site-packages/nvidia/cu13/lib/libnvrtc.so.13")]
    for directory in candidates:
        if (directory / "libnvrtc.so.13").exists() and (directory / "libnvrtc-builtins.so.13.0").exists():
            return directory
    pattern = "nvidia_cuda_nvrtc-13.*.whl"
    wheels = sorted(
        w for root in ("/opt/pypi-more/files", "/opt/pypi/files", "/opt/wheels") for w in Path(root).glob(pattern)
    )
    if not wheels:
        out = tmp / "wheel"
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(out), "nvidia-cuda-nvrtc==13.0.88"],
            capture_output=True,
            timeout=300,
            check=False,
        )
        wheels = sorted(out.glob(pattern))
    if not wheels:
        return None
    with zipfile.ZipFile(wheels[-1]) as wheel:
        wheel.extractall(tmp / "nvrtc")
    directory = tmp / "nvrtc" / "nvidia" / "cu13" / "lib"
    return directory if (directory / "libnvrtc.so.13").exists() else None


def write_manifest(tmp: Path, **cuda: str) -> Path:
    """A schema-2 manifest for the interpreter running the tests (its venv = sys.prefix), CUDA 13.0.1 pins."""
    import json

    from sm120check import __version__

    data = {
        "schema": 2,
        "sm120kit_version": __version__,
        "profile": "core",
        "cuda": {"version": "13.0.1", "nvcc": "13.0.88", "nvrtc": "13.0.88", "home": "/opt/cuda"}
        | {"lib_dir": "/opt/cuda/lib64"}
        | cuda,
        "nccl": {"version": "2.30.7", "lib_dir": f"{sys.prefix}/nvidia/nccl/lib"},
        "driver_min": "580.65.06",
        "venv": sys.prefix,
        "python_packages": {},
        "env": {},
    }
    path = tmp / "manifest.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return path
