"""ABI: no CUDA 12 wheels beside the CUDA 13 stack, and a torch process maps the libraries the node meant."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import ClassVar

from sm120check import versions
from sm120check.doctor import loader, remedies, stackenv
from sm120check.doctor.model import Context, Result, Status


def torch_cuda_major(version: str) -> int | None:
    """CUDA major of a torch wheel from its version alone: "+cu130" -> 13, "+cu128" -> 12, "+cpu" -> None;
    without a label, PyPI's builds: 2.11 and later are CUDA 13, older ones CUDA 12."""
    label = versions.local_label(version)
    if label.startswith("cu") and label[2:].isdigit():
        return int(label[2:-1])
    if label:
        return None
    return 13 if versions.at_least(version, "2.11") else 12


def cuda12_dists(installed: Mapping[str, str], layouts: Mapping[str, set[str]] | None = None) -> list[str]:
    """Distributions built for CUDA 12 in a venv: `*-cu12`, sgl-kernel 0.3.x, torch cu12, and unsuffixed
    nvidia-* wheels whose files live under nvidia/cu12/ (`layouts`, from stackenv.nvidia_layouts).

    An unsuffixed wheel's own version says nothing about its CUDA: cuFFT 12.0, cuSOLVER 12.0 and cuSPARSE 12.6
    are the CUDA 13 releases torch 2.11+ depends on.
    """
    layouts = layouts or {}
    found = []
    for name, version in sorted(installed.items()):
        if name.endswith("-cu12") and installed.get(f"{name[:-5]}-cu13") == version:
            continue  # a dual-flavour package (paired_flavours): the CUDA 13 twin is what a CUDA 13 process loads
        if name.endswith("-cu12"):
            found.append(f"{name} {version}")
        elif name == "sgl-kernel" and versions.parse(version)[:2] == (0, 3):
            found.append(f"{name} {version} (CUDA 12 build; CUDA 13 is sglang-kernel 0.4.x)")
        elif name.startswith("nvidia-") and "cu12" in layouts.get(name, set()):
            found.append(f"{name} {version} (files under nvidia/cu12)")
        elif name == "torch" and torch_cuda_major(version) == 12:
            found.append(f"torch {version} (a CUDA 12 build)")
    return found


def paired_flavours(installed: Mapping[str, str]) -> list[str]:
    """`*-cu12` wheels installed beside their `*-cu13` twin at the same version.

    Some packages hard-require both flavours and pick one at run time by the CUDA they find: nvidia-cutlass-dsl
    4.8.0 (pulled in by SGLang 0.5.23 and FlashInfer 0.7.2) depends on nvidia-cutlass-dsl-libs-cu12 always and on
    -libs-cu13 with its [cu13] extra. Uninstalling the cu12 one breaks pip's view of the venv and changes nothing.
    """
    return [
        f"{name} {version} (beside {name[:-5]}-cu13 {version})"
        for name, version in sorted(installed.items())
        if name.endswith("-cu12") and installed.get(f"{name[:-5]}-cu13") == version
    ]


def wheels_verdict(installed: Mapping[str, str], venv: str, layouts: Mapping[str, set[str]] | None = None) -> Result:
    bad = cuda12_dists(installed, layouts)
    torch = installed.get("torch", "")
    data = {"cuda12_dists": len(bad), "dists": len(installed)}
    if bad:
        names = " ".join(b.split()[0] for b in bad if not b.startswith("torch "))
        return Result(
            "abi_wheels",
            Status.FAIL,
            f"CUDA 12 wheels in the CUDA 13 stack venv {venv}: {', '.join(bad)}",
            details="CUDA 12 and 13 wheels in one environment load libnvrtc.so.12 / libcudart.so.12 beside the CUDA 13 "
            "libraries: 'cannot open shared object file' or undefined symbols at import",
            remedy=remedies.cuda12_wheels(venv, names),
            data=data,
        )
    with_torch = f", torch {torch}" if torch else ""
    paired = paired_flavours(installed)
    note = ("dual-flavour wheels, whose CUDA 13 twin is used: " + "; ".join(paired)) if paired else ""
    return Result(
        "abi_wheels",
        Status.PASS,
        f"no CUDA 12 wheels among {len(installed)} distributions{with_torch}",
        details=note,
        data=data,
    )


