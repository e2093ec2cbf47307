"""Run GPU work, and every library load that could hang or crash, in a child process with a hard timeout.

A hung NCCL call, a wedged GPU, an NVML or NVRTC library that blocks in its constructor or segfaults must
become a `fail`, never a hang or a crash of the doctor: the child runs in its own session and process group
(so ranks and compilers it spawns are killed with it) and prints one JSON object as its last line of stdout.

Every live child's process group is registered here, so that an interrupted doctor (Ctrl-C, SIGTERM) can
kill them all at once with `kill_all()`; after that no new child starts.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sm120check import bounded

STEP_MARK = "sm120check-step: "  # a probe's stderr line naming what it does next (see `step`)


@dataclass(frozen=True)
class ChildOutcome:
    ok: bool  # exited 0 and printed a JSON object
    data: Mapping[str, object] = field(default_factory=dict)
    returncode: int | None = None
    timed_out: bool = False
    stderr_tail: str = ""
    seconds: float = 0.0
    interrupted: bool = False  # the doctor was interrupted: the child was killed (or never started)
    cut: bool = False  # its stdout passed MAX_PROBE_OUTPUT: it was stopped (killed with its process group)
    silent: float | None = None  # run with `idle`: it wrote nothing for this many seconds and was killed as hung

    @property
    def signal(self) -> str:
        """The signal that killed the child ("SIGSEGV"), "" when it exited, timed out or was stopped."""
        if self.timed_out or self.cut or self.silent is not None or self.returncode is None or self.returncode >= 0:
            return ""
        return signal_name(-self.returncode)

    @property
    def step(self) -> str:
        """The last step the probe announced (`step()`) before it finished, hung or died; "" if none."""
        steps = [line[len(STEP_MARK) :].strip() for line in self.stderr_tail.splitlines() if line.startswith(STEP_MARK)]
        return steps[-1] if steps else ""

    @property
    def problem(self) -> str:
        """One line saying why the child did not deliver, for a result's summary."""
        if self.interrupted:
            return "was interrupted (the doctor was stopped; its process group was killed)"
        if self.cut:
            bound = bounded.size_text(MAX_PROBE_OUTPUT)
            return f"wrote more than {bound} of output (stopped, killed with its process group)"
        if self.silent is not None:
            return f"went silent for {self.silent:.0f} s (hung; killed with its process group)"
        if self.timed_out:
            return f"timed out after {self.seconds:.0f} s (killed with its process group)"
        if self.signal:
            return f"was killed by {self.signal} (signal {-(self.returncode or 0)})"
        if self.returncode not in (0, None):
            lines = [line for line in self.stderr_tail.strip().splitlines() if not line.startswith(STEP_MARK)]
            return f"exited {self.returncode}: {(lines[-1:] or ['no error output'])[0]}"
        return "printed no JSON result"


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


class _Children:
    """The process groups of live children, and whether the doctor is stopping (no new child then)."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.groups: set[int] = set()
        self.stopping = False


_CHILDREN = _Children()


def kill_all() -> None:
    """SIGKILL every live child's process group (the child and whatever it spawned); start no child after.

    Safe to call from a signal handler in the main thread and more than once."""
    with _CHILDREN.lock:
        _CHILDREN.stopping = True
        groups = list(_CHILDREN.groups)
    for group in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signal.SIGKILL)


def resume() -> None:
    """Let children start again after kill_all, once its children are gone: for a doctor that ended one run early
    (a usage error after a child started) inside a process that may run it again (API callers, tests)."""
    with _CHILDREN.lock:
        _CHILDREN.stopping = False


def stopping() -> bool:
    return _CHILDREN.stopping


@contextlib.contextmanager
def _spawned(cmd: Sequence[str], env: Mapping[str, str]) -> Iterator[subprocess.Popen[bytes] | None]:
    """Start `cmd` in its own session, registered for kill_all(); None when the doctor is stopping.
    On leaving, the child's whole process group is killed (helpers it left behind included)."""
    with _CHILDREN.lock:
        if _CHILDREN.stopping:
            proc = None
        else:
            proc = subprocess.Popen(
                list(cmd),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                env=dict(env),
                preexec_fn=die_with_parent if sys.platform == "linux" else None,
            )
            _CHILDREN.groups.add(proc.pid)
    if proc is None:
        yield None
        return
    try:
        yield proc
    finally:
        _kill_group(proc)
        if proc.poll() is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        with _CHILDREN.lock:
            _CHILDREN.groups.discard(proc.pid)


MAX_COMMAND_OUTPUT = 1 << 20  # a command's stdout kept (nvcc --version, an interpreter's probe): far above theirs
MAX_PROBE_OUTPUT = 16 << 20  # a probe's stdout (its JSON result is the last line)
MAX_STDERR = 64 << 10  # the newest bytes of a child's stderr


@dataclass(frozen=True)
class CommandResult:
    returncode: int  # 124 timed out, 127 did not start, 130 the doctor is stopping; -9 stopped at the output bound
    stdout: str = ""
    stderr: str = ""
    timed_out: bool = False
    cut: bool = False  # stdout passed its bound: the command was stopped (killed with its process group)

    @property
    def text(self) -> str:
        return self.stdout + self.stderr


