"""pip's own resolver, run as a program: `pip install --dry-run --report` for the node's Python and platform.

Nothing is installed: `--dry-run` with `--target` (pip wants one for `--platform`) into an empty temporary directory,
`--ignore-installed` so this machine's packages play no part, `--only-binary=:all:` as the node installs wheels only.
Every run is bounded (`timeout`); `--retries 2` keeps an unreachable index short and makes pip say so (with no
retry it fails silently, as if the wheel did not exist). This machine's pip constraint files are not applied
(`PIP_CONSTRAINT=/dev/null`): they constrain its own environments, not the node's stack venv; its indexes,
find-links and certificates are.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sm120check import bounded
from sm120check.stack.dist import canonical_name
from sm120check.stack.model import Sources, Target, WheelMetadata

DEFAULT_TIMEOUT = 600.0
# pip's words when it could not reach an index: retries after a broken connection, a fetch that failed.
_UNREACHABLE = re.compile(
    r"after connection broken by|Could not fetch URL|Failed to establish a new connection|"
    r"Temporary failure in name resolution|Name or service not known|Network is unreachable|ProxyError|"
    r"ConnectTimeoutError|Read timed out"
)


# pip's words when it refused the requirements themselves: only then is a failure the manifest's conflict (a full
# disk, a killed pip or a broken environment says nothing about the pins and is never cached as their verdict)
_ABOUT_THE_PINS = re.compile(
    r"ResolutionImpossible|conflicting dependencies|The conflict is caused by|No matching distribution found|"
    r"Could not find a version that satisfies|requires a different Python|is not a supported wheel|"
    r"Invalid requirement|has inconsistent (?:name|version)"
)
MAX_REPORT = 64 << 20  # pip's --report for a full profile is about 200 KiB


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
    if bad := [r for r in requirements if not r[:1].isalnum()]:  # never an option: `-rFILE`, `--index-url`
        raise ValueError(f"{bad[0]!r} is not a requirement (NAME==VERSION); nothing was passed to pip")
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


MAX_WORDS = 1 << 20  # the newest bytes of pip's stdout and of its stderr kept (its verdict is at the end)


def _run_bounded(cmd: Sequence[str], timeout: float) -> tuple[int | None, str, str]:
    """Run pip in its own process group, its output bounded (bounded.capture); at the timeout the whole group is
    killed (pip's build helpers with it) and the status is None."""
    proc = subprocess.Popen(
        list(cmd),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=_environment(),
        start_new_session=True,
    )

    def kill() -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)

    try:
        got = bounded.capture(proc, MAX_WORDS, timeout, kill, keep_newest=True, err_limit=MAX_WORDS)
        code = proc.wait()
    finally:
        kill()  # helpers pip left behind
        if proc.poll() is None:
            proc.wait()
    out, err = (data.decode("utf-8", "replace") for data in (got.stdout, got.stderr))
    return (None if got.timed_out else code), out, err


def run(
    requirements: Sequence[str], target: Target, sources: Sources, *, deps: bool, timeout: float = DEFAULT_TIMEOUT
) -> PipRun:
    """pip's answer for `requirements`; PipUnavailable when there is none to be had."""
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="sm120kit-resolve-") as scratch:
        report = Path(scratch) / "report.json"
        cmd = _command(requirements, target, sources, deps=deps, report=report, where=Path(scratch) / "target")
        try:
            code, out, err = _run_bounded(cmd, timeout)
        except OSError as exc:
            raise PipUnavailable(f"{sys.executable} could not run pip: {exc}") from None
        if code is None:
            raise PipUnavailable(f"pip did not finish within {timeout:.0f} s (preflight_resolve_timeout)")
        done = subprocess.CompletedProcess(cmd, code, out, err)
        words = _words(done.stderr + "\n" + done.stdout)
        if done.returncode != 0 and "No module named pip" in words:
            raise PipUnavailable(f"{sys.executable} has no pip (install it, or run from a venv that has one)")
        if done.returncode != 0 and _UNREACHABLE.search(words):
            first = next((line for line in words.splitlines() if _UNREACHABLE.search(line)), "")
            raise PipUnavailable(f"pip could not reach {sources.describe()}: {first.strip()[:300]}")
        if done.returncode != 0:
            if done.returncode > 0 and _ABOUT_THE_PINS.search(words):
                return PipRun(False, (), words, time.monotonic() - started)
            last = next((line for line in reversed(words.splitlines()) if line.startswith("ERROR:")), "")
            said = last.strip()[:300] or (words.strip().splitlines() or ["no error output"])[-1][:300]
            how = f"was killed by signal {-done.returncode}" if done.returncode < 0 else f"exited {done.returncode}"
            raise PipUnavailable(f"pip {how} for a reason that is not about the pins: {said}")
        wheels = _wheels(_report(report))
    return PipRun(True, wheels, words, time.monotonic() - started)


def _report(path: Path) -> object:
    """pip's --report, bounded; PipUnavailable naming what is wrong with it (it is not judged as the pins')."""
    try:
        return json.loads(bounded.read_text(path, MAX_REPORT))
    except bounded.Unreadable as exc:
        raise PipUnavailable(f"pip's report cannot be read: {exc}") from None
    except (ValueError, RecursionError) as exc:
        reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)[:200]
        raise PipUnavailable(f"pip's report {path.name} is not JSON pip writes: {reason}") from None


def _wheels(report: object) -> tuple[WheelMetadata, ...]:
    """The wheels of pip's report; PipUnavailable when an item is not what pip writes (its name and version are
    strings, its requirements a list of strings)."""
    install = report.get("install") if isinstance(report, dict) else None
    if not isinstance(install, list):
        raise PipUnavailable("pip's report has no list of wheels to install ('install'); is this pip 23 or newer?")
    out = []
    for item in install:
        meta = item.get("metadata") if isinstance(item, dict) else None
        if not isinstance(meta, dict):
            raise PipUnavailable(f"pip's report lists {str(item)[:80]!r}, not a wheel with its metadata")
        name, version = meta.get("name"), meta.get("version")
        requires = meta.get("requires_dist") or []
        python = meta.get("requires_python") or ""
        if not (isinstance(name, str) and isinstance(version, str) and isinstance(python, str)) or not (
            isinstance(requires, list) and all(isinstance(r, str) for r in requires)
        ):
            raise PipUnavailable(f"pip's report lists a wheel whose metadata is not what pip writes: {str(meta)[:120]}")
        out.append(WheelMetadata(canonical_name(name), version, tuple(requires), python))
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
