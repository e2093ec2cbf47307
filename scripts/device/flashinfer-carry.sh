#!/usr/bin/env bash
# Put FlashInfer 0.7.2 and the two packages it lacks on the GPU image (torch 2.11+cu130, Python 3.12)
# into .whl/ (gitignored), small enough to travel with the working tree (64 MiB limit, shared with
# other carried wheels).
#
# The 0.7.2 wheel is 65 MB. Its allreduce-fusion JIT build needs only the Python package, the
# headers (data/include, cutlass, cccl, spdlog, every header under data/csrc) and the sources of the
# comm modules (trtllm_allreduce*, trtllm_moe_allreduce*, pcie_ipc*); the trimmed wheel is
# repacked with a fresh RECORD so `pip install --no-deps --target` accepts it.
#
# Besides what the image has (torch, numpy, ninja, filelock, jinja2, click, einops, packaging,
# requests, tabulate, tqdm, nvidia-ml-py, cuda-bindings, cuda-pathfinder), flashinfer needs
# apache-tvm-ffi (imported by flashinfer.jit.core) and the cuda-python metapackage. Its other
# Requires-Dist (cuda-tile, nccl4py, nccl-extensions, nvidia-cudnn-frontend, nvidia-cutlass-dsl)
# are imported lazily by features the doctor does not use.
#
# Usage: scripts/device/flashinfer-carry.sh [DEST]   (DEST defaults to .whl in the repository root)
set -euo pipefail

FLASHINFER_VERSION=0.7.2
TVM_FFI_SPEC='apache-tvm-ffi>=0.1.11,<0.2'
CUDA_PYTHON_SPEC='cuda-python>=13.0,<13.1'
MAX_TOTAL_BYTES=$((45 * 1024 * 1024))

root=$(cd "$(dirname "$0")/../.." && pwd)
dest=${1:-$root/.whl}
python=${PYTHON:-python3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$dest"

platforms=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
           --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
download() {
  "$python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]}" -d "$work/dl" "$@"
}
download "flashinfer-python==$FLASHINFER_VERSION" "$TVM_FFI_SPEC" "$CUDA_PYTHON_SPEC"

# Drop earlier copies so exactly one version of each package travels.
rm -f "$dest"/flashinfer_python-*.whl "$dest"/apache_tvm_ffi-*.whl "$dest"/cuda_python-*.whl
cp "$work"/dl/apache_tvm_ffi-*.whl "$work"/dl/cuda_python-*.whl "$dest"/

"$python" - "$work"/dl/flashinfer_python-"$FLASHINFER_VERSION"-py3-none-any.whl "$dest" <<'PY'
"""Repack the FlashInfer wheel without what the comm JIT build never reads."""
import base64, hashlib, sys, zipfile
from pathlib import Path

src, dest = Path(sys.argv[1]), Path(sys.argv[2])
HEADER_SUFFIXES = (".h", ".hh", ".hpp", ".cuh", ".inc", ".inl", ".def")
KEEP_SOURCES = ("trtllm_allreduce", "trtllm_moe_allreduce", "pcie_ipc")
DROP_NON_PY_UNDER = ("flashinfer/experimental/", "flashinfer/fused_moe/backends/", "flashinfer/moe_ep/kernel_src/")

def keep(name: str) -> bool:
    if name.endswith("/"):
        return False
    if any(name.startswith(p) for p in DROP_NON_PY_UNDER) and not name.endswith(".py"):
        return False
    if name.startswith("flashinfer/data/csrc/"):
        base = name.rsplit("/", 1)[-1]
        return base.endswith(HEADER_SUFFIXES) or base.startswith(KEEP_SOURCES)
    return True

def digest(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()

out = dest / src.name
with zipfile.ZipFile(src) as zin, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zout:
    record_name = next(n for n in zin.namelist() if n.endswith(".dist-info/RECORD"))
    rows, kept, dropped = [], 0, 0
    for info in zin.infolist():
        name = info.filename
        if name == record_name:
            continue
        if not keep(name):
            dropped += not name.endswith("/")
            continue
        data = zin.read(info)
        zout.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED)
        rows.append(f"{name},{digest(data)},{len(data)}")
        kept += 1
    rows.append(f"{record_name},,")
    zout.writestr(record_name, "\n".join(rows) + "\n")
print(f"{out.name}: kept {kept} files, dropped {dropped}, {out.stat().st_size / 2**20:.1f} MiB")
PY

# The trimmed wheel must install the way the device command installs it.
"$python" -m pip install -q --no-index --no-deps --no-compile --target "$work/site" "$dest"/flashinfer_python-*.whl
test -f "$work/site/flashinfer/data/csrc/trtllm_allreduce_fusion.cu"
test -f "$work/site/flashinfer/data/csrc/pcie_ipc_all_reduce.cu"

total=$(cat "$dest"/flashinfer_python-*.whl "$dest"/apache_tvm_ffi-*.whl "$dest"/cuda_python-*.whl | wc -c)
ls -l "$dest"/flashinfer_python-*.whl "$dest"/apache_tvm_ffi-*.whl "$dest"/cuda_python-*.whl
echo "total $((total / 1024 / 1024)) MiB"
if (( total > MAX_TOTAL_BYTES )); then
  echo "flashinfer-carry: $total bytes exceed the $MAX_TOTAL_BYTES budget; trim further" >&2
  exit 1
fi
