"""Who listens on a TCP port, and whether it is the server we started (a systemd unit, or a process and its children).

Read from /proc: the LISTEN sockets of /proc/net/tcp and tcp6 on the port, each socket's inode found among the
links of /proc/PID/fd, and that process's command line and control group. A server started where another already
holds the port cannot bind it (SGLang logs "[Errno 98] ... address already in use"), yet the port answers: this is
what tells the two apart. Linux only; a process whose fds cannot be read (another user's, without root) is named by
its socket alone.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from sm120check import bounded
from sm120check.sglang.launch_terms import printable

PROC = Path("/proc")
MAX_TABLE_BYTES = 64 << 20  # /proc/net/tcp of a busy host: 150 bytes a socket
MAX_CMDLINE_BYTES = 64 << 10
MAX_CGROUP_BYTES = 64 << 10
MAX_PROCESSES = 1 << 16
SYSTEMCTL_TIMEOUT_S = 20.0
_LISTEN = "0A"
_SOCKET = re.compile(r"socket:\[(\d+)\]")
_UNIT = re.compile(r"[A-Za-z0-9:_.@\\-]{1,256}")


class PortError(Exception):
    """What could not be read (the message names it and what to do)."""


@dataclass(frozen=True)
class Listener:
    """One LISTEN socket on the port and the process holding it (pid None: its fds could not be read)."""

    address: str  # "127.0.0.1" or "::"
    port: int
    inode: int
    pid: int | None = None
    cmdline: str = ""
    cgroup: str = ""  # the unified (v2) path, or the systemd (name=systemd) one on v1

    @property
    def named(self) -> str:
        if self.pid is None:
            who = f"a process whose fds cannot be read here (socket inode {self.inode}; run as root to name it)"
        else:
            who = f"pid {self.pid} ({self.cmdline or 'command line unreadable'})"
        return f"{who} listening on {self.address}:{self.port}"


@dataclass(frozen=True)
class Owner:
    """The server we started: a systemd unit's main process and control group, or a process tree."""

    description: str  # "unit sglang-server (MainPID 123, /system.slice/sglang-server.service)"
    main_pid: int | None  # None or 0: the unit has no running main process
    cgroup: str = ""  # the unit's ControlGroup; "" for a process tree
    tree: frozenset[int] = frozenset()  # the main process and its descendants

    def owns(self, listener: Listener) -> bool:
        """The listener's process is the main process or one of its descendants, or lies in the unit's cgroup."""
        if listener.pid is None:
            return False
        if listener.pid in self.tree:
            return True
        inside = listener.cgroup == self.cgroup or listener.cgroup.startswith(self.cgroup + "/")
        return self.cgroup not in ("", "/") and inside


@dataclass(frozen=True)
class PortVerdict:
    ok: bool
    summary: str
    fix: str = ""
    listeners: tuple[Listener, ...] = ()

    @property
    def line(self) -> str:
        return self.summary + (f". Fix: {self.fix}" if self.fix else "")


def _hex_address(text: str) -> str:
    """An address as /proc/net/tcp{,6} writes it (each 32-bit word in host byte order, little-endian here)."""
    raw = bytes.fromhex(text)
    flat = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return str(ipaddress.ip_address(flat))


def parse_table(text: str, port: int) -> list[tuple[str, int]]:
    """(address, inode) of each LISTEN socket on `port` in a /proc/net/tcp or tcp6 table; malformed rows skipped."""
    found = []
    for row in text.splitlines()[1:]:
        cols = row.split()
        if len(cols) < 10 or cols[3] != _LISTEN or ":" not in cols[1]:
            continue
        address, _, port_hex = cols[1].rpartition(":")
        try:
            if int(port_hex, 16) != port:
                continue
            found.append((_hex_address(address), int(cols[9])))
        except ValueError:
            continue
    return found


def _read(path: Path, limit: int) -> str:
    try:
        return bounded.read_bytes(path, limit).decode("utf-8", "replace")
    except (bounded.Unreadable, bounded.TooLarge, OSError):
        return ""


def _cgroup(pid: int, proc: Path) -> str:
    v2 = v1 = ""
    for line in _read(proc / str(pid) / "cgroup", MAX_CGROUP_BYTES).splitlines():
        number, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if number == "0" and controllers == "":
            v2 = path
        elif controllers == "name=systemd":
            v1 = path
    return v2 if v2 not in ("", "/") or not v1 else v1


def _cmdline(pid: int, proc: Path) -> str:
    raw = _read(proc / str(pid) / "cmdline", MAX_CMDLINE_BYTES)
    return printable(" ".join(part for part in raw.split("\0") if part))[:400]


def _pids(proc: Path) -> Iterable[int]:
    try:
        names = [entry.name for entry in proc.iterdir()]
    except OSError as exc:
        raise PortError(f"cannot list {proc}: {exc.strerror or exc}; this check needs Linux's /proc") from None
    return [int(n) for n in names[: MAX_PROCESSES * 4] if n.isdigit()][:MAX_PROCESSES]


