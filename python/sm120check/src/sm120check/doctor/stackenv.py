"""The stack venv the doctor judges: the manifest's `venv`, else the interpreter running the doctor."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

from sm120check.doctor import facts, remedies
from sm120check.doctor.model import Context, Result, Status


def prefix(ctx: Context) -> Path:
    """The stack venv the checks judge (a fact: facts.venv_of)."""
    return ctx.facts.venv


def missing_venv(ctx: Context, check_id: str) -> Result | None:
    """A FAIL naming the manifest's venv when it is not a directory (else there is nothing to judge, and an empty
    package list would pass); None when the venv exists or the doctor judges its own interpreter."""
    if ctx.manifest is None or not ctx.manifest.venv:
        return None
    venv = Path(ctx.manifest.venv)
    if venv.is_dir():
        return None
    return Result(
        check_id,
        Status.FAIL,
        f"the stack venv {venv} (the manifest's `venv`) does not exist",
        details=f"manifest {ctx.manifest.path} names venv {venv}, which is not a directory",
        remedy=remedies.STACK_VENV_MISSING,
    )


def python(ctx: Context) -> Path:
    """The stack venv's interpreter (the running one when the venv is the doctor's own)."""
    return ctx.facts.venv_python


def site_packages(venv: Path) -> list[Path]:
    return facts.site_packages(venv)


def normalize(name: str) -> str:
    """PEP 503 name: "Flashinfer_Python" -> "flashinfer-python"."""
    return facts.normalize(name)


def nvidia_layouts(venv: Path) -> dict[str, set[str]]:
    """For each nvidia-* distribution of the venv, the CUDA trees its files live in ("cu12", "cu13").

    NVIDIA's unsuffixed wheels put their files under nvidia/cu<major>/; their own version numbers are
    the library's (cuFFT 12.x, cuSPARSE 12.x ship with CUDA 13), so the tree is what tells the CUDA major.
    """
    layouts: dict[str, set[str]] = {}
    paths = [str(p) for p in site_packages(venv)]
    for dist in metadata.distributions(path=paths):
        name = normalize(dist.metadata["Name"] or "")
        if not name.startswith("nvidia-") or name in layouts:
            continue
        trees = set()
        for file in dist.files or ():
            parts = file.parts
            if len(parts) > 1 and parts[0] == "nvidia" and parts[1][:2] == "cu" and parts[1][2:].isdigit():
                trees.add(parts[1])
        layouts[name] = trees
    return layouts


def installed(venv: Path) -> dict[str, str]:
    """Installed distributions of the venv: normalized name -> version (first one on the path wins); the checks
    read the stack venv's once, as a fact (Context.facts.distributions)."""
    return facts.distributions(venv)
