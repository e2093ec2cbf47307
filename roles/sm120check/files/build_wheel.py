#!/usr/bin/env python3
"""Build the sm120check wheel reproducibly with the standard library alone.

The control node needs nothing but the Python that runs Ansible: no setuptools, no network. The same
source gives a byte-identical wheel (sorted entries, fixed timestamps), so the role's copy task sees
no change and the checker is not reinstalled when nothing changed.

usage: build_wheel.py SOURCE_DIR OUT_DIR   (prints the wheel's path)
"""

from __future__ import annotations

import base64
import hashlib
import re
import sys
import zipfile
from pathlib import Path

FIXED_TIME = (1980, 1, 1, 0, 0, 0)
SUFFIXES = {".py", ".typed", ".json"}  # .json: manifest.schema.json, the manifest reader needs it


def _field(pyproject: str, key: str) -> str:
    match = re.search(rf'^{key}\s*=\s*"([^"]*)"', pyproject, re.MULTILINE)
    if not match:
        raise SystemExit(f"build_wheel: {key} not found in pyproject.toml")
    return match.group(1)


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest}"


def build(source: Path, out_dir: Path) -> Path:
    pyproject = (source / "pyproject.toml").read_text(encoding="utf-8")
    name = _field(pyproject, "name")
    version_text = (source / "src" / name / "__init__.py").read_text(encoding="utf-8")
    version_match = re.search(r'^__version__ = "([^"]+)"', version_text, re.MULTILINE)
    if not version_match:
        raise SystemExit(f"build_wheel: __version__ not found in src/{name}/__init__.py")
    version = version_match.group(1)
    dist_info = f"{name}-{version}.dist-info"
    files: dict[str, bytes] = {}
    for path in sorted((source / "src" / name).rglob("*")):
        if path.is_file() and path.suffix in SUFFIXES and "__pycache__" not in path.parts:
            files[path.relative_to(source / "src").as_posix()] = path.read_bytes()
    files[f"{dist_info}/METADATA"] = (
        "Metadata-Version: 2.1\n"
        f"Name: {name}\nVersion: {version}\n"
        f"Summary: {_field(pyproject, 'description')}\n"
        f"Requires-Python: {_field(pyproject, 'requires-python')}\n"
    ).encode()
    files[f"{dist_info}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: sm120kit build_wheel\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    files[f"{dist_info}/entry_points.txt"] = f"[console_scripts]\n{name} = {name}.cli:main\n".encode()
    record_name = f"{dist_info}/RECORD"
    record = "".join(f"{path},{_record_hash(data)},{len(data)}\n" for path, data in files.items())
    files[record_name] = (record + f"{record_name},,\n").encode()

    out_dir.mkdir(parents=True, exist_ok=True)
    wheel = out_dir / f"{name}-{version}-py3-none-any.whl"
    tmp = wheel.with_suffix(".tmp")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for path, data in files.items():
            info = zipfile.ZipInfo(path, date_time=FIXED_TIME)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, data)
    if wheel.exists() and wheel.read_bytes() == tmp.read_bytes():
        tmp.unlink()
    else:
        tmp.replace(wheel)
    return wheel


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    print(build(Path(sys.argv[1]), Path(sys.argv[2])))
