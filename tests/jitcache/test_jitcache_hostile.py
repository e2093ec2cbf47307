"""Hostile bundles: a bundle is data from another machine. Each one here has valid checksums (recomputed, as an
attacker would) and a real key, so only its hostile part differs; each must be refused with nothing changed on this
node, inside the cache or outside it. Node faults (a cache that cannot be written, a full disk) name the path and
exit 2; SIGTERM mid-unpack leaves no staging directory.
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest
from jitcache_helpers import KEY

from sm120check.jitcache import bundle
from sm120check.jitcache.cli import main

MOD = f"{KEY.flashinfer}/{KEY.arch}/cached_ops/demo"  # the one dir the key implies for module "demo"
LIB = f"{MOD}/demo.so"
STAGING = ".sm120kit-jit-staging-"  # what unpack names its staging directories
SRC = Path(__file__).resolve().parents[2] / "python" / "sm120check" / "src"


def _manifest(
    modules: Mapping[str, Any], files: Iterable[tuple[str, bytes]], key: Mapping[str, str] | None = None
) -> dict[str, Any]:
    return {
        "schema": bundle.SCHEMA,
        "kind": bundle.KIND,
        "key": dict(key or KEY.as_dict()),
        "context": {},
        "modules": dict(modules),
        "files": [
            {"path": p, "sha256": hashlib.sha256(d).hexdigest(), "size": len(d), "mtime_ns": 1} for p, d in files
        ],
        "created": "2026-12-01T00:00:00Z",
        "host": "elsewhere",
    }


def _write(out: Path, manifest: Mapping[str, Any], members: Iterable[tarfile.TarInfo | tuple[str, bytes]]) -> Path:
    """A bundle in the format `pack` writes: gzip'd PAX tar, the manifest first."""
    with tarfile.open(out, "w:gz", compresslevel=1, format=tarfile.PAX_FORMAT) as tar:
        body = json.dumps(manifest).encode()
        info = tarfile.TarInfo(bundle.MANIFEST_NAME)
        info.size = len(body)
        tar.addfile(info, io.BytesIO(body))
        for member in members:
            if isinstance(member, tarfile.TarInfo):
                tar.addfile(member)
            else:
                info = tarfile.TarInfo(member[0])
                info.size = len(member[1])
                tar.addfile(info, io.BytesIO(member[1]))
    return out


def _simple(out: Path, modules: Mapping[str, Any], files: list[tuple[str, bytes]], **kw: Any) -> Path:
    return _write(out, _manifest(modules, files, **kw), files)


def _tree(root: Path) -> dict[str, bytes | None]:
    """Every path under `root` (directories as None), to compare before and after."""
    return {
        p.relative_to(root).as_posix(): (p.read_bytes() if p.is_file() else None)
        for p in sorted(root.rglob("*"))
        if not p.name.endswith(".tar.gz")
    }


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A node's cache root holding one module of this key and one of another key; returns the cache root."""
    monkeypatch.setenv("FLASHINFER_WORKSPACE_BASE", str(tmp_path / "ws"))
    root = tmp_path / "ws" / ".cache" / "flashinfer"
    for rel in (MOD, f"{KEY.flashinfer}/120f/cached_ops/demo", f"{KEY.flashinfer}/{KEY.arch}/cached_ops/other"):
        (root / rel).mkdir(parents=True)
        (root / rel / f"{Path(rel).name}.so").write_bytes(b"precious " + rel.encode())
    return root


def _refused(args: list[str], capsys: pytest.CaptureFixture[str], *needles: str) -> None:
    assert main(args) == 1
    err = capsys.readouterr().err
    for needle in needles:
        assert needle in err


def _assert_refused_and_unchanged(
    tmp_path: Path, node: Path, out: Path, capsys: pytest.CaptureFixture[str], *needles: str
) -> None:
    before = _tree(tmp_path)
    _refused(["verify", "--no-key-check", str(out)], capsys, *needles)  # verify sees what unpack refuses
    _refused(["unpack", "--no-key-check", str(out)], capsys, *needles)
    assert _tree(tmp_path) == before
    assert not list(node.glob(f"{STAGING}*"))


