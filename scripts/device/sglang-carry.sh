#!/usr/bin/env bash
# Download what tests/gpu/sglang_symm_mem.py needs on the GPU machine (Python 3.12, torch already there) into .whl/:
# SGLang 0.5.23 slimmed to its Python files, without multimodal_gen/, test/ and benchmark/ (its Rust extensions
# are loaded lazily and not needed to import the communicator), and the wheels the GPU image lacks for that import (stack-facts section 3). About 20 MB.
# Run from the repository root on a machine that reaches PyPI.
set -euo pipefail

DEST=.whl
SGLANG=0.5.23
# IPython 9 imports jedi (and parso) only when it completes code: left out, 5 MB less to carry.
WHEELS=(
  orjson==3.13.0 pybase64==1.5.1 msgspec==0.23.0 pyzmq==27.3.0
  starlette==1.10.0 anyio==4.16.0 sniffio==1.3.1
  pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 typing-extensions==4.16.0
  ipython==9.18.1 ipython-pygments-lexers==1.1.1 decorator==5.3.1 matplotlib-inline==0.2.2
  pexpect==4.9.0 ptyprocess==0.7.0 prompt-toolkit==3.0.53 wcwidth==0.9.4 pygments==2.21.0 stack-data==0.6.3
  executing==2.3.0 asttokens==3.0.2 pure-eval==0.2.4 traitlets==5.16.1
)
download() {
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux_2_34_x86_64 -d "$1" "${@:2}"
}

mkdir -p "$DEST"
rm -f "$DEST"/*.whl
download "$DEST" "${WHEELS[@]}"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
download "$work" "sglang==$SGLANG"
python3 - "$work"/sglang-"$SGLANG"-*.whl "$DEST" <<'PY'
"""Repack the SGLang wheel with its Python files and metadata only, and a RECORD that matches."""
import base64, hashlib, sys, zipfile
from pathlib import Path

source, dest = Path(sys.argv[1]), Path(sys.argv[2])
# Not imported by the communicator, the fusion module or the patcher (which reads srt/ only); dropped so SGLang and
# FlashInfer's trimmed wheel travel together under the device tool's 64 MiB.
DROP = ("sglang/multimodal_gen/", "sglang/test/", "sglang/benchmark/")
name = source.name.split("-")
target = dest / f"{name[0]}-{name[1]}-py3-none-any.whl"  # same version: pip checks it against METADATA
with zipfile.ZipFile(source) as src, zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as out:
    info_dir = next(n.split("/")[0] for n in src.namelist() if n.split("/")[0].endswith(".dist-info"))
    record = []
    for item in src.infolist():
        skip = item.filename.startswith(DROP)
        keep = (item.filename.endswith(".py") and not skip) or (
            item.filename.startswith(info_dir) and not item.filename.endswith("RECORD")
        )
        if not keep:
            continue
        data = src.read(item.filename)
        if item.filename == f"{info_dir}/WHEEL":
            data = b"".join(
                b"Tag: py3-none-any\n" if line.startswith(b"Tag:") else line + b"\n" for line in data.splitlines()
            )
            data = b"\n".join(dict.fromkeys(data.split(b"\n")))
        out.writestr(item.filename, data)
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{item.filename},sha256={digest},{len(data)}")
    record.append(f"{info_dir}/RECORD,,")
    out.writestr(f"{info_dir}/RECORD", "\n".join(record) + "\n")
print(f"{target} ({target.stat().st_size // 1024} KiB)")
PY
du -sh "$DEST"
ls "$DEST"
