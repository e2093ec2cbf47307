"""PEP 440 versions, specifiers and PEP 508 requirements: the subset wheel metadata of the stack uses.

The core runs on the standard library alone (the `packaging` project may be absent on a control node), so this is a
small reader of what `Requires-Dist` lines hold: `torch==2.14.1`, `cuda-bindings<14,>=13.0.3`,
`nvidia-cuda-nvcc==13.2.86.*; ... and extra == 'nvcc'`, `triton~=3.9.0`. Markers other than `extra` are taken to
hold: the stack targets Linux nodes, and pip itself evaluates every marker in the resolution that decides.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

_VERSION = re.compile(
    r"v?(?:(?P<epoch>[0-9]+)!)?(?P<release>[0-9]+(?:\.[0-9]+)*)"
    r"(?:[-_.]?(?P<pre_l>a|b|c|rc|alpha|beta|pre|preview)[-_.]?(?P<pre_n>[0-9]+)?)?"
    r"(?:-(?P<post_n1>[0-9]+)|[-_.]?(?P<post_l>post|rev|r)[-_.]?(?P<post_n2>[0-9]+)?)?"
    r"(?:[-_.]?(?P<dev_l>dev)[-_.]?(?P<dev_n>[0-9]+)?)?"
    r"(?:\+(?P<local>[a-z0-9]+(?:[-_.][a-z0-9]+)*))?",
    re.IGNORECASE,
)
_PRE = {"a": "a", "alpha": "a", "b": "b", "beta": "b", "c": "rc", "rc": "rc", "pre": "rc", "preview": "rc"}
_REQUIREMENT = re.compile(
    r"\s*(?P<name>[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)\s*(?:\[(?P<extras>[^\]]*)\])?"
    r"\s*\(?(?P<spec>[^;()]*)\)?\s*(?:;\s*(?P<marker>.*))?"
)
_EXTRA = re.compile(r"""extra\s*==\s*['"]([^'"]+)['"]""")
_CLAUSE = re.compile(r"\s*(===|==|!=|~=|<=|>=|<|>)\s*([^\s,]+)\s*")


def canonical_name(name: str) -> str:
    """PEP 503: `Flashinfer_Python` and `flashinfer-python` are one project."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class Version:
    """One parsed version; `text` is what the metadata or the manifest wrote."""

    text: str
    epoch: int
    release: tuple[int, ...]
    pre: tuple[str, int] | None
    post: int | None
    dev: int | None
    local: str

    @property
    def public(self) -> str:
        return self.text.split("+", 1)[0]

    @property
    def is_prerelease(self) -> bool:
        return self.pre is not None or self.dev is not None

    def minor(self) -> tuple[int, int]:
        """(major, minor): "13.2.86" -> (13, 2)."""
        major, minor = (*self.release, 0)[:2]
        return major, minor

    def key(self) -> tuple[object, ...]:
        """PEP 440 ordering (local labels ignored: they only break ties, which no check here relies on)."""
        release = list(self.release)
        while len(release) > 1 and release[-1] == 0:
            release.pop()
        if self.pre is None and self.post is None and self.dev is not None:
            pre: tuple[object, ...] = (0,)  # 1.0.dev0 sorts before 1.0a1
        elif self.pre is None:
            pre = (3,)
        else:
            pre = (1, self.pre[0], self.pre[1])
        post: tuple[int, ...] = (0,) if self.post is None else (1, self.post)
        dev: tuple[int, ...] = (2,) if self.dev is None else (1, self.dev)
        return (self.epoch, tuple(release), pre, post, dev)


def parse(text: str) -> Version:
    """A PEP 440 version; ValueError naming `text` when it is not one."""
    match = _VERSION.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"{text!r} is not a PEP 440 version (such as 2.14.1, 0.5.24.dev0 or 2.14.1+cu130)")
    pre = None
    if match["pre_l"]:
        pre = (_PRE[match["pre_l"].lower()], int(match["pre_n"] or 0))
    post = match["post_n1"] or match["post_n2"]
    return Version(
        text=text.strip(),
        epoch=int(match["epoch"] or 0),
        release=tuple(int(p) for p in match["release"].split(".")),
        pre=pre,
        post=int(post) if post is not None else (0 if match["post_l"] else None),
        dev=(int(match["dev_n"] or 0) if match["dev_l"] else None),
        local=(match["local"] or "").lower(),
    )


def _prefix_match(version: Version, prefix: str) -> bool:
    """`==13.2.86.*`: the release starts with 13.2.86 (zero-padded, as PEP 440 compares)."""
    want = parse(prefix).release
    have = version.release + (0,) * max(0, len(want) - len(version.release))
    return have[: len(want)] == want


def _clause_holds(version: Version, op: str, text: str) -> bool:
    if op == "===":
        return version.text == text
    if text.endswith(".*"):
        matched = _prefix_match(version, text[:-2])
        return matched if op == "==" else not matched
    other = parse(text)
    if op in ("==", "!="):
        # A specifier without a local label matches any local build of that public version.
        same = version.key() == other.key() and (not other.local or version.local == other.local)
        return same if op == "==" else not same
    if op == "~=":
        upper = other.release[:-1]
        return version.key() >= other.key() and _prefix_match(version, ".".join(map(str, upper)))
    have, want = version.key(), other.key()
    return {"<=": have <= want, ">=": have >= want, "<": have < want, ">": have > want}[op]


@dataclass(frozen=True)
class Specifier:
    """A comma-separated specifier set such as `<14,>=13.0.3` (empty: any version)."""

    text: str

    def clauses(self) -> list[tuple[str, str]]:
        out = []
        for part in (p for p in self.text.split(",") if p.strip()):
            match = _CLAUSE.fullmatch(part)
            if match is None:
                raise ValueError(f"{part.strip()!r} is not a version specifier (such as ==2.14.1 or >=13.0.3)")
            out.append((match[1], match[2]))
        return out

    def contains(self, version: str | Version) -> bool:
        parsed = parse(version) if isinstance(version, str) else version
        return all(_clause_holds(parsed, op, text) for op, text in self.clauses())

    def exact(self) -> str | None:
        """The one version `==X` (or `==X.*`) names, else None: what a pin must move to when this requirement rules."""
        clauses = self.clauses()
        if len(clauses) == 1 and clauses[0][0] in ("==", "==="):
            return clauses[0][1].removesuffix(".*")
        return None


@dataclass(frozen=True)
class Requirement:
    """One `Requires-Dist` line."""

    text: str
    name: str  # canonical
    extras: tuple[str, ...]
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
    match = _REQUIREMENT.fullmatch(text)
    if match is None:
        raise ValueError(f"{text!r} is not a PEP 508 requirement")
    extras = tuple(e.strip() for e in (match["extras"] or "").split(",") if e.strip())
    spec = Specifier(match["spec"].strip())
    for op, version in spec.clauses():  # raises on a specifier this reader does not know
        if op != "===":  # arbitrary equality compares text; every other clause names a PEP 440 version
            parse(version.removesuffix(".*"))
    return Requirement(text, canonical_name(match["name"]), extras, spec, (match["marker"] or "").strip())