def test_module_name_with_dotdot_is_refused(tmp_path: Path, node: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # J12/J13: a second entry on the module's dir, named to climb out of the staging directory.
    out = _simple(
        tmp_path / "name.tar.gz",
        {"demo": {"dir": MOD, "seconds": 1}, "../../../../../PWN": {"dir": MOD, "seconds": 1}},
        [(LIB, b"ELF"), (f"{MOD}/authorized_keys", b"ssh-ed25519 AAAA attacker\n")],
    )
    _assert_refused_and_unchanged(tmp_path, node, out, capsys, "'../../../../../PWN'", "not a plain name")
    assert not (tmp_path / "PWN").exists()


def test_absolute_module_dir_is_refused(tmp_path: Path, node: Path, capsys: pytest.CaptureFixture[str]) -> None:
    elsewhere = tmp_path / "elsewhere" / "demo"
    out = _simple(tmp_path / "abs.tar.gz", {"demo": {"dir": str(elsewhere)}}, [(LIB, b"ELF")])
    _assert_refused_and_unchanged(tmp_path, node, out, capsys, f"is not '{MOD}'")
    assert not elsewhere.exists()


def test_module_dir_of_another_key_is_refused(tmp_path: Path, node: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # J14: the dir named is another key's existing module: it would be moved out and deleted.
    other = f"{KEY.flashinfer}/120f/cached_ops/demo"
    out = _simple(tmp_path / "other.tar.gz", {"demo": {"dir": other}}, [(LIB, b"ELF")])
    _assert_refused_and_unchanged(tmp_path, node, out, capsys, f"dir '{other}' is not '{MOD}'")


def test_file_outside_every_listed_module_is_refused(
    tmp_path: Path, node: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stray = f"{KEY.flashinfer}/{KEY.arch}/cached_ops/other/other.so"
    out = _simple(tmp_path / "stray.tar.gz", {"demo": {"dir": MOD}}, [(LIB, b"ELF"), (stray, b"replaced")])
    _assert_refused_and_unchanged(tmp_path, node, out, capsys, f"'{stray}': lies under no listed module's dir")


def test_two_modules_claiming_one_dir_are_refused(
    tmp_path: Path, node: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = _simple(
        tmp_path / "twice.tar.gz", {"demo": {"dir": MOD}, "demo2": {"dir": MOD}}, [(LIB, b"ELF"), (f"{MOD}/x", b"x")]
    )
    _assert_refused_and_unchanged(tmp_path, node, out, capsys, f"modules 'demo' and 'demo2' both claim dir '{MOD}'")


def test_module_listed_twice_in_the_json_is_refused(
    tmp_path: Path, node: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files = [(LIB, b"ELF")]
    body = json.dumps(_manifest({"demo": {"dir": MOD}}, files)).replace(
        '"modules": {', f'"modules": {{"demo": {{"dir": "{KEY.flashinfer}/120f/cached_ops/demo"}}, '
    )
    out = tmp_path / "dup.tar.gz"  # the raw text: json.loads would keep only the last "demo"
    with tarfile.open(out, "w:gz", format=tarfile.PAX_FORMAT) as tar:
        for name, data in [(bundle.MANIFEST_NAME, body.encode()), *files]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    _assert_refused_and_unchanged(tmp_path, node, out, capsys, "lists 'demo' twice")


def test_key_that_climbs_out_of_the_cache_is_refused(
    tmp_path: Path, node: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    key = {**KEY.as_dict(), "flashinfer": ".."}
    climbing = f"../{KEY.arch}/cached_ops/demo"
    out = _simple(tmp_path / "key.tar.gz", {"demo": {"dir": climbing}}, [(f"{climbing}/demo.so", b"ELF")], key=key)
    _assert_refused_and_unchanged(tmp_path, node, out, capsys, "key.flashinfer '..' is not a plain directory name")


@pytest.mark.parametrize("kind", [tarfile.SYMTYPE, tarfile.LNKTYPE, tarfile.DIRTYPE, tarfile.CHRTYPE, tarfile.FIFOTYPE])
def test_member_that_is_not_a_plain_file_is_refused(
    tmp_path: Path, node: Path, capsys: pytest.CaptureFixture[str], kind: bytes
) -> None:
    files = [(LIB, b"ELF")]
    special = tarfile.TarInfo(f"{MOD}/build.ninja")
    special.type, special.linkname = kind, "/etc/passwd"
    out = _write(
        tmp_path / "special.tar.gz", _manifest({"demo": {"dir": MOD}}, [*files, (special.name, b"")]), [special, *files]
    )
    _assert_refused_and_unchanged(tmp_path, node, out, capsys, "not a plain file")


def test_aot_install_refuses_a_hostile_name(tmp_path: Path) -> None:
    out = _simple(tmp_path / "aot.tar.gz", {"../../evil": {"dir": MOD}}, [(LIB, b"ELF")])
    with pytest.raises(bundle.BundleError, match="not a plain name"):
        bundle.install_aot(out, tmp_path / "pkg" / "data" / "aot")
    assert not (tmp_path / "pkg").exists() and not (tmp_path / "evil").exists()


def _cli(args: list[str], env: Mapping[str, str], **kw: Any) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "sm120check.jitcache", *args],
        env={**os.environ, "PYTHONPATH": str(SRC), **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        **kw,
    )


class _Zeros(io.RawIOBase):
    def __init__(self, n: int) -> None:
        self.n = n

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        k = min(len(b), self.n)
        b[:k] = bytes(k)
        self.n -= k
        return k


def test_member_larger_than_its_manifest_entry_writes_nothing_past_the_claim(tmp_path: Path, node: Path) -> None:
    # J15: the manifest says 10 bytes, the member is 64 MiB of zeros (a small bundle). The kernel limits every file
    # this unpack writes to 1 MiB: a copy that ran past the claimed size would be killed by SIGXFSZ.
    claim, size = b"0123456789", 64 << 20
    big = tarfile.TarInfo(LIB)
    big.size = size
    out = tmp_path / "bomb.tar.gz"
    with tarfile.open(out, "w:gz", compresslevel=1, format=tarfile.PAX_FORMAT) as tar:
        body = json.dumps(_manifest({"demo": {"dir": MOD}}, [(LIB, claim)])).encode()
        info = tarfile.TarInfo(bundle.MANIFEST_NAME)
        info.size = len(body)
        tar.addfile(info, io.BytesIO(body))
        tar.addfile(big, io.BufferedReader(_Zeros(size)))
    before = _tree(tmp_path)

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))

    env = {"FLASHINFER_WORKSPACE_BASE": str(tmp_path / "ws")}
    proc = _cli(["unpack", "--no-key-check", str(out)], env, preexec_fn=limit)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, err.decode()
    assert f"{size} bytes in the bundle but the manifest says 10" in err.decode()
    assert "File too large" not in err.decode()  # no write went past the limit
    assert _tree(tmp_path) == before
    assert not list(node.glob(f"{STAGING}*"))


def test_sigterm_during_unpack_leaves_no_staging_and_changes_nothing(tmp_path: Path, node: Path) -> None:
    # J20: the bundle arrives through a pipe, half of it; SIGTERM while the unpack waits for the rest.
    data = os.urandom(8 << 20)  # does not compress: half the bundle is half of this file
    whole = _simple(tmp_path / "whole.tar.gz", {"demo": {"dir": MOD}}, [(LIB, data)]).read_bytes()
    fifo = tmp_path / "pipe.tar.gz"
    os.mkfifo(fifo)
    before = _tree(tmp_path)
    proc = _cli(["unpack", "--no-key-check", str(fifo)], {"FLASHINFER_WORKSPACE_BASE": str(tmp_path / "ws")})

    def feed() -> None:
        """Each time the unpack opens the pipe, give it the first half of the bundle and keep the pipe open."""
        while proc.poll() is None:
            try:
                fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)  # ENXIO until a reader has it open
            except OSError:
                time.sleep(0.01)
                continue
            os.set_blocking(fd, True)
            try:
                with os.fdopen(fd, "wb") as pipe:
                    pipe.write(whole[: len(whole) // 2])
                    pipe.flush()
                    while proc.poll() is None:
                        time.sleep(0.05)
            except BrokenPipeError:
                continue  # the reader closed its end (it had read what it wanted): serve the next open

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    deadline = time.monotonic() + 60
    staged: list[Path] = []
    while time.monotonic() < deadline and proc.poll() is None:
        staged = [p for p in node.glob(f"{STAGING}*/**/demo.so") if p.stat().st_size > (1 << 20)]
        if staged:
            break
        time.sleep(0.02)
    if not staged:
        proc.kill()
        pytest.fail(f"the unpack never staged a file: {proc.communicate()[1].decode()[-2000:]}")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    feeder.join(timeout=10)
    assert proc.returncode == 128 + signal.SIGTERM, err.decode()
    assert "terminated (SIGTERM)" in err.decode()
    assert not list(node.glob(f"{STAGING}*"))
    assert _tree(tmp_path) == before


def test_staging_left_by_a_killed_unpack_is_removed_by_the_next(
    tmp_path: Path, node: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    left = node / f"{STAGING}dead"
    (left / "files").mkdir(parents=True)
    (left / "files" / "big").write_bytes(b"x" * 1000)
    out = _simple(tmp_path / "ok.tar.gz", {"demo": {"dir": MOD}}, [(LIB, b"ELF")])
    assert main(["unpack", "--no-key-check", str(out)]) == 0
    assert not left.exists()
    assert (node / LIB).read_bytes() == b"ELF"


@pytest.mark.parametrize("where", ["file", "proc"])
def test_cache_that_cannot_be_written_exits_2_naming_the_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], where: str
) -> None:
    # J17 (root ignores chmod 0555): a file where the cache's parent directory belongs, or a path under /proc.
    base = tmp_path / "not-a-dir"
    base.write_text("a file\n")
    if where == "proc":
        base = Path("/proc/self")
    monkeypatch.setenv("FLASHINFER_WORKSPACE_BASE", str(base))
    out = _simple(tmp_path / "ok.tar.gz", {"demo": {"dir": MOD}}, [(LIB, b"ELF")])
    assert main(["unpack", "--no-key-check", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"cannot write {base}/.cache" in err and "writable directory" in err
    assert "Traceback" not in err


def test_full_disk_says_so_naming_the_path(
    tmp_path: Path, node: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # J18: ENOSPC while staging is the node's disk, not a damaged bundle.
    def full(out: Any, chunk: bytes) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(bundle, "_write_all", full, raising=False)
    out = _simple(tmp_path / "ok.tar.gz", {"demo": {"dir": MOD}}, [(LIB, b"ELF" * 1000)])
    before = _tree(tmp_path)
    assert main(["unpack", "--no-key-check", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"the disk holding {node}/{STAGING}" in err and "is full" in err
    assert "copy it again" not in err
    assert _tree(tmp_path) == before


def test_bundle_larger_than_the_free_space_is_refused_before_writing(
    tmp_path: Path, node: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(shutil, "disk_usage", lambda path: _Usage(100))  # what bundle.py asks
    out = _simple(tmp_path / "ok.tar.gz", {"demo": {"dir": MOD}}, [(LIB, b"E" * 1000)])
    before = _tree(tmp_path)
    assert main(["unpack", "--no-key-check", str(out)]) == 2
    assert "1000 bytes needed, 100 free" in capsys.readouterr().err
    assert _tree(tmp_path) == before


class _Usage:
    def __init__(self, free: int) -> None:
        self.total, self.used, self.free = free, 0, free


def test_manifest_nested_past_the_recursion_limit_is_refused(
    tmp_path: Path, node: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # J21: a deep manifest was a RecursionError traceback.
    out = tmp_path / "deep.tar.gz"
    with tarfile.open(out, "w:gz", format=tarfile.PAX_FORMAT) as tar:
        body = b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
        info = tarfile.TarInfo(bundle.MANIFEST_NAME)
        info.size = len(body)
        tar.addfile(info, io.BytesIO(body))
    _assert_refused_and_unchanged(tmp_path, node, out, capsys, "cannot read its manifest")


def test_failure_while_moving_modules_into_place_puts_back_what_was_there(
    tmp_path: Path, node: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    two = f"{KEY.flashinfer}/{KEY.arch}/cached_ops/demo2"
    out = _simple(
        tmp_path / "two.tar.gz",
        {"demo": {"dir": MOD}, "demo2": {"dir": two}},
        [(LIB, b"new demo"), (f"{two}/demo2.so", b"new demo2")],
    )
    before = _tree(tmp_path)
    replace = Path.replace

    def failing(self: Path, target: Any) -> Any:
        if self.name == "demo2" and str(target).startswith(str(node / KEY.flashinfer)):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(target))
        return replace(self, target)

    monkeypatch.setattr(Path, "replace", failing)
    assert main(["unpack", "--no-key-check", str(out)]) == 2
    monkeypatch.undo()
    assert f"cannot write {node / two}" in capsys.readouterr().err
    assert _tree(tmp_path) == before  # demo's old directory is back, demo2 was never placed
    assert not list(node.glob(f"{STAGING}*"))


def test_unpack_waits_for_another_only_within_a_bound(
    tmp_path: Path, node: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A wedged unpack elsewhere holds the cache's lock: this one gives up with exit 2 and says who to look for."""
    import fcntl

    monkeypatch.setattr(bundle, "LOCK_WAIT_S", 1.0)
    node.mkdir(parents=True, exist_ok=True)
    holder = os.open(node, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(holder, fcntl.LOCK_EX)
        out = _simple(tmp_path / "ok.tar.gz", {"demo": {"dir": MOD}}, [(LIB, b"ELF" * 100)])
        before = _tree(tmp_path)
        assert main(["unpack", "--no-key-check", str(out)]) == 2
    finally:
        os.close(holder)
    err = capsys.readouterr().err
    assert f"another unpack has held the lock on {node}" in err and "fuser" in err
    assert _tree(tmp_path) == before


EARLY = "(Compressed file ended before the end-of-stream marker was reached)"


@pytest.mark.parametrize(
    ("cut", "said"),
    [
        (
            8,
            "failed verification, nothing was installed:\n  the bundle's gzip stream ends early or is damaged "
            f"{EARLY}, though every file's sha256 matched: copy it",
        ),
        (30, f"is not a readable gzip'd tar {EARLY}: copy it again"),  # a small bundle: the cut reaches its start
    ],
)
def test_bundle_with_its_gzip_trailer_cut_is_refused_though_every_sha256_matches(
    tmp_path: Path, node: Path, capsys: pytest.CaptureFixture[str], cut: int, said: str
) -> None:
    # Probe 2, J9: the last bytes of the gzip stream (its CRC and length) gone; every member is still whole.
    whole = _simple(tmp_path / "whole.tar.gz", {"demo": {"dir": MOD}}, [(LIB, os.urandom(4096))])
    out = tmp_path / "cut.tar.gz"
    out.write_bytes(whole.read_bytes()[:-cut])
    _assert_refused_and_unchanged(tmp_path, node, out, capsys, f"sm120check jit: {out} {said}")
    assert main(["verify", "--no-key-check", str(whole)]) == 0  # the same bundle, whole, passes
