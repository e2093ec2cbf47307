"""pip's own resolver, run as a program: `pip install --dry-run --report` for the node's Python and platform.

Nothing is installed: `--dry-run` with `--target` (pip wants one for `--platform`) into an empty temporary directory,
`--ignore-installed` so this machine's packages play no part, `--only-binary=:all:` as the node installs wheels only.
Every run is bounded (`timeout`); `--retries 2` keeps an unreachable index short and makes pip say so (with no
retry it fails silently, as if the wheel did not exist). This machine's pip constraint files are not applied
(`PIP_CONSTRAINT=/dev/null`): they constrain its own environments, not the node's stack venv; its indexes,
find-links and certificates are.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sm120check.stack.model import Sources, Target, WheelMetadata
from sm120check.stack.pep440 import canonical_name

DEFAULT_TIMEOUT = 600.0
# pip's words when it could not reach an index: retries after a broken connection, a fetch that failed.
_UNREACHABLE = re.compile(
    r"after connection broken by|Could not fetch URL|Failed to establish a new connection|"
    r"Temporary failure in name resolution|Name or service not known|Network is unreachable|ProxyError|"
    r"ConnectTimeoutError|Read timed out"
)


class PipUnavailable(Exception):
    """pip could not give an answer (none installed, unreachable index, timeout): the message says why."""


@dataclass(frozen=True)
class PipRun:
    """One pip run: its report (None when pip refused) and its words."""

    ok: bool
    wheels: tuple[WheelMetadata, ...]
    words: str  # stderr and stdout, warnings about ignored find-links locations removed
    seconds: float


def _command(
    requirements: Sequence[str], target: Target, sources: Sources, *, deps: bool, report: Path, where: Path
) -> list[str]:
    cmd = [
        sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--disable-pip-version-check",
        "--no-input", "--progress-bar", "off", "--retries", "2", "--report", str(report), "--target", str(where),
        "--only-binary=:all:", "--implementation", "cp", "--python-version", target.python,
    ]  # fmt: skip
    for platform in target.platforms():
        cmd += ["--platform", platform]
    if not deps:
        cmd.append("--no-deps")
    return [*cmd, *sources.pip_args(), *requirements]


def _environment() -> dict[str, str]:
    env = dict(os.environ)
    env["PIP_CONSTRAINT"] = os.devnull  # an empty constraints file in place of this machine's
    env.pop("PIP_REQUIREMENT", None)
    env["PIP_NO_INPUT"] = "1"
    return env


def _words(text: str) -> str:
    lines = [line for line in text.splitlines() if "is ignored: it is neither a file nor a directory" not in line]
    return "\n".join(lines).strip()


def run(
    requirements: Sequence[str], target: Target, sources: Sources, *, deps: bool, timeout: float = DEFAULT_TIMEOUT
) -> PipRun:
    """pip's answer for `requirements`; PipUnavailable when there is none to be had."""
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="sm120kit-resolve-") as scratch:
        report = Path(scratch) / "report.json"
        cmd = _command(requirements, target, sources, deps=deps, report=report, where=Path(scratch) / "target")
        try:
            done = subprocess.run(
                cmd,
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
                env=_environment(),
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:
            raise PipUnavailable(f"pip did not finish within {timeout:.0f} s (preflight_resolve_timeout)") from None
        except OSError as exc:
            raise PipUnavailable(f"{sys.executable} could not run pip: {exc}") from None
        words = _words(done.stderr + "\n" + done.stdout)
        if done.returncode != 0 and "No module named pip" in words:
            raise PipUnavailable(f"{sys.executable} has no pip (install it, or run from a venv that has one)")
        if done.returncode != 0 and _UNREACHABLE.search(words):
            first = next((line for line in words.splitlines() if _UNREACHABLE.search(line)), "")
            raise PipUnavailable(f"pip could not reach {sources.describe()}: {first.strip()[:300]}")
        if done.returncode != 0 or not report.is_file():
            return PipRun(False, (), words, time.monotonic() - started)
        wheels = _wheels(json.loads(report.read_text(encoding="utf-8")))
    return PipRun(True, wheels, words, time.monotonic() - started)


def _wheels(report: object) -> tuple[WheelMetadata, ...]:
    install = report.get("install") if isinstance(report, dict) else None
    out = []
    for item in install if isinstance(install, list) else []:
        meta = item.get("metadata") if isinstance(item, dict) else None
        if not isinstance(meta, dict):
            continue
        requires = meta.get("requires_dist") or []
        out.append(
            WheelMetadata(
                name=canonical_name(str(meta.get("name", ""))),
                version=str(meta.get("version", "")),
                requires=tuple(str(r) for r in requires) if isinstance(requires, list) else (),
                requires_python=str(meta.get("requires_python") or ""),
            )
        )
    return tuple(out)


def conflict_words(words: str) -> str:
    """pip's refusal without its progress and generic advice: its ERROR lines and its "conflict is caused by" block."""
    lines = words.splitlines()
    errors = [line.rstrip() for line in lines if line.startswith("ERROR:") and "ResolutionImpossible" not in line]
    block: list[str] = []
    for line in lines[
        next((i for i, line in enumerate(lines) if line.startswith("The conflict is caused by")), len(lines)) :
    ]:
        if block and not line.strip():
            break
        block.append(line.rstrip())
    return "\n".join([*errors, *block]).strip() or words.strip()[-2000:]
