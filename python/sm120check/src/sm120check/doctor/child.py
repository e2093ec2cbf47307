"""Run GPU work in a child process with a hard timeout.

A hung NCCL call or a wedged GPU must become a `fail`, never a hang of the doctor: the child runs in
its own process group (so ranks it spawns are killed with it) and prints one JSON object as its last
line of stdout.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ChildOutcome:
    ok: bool  # exited 0 and printed a JSON object
    data: Mapping[str, object] = field(default_factory=dict)
    returncode: int | None = None
    timed_out: bool = False
    stderr_tail: str = ""
    seconds: float = 0.0

    @property
    def problem(self) -> str:
        """One line saying why the child did not deliver, for a result's summary."""
        if self.timed_out:
            return f"timed out after {self.seconds:.0f} s (killed with its process group)"
        if self.returncode not in (0, None):
            last = self.stderr_tail.strip().splitlines()[-1:] or ["no error output"]
            return f"exited {self.returncode}: {last[0]}"
        return "printed no JSON result"


def run_probe(
    module: str,
    args: Sequence[str] = (),
    *,
    timeout: float,
    env: Mapping[str, str] | None = None,
    python: str | None = None,
) -> ChildOutcome:
    """Run `python -m module *args` and parse the JSON object on its last stdout line."""
    cmd = [python or sys.executable, "-m", module, *args]
    child_env = dict(os.environ)
    if env:
        child_env.update(env)
    start = time.monotonic()
    proc = subprocess.Popen(
        cmd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env,
        start_new_session=True,
        preexec_fn=die_with_parent if sys.platform == "linux" else None,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        out, err = proc.communicate()
        return ChildOutcome(
            ok=False,
            returncode=proc.returncode,
            timed_out=True,
            stderr_tail=err[-4000:],
            seconds=time.monotonic() - start,
        )
    finally:
        if proc.poll() is None:
            _kill_group(proc)
    # The child's own process group may hold helpers (ranks) that outlived it: end them too.
    _kill_group(proc)
    seconds = time.monotonic() - start
    data = _last_json(out)
    return ChildOutcome(
        ok=proc.returncode == 0 and data is not None,
        data=data or {},
        returncode=proc.returncode,
        stderr_tail=err[-4000:],
        seconds=seconds,
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


def _kill_group(proc: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def _last_json(out: str) -> dict[str, object] | None:
    for line in reversed(out.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except json.JSONDecodeError:
                return None
            return value if isinstance(value, dict) else None
    return None


def emit(data: Mapping[str, object]) -> None:
    """Called by probe modules: print the result as the last stdout line."""
    sys.stdout.write(json.dumps(data, default=str) + "\n")
    sys.stdout.flush()
