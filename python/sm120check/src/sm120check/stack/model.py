"""The typed data the stack modules pass: the manifest's pins, the node's target, pip's sources, and verdicts."""

from __future__ import annotations

import enum
import hashlib
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

from sm120check import versions
from sm120check.stack.dist import canonical_name

NCCL_WHEEL = "nvidia-nccl-cu13"
CUDA_TOOLKIT_WHEEL = "cuda-toolkit"
# FlashInfer's companion wheels: each release ships them at flashinfer-python's own version.
FLASHINFER = "flashinfer-python"
FLASHINFER_COMPANIONS = ("flashinfer-cubin", "flashinfer-jit-cache")
# Where each manifest value is set (messages name it, so a user knows which line to change).
WHERE = "inventory/group_vars/all/stack.yml or your inventory"
# The oldest glibc of the supported operating systems (Ubuntu 22.04 has 2.35, Debian 12 2.36, Ubuntu 24.04 2.39).
DEFAULT_GLIBC = "2.35"


def glibc(text: str) -> str:
    """A glibc version as the node reports it (2.35): 2.17 (manylinux2014's) to 2.99; ValueError naming `text`."""
    major, dot, minor = text.strip().partition(".")
    if not (dot and major == "2" and minor.isascii() and minor.isdigit() and 17 <= int(minor[:3]) <= 99):
        raise ValueError(f"glibc {text!r} is not a glibc version from 2.17 to 2.99 (`getconf GNU_LIBC_VERSION`: 2.35)")
    return f"2.{int(minor)}"


@dataclass(frozen=True)
class Target:
    """The node's interpreter and platform: what pip resolves for (`--python-version`, `--platform`)."""

    python: str  # "3.12"
    arch: str  # "x86_64" or "aarch64"
    glibc: str = DEFAULT_GLIBC

    def platforms(self) -> tuple[str, ...]:
        """Every manylinux tag a wheel for this node may carry, newest first (pip expands only its own platform)."""
        major, minor = versions.parse(self.glibc)[:2]
        tags = [f"manylinux_{major}_{m}_{self.arch}" for m in range(minor, 16, -1)]
        return (*tags, f"manylinux2014_{self.arch}", f"linux_{self.arch}")

    def describe(self) -> str:
        return f"Python {self.python} on {self.arch} (glibc {self.glibc})"


@dataclass(frozen=True)
class Sources:
    """Where pip finds wheels: the manifest's indexes (empty: pip's own configuration) or a wheelhouse directory on
    this machine (then `--no-index`, as the node installs)."""

    index_url: str = ""
    extra_index_urls: tuple[str, ...] = ()
    wheelhouse: str = ""

    def pip_args(self) -> list[str]:
        if self.wheelhouse:
            return [
                "--no-index",
                "--find-links",
                f"{self.wheelhouse}/python",
                "--find-links",
                f"{self.wheelhouse}/toolkit",
            ]
        args = ["--index-url", self.index_url] if self.index_url else []
        for url in self.extra_index_urls:
            args += ["--extra-index-url", url]
        return args

    def describe(self) -> str:
        if self.wheelhouse:
            return f"the wheelhouse {self.wheelhouse}"
        if self.index_url or self.extra_index_urls:
            return "the indexes " + ", ".join(_redact(u) for u in (self.index_url, *self.extra_index_urls) if u)
        return "pip's configured indexes on this machine (`pip config list`)"


def _redact(url: str) -> str:
    head, sep, rest = url.partition("://")
    if sep and "@" in rest.split("/", 1)[0]:
        return f"{head}://***@{rest.split('@', 1)[1]}"
    return url


