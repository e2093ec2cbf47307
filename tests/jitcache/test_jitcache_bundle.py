"""Bundles: a module directory with its ninja state travels with a sha256 per file, and only intact bundles for this
node's key are installed."""

from __future__ import annotations

import dataclasses
import gzip
import io
import shutil
import tarfile
from pathlib import Path

import pytest
from jitcache_helpers import KEY, built_module, module_dir, ninja

from sm120check.jitcache import bundle
from sm120check.jitcache.key import BuildContext
from sm120check.jitcache.ninja import dry_run

CONTEXT = BuildContext("/venv/flashinfer", "/venv/tvm_ffi", "/usr/include/python3.12", "/opt/cuda", "/c", "c++ 12.2.0")


@pytest.fixture
def packed(tmp_path: Path) -> tuple[Path, Path]:
    """(cache root, bundle) after building the demo module and packing it."""
    root = tmp_path / "cache"
    built_module(root, tmp_path / "src")
    out = tmp_path / "out" / "demo.tar.gz"
    bundle.pack(root, KEY, CONTEXT, ["demo"], out, {"demo": 12.5})
    return root, out


def _rewrite(src: Path, dest: Path, change: str) -> None:
    """Copy a bundle, altering one module file ("tamper"), or dropping it ("drop")."""
    with tarfile.open(src, "r:gz") as tin, tarfile.open(dest, "w:gz", format=tarfile.PAX_FORMAT) as tout:
        for member in tin:
            data = tin.extractfile(member).read() if member.isfile() else b""  # type: ignore[union-attr]
            if member.name.endswith("demo.so"):
                if change == "drop":
                    continue
                data = data + b"\x00"
                member.size = len(data)
            tout.addfile(member, io.BytesIO(data))


def test_module_installed_from_a_bundle_loads_without_rebuilding(packed: tuple[Path, Path]) -> None:
    root, out = packed
    shutil.rmtree(module_dir(root))  # the receiving node: same paths, no module yet
    done = bundle.unpack(out, root, expect=KEY)
    assert done.modules == ("demo",)
    assert dry_run(module_dir(root), ninja()).clean


def test_file_times_come_back_to_the_nanosecond(packed: tuple[Path, Path]) -> None:
    root, out = packed
    before = {p.name: p.stat().st_mtime_ns for p in module_dir(root).iterdir()}
    shutil.rmtree(module_dir(root))
    bundle.unpack(out, root, expect=KEY)
    after = {p.name: p.stat().st_mtime_ns for p in module_dir(root).iterdir() if p.name != bundle.STAMP_NAME}
    assert after == before


def test_manifest_lists_ninja_state_with_checksums(packed: tuple[Path, Path]) -> None:
    _, out = packed
    manifest = bundle.verify(out)
    names = {Path(f.path).name for f in manifest.files}
    assert {"demo.so", "demo.cuda.o", "build.ninja", ".ninja_log", ".ninja_deps"} <= names
    assert all(len(f.sha256) == 64 for f in manifest.files)
    assert manifest.modules["demo"]["seconds"] == 12.5


def test_tampered_file_is_refused_and_nothing_is_installed(packed: tuple[Path, Path], tmp_path: Path) -> None:
    root, out = packed
    bad = tmp_path / "tampered.tar.gz"
    _rewrite(out, bad, "tamper")
    shutil.rmtree(module_dir(root))
    with pytest.raises(bundle.BundleError, match=r"demo.so: sha256 .* \(tampered or corrupted\)"):
        bundle.unpack(bad, root, expect=KEY)
    assert not module_dir(root).exists()
    assert not [p for p in root.iterdir() if p.name.startswith(".sm120kit-jit-staging-")]


def test_bundle_missing_a_listed_file_is_refused(packed: tuple[Path, Path], tmp_path: Path) -> None:
    _, out = packed
    bad = tmp_path / "dropped.tar.gz"
    _rewrite(out, bad, "drop")
    with pytest.raises(bundle.BundleError, match=r"demo\.so: listed in the manifest but missing"):
        bundle.verify(bad)


def test_truncated_bundle_is_refused(packed: tuple[Path, Path], tmp_path: Path) -> None:
    _, out = packed
    raw = gzip.decompress(out.read_bytes())
    cut = tmp_path / "partial.tar.gz"
    cut.write_bytes(gzip.compress(raw[: len(raw) // 2]))
    with pytest.raises(bundle.BundleError, match="copy it again"):
        bundle.verify(cut)


def test_bundle_for_another_key_is_refused_naming_the_field(packed: tuple[Path, Path]) -> None:
    root, out = packed
    node = dataclasses.replace(KEY, arch="120f")
    with pytest.raises(bundle.BundleError, match=r"arch: 90a vs 120f.*--tags flashinfer_jit_build"):
        bundle.unpack(out, root, expect=node)


def test_ignored_key_field_lets_a_bundle_through(packed: tuple[Path, Path]) -> None:
    _, out = packed
    node = dataclasses.replace(KEY, torch="2.11.0+cu130")
    assert bundle.verify(out, expect=node, ignore=["torch"]).key == KEY


def test_existing_module_is_replaced_by_the_bundle(packed: tuple[Path, Path]) -> None:
    root, out = packed
    (module_dir(root) / "demo.so").write_bytes(b"stale")
    bundle.unpack(out, root, expect=KEY)
    assert (module_dir(root) / "demo.so").read_bytes() != b"stale"
    assert bundle.read_stamp(module_dir(root))["key"] == KEY.as_dict()


def test_packing_an_unbuilt_module_says_build_it_first(tmp_path: Path) -> None:
    with pytest.raises(bundle.BundleError, match="build trtllm_comm before packing"):
        bundle.pack(tmp_path, KEY, CONTEXT, ["trtllm_comm"], tmp_path / "x.tar.gz")


def test_bundle_that_is_not_one_is_named(tmp_path: Path) -> None:
    fake = tmp_path / "notes.tar.gz"
    with tarfile.open(fake, "w:gz") as tar:
        tar.addfile(tarfile.TarInfo("README"), io.BytesIO(b""))
    with pytest.raises(bundle.BundleError, match="not an sm120kit JIT bundle"):
        bundle.verify(fake)


def test_libraries_only_bundle_installs_as_prebuilt_modules(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    built_module(root, tmp_path / "src")
    out = tmp_path / "libs.tar.gz"
    manifest = bundle.pack(root, KEY, CONTEXT, ["demo"], out, libraries_only=True)
    assert [Path(f.path).name for f in manifest.files] == ["demo.so"]
    bundle.install_aot(out, tmp_path / "aot", expect=KEY)
    assert (tmp_path / "aot" / "demo" / "demo.so").read_bytes() == (module_dir(root) / "demo.so").read_bytes()
