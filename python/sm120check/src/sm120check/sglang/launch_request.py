"""What a launch asked for: the expectations from --expect or from the SGLang launch command line."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from sm120check.sglang.launch_terms import Expectation, LaunchError


@dataclass(frozen=True)
class LaunchRequest:
    expected: tuple[Expectation, ...]
    origin: str  # "--expect", "--launch-command FILE", "server_info launch_command"
    speculative_algorithm: str | None = None
    fusion_backend: str | None = None  # the value given, "legacy flag" for --enable-flashinfer-allreduce-fusion
    max_running_requests: str | None = None  # --max-running-requests as given (None: SGLang's choice)


def parse_expect(text: str) -> tuple[Expectation, ...]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    known = {e.value: e for e in Expectation}
    bad = [n for n in names if n not in known]
    if bad or not names:
        raise LaunchError(
            f"--expect {text!r}: unknown expectation {', '.join(map(repr, bad)) or '(empty)'}; "
            f"choose from {','.join(known)}"
        )
    return tuple(dict.fromkeys(known[n] for n in names))


def _options(argv: Sequence[str]) -> dict[str, str]:
    """`--name value` / `--name=value` / `--flag` -> {name: value or ""}; the last occurrence wins."""
    found: dict[str, str] = {}
    for i, token in enumerate(argv):
        if not token.startswith("--"):
            continue
        name, eq, value = token.partition("=")
        if not eq:
            following = argv[i + 1] if i + 1 < len(argv) else ""
            value = "" if following.startswith("--") else following
        found[name] = value
    return found


def request_from_argv(argv: Sequence[str], origin: str) -> LaunchRequest:
    """What an SGLang launch command line asks for."""
    if not any("sglang" in token for token in argv[:4]):
        raise LaunchError(f"{origin}: {shlex.join(argv[:4])!r}... does not launch SGLang")
    opts = _options(argv)
    algorithm = opts.get("--speculative-algorithm") or None
    if algorithm is not None and algorithm.lower() == "none":
        algorithm = None
    backend = opts.get("--flashinfer-allreduce-fusion-backend") or None
    if backend is None and "--enable-flashinfer-allreduce-fusion" in opts:
        backend = "legacy flag"
    if "--enforce-disable-flashinfer-allreduce-fusion" in opts:
        backend = None
    graphs_off = (
        "--disable-cuda-graph" in opts
        or "--disable-decode-cuda-graph" in opts
        or opts.get("--cuda-graph-backend-decode") == "disabled"
    )
    expected = [Expectation.CUDA_GRAPH] if not graphs_off else []
    if algorithm:
        expected.append(Expectation.SPECULATIVE)
        if "--speculative-adaptive" in opts:
            expected.append(Expectation.ADAPTIVE)
    if backend:
        expected.append(Expectation.FUSION)
    if "--enable-torch-symm-mem" in opts:
        expected.append(Expectation.SYMM_MEM)
    return LaunchRequest(tuple(expected), origin, algorithm, backend, opts.get("--max-running-requests") or None)


def request_from_command(text: str, origin: str) -> LaunchRequest:
    """The launch-command.txt the sglang_server role writes: one shell-quoted command line."""
    try:
        argv = shlex.split(text.replace("\\\n", " "), comments=True)
    except ValueError as exc:
        raise LaunchError(f"{origin}: not a shell command line ({exc})") from None
    if not argv:
        raise LaunchError(f"{origin}: empty: no launch command in it")
    return request_from_argv(argv, origin)
