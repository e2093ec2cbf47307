"""Turn the doctor results Ansible registered on each node into node files of a fleet run directory.

playbooks/doctor.yml pipes {host: registered result of the doctor task} into `sm120check fleet collect RUN`, which
writes RUN/nodes/<host>.json: the doctor's own JSON report when it gave one, else a stub that says why there is none
(unreachable, no sm120check on the node, the doctor crashed), so no node is ever silently missing.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
from collections.abc import Mapping
from pathlib import Path

from sm120check.doctor.report import write_file
from sm120check.fleet.load import NODES_DIR, NodeDocumentError, parse_document
from sm120check.fleet.model import NodeState

NO_CHECKER_RC = 127  # the playbook's shell exits 127 when the node has no sm120check
# The playbook's script writes this line to stderr first. A failed command without it never ran on the node: the
# connection failed without Ansible calling the node unreachable (the podman connection reports a missing container
# as `podman exec` exit 125, not as unreachable).
REACHED = "sm120kit fleet: on the node"
LATEST = "latest"
_TAIL = 2000


def _tail(text: object) -> str:
    value = str(text or "").strip()
    return value if len(value) <= _TAIL else "..." + value[-_TAIL:]


def _stub(host: str, state: NodeState, error: str, **extra: object) -> str:
    document = {"schema": 1, "tool": "sm120kit fleet doctor", "host": host, "state": state.value, "error": error}
    return json.dumps({**document, **extra}, indent=2) + "\n"


def node_file(host: str, result: object) -> str:
    """The text of a node's file from its registered result (a mapping with rc, stdout, stderr, msg, unreachable)."""
    if not isinstance(result, Mapping):
        return _stub(host, NodeState.ERROR, "the doctor task left no result for this node")
    if result.get("unreachable"):
        return _stub(host, NodeState.UNREACHABLE, _tail(result.get("msg")) or "unreachable")
    rc = result.get("rc")
    raw_stderr = str(result.get("stderr") or "")
    stderr = "\n".join(line for line in raw_stderr.splitlines() if line.strip() != REACHED)
    if rc not in (0, 1) and REACHED not in raw_stderr:
        why = _tail(stderr) or _tail(result.get("msg")) or "no output"
        return _stub(host, NodeState.UNREACHABLE, f"the command did not run on the node (exit {rc}): {why}", rc=rc)
    if rc == NO_CHECKER_RC:
        return _stub(host, NodeState.NO_CHECKER, _tail(stderr) or "no sm120check on the node")
    stdout = str(result.get("stdout") or "")
    if rc in (0, 1):
        try:
            parse_document(stdout)  # bounded: too large or too deep is this node's error, not a traceback
        except NodeDocumentError as error:
            why = f"the doctor exited {rc} but its output is not usable JSON ({error}): {stdout[:200]!r}"
            return _stub(host, NodeState.ERROR, why, rc=rc, stderr=_tail(stderr))
        return stdout if stdout.endswith("\n") else stdout + "\n"
    why = _tail(stderr) or _tail(result.get("msg")) or "no output"
    return _stub(host, NodeState.ERROR, f"the doctor exited {rc}: {why}", rc=rc)


def _safe_name(host: str) -> str:
    if not host or host in {".", ".."} or "/" in host or "\0" in host:
        raise ValueError(f"host name {host!r} cannot be a file name; rename it in the inventory")
    return host


def _check_latest(latest: Path) -> None:
    """`latest` must be a symbolic link (or absent): a real file or directory there is refused, before anything is
    written, rather than half-replaced."""
    if latest.is_symlink() or not latest.exists():
        return
    kind = "directory" if latest.is_dir() else "file"
    raise ValueError(
        f"{latest} is a real {kind}, not the `latest` link; move it away (or pass --no-latest) and collect again"
    )


def _link_latest(run: Path, latest: Path) -> None:
    """Point `latest` at RUN atomically (a new link of an unpredictable name, renamed over it); the new link is
    removed when the rename fails."""
    for _ in range(100):
        fresh = latest.with_name(f".{LATEST}.{os.getpid()}.{secrets.token_hex(6)}")
        try:
            fresh.symlink_to(run.name)  # fails on an existing name: never reuses a planted one
        except FileExistsError:
            continue
        break
    else:
        raise FileExistsError(errno.EEXIST, "cannot make a new link name", str(latest))
    try:
        fresh.replace(latest)  # atomic: readers see the old run or the new one
    except OSError:
        with contextlib.suppress(OSError):
            fresh.unlink()
        raise


def write_run(run: Path, results: Mapping[str, object], link_latest: bool = True) -> list[Path]:
    """Write RUN/nodes/<host>.json for every host; point RUN's parent's `latest` at RUN. Returns the files.

    A reused RUN keeps only this run's nodes: node files of hosts not in `results` are removed."""
    if run.name in ("", ".", ".."):
        raise ValueError(f"the run directory {str(run)!r} has no name of its own; give one, e.g. build/fleet/<time>")
    names = {host: f"{_safe_name(host)}.json" for host in results}  # every name checked before anything is written
    latest = run.parent / LATEST
    if link_latest:
        _check_latest(latest)
    nodes = run / NODES_DIR
    nodes.mkdir(parents=True, exist_ok=True)
    written = []
    for host in sorted(results):
        path = nodes / names[host]
        try:
            text = node_file(host, results[host])
        except Exception as error:  # one node's odd result never costs the other nodes their files
            text = _stub(host, NodeState.ERROR, f"its registered result cannot be read: {error!r}"[:500])
        write_file(path, text)  # mkstemp + rename: a planted link at any name is never written through
        written.append(path)
    keep = set(names.values())
    for stale in nodes.glob("*.json"):  # an earlier run's nodes in a reused RUN directory
        if stale.name not in keep and (stale.is_symlink() or stale.is_file()):
            stale.unlink()
    if link_latest:
        _link_latest(run, latest)
    return written