@dataclass(frozen=True)
class Stack:
    """The manifest's versions that the wheels' requirements are held against."""

    profile: str
    python_packages: Mapping[str, str]  # the profile's pins and sm120kit_extra_python_packages
    cuda_version: str  # sm120kit_cuda_version
    cuda_components: Mapping[str, str]  # sm120kit_cuda_components
    nccl_version: str  # sm120kit_nccl_version
    cuda_apt_version: str = ""  # sm120kit_cuda_apt_version
    extra_names: frozenset[str] = field(default_factory=frozenset)  # pins that come from sm120kit_extra_python_packages

    def pins(self) -> dict[str, str]:
        """Canonical name -> version of every wheel pip installs into the stack venv (NCCL beside the profile)."""
        out = {NCCL_WHEEL: self.nccl_version}
        out.update({canonical_name(n): str(v) for n, v in self.python_packages.items()})
        return out

    def requirements(self) -> list[str]:
        return [f"{name}=={version}" for name, version in sorted(self.pins().items())]

    def where(self, name: str) -> str:
        """The variable that sets `name`'s version."""
        name = canonical_name(name)
        if name == NCCL_WHEEL:
            return "sm120kit_nccl_version"
        if name == CUDA_TOOLKIT_WHEEL:
            return "sm120kit_cuda_version"
        if name in {canonical_name(c) for c in self.cuda_components}:
            return f"sm120kit_cuda_components['{name}']"
        original = next((n for n in self.python_packages if canonical_name(n) == name), name)
        if original in self.extra_names:
            return f"sm120kit_extra_python_packages['{original}']"
        return f"sm120kit_profiles.{self.profile}.python_packages['{original}']"

    def as_json(self) -> dict[str, object]:
        return {
            "profile": self.profile,
            "python_packages": dict(sorted(self.python_packages.items())),
            "cuda_version": self.cuda_version,
            "cuda_components": dict(sorted(self.cuda_components.items())),
            "nccl_version": self.nccl_version,
            "cuda_apt_version": self.cuda_apt_version,
            "extra_names": sorted(self.extra_names),
        }


def digest(stack: Stack, target: Target, sources: Sources) -> str:
    """The manifest hash a resolution is cached under: every input that can change pip's answer."""
    document = {"stack": stack.as_json(), "target": asdict(target), "sources": asdict(sources), "v": RESOLVER_VERSION}
    return hashlib.sha256(json.dumps(document, sort_keys=True).encode()).hexdigest()[:32]


RESOLVER_VERSION = 1  # bumped when the rules change, so an old cached verdict is not reused


@dataclass(frozen=True)
class WheelMetadata:
    """What a wheel says about itself (its METADATA, as pip's report gives it)."""

    name: str  # canonical
    version: str
    requires: tuple[str, ...]  # Requires-Dist lines
    requires_python: str = ""


class Status(enum.Enum):
    OK = "ok"  # pip resolved the pins and every requirement holds against the manifest
    CONFLICT = "conflict"  # pip refused, or a wheel's requirement contradicts another pin: refused before changes
    SKIPPED = "skipped"  # nothing to resolve against (offline, no pip, a timeout): said, not judged


@dataclass(frozen=True)
class Problem:
    """One contradiction between a wheel's requirement and the manifest, with the fix."""

    wheel: str  # "torch 2.15.0": who requires
    requirement: str  # "cuda-toolkit==13.2.2"
    variable: str  # "sm120kit_cuda_version": the pin it contradicts
    pinned: str  # "13.0.1"
    why: str
    fix: str

    def message(self) -> str:
        head = f"{self.wheel} requires {self.requirement}, but {self.variable} is {self.pinned}"
        return f"{head}: {self.why}. Fix: {self.fix}"


@dataclass(frozen=True)
class Resolution:
    """The verdict on one manifest for one target and sources."""

    status: Status
    digest: str
    target: str  # Target.describe()
    sources: str  # Sources.describe()
    problems: tuple[Problem, ...] = ()
    pip_words: str = ""  # pip's own conflict message, verbatim
    resolved: Mapping[str, str] = field(default_factory=dict)  # canonical name -> version pip would install
    reason: str = ""  # why a resolution was skipped
    cached: bool = False  # read from the cache: pip did not run

    def to_json(self) -> dict[str, object]:
        return {
            "status": self.status.value,
            "digest": self.digest,
            "target": self.target,
            "sources": self.sources,
            "problems": [asdict(p) for p in self.problems],
            "pip_words": self.pip_words,
            "resolved": dict(sorted(self.resolved.items())),
            "reason": self.reason,
            "cached": self.cached,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> Resolution:
        problems = data.get("problems")
        resolved = data.get("resolved")
        return cls(
            status=Status(str(data["status"])),
            digest=str(data["digest"]),
            target=str(data.get("target", "")),
            sources=str(data.get("sources", "")),
            problems=tuple(
                Problem(**{k: str(v) for k, v in p.items()}) for p in (problems if isinstance(problems, list) else [])
            ),
            pip_words=str(data.get("pip_words", "")),
            resolved={str(k): str(v) for k, v in (resolved.items() if isinstance(resolved, dict) else [])},
            reason=str(data.get("reason", "")),
            cached=bool(data.get("cached", False)),
        )