class AbiWheelsCheck:
    """No CUDA 12 wheels (any *-cu12, sgl-kernel 0.3.x, a CUDA 12 torch) in the stack venv."""

    id: ClassVar[str] = "abi_wheels"
    family: ClassVar[str] = "python_stack"
    level: ClassVar[int] = 1
    requires: ClassVar[tuple[str, ...]] = ()
    uses: ClassVar[tuple[str, ...]] = ()

    def run(self, ctx: Context) -> Result:
        if (absent := stackenv.missing_venv(ctx, self.id)) is not None:
            return absent
        venv = ctx.facts.venv
        return wheels_verdict(ctx.facts.distributions, str(venv), stackenv.nvidia_layouts(venv))


def _soname_major(path: str) -> int | None:
    tail = Path(path).name.split(".so.", 1)
    return int(tail[1].split(".")[0]) if len(tail) == 2 and tail[1].split(".")[0].isdigit() else None


RUNTIME_LIBS = ("libnvrtc", "libcudart")


def libs_verdict(
    mapped: Mapping[str, Sequence[str]],
    cache: Mapping[str, list[str]],
    want_dirs: Mapping[str, str],
) -> Result:
    """Verdict on the libraries a torch process mapped, against the loader cache and the manifest's lib dirs.

    `want_dirs` maps a library stem (libnvrtc, libnccl, ...) to the directory the manifest says it comes from.
    """
    data: dict[str, object] = {"mapped": {k: list(v) for k, v in mapped.items()}}
    failures: list[str] = []
    warnings: list[str] = []
    for name, paths in mapped.items():
        if name in ("libcudart", "libnvrtc") and any(_soname_major(p) == 12 for p in paths):
            failures.append(f"{name}: CUDA 12 copy mapped ({', '.join(paths)})")
        distinct = {os.path.realpath(p) for p in paths}
        if len(distinct) > 1:
            failures.append(f"{name}: {len(distinct)} different files mapped in one process: {', '.join(paths)}")
    # torch loads its own wheel's libnvrtc.so.13 / libcudart.so.13 through its rpath; a later dlopen by soname
    # (sgl_kernel, FlashInfer) gets that same copy, so a different path of the same CUDA 13 soname is a note.
    # NCCL differs: a second copy on the node is what non-torch consumers would load.
    notes: list[str] = []
    for line in loader.mapped_vs_cache({k: list(v) for k, v in mapped.items()}, cache):
        (notes if line.startswith(RUNTIME_LIBS) else warnings).append(line)
    nccl_copies = loader.copies_in_cache(cache, "libnccl")
    data["nccl_copies_in_cache"] = len(nccl_copies)
    if len(nccl_copies) > 1:
        warnings.append(f"libnccl: {len(nccl_copies)} copies on the loader path: {', '.join(nccl_copies)}")
    for name, directory in want_dirs.items():
        for path in mapped.get(name, []):
            if directory and not loader.same_file(str(Path(path).parent), directory):
                line = f"{name}: mapped from {Path(path).parent}, the manifest says {directory}"
                (notes if name in RUNTIME_LIBS else warnings).append(line)
    shown = "; ".join(f"{k} {', '.join(v)}" for k, v in sorted(mapped.items()))
    if failures:
        return Result(
            "abi_libs",
            Status.FAIL,
            f"a torch process maps mixed CUDA libraries: {failures[0]}",
            details="\n".join(failures + warnings),
            remedy=remedies.ABI_MIXED_LIBS,
            data=data,
        )
    if warnings:
        return Result(
            "abi_libs",
            Status.WARN,
            f"a torch process maps libraries other than the node's: {warnings[0]}",
            details="\n".join([*warnings, f"mapped: {shown}"]),
            remedy=remedies.ABI_FOREIGN_LIBS,
            data=data,
        )
    return Result(
        "abi_libs",
        Status.PASS,
        f"a torch process maps one copy of each: {shown or 'none tracked'}",
        details="\n".join(notes),
        data=data,
    )


class AbiLibsCheck:
    """The libnvrtc/libcudart/libnccl/libcuda a torch process maps agree with the loader cache and the manifest."""

    id: ClassVar[str] = "abi_libs"
    family: ClassVar[str] = "python_stack"
    level: ClassVar[int] = 2
    requires: ClassVar[tuple[str, ...]] = ("torch",)
    uses: ClassVar[tuple[str, ...]] = ()

    def run(self, ctx: Context) -> Result:
        maps = ctx.results["torch"].data.get("maps", {})
        mapped = {str(k): [str(p) for p in v] for k, v in maps.items()} if isinstance(maps, dict) else {}
        m = ctx.manifest
        # nccl.lib_dir only: cuda.lib_dir (libnvrtc's directory) is the nvrtc check's to compare.
        want = {"libnccl": m.nccl.lib_dir} if m is not None else {}
        return libs_verdict(mapped, loader.ldconfig_cache(), want)


CHECKS = (AbiWheelsCheck, AbiLibsCheck)
