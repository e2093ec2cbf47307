#!/usr/bin/env python3
"""FlashInfer's JIT toolchain for the lent GPU machine, carried in parts: one device call carries 64 MiB with the
tree, and FlashInfer 0.7.2 (the first release with `pcie_ipc_comm`, issue #38) is a 63 MiB wheel on its own.

    python3 scripts/device/jit_carry.py build      # here: the wheels (cp312), one tar, cut into .carry-jit-1, -2, ...
    python3 scripts/device/jit_carry.py install    # there: every part checked, joined, the wheels installed into a venv

The parts go in consecutive calls on one warm machine (`carry: [".carry-jit-1"]`, then `[".carry-jit-2"]`): a path
a call does not carry stays there. Each part's folder holds the whole manifest (jit-carry.json), so `install` checks
every part's size and sha256, the joined tar's, and each wheel's before anything is written. The venv it makes holds
the carried wheels whole (FlashInfer's CUTLASS, CCCL and spdlog headers, tvm-ffi's sources, ninja's binary in its
bin/), then the stack venv's site-packages with its own .pth files (SGLang's stack, then the image's torch), so the
carried wheels shadow the stack's pruned FlashInfer 0.6.14 and tvm-ffi 0.1.11.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from sglang_stack import CACHE, sha256, wheel_for  # noqa: E402
from sglang_stack import Wheel as Item  # noqa: E402  (file, bytes, sha256: a wheel, the tar or a part)

PINS = ("flashinfer-python==0.7.2", "apache-tvm-ffi==0.1.15.post2", "ninja==1.13.2")
PART_MIB = 40  # with the tree (about 8 MiB) well inside the 64 MiB a call carries
MANIFEST = "jit-carry.json"
STAMP = ".sm120kit-jit-carry.sha256"
_SHA = re.compile(r"[0-9a-f]{64}")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")  # a plain file name: no separator, no leading dot
MAX_BYTES = 1 << 30


@dataclass(frozen=True)
class Manifest:
    """What `build` cut: the wheels in the tar, the tar itself, and its parts in order (part i in .carry-jit-i)."""

    wheels: tuple[Item, ...]
    tar: Item
    parts: tuple[Item, ...]

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1) + "\n"

    @staticmethod
    def read(path: Path) -> Manifest:
        """The manifest of a carried part, every field checked: it comes from another machine."""
        fix = "build the parts again here (`jit_carry.py build`) and carry them"
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
            wheels = tuple(_item(w, ".whl") for w in raw["wheels"])
            tar = _item(raw["tar"], ".tar")
            parts = tuple(_item(p, "") for p in raw["parts"])
        except FileNotFoundError:
            raise SystemExit(f"{path}: missing; {fix}") from None
        except (OSError, KeyError, TypeError, ValueError) as exc:
            raise SystemExit(f"{path}: not a jit-carry manifest ({exc}); {fix}") from None
        if not wheels or not parts:
            raise SystemExit(f"{path}: no wheels or no parts; {fix}")
        if sum(p.bytes for p in parts) != tar.bytes:
            raise SystemExit(f"{path}: the parts' sizes do not add up to the tar's {tar.bytes} bytes; {fix}")
        return Manifest(wheels, tar, parts)


def _item(raw: object, suffix: str) -> Item:
    if not isinstance(raw, dict):
        raise ValueError(f"expected an object, got {raw!r}")
    name, size, digest = raw["file"], raw["bytes"], raw["sha256"]
    if not isinstance(name, str) or not _NAME.fullmatch(name) or not name.endswith(suffix):
        raise ValueError(f"file {name!r} is not a plain file name ending in {suffix!r}")
    if not isinstance(size, int) or isinstance(size, bool) or not 0 < size <= MAX_BYTES:
        raise ValueError(f"{name}: bytes {size!r} is not a size from 1 to {MAX_BYTES}")
    if not isinstance(digest, str) or not _SHA.fullmatch(digest):
        raise ValueError(f"{name}: sha256 {digest!r} is not 64 lowercase hex digits")
    return Item(name, size, digest)


def _describe(path: Path) -> Item:
    return Item(path.name, path.stat().st_size, sha256(path))


def build(wheels: list[Path], out: Path, part_mib: int = PART_MIB) -> Manifest:
    """Pack the wheels into one tar, cut it into parts of at most part_mib MiB: out/.carry-jit-N/jit.tar.N, each
    folder with the manifest. Parts of an earlier build are removed first."""
    if part_mib < 1:
        raise SystemExit(f"--part-mib {part_mib}: expected 1 MiB or more")
    for old in out.glob(".carry-jit-*"):
        shutil.rmtree(old)
    with tempfile.TemporaryDirectory() as tmp:
        tar_path = Path(tmp) / "jit.tar"
        with tarfile.open(tar_path, "w", format=tarfile.PAX_FORMAT) as tar:
            for wheel in wheels:
                info = tar.gettarinfo(str(wheel), arcname=wheel.name)
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                info.mtime = 0
                with wheel.open("rb") as handle:
                    tar.addfile(info, handle)
        size, step = tar_path.stat().st_size, part_mib << 20
        parts = []
        with tar_path.open("rb") as handle:
            for i in range(1, -(-size // step) + 1):
                folder = out / f".carry-jit-{i}"
                folder.mkdir(parents=True)
                part = folder / f"jit.tar.{i}"
                part.write_bytes(handle.read(step))
                parts.append(_describe(part))
        manifest = Manifest(tuple(_describe(w) for w in wheels), Item("jit.tar", size, sha256(tar_path)), tuple(parts))
    for i in range(1, len(parts) + 1):
        (out / f".carry-jit-{i}" / MANIFEST).write_text(manifest.to_json(), encoding="utf-8")
    return manifest


def join(folders: list[Path], dest: Path) -> Manifest:
    """Check every part against the manifest (the same in every folder), join them, check the tar and extract the
    wheels it lists into dest. Raises SystemExit naming the part and the fix before writing anything."""
    if not folders:
        raise SystemExit("no part folders given: name .carry-jit-1 .carry-jit-2 ... in order")
    manifests = [Manifest.read(f / MANIFEST) for f in folders]
    manifest = manifests[0]
    for folder, other in zip(folders[1:], manifests[1:], strict=True):
        if other != manifest:
            raise SystemExit(
                f"{folder / MANIFEST} differs from {folders[0] / MANIFEST}: the parts come from two builds"
            )
    if len(folders) != len(manifest.parts):
        raise SystemExit(f"{len(folders)} part folders given, the manifest lists {len(manifest.parts)}: carry them all")
    for folder, part in zip(folders, manifest.parts, strict=True):
        path = folder / part.file
        if not path.is_file():
            raise SystemExit(f"{path}: missing (the manifest lists {part.file} in {folder.name}); carry that part")
        if path.stat().st_size != part.bytes or sha256(path) != part.sha256:
            raise SystemExit(f"{path}: size or sha256 differs from the manifest; carry that part again")
    digest = hashlib.sha256()
    blob = io.BytesIO()
    for folder, part in zip(folders, manifest.parts, strict=True):
        data = (folder / part.file).read_bytes()
        digest.update(data)
        blob.write(data)
    if digest.hexdigest() != manifest.tar.sha256:
        raise SystemExit(f"the joined parts' sha256 differs from the manifest's tar: parts out of order? ({folders})")
    blob.seek(0)
    wanted = {w.file: w for w in manifest.wheels}
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=blob, mode="r:") as tar:
        members = tar.getmembers()
        names = sorted(m.name for m in members)
        if names != sorted(wanted) or not all(m.isfile() for m in members):
            raise SystemExit(f"the joined tar holds {names}, the manifest lists {sorted(wanted)}")
        tar.extractall(dest, filter="data")
    for wheel in wanted.values():
        path = dest / wheel.file
        if path.stat().st_size != wheel.bytes or sha256(path) != wheel.sha256:
            raise SystemExit(f"{path}: size or sha256 differs from the manifest")
    return manifest


def install_wheel(wheel: Path, site: Path, bindir: Path) -> None:
    """Unpack one wheel as pip would without pip: its files into site, *.data/scripts into bindir (executable),
    *.data/purelib and platlib into site. Member names that leave their folder are refused."""
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            name = info.filename
            if info.is_dir():
                continue
            if name.startswith("/") or ".." in Path(name).parts:
                raise SystemExit(f"{wheel.name}: member {name!r} leaves the install folder")
            parts = Path(name).parts
            kind = parts[1] if parts[0].endswith(".data") and len(parts) > 2 else ""
            if kind and kind not in ("scripts", "purelib", "platlib"):
                raise SystemExit(f"{wheel.name}: member {name!r}: wheel data of kind {kind!r} is not installed here")
            target = (bindir if kind == "scripts" else site) / Path(*parts[2:]) if kind else site / name
            target.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(info) as src, target.open("wb") as dst:
                shutil.copyfileobj(src, dst)
            mode = (info.external_attr >> 16) & 0o777
            if kind == "scripts":
                mode |= 0o755
            if mode:
                target.chmod(mode)


def install(folders: list[Path], venv: Path, on_top: Path | None) -> None:
    """A venv at `venv` holding the carried wheels whole, then (a .pth line) `on_top`'s site-packages. Idempotent:
    a venv already holding this carry (the tar's sha256 stamp) is left as it is."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    site = venv / "lib" / version / "site-packages"
    with tempfile.TemporaryDirectory() as tmp:
        manifest = join(folders, Path(tmp))
        stamp = site / STAMP
        if stamp.is_file() and stamp.read_text(encoding="utf-8").strip() == manifest.tar.sha256:
            print(f"{venv}: already holds this carry", flush=True)
            return
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
        for wheel in manifest.wheels:
            install_wheel(Path(tmp) / wheel.file, site, venv / "bin")
    if on_top is not None:
        below = on_top / "lib" / version / "site-packages"
        if not below.is_dir():
            raise SystemExit(f"--on-top {on_top}: no {below}; make the stack venv first (the venv phase)")
        # addsitedir, not a bare path: the .pth files there (the stack's line to the image's torch) count too
        (site / "zz-on-top.pth").write_text(f"import site; site.addsitedir({str(below)!r})\n", encoding="utf-8")
    (site / STAMP).write_text(manifest.tar.sha256 + "\n", encoding="utf-8")
    names = ", ".join(w.file.split("-")[0] + " " + w.file.split("-")[1] for w in manifest.wheels)
    print(f"{venv}: {names}" + (f", then {on_top}" if on_top else ""), flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="download the pins (cp312) and cut them into .carry-jit-N folders")
    b.add_argument("--out", type=Path, default=ROOT, help="where the .carry-jit-N folders go (default: the tree)")
    b.add_argument("--cache", type=Path, default=CACHE)
    b.add_argument("--part-mib", type=int, default=PART_MIB)
    i = sub.add_parser("install", help="check and join the parts, make the JIT venv (on the GPU machine)")
    i.add_argument("--parts", type=Path, nargs="+", help="the .carry-jit-N folders in order (default: the tree's)")
    i.add_argument("--venv", type=Path, required=True)
    i.add_argument("--on-top", type=Path, help="the venv whose site-packages follow the carried wheels")
    args = parser.parse_args(argv)
    if args.cmd == "build":
        args.cache.mkdir(parents=True, exist_ok=True)
        manifest = build([wheel_for(pin, args.cache) for pin in PINS], args.out, args.part_mib)
        for n, part in enumerate(manifest.parts, 1):
            print(f".carry-jit-{n}: {part.file} {part.bytes >> 20} MiB", flush=True)
        return 0
    install(args.parts or carried(ROOT), args.venv, args.on_top)
    return 0


def carried(where: Path) -> list[Path]:
    """The .carry-jit-N folders under `where`, by N."""
    found = [p for p in where.glob(".carry-jit-*") if p.is_dir() and p.name.rsplit("-", 1)[1].isdigit()]
    return sorted(found, key=lambda p: int(p.name.rsplit("-", 1)[1]))


if __name__ == "__main__":
    sys.exit(main())
