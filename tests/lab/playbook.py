"""Run ansible-playbook against lab nodes and read what it reports.

The PLAY RECAP of the default callback gives ok/changed/failed/unreachable per host; the task log gives the names of
tasks that reported a change (what an idempotence failure message needs). The JSON callback (`ansible.posix.json`)
is parsed as well for callers that want structured results.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .podman import Node

REPO_ROOT = Path(__file__).resolve().parents[2]
PLAYBOOK_BIN = Path(sys.executable).parent / "ansible-playbook"
CONNECTION = "containers.podman.podman"
NODE_PYTHON = "/usr/bin/python3"
_RECAP_LINE = re.compile(r"^(?P<host>\S+)\s+:\s+(?P<counts>(?:[a-z]+=\d+\s*)+)$")
_TASK_LINE = re.compile(r"^(?:TASK|RUNNING HANDLER) \[(?P<name>.*)\] \**$")
_CHANGED_LINE = re.compile(r"^changed: \[(?P<host>[^\]\s]+)")


@dataclass(frozen=True)
class HostRecap:
    """One host's line of the PLAY RECAP."""

    ok: int = 0
    changed: int = 0
    unreachable: int = 0
    failed: int = 0
    skipped: int = 0
    rescued: int = 0
    ignored: int = 0


@dataclass(frozen=True)
class PlaybookRun:
    """A finished ansible-playbook run."""

    argv: tuple[str, ...]
    rc: int
    output: str
    seconds: float
    recap: Mapping[str, HostRecap] = field(default_factory=dict)
    changed_tasks: tuple[str, ...] = ()

    def host(self, name: str) -> HostRecap:
        if name not in self.recap:
            raise AssertionError(f"no PLAY RECAP line for {name}\n{self.tail()}")
        return self.recap[name]

    def tail(self, lines: int = 60) -> str:
        """The end of the log, for assertion messages."""
        return f"$ {' '.join(self.argv)}\n(rc={self.rc}, {self.seconds:.0f} s)\n" + "\n".join(
            self.output.splitlines()[-lines:]
        )


def parse_recap(output: str) -> dict[str, HostRecap]:
    """Per-host counts from the last PLAY RECAP of a default-callback log."""
    start = output.rfind("PLAY RECAP")
    if start < 0:
        return {}
    recap = {}
    for line in output[start:].splitlines()[1:]:
        match = _RECAP_LINE.match(line.strip())
        if not match:
            continue
        counts = dict(item.split("=") for item in match["counts"].split())
        known = {key: int(value) for key, value in counts.items() if key in HostRecap.__dataclass_fields__}
        recap[match["host"]] = HostRecap(**known)
    return recap


def parse_changed_tasks(output: str) -> tuple[str, ...]:
    """'task name [host]' for every task result reported as changed in a default-callback log."""
    task = ""
    changed = []
    for line in output.splitlines():
        if header := _TASK_LINE.match(line):
            task = header["name"]
        elif hit := _CHANGED_LINE.match(line):
            changed.append(f"{task} [{hit['host']}]")
    return tuple(changed)


def parse_json_output(output: str) -> tuple[dict[str, HostRecap], tuple[str, ...]]:
    """Per-host counts and changed tasks from the `ansible.posix.json` stdout callback."""
    document = json.loads(output[output.index("{") :])
    recap = {
        host: HostRecap(
            ok=stats.get("ok", 0),
            changed=stats.get("changed", 0),
            unreachable=stats.get("unreachable", 0),
            failed=stats.get("failures", 0),
            skipped=stats.get("skipped", 0),
            rescued=stats.get("rescued", 0),
            ignored=stats.get("ignored", 0),
        )
        for host, stats in document.get("stats", {}).items()
    }
    changed = tuple(
        f"{task['task']['name']} [{host}]"
        for play in document.get("plays", [])
        for task in play.get("tasks", [])
        for host, result in task.get("hosts", {}).items()
        if result.get("changed")
    )
    return recap, changed


def write_inventory(directory: Path, nodes: Sequence[Node], groups: Sequence[str] = ()) -> Path:
    """An INI inventory of podman-connected nodes beside the project's group_vars (so the manifest applies)."""
    directory.mkdir(parents=True, exist_ok=True)
    group_vars = directory / "group_vars"
    if not group_vars.exists():
        group_vars.symlink_to(REPO_ROOT / "inventory" / "group_vars")
    lines = [f"{node.name} ansible_connection={CONNECTION} ansible_python_interpreter={NODE_PYTHON}" for node in nodes]
    for group in groups:
        lines += ["", f"[{group}]", *(node.name for node in nodes)]
    path = directory / "hosts.ini"
    path.write_text("\n".join(lines) + "\n")
    return path


def playbook_argv(
    playbook: str | Path,
    inventory: Path | None,
    extra_vars: Mapping[str, object] | None = None,
    check: bool = False,
    diff: bool = False,
    tags: Sequence[str] = (),
) -> list[str]:
    """The ansible-playbook command line; extra vars travel as JSON so lists and mappings keep their types."""
    argv = [str(PLAYBOOK_BIN), str(playbook)]
    if inventory is not None:
        argv += ["-i", str(inventory)]
    if extra_vars:
        argv += ["-e", json.dumps(dict(extra_vars))]
    if check:
        argv.append("--check")
    if diff:
        argv.append("--diff")
    if tags:
        argv += ["--tags", ",".join(tags)]
    return argv


def playbook_env(json_output: bool = False) -> dict[str, str]:
    env = {
        **os.environ,
        "PATH": f"{PLAYBOOK_BIN.parent}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_FORCE_COLOR": "0",
        "PYTHONUNBUFFERED": "1",
    }
    if json_output:
        env["ANSIBLE_STDOUT_CALLBACK"] = "ansible.posix.json"
    return env


def run_playbook(argv: Sequence[str], timeout: float = 1800, json_output: bool = False) -> PlaybookRun:
    """Run ansible-playbook from the repository root (its ansible.cfg applies) and parse the result."""
    started = time.monotonic()
    result = subprocess.run(
        list(argv),
        cwd=REPO_ROOT,
        env=playbook_env(json_output),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
        check=False,
    )
    seconds = time.monotonic() - started
    if json_output and "{" in result.stdout:
        recap, changed = parse_json_output(result.stdout)
    else:
        recap, changed = parse_recap(result.stdout), parse_changed_tasks(result.stdout)
    return PlaybookRun(tuple(argv), result.returncode, result.stdout, seconds, recap, changed)


def start_playbook(argv: Sequence[str], log: Path) -> subprocess.Popen[bytes]:
    """Start ansible-playbook in the background, its log going to `log` (for interrupting it mid-run)."""
    with log.open("wb") as sink:
        return subprocess.Popen(
            list(argv),
            cwd=REPO_ROOT,
            env=playbook_env(),
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
