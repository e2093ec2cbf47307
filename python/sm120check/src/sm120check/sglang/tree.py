"""Where the SGLang source is, which release it is, and the facts about this node a scan needs."""

from __future__ import annotations

import ast
import functools
import importlib.metadata
import importlib.util
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from sm120check import bounded, versions
from sm120check.sglang.errors import SglangError

# FlashInfer builds its trtllm allreduce-fusion kernels for major 12 from this release on.
FLASHINFER_MIN_FOR_SM120 = (0, 6, 17)
DEFAULT_CC = "12.0"
MAX_SOURCE_BYTES = 64 << 20  # SGLang's largest module is under 1 MiB


@dataclass(frozen=True)
class ComputeCapability:
    major: int
    minor: int
    origin: str  # "--cc", "nvidia-smi" or "default (no GPU found)"

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}"


def parse_cc(text: str, origin: str = "--cc") -> ComputeCapability:
    match = re.fullmatch(r"\s*(\d+)(?:\.(\d+))?\s*", text)
    if not match:
        raise SglangError(f"compute capability {text!r} is not MAJOR.MINOR; pass for example --cc 12.0")
    major, minor = int(match.group(1)), int(match.group(2) or 0)
    if major < 9:
        raise SglangError(
            f"compute capability {major}.{minor}: SGLang's symmetric-memory all-reduce needs 9.0 or later; "
            "pass the major of the GPUs you serve on, for example --cc 12.0"
        )
    return ComputeCapability(major, minor, origin)


def local_cc() -> ComputeCapability:
    """The compute capability of this node's first GPU (nvidia-smi), or 12.0 when there is none."""
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            proc = subprocess.run(
                [smi, "--query-gpu=compute_cap", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=20,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired):
            proc = None
        if proc is not None and proc.returncode == 0 and proc.stdout.strip():
            return parse_cc(proc.stdout.split()[0], "nvidia-smi")
    return parse_cc(DEFAULT_CC, "default (no GPU found)")


def parse_flashinfer_version(text: str) -> tuple[int, ...]:
    """`versions.parse` for a FlashInfer version the scan needs: "0.6.17.post1" -> (0, 6, 17), else SglangError."""
    try:
        return versions.parse(text)
    except ValueError as exc:
        raise SglangError(f"FlashInfer version: {exc}; pass for example --flashinfer-version 0.7.2") from None


def _metadata_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def flashinfer_version(sglang_root: Path | None = None) -> tuple[str | None, str]:
    """FlashInfer's version and where it was read: a dist-info beside the tree, else this environment."""
    if sglang_root is not None:
        for pattern in ("flashinfer_python-*.dist-info", "flashinfer-*.dist-info"):
            for info in sorted(sglang_root.parent.glob(pattern)):
                return info.name.split("-")[1].removesuffix(".dist-info"), str(info)
    for dist in ("flashinfer-python", "flashinfer"):
        version = _metadata_version(dist)
        if version:
            return version, f"importlib.metadata ({dist})"
    return None, "not installed"


def find_installed() -> Path | None:
    """The installed `sglang` package directory, found without importing it."""
    spec = importlib.util.find_spec("sglang")
    # A namespace package (a stray `sglang/` directory on sys.path) is not SGLang: it has no __init__.py.
    if spec is None or not spec.origin or not spec.origin.endswith("__init__.py"):
        return None
    return Path(spec.origin).parent


def resolve_source(directory: str) -> Path:
    """Accept the `sglang` package itself, a directory holding it (site-packages, python/), or a checkout."""
    base = Path(directory).expanduser()
    for candidate in (base, base / "sglang", base / "python" / "sglang"):
        if (candidate / "srt").is_dir() and (candidate / "__init__.py").is_file():
            return candidate.resolve()
    raise SglangError(
        f"--source {directory}: no SGLang package there (looked for srt/ in {base}, {base}/sglang and "
        f"{base}/python/sglang); pass the site-packages/sglang directory or an SGLang checkout"
    )


def _assigned_version(path: Path) -> str | None:
    try:
        tree = ast.parse(bounded.read_text(path, 1 << 20))
    except (bounded.Unreadable, SyntaxError, ValueError):
        return None
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
            and any(isinstance(t, ast.Name) and t.id == "__version__" for t in node.targets)
        ):
            return node.value.value
    return None


@dataclass(frozen=True)
class SourceTree:
    """One SGLang package directory; paths below are relative to it ("srt/models/llama.py")."""

    root: Path
    _cache: dict[str, ast.Module] = field(default_factory=dict, compare=False, repr=False)

    @functools.cached_property
    def version(self) -> str:
        for name in ("_version.py", "version.py"):
            found = _assigned_version(self.root / name)
            if found:
                return found
        for info in sorted(self.root.parent.glob("sglang-*.dist-info")):
            return info.name.split("-")[1].removesuffix(".dist-info")
        return "unknown"

    def exists(self, rel: str) -> bool:
        return (self.root / rel).is_file()

    def read(self, rel: str) -> str:
        path = self.root / rel
        try:
            return bounded.decode(bounded.read_bytes(path, MAX_SOURCE_BYTES), path)  # a BOM is not Python source
        except bounded.Unreadable as exc:
            raise SglangError(f"{exc}; reinstall SGLang or restore the file") from exc

    def parse(self, rel: str) -> ast.Module:
        if rel not in self._cache:
            try:
                self._cache[rel] = ast.parse(self.read(rel), filename=rel)
            except SyntaxError as exc:
                raise SglangError(f"{self.root / rel}: not valid Python ({exc.msg}, line {exc.lineno})") from exc
        return self._cache[rel]

    def files(self, under: str, pattern: str = "*.py") -> list[str]:
        return sorted(str(p.relative_to(self.root)) for p in (self.root / under).rglob(pattern) if p.is_file())

    def module_path(self, dotted: str) -> str | None:
        """ "sglang.srt.models.llama" -> "srt/models/llama.py" when it is in this tree."""
        parts = dotted.split(".")
        if parts[0] != "sglang":
            return None
        rel = "/".join(parts[1:])
        for candidate in (f"{rel}.py", f"{rel}/__init__.py"):
            if rel and self.exists(candidate):
                return candidate
        return None
