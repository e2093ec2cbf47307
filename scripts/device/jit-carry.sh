#!/usr/bin/env bash
# Carry FlashInfer 0.7.2 (trimmed), apache-tvm-ffi, cuda-python and a FlashInfer JIT cache bundle built on this CPU
# machine to the GPU machine: "built elsewhere, loaded there without rebuilding" (issue 9).
#
# Usage: scripts/device/jit-carry.sh BUNDLE [DEST]
#   BUNDLE  a bundle from `python -m sm120check.jitcache build|pack` (e.g. .carry/jit-90a.tar.gz)
#   DEST    defaults to .carry/jit (gitignored); the bundle lands there as sm120kit-jit.tar.gz. Not .whl: other
#           engineers' carried wheels live there, and together they pass the device tool's 64 MiB.
#
# Fails when the files this script puts in DEST exceed 60 MiB, and warns when DEST also holds other files that would
# push a carry of DEST past the device tool's 64 MiB.
set -euo pipefail

MAX_OWN_BYTES=$((60 * 1024 * 1024))
CARRY_LIMIT_BYTES=$((64 * 1024 * 1024))

root=$(cd "$(dirname "$0")/../.." && pwd)
bundle=${1:?usage: scripts/device/jit-carry.sh BUNDLE [DEST]}
dest=${2:-$root/.carry/jit}
python=${PYTHON:-python3}

"$root/scripts/device/flashinfer-carry.sh" "$dest"

cp "$bundle" "$dest/sm120kit-jit.tar.gz"
# The same verification the device runs (checksums of every file), without a key: this machine is not the target.
PYTHONPATH="$root/python/sm120check/src" "$python" -m sm120check.jitcache verify --no-key-check \
  "$dest/sm120kit-jit.tar.gz"

own=("$dest"/flashinfer_python-*.whl "$dest"/apache_tvm_ffi-*.whl "$dest"/cuda_python-*.whl "$dest/sm120kit-jit.tar.gz")
own_bytes=$(cat "${own[@]}" | wc -c)
all_bytes=$(find "$dest" -maxdepth 1 -type f -printf '%s\n' | awk '{s += $1} END {print s + 0}')
ls -l "${own[@]}"
echo "jit-carry: $((own_bytes / 1024 / 1024)) MiB of ours, $((all_bytes / 1024 / 1024)) MiB in $dest"
if (( own_bytes > MAX_OWN_BYTES )); then
  echo "jit-carry: $own_bytes bytes exceed the $MAX_OWN_BYTES budget; pack fewer modules" >&2
  exit 1
fi
if (( all_bytes > CARRY_LIMIT_BYTES )); then
  echo "jit-carry: WARNING $dest holds other files too; carried whole it exceeds 64 MiB. Others:" >&2
  find "$dest" -maxdepth 1 -type f ! -name 'flashinfer_python-*' ! -name 'apache_tvm_ffi-*' \
    ! -name 'cuda_python-*' ! -name 'sm120kit-jit.tar.gz' -printf '  %f\n' >&2
fi
