"""Shared helpers of the doctor unit tests: fixture files, toy checks, finding a real NVRTC."""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from sm120check.doctor.model import Context, Result, Status

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "doctor"
SRC = Path(__file__).resolve().parents[3] / "python" / "sm120check" / "src"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")


@dataclass
class ToyCheck:
    """A check whose verdict is given up front (or that raises), for runner tests."""

    id: str
    status: Status = Status.PASS
    level: int = 1
    requires: tuple[str, ...] = ()
    family: str = "toy"
    raises: Exception | None = None
    ran: list[str] = field(default_factory=list)
    kind: ClassVar[str] = "toy"

    def run(self, ctx: Context) -> Result:
        self.ran.append(self.id)
        if self.raises is not None:
            raise self.raises
        return Result(self.id, self.status, f"{self.id} said {self.status.value}", remedy=f"fix {self.id}")


def doctor(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run `python -m sm120check.doctor ARGS` as a user would, in a fresh interpreter."""
    child_env = dict(os.environ)
    child_env["PYTHONPATH"] = str(SRC)
    child_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "sm120check.doctor", *args],
        capture_output=True, text=True, env=child_env, timeout=timeout, check=False,
    )


def find_nvrtc_dir(tmp: Path) -> Path | None:
    """A directory holding a real libnvrtc.so.13 and its builtins: the CUDA tree, a CUDA wheel, or the wheel file."""
    candidates = [Path(p) for p in ("/usr/local/cuda/lib", "/usr/local/cuda/lib64")]
    candidates += [Path(p).parent for p in glob.glob(f"{sys.prefix}/lib/python3*/site-packages/nvidia/cu13/lib/libnvrtc.so.13")]
    for directory in candidates:
        if (directory / "libnvrtc.so.13").exists() and (directory / "libnvrtc-builtins.so.13.0").exists():
            return directory
    wheels = sorted(glob.glob("/opt/pypi*/files/nvidia_cuda_nvrtc-13.*.whl")) + sorted(glob.glob("/opt/wheels/nvidia_cuda_nvrtc-13.*.whl"))
    if not wheels:
        out = tmp / "wheel"
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(out), "nvidia-cuda-nvrtc==13.0.88"],
            capture_output=True, timeout=300, check=False,
        )
        wheels = sorted(glob.glob(f"{out}/nvidia_cuda_nvrtc-13.*.whl"))
    if not wheels:
        return None
    with zipfile.ZipFile(wheels[-1]) as wheel:
        wheel.extractall(tmp / "nvrtc")
    directory = tmp / "nvrtc" / "nvidia" / "cu13" / "lib"
    return directory if (directory / "libnvrtc.so.13").exists() else None