def listeners(port: int, proc: Path = PROC) -> tuple[Listener, ...]:
    """Every LISTEN socket on `port` (any address) and, where its fds can be read, the process holding it."""
    sockets: list[tuple[str, int]] = []
    tables = [proc / "net" / "tcp", proc / "net" / "tcp6"]
    if not any(t.exists() for t in tables):
        raise PortError(f"no {tables[0]}: this check needs Linux's /proc")
    for table in tables:
        sockets += parse_table(_read(table, MAX_TABLE_BYTES), port)
    if not sockets:
        return ()
    wanted = {inode: address for address, inode in sockets}
    holders: dict[int, int] = {}
    for pid in _pids(proc):
        fds = proc / str(pid) / "fd"
        try:
            entries = list(fds.iterdir())
        except OSError:
            continue
        for fd in entries[: 1 << 20]:
            try:
                link = str(fd.readlink())
            except OSError:
                continue
            m = _SOCKET.fullmatch(link)
            if m and int(m.group(1)) in wanted:
                holders.setdefault(int(m.group(1)), pid)
        if len(holders) == len(wanted):
            break
    out = []
    for address, inode in sockets:
        holder = holders.get(inode)
        if holder is None:
            out.append(Listener(address, port, inode))
        else:
            out.append(Listener(address, port, inode, holder, _cmdline(holder, proc), _cgroup(holder, proc)))
    return tuple(out)


def process_tree(root: int, proc: Path = PROC) -> frozenset[int]:
    """`root` and every process descended from it (parents read from /proc/PID/stat)."""
    parent: dict[int, int] = {}
    for pid in _pids(proc):
        stat = _read(proc / str(pid) / "stat", 4096)
        _, _, rest = stat.rpartition(")")  # the command name in parentheses may hold anything
        fields = rest.split()
        if len(fields) >= 2 and fields[1].isdigit():
            parent[pid] = int(fields[1])
    tree, frontier = {root}, [root]
    while frontier:
        current = frontier.pop()
        for child, ppid in parent.items():
            if ppid == current and child not in tree:
                tree.add(child)
                frontier.append(child)
    return frozenset(tree)


def unit_owner(unit: str) -> Owner:
    """The unit's MainPID and ControlGroup, from `systemctl show`."""
    if not _UNIT.fullmatch(unit) or unit.startswith("-"):
        raise PortError(f"--unit {printable(unit)!r} is not a systemd unit name")
    argv = ["systemctl", "show", "-p", "MainPID", "-p", "ControlGroup", "-p", "ActiveState", "--", unit]
    try:
        out = bounded.command_output(argv, 1 << 16, SYSTEMCTL_TIMEOUT_S)
    except OSError as exc:
        raise PortError(f"cannot run systemctl: {exc.strerror or exc}") from None
    if out.timed_out or out.returncode != 0:
        first = (out.stderr.strip().splitlines() or ["no message"])[0]
        why = f"did not finish within {SYSTEMCTL_TIMEOUT_S:g} s" if out.timed_out else f"failed (exit {out.returncode})"
        raise PortError(f"systemctl show {unit} {why}: {printable(first)}")
    props = dict(line.partition("=")[::2] for line in out.data.decode("utf-8", "replace").splitlines())
    main = props.get("MainPID", "").strip()
    pid = int(main) if main.isdigit() and int(main) > 0 else None
    cgroup = props.get("ControlGroup", "").strip()
    state = printable(props.get("ActiveState", "").strip())[:40] or "unknown"
    tree = process_tree(pid) if pid else frozenset()
    return Owner(f"unit {unit} (MainPID {pid or 0}, {state}, control group {cgroup or 'none'})", pid, cgroup, tree)


def tree_owner(pid: int, proc: Path = PROC) -> Owner:
    alive = (proc / str(pid)).exists()
    return Owner(f"process {pid} and its children", pid if alive else None, "", process_tree(pid, proc))


def _stray(found: Sequence[Listener], owner: Owner) -> list[Listener]:
    return [item for item in found if not owner.owns(item)]


def before_start(found: Sequence[Listener], owner: Owner, port: int, who: str) -> PortVerdict:
    """Free, or held only by the owner (a running unit its restart rebinds): ok. Held by anyone else: not."""
    stray = _stray(found, owner)
    if not stray:
        held = f"held by {owner.description}" if found else "free"
        return PortVerdict(True, f"port {port} is {held}", listeners=tuple(found))
    first = stray[0]
    kill = f"stop it (`kill {first.pid}`, or the unit or container that runs it)" if first.pid else "stop it"
    return PortVerdict(
        False,
        f"port {port} is held by {', '.join(s.named for s in stray)}, not by {owner.description}: {who} could not "
        "bind it, and whatever answers there would be taken for it",
        f"{kill}, or give {who} another port; nothing was started or restarted",
        tuple(found),
    )


def serving(found: Sequence[Listener], owner: Owner, port: int, who: str) -> PortVerdict:
    """The server answering on the port is the owner's: its listener is in the unit's control group (or the
    process tree), and the owner still runs."""
    stray = _stray(found, owner)
    if owner.main_pid is None:
        answering = ", ".join(s.named for s in stray) or "nothing"
        return PortVerdict(
            False,
            f"{who} is not running ({owner.description}) while {answering} answers on port {port}",
            "read the server's log for why it exited (a bind error means the port was taken), stop the other "
            "process, and start the server again",
            tuple(found),
        )
    if stray or not found:
        answering = ", ".join(s.named for s in stray) or "nothing"
        return PortVerdict(
            False,
            f"port {port} is answered by {answering}, not by {owner.description} ({who})",
            "stop the other process, then restart the server; its log shows a bind error if it never served",
            tuple(found),
        )
    return PortVerdict(True, f"port {port} is served by {owner.description}", listeners=tuple(found))
