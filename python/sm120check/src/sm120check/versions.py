"""Version strings as the stack prints them ("580.159.04", "13.0.88", "2.11.0+cu130", "0.6.17.post1", "v0.7.0rc1").

The one parser of release numbers: every caller that compares versions goes through `parse` (bad input is a
ValueError naming the text) or `parse_or_none` (bad or missing input is None).
"""

from __future__ import annotations

import re

# Leading blanks and a "v", then dotted numbers; what follows (rc1, .post1, +cu130, a space) is not the release.
_RELEASE = re.compile(r"\s*[vV]?(\d+(?:\.\d+)*)")


def parse(text: str) -> tuple[int, ...]:
    """The release numbers `text` starts with: "2.11.0+cu130" -> (2, 11, 0); raise ValueError if it has none."""
    match = _RELEASE.match(text)
    if match is None:
        raise ValueError(f"{text!r} is not a version (expected dotted numbers such as 13.0.88)")
    return tuple(int(part) for part in match.group(1).split("."))


def parse_or_none(text: str | None) -> tuple[int, ...] | None:
    """`parse`, with None for a missing or unparseable version (a value that is only reported, never required)."""
    try:
        return parse(text) if text is not None else None
    except ValueError:
        return None


def triple(text: str) -> tuple[int, int, int] | None:
    """Exactly MAJOR.MINOR.PATCH, then nothing or a "-build" / "+local" part, as the NCCL packages print it
    ("2.30.7", "2.30.7-1+cuda13.0" -> (2, 30, 7)); None otherwise (a "v", a pre-release, a fourth number)."""
    match = _RELEASE.match(text)
    if match is None or not text.lstrip()[:1].isdigit():
        return None
    numbers = match.group(1).split(".")
    rest = text[match.end() :]
    if len(numbers) != 3 or not (rest[:1] in ("-", "+") or not rest.strip()):
        return None
    major, minor, patch = (int(n) for n in numbers)
    return major, minor, patch


def at_least(version: str, minimum: str) -> bool:
    """True when `version` >= `minimum`, comparing numerically and padding the shorter with zeros."""
    have, want = parse(version), parse(minimum)
    width = max(len(have), len(want))
    return have + (0,) * (width - len(have)) >= want + (0,) * (width - len(want))


def same_release(version: str, other: str, parts: int = 2) -> bool:
    """True when the first `parts` numbers agree: same_release("13.0.88", "13.0") is True."""
    return parse(version)[:parts] == parse(other)[:parts]


def local_label(version: str) -> str:
    """The PEP 440 local label: "2.11.0+cu130" -> "cu130", "" when there is none."""
    return version.split("+", 1)[1] if "+" in version else ""
