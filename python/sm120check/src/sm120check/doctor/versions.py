"""Version strings as the stack prints them ("580.159.04", "13.0.88", "2.11.0+cu130", "2.28.9")."""

from __future__ import annotations

import re

_NUMBERS = re.compile(r"\d+(?:\.\d+)*")


def parse(version: str) -> tuple[int, ...]:
    """The leading dotted numbers of `version`: "2.11.0+cu130" -> (2, 11, 0); raise ValueError if none."""
    match = _NUMBERS.search(version.strip())
    if match is None:
        raise ValueError(f"{version!r} is not a version (expected dotted numbers such as 13.0.88)")
    return tuple(int(part) for part in match.group(0).split("."))


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
