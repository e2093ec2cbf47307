"""The terms the verify-launch modules share: what a launch can expect, what a log line shows, the error for an input
that cannot be used, and safe printing of text a server or a log wrote (launch_cli.py maps the verify-launch modules).
"""

from __future__ import annotations

from enum import Enum


class Expectation(str, Enum):
    FUSION = "fusion"
    SYMM_MEM = "symm-mem"
    SPECULATIVE = "speculative"
    ADAPTIVE = "adaptive"
    CUDA_GRAPH = "cuda-graph"


class Sign(str, Enum):
    DEGRADED = "degraded"  # the feature is off or broken
    CONFIRMED = "confirmed"  # the feature ran
    NOTED = "noted"  # consistent with the request, proves nothing alone (a flag the server accepted)
    START = "start"  # the server (re)started here: earlier lines belong to an earlier run
    READY = "ready"  # the server finished its startup (every startup line is before this one)


class LaunchError(ValueError):
    """An input (launch command, server_info, expectation list) that cannot be used; the message names it."""


def printable(text: str) -> str:
    """Text safe to print: control characters (terminal escapes from a hostile log) shown as escapes."""
    return "".join(c if c.isprintable() or c == "\t" else f"\\x{ord(c):02x}" for c in text)
