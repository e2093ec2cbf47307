"""Read a file anyone may have planted: bounded before it is read, regular files only, never blocking; run a
command with its output bounded; write a file atomically, never through a planted link, under a lock.

Every whole-file read of the tools goes through here (the manifest, bench's prompt files and datasets, crossover's
JSONL, verify-launch's log and launch command, fleet node files, sysfs and fact files, JIT stamps). A FIFO opened
for reading blocks until a writer comes and /dev/zero never ends: the file is opened non-blocking and refused unless
fstat says it is a regular file, and at most `limit + 1` bytes are read, so a file over the bound costs `limit`
bytes of memory, never more. Text must be UTF-8; the error names the file, the line and the fix.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import os
import signal
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

UTF8_FIX = "convert the file to UTF-8 (e.g. `iconv -f latin1 -t utf-8 FILE > FILE.utf8`)"
_CHUNK = 1 << 16


class Unreadable(Exception):
    """Why a file could not be read (missing, not a regular file, over its bound, not UTF-8); the message names
    the file and, for text, the line."""


class Missing(Unreadable):
    """No file at the path (or a link that leads nowhere)."""


class TooLarge(Unreadable):
    """Larger than the bound its reader set."""


class NotText(Unreadable):
    """Not UTF-8, or binary (NUL bytes); the message names the line and the fix."""


def size_text(limit: int) -> str:
    """`limit` bytes as a person reads it: 4 MiB, 64 KiB, 1 GiB, or a byte count."""
    for shift, unit in ((30, "GiB"), (20, "MiB"), (10, "KiB")):
        if limit >= 1 << shift and limit % (1 << shift) == 0:
            return f"{limit >> shift} {unit}"
    return f"{limit} bytes"


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def open_regular(path: Path, follow: bool = True) -> int:
    """A read-only descriptor of `path`, which must be a regular file (a link to one when `follow`); raises
    Unreadable otherwise. Non-blocking, so a FIFO is refused instead of waiting for a writer."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow:
            raise Unreadable(f"{path}: is a symbolic link, not followed here") from None
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):  # no file there (or a file where a directory should be)
            raise Missing(f"{path}: {exc.strerror}") from None
        if exc.errno == errno.ENXIO:  # a socket, or a FIFO without a writer on some systems
            raise Unreadable(f"{path}: not a regular file") from None
        raise Unreadable(f"{path}: {exc.strerror or exc}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        what = _kind(mode)
        raise Unreadable(
            f"{path}: is {what}, not a regular file" if what != "not a regular file" else f"{path}: {what}"
        )
    return fd


def _read_up_to(fd: int, path: Path, count: int) -> bytes:
    chunks: list[bytes] = []
    total = 0
    while total < count:
        try:
            chunk = os.read(fd, min(_CHUNK, count - total))
        except OSError as exc:
            raise Unreadable(f"{path}: {exc.strerror or exc}") from None
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    return b"".join(chunks)


def read_bytes(path: Path, limit: int, follow: bool = True) -> bytes:
    """The whole file, refused (Unreadable) when it is larger than `limit` bytes; never reads more than limit + 1."""
    fd = open_regular(path, follow)
    try:
        data = _read_up_to(fd, path, limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise TooLarge(f"{path}: larger than {size_text(limit)}, the bound on this file")
    return data


def read_tail(path: Path, limit: int) -> tuple[bytes, bool]:
    """The last `limit` bytes of the file (the newest lines of a log) and whether the start was cut."""
    fd = open_regular(path)
    try:
        size = os.fstat(fd).st_size
        cut = size > limit
        if cut:
            os.lseek(fd, size - limit, os.SEEK_SET)
        data = _read_up_to(fd, path, limit)
    finally:
        os.close(fd)
    return data, cut


def decode(data: bytes, path: Path | str, nul_ok: bool = False) -> str:
    """UTF-8 text (a BOM dropped); raises Unreadable naming the file, the line and the fix for anything else."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        start = exc.start + (3 if data.startswith(b"\xef\xbb\xbf") else 0)
        line = data.count(b"\n", 0, start) + 1
        column = start - (data.rfind(b"\n", 0, start) + 1) + 1
        raise NotText(
            f"{path}:{line}: not UTF-8 text (byte 0x{data[start]:02x} at column {column}); {UTF8_FIX}"
        ) from None
    if not nul_ok and "\x00" in text:
        line = text.count("\n", 0, text.index("\x00")) + 1
        raise NotText(f"{path}:{line}: binary content (NUL bytes), not a text file")
    return text


def read_text(path: Path, limit: int, follow: bool = True, lenient: bool = False) -> str:
    """`read_bytes` then `decode`: UTF-8 text of at most `limit` bytes, from a regular file. `lenient` (for what the
    kernel writes: /proc, sysfs) replaces undecodable bytes instead of refusing the file."""
    data = read_bytes(path, limit, follow)
    return data.decode("utf-8", "replace") if lenient else decode(data, path)


@dataclass(frozen=True)
class Captured:
    """What a child wrote to its pipes, bounded (see `capture`)."""

    stdout: bytes  # its first `limit` bytes (or its newest, keep_newest)
    stderr: bytes  # its newest `err_limit` bytes
    cut: bool  # stdout was longer than the bound: some of it is left out
    stopped: bool  # stdout reached the bound and the process group was killed (not keep_newest)
    timed_out: bool  # killed at the time bound
    silent: bool = False  # killed after `idle` seconds without a byte on either pipe (a hung child)


def _keep(kept: collections.deque[bytes], size: int, chunk: bytes, limit: int) -> tuple[int, bool]:
    """Append `chunk` keeping the newest `limit` bytes; returns the new size and whether anything was dropped."""
    kept.append(chunk)
    size += len(chunk)
    dropped = False
    while size > limit and kept:
        extra = size - limit
        if len(kept[0]) <= extra:
            size -= len(kept.popleft())
        else:
            kept[0] = kept[0][extra:]
            size -= extra
        dropped = True
    return size, dropped


def capture(
    proc: subprocess.Popen[bytes],
    limit: int,
    timeout: float,
    kill: Callable[[], None],
    *,
    keep_newest: bool = False,
    err_limit: int = 64 << 10,
    idle: float | None = None,
) -> Captured:
    """Read a started child's stdout and stderr pipes as they are written, never holding more than `limit` bytes of
    stdout and `err_limit` of stderr: at the time bound, or once stdout passed `limit` (unless `keep_newest`, which
    keeps its newest bytes instead), `kill()` stops the child (its process group) and reading ends. A command that
    writes without end costs the bound in memory, never more. With `idle`, a child that writes nothing to either pipe
    for that many seconds is taken as hung and killed too (`silent`). The pipes are closed on return."""
    import selectors

    deadline = time.monotonic() + max(timeout, 0.0)
    pipes = {p.fileno(): p for p in (proc.stdout, proc.stderr) if p is not None}
    out_fd = proc.stdout.fileno() if proc.stdout is not None else -1
    out: collections.deque[bytes] = collections.deque()
    err: collections.deque[bytes] = collections.deque()
    out_size = err_size = 0
    cut = stopped = timed_out = silent = False
    heard = time.monotonic()
    with selectors.DefaultSelector() as selector:
        for fd in pipes:
            selector.register(fd, selectors.EVENT_READ)
        try:
            while pipes:
                left = deadline - time.monotonic()
                if left <= 0:
                    timed_out = True
                    kill()
                    break
                if idle is not None and time.monotonic() - heard > idle:
                    silent = True
                    kill()
                    break
                for key, _ in selector.select(min(left, 1.0)):
                    heard = time.monotonic()
                    fd = int(key.fd)
                    try:
                        chunk = os.read(fd, _CHUNK)
                    except OSError:
                        chunk = b""
                    if not chunk:
                        selector.unregister(fd)
                        pipes.pop(fd)
                    elif fd != out_fd:
                        err_size, _ = _keep(err, err_size, chunk, err_limit)
                    elif keep_newest:
                        out_size, dropped = _keep(out, out_size, chunk, limit)
                        cut = cut or dropped
                    elif out_size + len(chunk) > limit:
                        out.append(chunk[: limit - out_size])
                        out_size = limit
                        cut = stopped = True
                        kill()  # the rest is not wanted: stop the command instead of reading it
                        pipes.clear()
                        break
                    else:
                        out.append(chunk)
                        out_size += len(chunk)
        finally:
            for pipe in (proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()
    return Captured(b"".join(out), b"".join(err), cut, stopped, timed_out, silent)


@dataclass(frozen=True)
class Output:
    """What a command wrote, bounded: `data` is its newest (keep_newest) or first `limit` bytes of stdout."""

    returncode: int  # negative: killed by that signal (-9 at the time bound)
    data: bytes
    cut: bool  # stdout was longer than the bound: some of it is left out
    stderr: str  # its last 4 KiB
    timed_out: bool = False


def command_output(argv: Sequence[str], limit: int, timeout: float, keep_newest: bool = True) -> Output:
    """Run `argv` (its own process group, killed whole at `timeout` s) and keep at most `limit` bytes of stdout:
    the newest (a log's last lines) or the first (then the command is stopped once it has written them). Memory
    stays at `limit` whatever it writes. Raises OSError when it cannot start."""
    proc = subprocess.Popen(
        list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, start_new_session=True
    )

    def kill() -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)

    try:
        got = capture(proc, limit, timeout, kill, keep_newest=keep_newest, err_limit=4096)
        code = proc.wait()
    finally:
        if proc.poll() is None:
            kill()
            proc.wait()
    message = got.stderr.decode("utf-8", "replace")
    if got.stopped:
        return Output(0, got.stdout, True, message)  # stopped by us once it had written enough: not a failure
    return Output(code, got.stdout, got.cut, message, got.timed_out)


def write_atomic(path: Path, data: bytes, follow: bool = False) -> Path:
    """Replace the file at `path` with `data`, atomically: a new temporary file beside it (mkstemp: O_EXCL, so a
    link planted at any name is never written through), flushed, given the old file's mode (and owner, where this
    user may; a new file: 0666 less the umask), then renamed over it. A link at `path` is replaced, or with `follow`
    (a user's own file, such as a symlinked stack.yml) the file it leads to is. A reader sees the old file or the
    new one; on any error the temporary file is removed and the old file is left as it was. Returns the path
    written."""
    target = Path(os.path.realpath(path)) if follow else path
    try:
        old: os.stat_result | None = target.lstat()
    except FileNotFoundError:
        old = None
    if old is not None and not stat.S_ISREG(old.st_mode):
        old = None  # a link (not followed) or something else: replaced, its mode not copied
    fd, name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
            if old is not None:
                os.fchmod(handle.fileno(), stat.S_IMODE(old.st_mode))
                if (old.st_uid, old.st_gid) != (os.geteuid(), os.getegid()):
                    with contextlib.suppress(PermissionError):
                        os.fchown(handle.fileno(), old.st_uid, old.st_gid)
            else:
                mask = os.umask(0)
                os.umask(mask)
                os.fchmod(handle.fileno(), 0o666 & ~mask)
        Path(name).replace(target)
    except BaseException:
        with contextlib.suppress(OSError):
            Path(name).unlink()
        raise
    return target


@contextlib.contextmanager
def locked(path: Path, wait: float = 600.0, waiting: Callable[[], None] | None = None) -> Iterator[None]:
    """Hold an exclusive lock for `path` (fcntl.flock on `.NAME.lock` beside it, opened without following a link),
    so two writers of one file take turns. `waiting()` is called once when another holder makes this one wait;
    OSError (a read-only directory, a planted link, `wait` seconds passed) when the lock cannot be had."""
    import fcntl

    lock = path.with_name(f".{path.name}.lock")
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        deadline = time.monotonic() + wait
        told = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(errno.ETIMEDOUT, f"another run held {lock} for {wait:.0f} s") from None
                if waiting is not None and not told:
                    waiting()
                    told = True
                time.sleep(0.1)
        yield
    finally:
        os.close(fd)  # releases the lock
