#!/usr/bin/env bash
# The SGLang server tests on the lent GPU machine, every step bounded.
#
# Usage (device, from the repository root of the carried tree, the stack carried in .carry/sglang-0.5.16):
#   scripts/device/sglang-server.sh PHASE...
# Phases:
#   venv      make the stack venv (without the import probe)
#   stack     make the stack venv $VENV from the carried archive (scripts/device/sglang_stack.py install: SGLang
#             0.5.16's pins, then the image's torch) and import-probe the server's modules
#   gputests  pytest -m gpu tests/gpu with the stack venv's python: the doctor, node health and the SGLang server
#             (tests/gpu/test_sglang_server.py); pytest's summary line in $OUT/pytest-gpu.txt, every artifact in
#             $OUT/gpu-artifacts.tar.gz (tests/gpu/test_sglang_policy.py is left to its own phase)
#   policy    the issue #24 sweeps (tests/gpu/test_sglang_policy.py: four servers, four sweeps; about 10 minutes)
# GPU_TESTS narrows the pytest paths (default tests/gpu), GPU_TIMEOUT bounds them (default 560 s).
# Every process keeps NVLink multicast off (NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
# NVSHMEM_DISABLE_NVLS=1). Servers listen on 127.0.0.1 only.
set -uo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
out=${OUT:-$(mktemp -d)}
VENV=${VENV:-/tmp/sglang-venv}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
export PYTHONPATH="$root/python/sm120check/src:$root/tests"

log() { echo "== $(date -u +%H:%M:%S) $*"; }

phase_venv() {
  log "venv: install into $VENV"
  timeout 300 python3 scripts/device/sglang_stack.py install --from .carry/sglang-0.5.16 --venv "$VENV"
}

phase_stack() {
  phase_venv || return 1
  log "stack: imports"
  timeout 300 "$VENV/bin/python" scripts/device/sglang_imports.py > "$out/imports.txt" 2>&1
  local rc=$?
  grep -v '^  ' "$out/imports.txt"
  return $rc
}

phase_gputests() {
  log "gputests: pytest -m gpu tests/gpu"
  mkdir -p "$out/gpu"
  SM120KIT_GPU_OUT="$out/gpu" timeout "${GPU_TIMEOUT:-560}" "$VENV/bin/python" -m pytest -m gpu \
    ${GPU_TESTS:-tests/gpu --ignore=tests/gpu/test_sglang_policy.py} \
    -p no:cacheprovider -rA \
    ${PYTEST_ARGS:-} > "$out/pytest-gpu-full.txt" 2>&1
  local rc=$?
  grep -E '^(FAILED|ERROR|PASSED|SKIPPED)' "$out/pytest-gpu-full.txt" | cut -c1-400
  grep -E '=+ .*(passed|failed|error|skipped).* =+$' "$out/pytest-gpu-full.txt" | tail -1 > "$out/pytest-gpu.txt"
  log "gputests summary: $(cat "$out/pytest-gpu.txt")"
  tar -czf "$out/gpu-artifacts.tar.gz" -C "$out" gpu && rm -rf "$out/gpu"
  return $rc
}

phase_policy() {
  GPU_TESTS=tests/gpu/test_sglang_policy.py GPU_TIMEOUT=${GPU_TIMEOUT:-590} phase_gputests
}

failed=()
for phase in "$@"; do
  "phase_$phase" || { log "phase $phase failed"; failed+=("$phase"); }
done
log "phases failed: ${failed[*]:-none}"
[[ ${#failed[@]} -eq 0 ]]
