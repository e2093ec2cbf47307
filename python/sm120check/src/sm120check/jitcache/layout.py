"""Where FlashInfer keeps a JIT module: the one cache-path formula and the one JIT-target rule.

FlashInfer 0.7.2 (flashinfer/jit/env.py, flashinfer/compilation_context.py): the cache root is
$FLASHINFER_WORKSPACE_BASE (default: the process's home)/.cache/flashinfer; a module lives in
<root>/<version>/<arch dir>/cached_ops/<module>/<module>.so, where <arch dir> joins the sorted JIT targets ("90a",
"120f", "90a_120f"). The targets come from FLASHINFER_CUDA_ARCH_LIST (space separated; a suffix given is kept) or
else from every visible GPU: 9.x gets "a", 12.0 gets "f" on CUDA >= 12.9 ("a" before), other majors >= 10 get "a".

The doctor, the jitcache CLI (and so the flashinfer_jit role) and the serving process must agree on this path; all
of them take it from here. Nothing here imports FlashInfer.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath

ARCH_LIST_ENV = "FLASHINFER_CUDA_ARCH_LIST"
WORKSPACE_ENV = "FLASHINFER_WORKSPACE_BASE"
CACHED_OPS = "cached_ops"


def cache_root(env: Mapping[str, str] | None = None, home: Path | None = None) -> Path:
    """FlashInfer's cache root for a process with this environment.

    An empty FLASHINFER_WORKSPACE_BASE counts as unset here (FlashInfer itself would use the working directory).
    """
    env = os.environ if env is None else env
    base = env.get(WORKSPACE_ENV) or str(home or Path.home())
    return Path(base) / ".cache" / "flashinfer"


def _normalize(major: int, minor: int, cuda: tuple[int, int]) -> str:
    if major == 9:
        return f"{major}{minor}a"
    if major == 12:
        if minor == 0:
            return "120f" if cuda >= (12, 9) else "120a"
        return f"12{minor}a"
    if major >= 10:
        return f"{major}{minor}a"
    return f"{major}{minor}"


def jit_targets(
    capabilities: Sequence[str], arch_list: str | None = None, cuda: tuple[int, int] = (13, 0)
) -> tuple[str, ...]:
    """The JIT targets FlashInfer derives, sorted as it sorts them (by major, then minor string)."""
    pairs: set[tuple[int, str]] = set()
    entries = arch_list.split() if arch_list else list(capabilities)
    for entry in entries:
        try:
            major_text, minor_text = entry.split(".", 1)
            major = int(major_text)
        except ValueError:
            raise ValueError(
                f"JIT target {entry!r} is not of the form MAJOR.MINOR[suffix] (e.g. 12.0f); fix {ARCH_LIST_ENV}"
            ) from None
        if minor_text and minor_text[-1].isalpha():
            pairs.add((major, minor_text))
        else:
            pairs.add((major, _normalize(major, int(minor_text), cuda)[len(str(major)) :]))
    return tuple(f"{major}{minor}" for major, minor in sorted(pairs))


def target_majors(targets: Sequence[str]) -> tuple[int, ...]:
    """Compute-capability majors of JIT targets ("90a", "120f" -> 9, 12), sorted, without repeats."""
    majors = set()
    for target in targets:
        digits = target.rstrip("abcdefghijklmnopqrstuvwxyz")
        if len(digits) < 2 or not digits.isdigit():
            raise ValueError(f"JIT target {target!r} is not of the form <major><minor>[suffix] (e.g. 120f)")
        majors.add(int(digits[:-1]))
    return tuple(sorted(majors))


def arch_dir(targets: Sequence[str]) -> str:
    """The directory name FlashInfer gives a set of targets: sorted ones joined by "_"."""
    return "_".join(targets)


def workspace_dir(root: Path, version: str, arch: str) -> Path:
    return root / version / arch


def module_relpath(version: str, arch: str, module: str) -> PurePosixPath:
    """A module's directory relative to the cache root: <version>/<arch>/cached_ops/<module>."""
    return PurePosixPath(version, arch, CACHED_OPS, module)


def module_dir(root: Path, version: str, arch: str, module: str) -> Path:
    return workspace_dir(root, version, arch) / CACHED_OPS / module


def module_library(root: Path, version: str, arch: str, module: str) -> Path:
    return module_dir(root, version, arch, module) / f"{module}.so"


def aot_library(aot_dir: Path, module: str) -> Path:
    """A prebuilt (AOT) module in a FlashInfer package's data/aot directory, loaded without ninja."""
    return aot_dir / module / f"{module}.so"