def _capture(proc: subprocess.Popen[bytes], limit: int, timeout: float, idle: float | None = None) -> bounded.Captured:
    """Read the child's pipes as they fill, bounded (bounded.capture): killed whole at the timeout, after `idle`
    seconds without output, or once its stdout passed `limit`, then reaped."""
    got = bounded.capture(proc, limit, max(timeout, 0.01), lambda: _kill_group(proc), err_limit=MAX_STDERR, idle=idle)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)
    return got


def _text(data: bytes) -> str:
    return data.decode("utf-8", "replace")


def run_command(
    cmd: Sequence[str], *, timeout: float, env: Mapping[str, str] | None = None, limit: int = MAX_COMMAND_OUTPUT
) -> CommandResult:
    """Run a command (nvcc, a fresh interpreter) like run_probe: in its own process group, killed whole at
    the timeout, when the doctor stops, or once it has written `limit` bytes to stdout (then `cut`, its first
    `limit` bytes kept). `env` is the whole environment (default: the doctor's)."""
    try:
        with _spawned(cmd, dict(os.environ) if env is None else env) as proc:
            if proc is None:
                return CommandResult(130, stderr=f"{cmd[0]} not started: the doctor is stopping")
            got = _capture(proc, limit, timeout)
    except OSError as exc:
        return CommandResult(127, stderr=str(exc))
    out, err = _text(got.stdout), _text(got.stderr)
    if got.timed_out:
        return CommandResult(
            124, out, f"{cmd[0]} did not answer in {timeout:.0f} s (killed with its process group)", True
        )
    if got.stopped:
        said = f"{cmd[0]} wrote more than {bounded.size_text(limit)} of output; stopped (killed with its process group)"
        return CommandResult(-signal.SIGKILL, out, f"{err}\n{said}" if err else said, cut=True)
    if _CHILDREN.stopping and proc.returncode == -signal.SIGKILL:
        return CommandResult(130, out, err + f"\n{cmd[0]} killed: the doctor is stopping")
    return CommandResult(proc.returncode if proc.returncode is not None else -signal.SIGKILL, out, err)


def run_probe(
    module: str,
    args: Sequence[str] = (),
    *,
    timeout: float,
    env: Mapping[str, str] | None = None,
    python: str | None = None,
    idle: float | None = None,
) -> ChildOutcome:
    """Run `python -m module *args` and parse the JSON object on its last stdout line (stdout bounded at
    MAX_PROBE_OUTPUT: a probe that writes more is stopped and fails). With `idle`, a long-running probe that
    announces its progress (`step`) is killed as hung once it has written nothing for `idle` seconds."""
    cmd = [python or sys.executable, "-m", module, *args]
    child_env = dict(os.environ)
    if env:
        child_env.update(env)
    start = time.monotonic()
    with _spawned(cmd, env=child_env) as proc:
        if proc is None:
            return ChildOutcome(ok=False, interrupted=True)
        got = _capture(proc, MAX_PROBE_OUTPUT, timeout, idle)
    # The child's own process group may hold helpers (ranks) that outlived it: _spawned ended them too.
    seconds = time.monotonic() - start
    err = _text(got.stderr)[-4000:]
    if got.timed_out or got.stopped or got.silent:
        return ChildOutcome(
            ok=False,
            returncode=proc.returncode,
            timed_out=got.timed_out,
            silent=idle if got.silent else None,
            stderr_tail=err,
            seconds=seconds,
            interrupted=_CHILDREN.stopping,
            cut=got.stopped,
        )
    data = _last_json(_text(got.stdout))
    return ChildOutcome(
        ok=proc.returncode == 0 and data is not None,
        data=data or {},
        returncode=proc.returncode,
        stderr_tail=err,
        seconds=seconds,
        interrupted=_CHILDREN.stopping and proc.returncode == -signal.SIGKILL,
    )


_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Between fork and exec: have the kernel SIGKILL this child when its parent dies, so a doctor
    killed from outside (a timeout, Ctrl-C, an OOM kill) takes its GPU children along."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def _last_json(out: str) -> dict[str, object] | None:
    for line in reversed(out.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except (ValueError, RecursionError):
                return None
            return value if isinstance(value, dict) else None
    return None


def step(text: str) -> None:
    """Called by probe modules before a step that may hang or crash (an import, a dlopen, a library call):
    the parent reads the last one from stderr when the child times out or dies (ChildOutcome.step)."""
    sys.stderr.write(f"{STEP_MARK}{text}\n")
    sys.stderr.flush()


def emit(data: Mapping[str, object]) -> None:
    """Called by probe modules: print the result as the last stdout line."""
    sys.stdout.write(json.dumps(data, default=str) + "\n")
    sys.stdout.flush()


def probe_env() -> dict[str, str]:
    """Environment for a probe run by another interpreter: it can import this sm120check from source."""
    import sm120check

    src = str(Path(sm120check.__file__).resolve().parent.parent)
    path = os.environ.get("PYTHONPATH", "")
    return {"PYTHONPATH": f"{src}{os.pathsep}{path}" if path else src}


def gpu_indices(text: str) -> list[int] | None:
    """A probe's `--gpus 0,1` as NVML indices (None: all); a bad value ends the probe naming it (exit 2)."""
    if not text:
        return None
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise SystemExit(f"--gpus {text!r}: expected NVML indices such as 0,1") from None
