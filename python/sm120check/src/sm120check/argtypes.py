"""argparse types for every numeric option: finite, in a stated range, ASCII digits only.

`float("nan")` and `float("inf")` parse, and NaN compares false with everything, so a bare `value <= 0` test lets it
through (a NaN level timeout ended every level at once and the bench exited 0); `"²".isdigit()` is true but
`int("²")` fails. Each option names its range once, here, and the error names the value and what to give instead.
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable

_WHOLE = re.compile(r"[+-]?[0-9]+")


def _bound(low: float, high: float, low_open: bool, high_open: bool, unit: str) -> str:
    unit = f" {unit}" if unit else ""
    lower = f"more than {low:g}" if low_open else f"at least {low:g}"
    upper = f"less than {high:g}" if high_open else f"at most {high:g}"
    return f"a number{unit} {lower} and {upper}"


def real(
    low: float,
    high: float,
    *,
    unit: str = "",
    low_open: bool = False,
    high_open: bool = False,
    hint: str = "",
    inf_means: str = "",
) -> Callable[[str], float]:
    """A parser for a finite float in [low, high] (open ends with low_open / high_open); `inf_means` names what
    `inf` does where infinity is a documented value (a rate of inf: all at once)."""
    wanted = _bound(low, high, low_open, high_open, unit)
    wanted += f", or inf ({inf_means})" if inf_means else ""
    wanted += f" ({hint})" if hint else ""

    def parse(text: str) -> float:
        try:
            if not text.isascii():
                raise ValueError(text)
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number; give {wanted}") from None
        if inf_means and value == math.inf:
            return value
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number; give {wanted}")
        if value < low or value > high or (low_open and value == low) or (high_open and value == high):
            raise argparse.ArgumentTypeError(f"{text!r} is out of range; give {wanted}")
        return value

    parse.__name__ = "number"
    return parse


def whole(low: int, high: int, *, unit: str = "", hint: str = "") -> Callable[[str], int]:
    """A parser for an integer in [low, high], written in ASCII digits."""
    unit = f" {unit}" if unit else ""
    wanted = f"a whole number{unit} from {low} to {high}" + (f" ({hint})" if hint else "")

    def parse(text: str) -> int:
        if not _WHOLE.fullmatch(text.strip()):
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number; give {wanted}")
        value = int(text)
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{text!r} is out of range; give {wanted}")
        return value

    parse.__name__ = "whole number"
    return parse


DAY_S = 86400.0
seconds = real(0, DAY_S, unit="of seconds", low_open=True)  # a timeout or a window: finite, above 0, a day at most
