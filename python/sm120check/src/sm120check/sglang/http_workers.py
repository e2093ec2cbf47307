"""SGLang's HTTP (tokenizer) processes, read from a server log: how many the launch asked for, which started, and
which uvicorn's supervisor killed.

With `--tokenizer-worker-num N` (N > 1) SGLang runs uvicorn with N worker processes. uvicorn's supervisor
(`uvicorn/supervisors/multiprocess.py`) pings each worker and kills one that does not answer within
`timeout_worker_healthcheck` (`Child process [PID] died`), then spawns a replacement. A spawned worker answers only
after it has imported SGLang's launch module; SGLang sets the timeout from SGLANG_UVICORN_WORKER_HEALTHCHECK_TIMEOUT
(10 s in 0.5.13-0.5.23; before 0.5.13 uvicorn's 5 s, not settable). Where the import takes longer (several workers
importing at once beside the scheduler, a loaded host), a worker is killed while starting; a replacement that also
takes longer is killed again, every timeout, and the server serves with fewer processes than launched.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sm120check.sglang.launch_patterns import LOG_PATTERNS
from sm120check.sglang.launch_terms import Sign

HEALTHCHECK_ENV = "SGLANG_UVICORN_WORKER_HEALTHCHECK_TIMEOUT"
HEALTHCHECK_ENV_FIRST = "0.5.13"  # the first release that reads it (read from the releases' environ.py)
HEALTHCHECK_S = 120  # what the role and the GPU harness set where a server has more than one HTTP process
ROLE_VARIABLE = "sglang_server_http_worker_healthcheck_s"

_ASKED = re.compile(r"\btokenizer_worker_num=(?P<n>\d{1,4})\b")  # in SGLang's server_args= line
_STARTED = re.compile(r"Start multi-tokenizer worker process (?P<pid>\d{1,10})\b")  # SGLang, 0.5.9-0.5.23
_KILLED = re.compile(r"Child process \[(?P<pid>\d{1,10})\] died")  # uvicorn's supervisor
# uvicorn's own lines around a kill and a stop (the supervisor's join, the workers' shutdown): they neither start nor
# end the run of deaths that a stop signal causes
_STOPPING = re.compile(
    r"Waiting for child process \[\d{1,10}\]|Terminated child process \[|Shutting down\s*$|"
    r"Waiting for application shutdown|Application shutdown complete|Finished server process \["
)
_SHUTDOWN = re.compile(r"Received SIG(?:TERM|INT|QUIT|BREAK), exiting\.|Stopping parent process \[")
_START = next(p for p in LOG_PATTERNS if p.sign is Sign.START).compiled  # verify-launch's own run boundaries
_READY = next(p for p in LOG_PATTERNS if p.sign is Sign.READY).compiled
FIX = (
    f"set {HEALTHCHECK_ENV}={HEALTHCHECK_S} in the server's environment (SGLang {HEALTHCHECK_ENV_FIRST} or newer; the "
    f"role sets it from {ROLE_VARIABLE} where sglang_server_tokenizer_workers is above 1) and restart the server; "
    f"before {HEALTHCHECK_ENV_FIRST} uvicorn's 5 s check cannot be raised: serve with --tokenizer-worker-num 1"
)


@dataclass(frozen=True)
class HttpWorkers:
    """The HTTP processes of the last server run in a log."""

    asked: int  # --tokenizer-worker-num (server_args' tokenizer_worker_num)
    started: tuple[int, ...]  # pids that logged their start, in order
    killed: tuple[int, ...]  # pids uvicorn's supervisor killed, in order
    killed_after_ready: int  # of those, killed after the server's ready line
    last_killed_line: int | None  # 1-based line of the last kill in what was read
    ready: bool

    @property
    def serving(self) -> int:
        """Workers that started and were not killed since."""
        gone = set(self.killed)
        return len({pid for pid in self.started if pid not in gone})

    @property
    def problem(self) -> str:
        """What says the server lost HTTP processes while it served ("" when nothing does). A worker killed before
        the ready line was replaced while the server started; one still starting when the log was read is no loss."""
        if not self.killed_after_ready:
            return ""
        return (
            f"HTTP processes: uvicorn's health check killed {self.killed_after_ready} after the server was ready (last "
            f"at log line {self.last_killed_line}); {self.serving} of the {self.asked} launched serve. Fix: {FIX}"
        )

    @property
    def note(self) -> str:
        text = f"HTTP processes: {self.asked} launched, {self.serving} serving"
        if self.killed:
            text += f"; uvicorn's health check killed {len(self.killed)}"
            after = self.killed_after_ready
            text += f" ({after} after the server was ready)" if after else " while the server started"
        return text

    def to_dict(self) -> dict[str, Any]:
        return {
            "asked": self.asked,
            "serving": self.serving,
            "started": list(self.started),
            "killed": list(self.killed),
            "killed_after_ready": self.killed_after_ready,
            "ready": self.ready,
        }


def scan(lines: Sequence[str]) -> HttpWorkers | None:
    """The HTTP processes of the last server run in `lines` (None: no run whose arguments name more than one).
    Workers that die right before the supervisor's own shutdown line (with only uvicorn's stop lines between), at
    most one a worker, got the stop signal with it (a stopped unit signals the whole group): those are no kills."""
    asked = 0
    started: list[int] = []
    killed: list[tuple[int, int, bool]] = []  # pid, line, after the ready line
    pending = 0  # kills in the supervisor's lines since the last other line
    ready = False
    for number, line in enumerate(lines, 1):
        if _START.search(line):
            m = _ASKED.search(line)
            asked = int(m.group("n")) if m else 0
            started, killed, pending, ready = [], [], 0, False
            continue
        if m := _KILLED.search(line):
            killed.append((int(m.group("pid")), number, ready))
            pending += 1
            continue
        if _STOPPING.search(line):
            continue
        if _SHUTDOWN.search(line) and pending:
            del killed[-min(pending, max(asked, 1)) :]  # the stop ends each worker once
        pending = 0
        if _READY.search(line):
            ready = True
        elif m := _STARTED.search(line):
            started.append(int(m.group("pid")))
    if asked <= 1:
        return None
    return HttpWorkers(
        asked,
        tuple(started),
        tuple(pid for pid, _, _ in killed),
        sum(after for _, _, after in killed),
        killed[-1][1] if killed else None,
        ready,
    )


def kills_between(lines: Sequence[str], first: int, last: int) -> int:
    """uvicorn's kills in lines[first:last] (0-based slice bounds): those during one stretch of a run, a sweep."""
    return sum(1 for line in lines[first:last] if _KILLED.search(line))
