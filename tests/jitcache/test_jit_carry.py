"""scripts/device/jit_carry.py: FlashInfer's JIT toolchain cut into parts the device tool can carry, joined and
installed on the other side. Real wheels (ninja and apache-tvm-ffi for this interpreter, from pip's configured
index), cut into 1 MiB parts so the join has several to check."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
WHEELS = ROOT / ".cache" / "jit-carry-test"
PINS = ("ninja==1.13.2", "apache-tvm-ffi==0.1.15.post2")

pytestmark = pytest.mark.slow


def _module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("jit_carry", ROOT / "scripts" / "device" / "jit_carry.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["jit_carry"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


jit_carry = _module()


@pytest.fixture(scope="module")
def wheels() -> list[Path]:
    """The real wheels for this interpreter, downloaded once."""
    WHEELS.mkdir(parents=True, exist_ok=True)
    found = sorted(WHEELS.glob("*.whl"))
    if len(found) != len(PINS):
        for old in found:
            old.unlink()
        pip = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "-d", str(WHEELS)]
        subprocess.run([*pip, *PINS], check=True, timeout=600)
        found = sorted(WHEELS.glob("*.whl"))
    assert len(found) == len(PINS), found
    return found


@pytest.fixture
def parts(wheels: list[Path], tmp_path: Path) -> list[Path]:
    manifest = jit_carry.build(wheels, tmp_path, part_mib=1)
    folders = jit_carry.carried(tmp_path)
    assert len(folders) == len(manifest.parts) >= 3
    return list(folders)


def test_the_parts_join_into_a_venv_that_runs_the_carried_wheels(parts: list[Path], tmp_path: Path) -> None:
    """The venv below is laid out as the stack venv is: its site-packages holds a .pth line to a further folder (the
    image's site-packages, where torch is); the JIT venv must see that folder too."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    stack = tmp_path / "stack-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(stack)], check=True, timeout=120)
    image = tmp_path / "image-site"
    (image / "imagemod").mkdir(parents=True)
    (image / "imagemod" / "__init__.py").write_text("")
    purelib = sysconfig.get_paths()["purelib"]  # typing_extensions for tvm_ffi, as the image's site has it
    (stack / "lib" / version / "site-packages" / "zz-image-site.pth").write_text(f"{image}\n{purelib}\n")
    venv = tmp_path / "jit-venv"
    jit_carry.install(parts, venv, stack)
    py = venv / "bin" / "python"
    probe = "import tvm_ffi, ninja, imagemod; print(tvm_ffi.__file__); print(imagemod.__file__)"
    run = subprocess.run([str(py), "-c", probe], capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stderr
    tvm_file, below = run.stdout.splitlines()
    assert tvm_file.startswith(str(venv)), "tvm_ffi must come from the carried wheel, not the venv below"
    assert below.startswith(str(image)), "the stack venv's own .pth lines (the image's torch) must reach the JIT venv"
    ninja = subprocess.run([str(venv / "bin" / "ninja"), "--version"], capture_output=True, text=True, timeout=60)
    assert ninja.stdout.startswith("1.13.2"), "FlashInfer runs `ninja` by name: the wheel's binary must be in bin/"
    again = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "device" / "jit_carry.py"), "install", "--venv", str(venv),
         "--parts", *map(str, parts)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert again.returncode == 0 and "already holds this carry" in again.stdout, again.stdout + again.stderr


def test_a_changed_part_is_refused_by_name_before_the_venv_is_made(parts: list[Path], tmp_path: Path) -> None:
    part = next(parts[1].glob("jit.tar.*"))
    data = bytearray(part.read_bytes())
    data[100] ^= 0xFF
    part.write_bytes(bytes(data))
    venv = tmp_path / "jit-venv"
    with pytest.raises(SystemExit, match=rf"{part.name}: size or sha256 differs from the manifest; carry that part"):
        jit_carry.install(parts, venv, None)
    assert not venv.exists()


def test_a_missing_part_or_parts_out_of_order_are_refused(parts: list[Path], tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match=r"part folders given, the manifest lists .*: carry them all"):
        jit_carry.join(parts[:-1], tmp_path / "a")
    swapped = [parts[1], parts[0], *parts[2:]]
    with pytest.raises(SystemExit, match=r"jit\.tar\.2: missing|jit\.tar\.1: missing"):
        jit_carry.join(swapped, tmp_path / "b")
    shutil.rmtree(parts[-1])
    with pytest.raises(SystemExit, match=r"jit-carry\.json: missing"):
        jit_carry.join(parts, tmp_path / "c")


def test_parts_of_two_builds_are_refused(wheels: list[Path], parts: list[Path], tmp_path: Path) -> None:
    other = tmp_path / "other"
    jit_carry.build(wheels[:1], other, part_mib=1)
    mixed = [*parts[:-1], jit_carry.carried(other)[0]]
    with pytest.raises(SystemExit, match=r"differs from .*: the parts come from two builds"):
        jit_carry.join(mixed, tmp_path / "x")


@pytest.mark.parametrize(
    ("field", "value", "said"),
    [
        ("file", "../../etc/x.whl", "is not a plain file name"),
        ("bytes", -1, "is not a size"),
        ("sha256", "ABC", "is not 64 lowercase hex digits"),
    ],
)
def test_a_hostile_manifest_is_refused_naming_the_field(
    parts: list[Path], tmp_path: Path, field: str, value: object, said: str
) -> None:
    """The manifest comes from another machine: a wheel name that leaves the folder, a bad size or digest is named."""
    for folder in parts:
        path = folder / jit_carry.MANIFEST
        raw = json.loads(path.read_text())
        raw["wheels"][0][field] = value
        path.write_text(json.dumps(raw))
    with pytest.raises(SystemExit, match=rf"not a jit-carry manifest .*{said}.*; build the parts again"):
        jit_carry.join(parts, tmp_path / "x")
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize(
    ("member", "said"),
    [("../escape.py", "leaves the install folder"), ("pkg-1.0.data/headers/pkg.h", "wheel data of kind 'headers'")],
)
def test_a_wheel_member_outside_site_and_bin_is_refused(tmp_path: Path, member: str, said: str) -> None:
    """A joined wheel is hostile input: a member that leaves its folder, or data this installer has no place for, is
    named instead of written somewhere it does not belong."""
    wheel = tmp_path / "pkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(member, "x")
    site, bindir = tmp_path / "site", tmp_path / "bin"
    with pytest.raises(SystemExit, match=rf"pkg-1.0-py3-none-any\.whl: member .*{re.escape(said)}"):
        jit_carry.install_wheel(wheel, site, bindir)
    assert not site.exists() and not bindir.exists() and not (tmp_path / "escape.py").exists()
