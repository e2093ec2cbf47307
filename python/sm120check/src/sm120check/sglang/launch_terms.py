"""The terms the verify-launch modules share: what a launch can expect, what a log line shows, the error for an input
that cannot be used, and safe printing of text a server or a log wrote (launch_cli.py maps the verify-launch modules).
"""

from __future__ import annotations

from enum import Enum

from sm120check.safetext import terminal_text

# SGLang resets max_running_requests to this for speculative decoding unless --max-running-requests is given
# (sglang/srt/arg_groups/speculative_hook.py, 0.5.16; see finding sglang-speculative-running-cap). Read by
# verify-launch's note and crossover's warning.
SPECULATIVE_RUNNING_DEFAULT = 48
RAISE_RUNNING_CAP = (
    "SGLang's default for speculative decoding when --max-running-requests is not given: set it (role variable "
    "sglang_server_max_running_requests) above the concurrency you serve"
)


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
    """One line safe to print and to keep as evidence (terminal escapes from a hostile log or server made inert):
    safetext.terminal_text, the tools' one escaping function."""
    return terminal_text(text, one_line=True)
