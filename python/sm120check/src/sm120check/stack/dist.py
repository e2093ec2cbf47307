"""Project names, versions and `Requires-Dist` lines of the stack's wheels, read with `packaging` (pip's reader).

`sm120check stack` runs on the control node, whose Python has `packaging` (ansible-core requires it). Nodes may lack it
(the role installs sm120check with --no-deps): `packaging` is imported inside the functions that read versions, so
importing this module (the CLI's parser does) never needs it; the doctor's reader is `sm120check.versions`.
Markers other than `extra` are taken to hold: the stack targets Linux nodes whatever the control node is, and pip
itself evaluates every marker in the resolution that decides.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

NEEDS_PACKAGING = "sm120check stack needs the `packaging` module (pip install packaging; ansible-core brings it)"

_EXTRA = re.compile(r"""extra\s*==\s*['"]([^'"]+)['"]""")
# What a line writes between the project (and its extras) and its marker: the specifier as its author wrote it.
_WRITTEN = re.compile(r"\s*[^\s\[(<>=!~;@]+\s*(?:\[[^\]]*\])?\s*\(?(?P<spec>[^;()]*)\)?")


def canonical_name(name: str) -> str:
    """PEP 503: `Flashinfer_Python` and `flashinfer-python` are one project (packaging's canonicalize_name rule)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def version(text: str) -> Version:
    """A PEP 440 version; ValueError naming `text` and the form to write when it is not one."""
    from packaging.version import InvalidVersion, Version

    try:
        return Version(text.strip())
    except InvalidVersion:
        raise ValueError(f"{text!r} is not a PEP 440 version (such as 2.14.1, 0.5.24.dev0 or 2.14.1+cu130)") from None


def minor(text: str) -> tuple[int, int]:
    """(major, minor): "13.2.86" -> (13, 2)."""
    major, minor = (*version(text).release, 0)[:2]
    return major, minor


def public(text: str) -> str:
    """The version as written, without its local label: "0.6.1+cu130" -> "0.6.1"."""
    version(text)
    return text.strip().split("+", 1)[0]


@dataclass(frozen=True)
class Specifier:
    """A specifier set such as `<14,>=13.0.3` (empty: any version); `text` is as the metadata wrote it."""

    text: str
    parsed: SpecifierSet

    def contains(self, value: str) -> bool:
        """Whether `value` is in the set, pre-releases included (a pin is what it is: pip was told to install it)."""
        return self.parsed.contains(version(value), prereleases=True)

    def exact(self) -> str | None:
        """The one version `==X` (or `==X.*`) names, else None: what a pin must move to when this requirement rules."""
        clauses = list(self.parsed)
        if len(clauses) == 1 and clauses[0].operator in ("==", "==="):
            return clauses[0].version.removesuffix(".*")
        return None


@dataclass(frozen=True)
class Requirement:
    """One `Requires-Dist` line."""

    text: str
    name: str  # canonical
    specifier: Specifier
    marker: str

    def applies(self, extras: Iterable[str] = ()) -> bool:
        """Whether the line is a requirement of the wheel installed with `extras` (other markers are taken to hold)."""
        wanted = _EXTRA.findall(self.marker)
        return not wanted or any(canonical_name(e) in {canonical_name(x) for x in extras} for e in wanted)

    def short(self) -> str:
        """The requirement without its marker: `cuda-toolkit[cublas,...]==13.2.2`."""
        return self.text.split(";", 1)[0].strip()


def requirement(text: str) -> Requirement:
    """A PEP 508 line with a version specifier; ValueError for anything else (a URL requirement: pip judges it)."""
    from packaging.requirements import InvalidRequirement
    from packaging.requirements import Requirement as _Requirement

    try:
        parsed = _Requirement(text)
    except InvalidRequirement as exc:
        reason = str(exc).splitlines()[0]
        raise ValueError(f"{text!r} is not a PEP 508 requirement (such as torch==2.14.1): {reason}") from None
    if parsed.url:
        raise ValueError(f"{text!r} names a URL, not a version: pip's resolution judges it")
    written = _WRITTEN.match(text.split(";", 1)[0])
    spec = written["spec"].strip() if written else str(parsed.specifier)
    marker = str(parsed.marker) if parsed.marker else ""
    return Requirement(text, canonical_name(parsed.name), Specifier(spec, parsed.specifier), marker)
