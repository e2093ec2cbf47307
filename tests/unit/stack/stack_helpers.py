"""A small stack.yml and a wheelhouse of stand-in wheels on this machine, so `stack plan` and `stack resolve` run the
real pip offline (`--no-index --find-links`): each wheel is a zip with METADATA, WHEEL and RECORD, nothing else."""

from __future__ import annotations

import contextlib
import io
import zipfile
from collections.abc import Sequence
from pathlib import Path

from sm120check.cli import main

STACK = """\
# a small manifest for the stack tools' tests
sm120kit_profile: core
sm120kit_cuda_version: "13.0.1"
sm120kit_cuda_apt_version: "13.0.1-1"
sm120kit_nccl_version: "2.28.3"
sm120kit_cuda_components:
  nvidia-cuda-nvcc: "13.0.88"
sm120kit_profiles:
  core:
    python_packages:
      alpha: "1.0"  # the first pin
      beta: "1.0"
"""


def make_wheel(where: Path, name: str, version: str, requires: Sequence[str] = ()) -> Path:
    stem = f"{name.replace('-', '_')}-{version}"
    path = where / f"{stem}-py3-none-any.whl"
    info = f"{stem}.dist-info"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(
        f"Requires-Dist: {r}\n" for r in requires
    )
    files = {
        f"{info}/METADATA": metadata,
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        f"{info}/RECORD": "",
    }
    with zipfile.ZipFile(path, "w") as archive:
        for member, text in files.items():
            archive.writestr(member, text)
    return path


def wheelhouse(tmp: Path, extra: Sequence[tuple[str, str, Sequence[str]]] = ()) -> Path:
    """nvidia-nccl-cu13 2.28.3, alpha 1.0 and 2.0, beta 1.0 and 2.0 (none requires another), and `extra`."""
    root = tmp / "wh"
    (root / "python").mkdir(parents=True, exist_ok=True)
    (root / "toolkit").mkdir(exist_ok=True)
    for name, version, requires in [
        ("nvidia-nccl-cu13", "2.28.3", ()),
        ("alpha", "1.0", ()),
        ("alpha", "2.0", ()),
        ("beta", "1.0", ()),
        ("beta", "2.0", ()),
        *extra,
    ]:
        make_wheel(root / "python", name, version, requires)
    return root


def stack_cli(*argv: str) -> tuple[int, str, str]:
    """`sm120check stack ARGV` in this process: (exit status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = main(["stack", *argv])
        except SystemExit as exc:  # argparse: a usage error
            status = int(exc.code or 0)
    return status, out.getvalue(), err.getvalue()
