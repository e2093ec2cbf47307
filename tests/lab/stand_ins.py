"""Stand-ins for parts of a node the Ansible tests cannot install here, each as thin as the one thing it replaces."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def nccl_stand_in_venv(tmp: Path) -> Path:
    """A stand-in stack venv: a real interpreter with an empty nvidia/nccl/lib (the NCCL wheel's layout), so the nccl
    role's own lookup finds its lib dir without installing the 200 MB wheel."""
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    (site,) = venv.glob("lib/python3*/site-packages")
    (site / "nvidia/nccl/lib").mkdir(parents=True)
    return venv
