#!/usr/bin/env bash
# The SGLang server tests on the lent GPU machine, every step bounded.
#
# Usage (device, from the repository root of the carried tree, the stack carried in .carry/sglang-0.5.16):
#   scripts/device/sglang-server.sh PHASE...
# Phases:
#   venv      make the stack venv (without the import probe)
#   stack     make the stack venv $VENV from the carried archive (scripts/device/sglang_stack.py install: SGLang
#             0.5.16's pins, then the image's torch) and import-probe the server's modules
#   gputests  pytest -m gpu on $QUICK_TESTS with the stack venv's python: the comm, doctor and node health tests and
#             the SGLang server (tests/gpu/test_sglang_server.py); pytest's summary line in $OUT/pytest-gpu.txt, every
#             artifact in $OUT/gpu-artifacts.tar.gz (the policy, envelope, switch and soak files have their own phases)
#   server-base  gputests on the doctor, health and comm tests and tests/gpu/test_sglang_server.py without TestSpec
#             (patch, base server, no-graphs server, bad-draft server, revert; about 6 minutes)
#   server-spec  gputests on tests/gpu/test_sglang_server.py's TestSpec (patch, EAGLE-3 server, revert; about 5 minutes;
#             SERVER_SPEC_K=" or bench_counts" adds the base server's bench tests)
#   policy    the issue #24 sweeps (tests/gpu/test_sglang_policy.py: five servers, five sweeps; about 25 minutes),
#             in four calls on one warm machine: policy-curves (base and EAGLE-3 sweeps, crossover; about 8.5
#             minutes), policy-zero (the EAGLE-3 server held at 0 steps, the policy from it, and the OpenAI APIs'
#             accept length against the EAGLE-3 server; about 8), policy-ours (our policy's sweep, the steps it used;
#             about 5), policy-anchor (SGLang's adaptive mode, the verdicts; about 5); the sweeps wait for the next
#             call in /tmp/sm120kit-policy
#   policy-deeper  the EAGLE-3 server at 7 static steps at C=1, 2, 5 (TestDeeper; about 2 minutes)
#   switch    the speculation switch (tests/gpu/test_sglang_switch.py: the plain server, then the EAGLE-3 server
#             patched with --plain-decode; greedy outputs token for token across the switch, rates at C=1/30/100;
#             about 7 minutes)
#   envelope-a, envelope-b, envelope-c  issue #33's five curves in three calls on one warm machine (every envelope
#             phase starts its servers with SGLANG_ENABLE_METRICS_DEVICE_TIMER=1: the bench records each level's GPU
#             seconds per forward kind, server_forward_seconds)
#             (tests/gpu/test_sglang_envelope.py: the base and 3-step sweeps; the 7-step sweep, the tiers and the
#             policy server with the switch; SGLang's adaptive mode and table.json; about 5, 5 and 3 minutes)
#   envelope-spread-a, envelope-spread-b  the same with each request's output length uniform in 128 x (1 +- 0.5)
#             (SM120KIT_ENVELOPE_SPREAD), in two calls: the base and 7-step sweeps; the policy server planned from
#             them and the verdict (about 6.5 and 3.5 minutes)
#   envelope-repeat-a, -b, -c  fixed lengths, SM120KIT_ENVELOPE_REPEATS=2 sweeps per server in its one start (the
#             curves are their means, the record keeps each sweep and their spread), one server a call: the base
#             server, the 7-step server, then the policy server planned from them and the verdict (about 5 minutes
#             each); envelope-repeat-d adds the 3-step server and SGLang's adaptive mode, one sweep each, and the
#             verdict on the five curves (about 6 minutes)
#   envelope-gap  the plain server and the switch-7 launch (plain from SM120KIT_ENVELOPE_PLAIN_FROM, default 57) at
#             C=30, 70, 100, 250 only, SM120KIT_ENVELOPE_REPEATS=2 sweeps each, in one call: gap.json holds each level's
#             rates and GPU milliseconds per output token by forward kind, and the share of the level the GPU did not
#             compute (about 6 minutes); SM120KIT_ENVELOPE_GAP_LEVELS (e.g. 100) narrows it to some of those levels
#   envelope-profile  the same two servers under the gap's top level for 36 s each while SGLang's profiler records
#             12 scheduler steps three times (host with its Python stack, and GPU): profile-gap.json sets their GPU
#             idle share, kernels and host time per step side by side (about 6 minutes); the traces, as many as fit
#             15 MiB, in $OUT/traces.tar
#   envelope-host  the same two servers under the gap's top level for 30 s each: 12 s in, every server process's CPU
#             time per thread and py-spy's Python stacks (carried in the stack) over 10 s, and the bench client's;
#             host.json sets them side by side per role (the HTTP and tokenizer process, scheduler, detokenizer,
#             bench) (about 4 minutes)
#             Every envelope phase takes SM120KIT_ENVELOPE_TOKENIZER_WORKERS=N: each server it starts gets N SGLang HTTP
#             processes (--tokenizer-worker-num N; one process caps both servers at C=250,
#             docs/validation/2026-12-07-h100-host; with 4 the repeat phases take about 7.5, 5.5, 5.5 and 8 minutes),
#             and SM120KIT_ENVELOPE_STARTS=N (1-3): each server of the curves, policy and adaptive phases started N
#             times in turn, each swept SM120KIT_ENVELOPE_REPEATS times, so the verdict's spread covers the spread
#             between two starts of one launch (with 4 HTTP processes, STARTS=2 and REPEATS=1, repeat-a, -b and -c take
#             about 9, 7 and 7.5 minutes); a server with several HTTP processes gets
#             SGLANG_UVICORN_WORKER_HEALTHCHECK_TIMEOUT=120 and is swept only once every one has started;
#             SM120KIT_ENVELOPE_DRAFT_ERROR=P (0 to below 1, default 0.1): the synthetic draft wrong on a share P of
#             its proposals (mean accept length 5.7 at 7 steps for 0.1, 3.1 for 0.3); the pair is rewritten when a
#             call asks for another P, so every call of one record must pass the same value;
#             SM120KIT_ENVELOPE_FRESH_CONNECTIONS=0|1 (default 1 with several HTTP processes): bench --fresh-connections;
#             SM120KIT_ENVELOPE_SERVER_ARGS="ARGS": SGLang arguments every server of the phase gets on top of its launch
#             (e.g. "--enable-prefill-delayer --prefill-delayer-queue-min-ratio 0.1"), named in table.json;
#             every sweep runs sm120check.soak.sampler (NVML reads, 1 s): gpu-samples-*.jsonl, and the verdict's
#             gpu_clocks gives each level's SM clock, power, temperature and clock-event reasons
#   jit-venv  $JIT_VENV (default /tmp/jit-venv) from the JIT parts carried in earlier calls of this warm machine
#             (scripts/device/jit_carry.py: FlashInfer 0.7.2, tvm-ffi and ninja whole, over $VENV): every part checked,
#             joined and installed
#   pcie-ipc-jit  issue #38 on one GPU, in $JIT_VENV: FlashInfer's pcie_ipc_comm JIT-built cold for 9.0a and 12.0f
#             (sm_120, compile only) into fresh workspaces, then the doctor's flashinfer_jit (about 1 minute); the off
#             case is server-base's verify-launch (allreduce_backend default on the 0.5.16 server)
#   soak-base, soak-killed, soak-spec  issue #37's soak record (tests/gpu/test_sglang_soak.py): the base server held at
#             SOAK_C=64 for SOAK_S=300 s (about 8 minutes with the server's start); the base server killed 40 s into
#             a 90 s soak (about 3); the EAGLE-3 server at SOAK_SPEC_C=8 for SOAK_S s (about 8); soak-load: no server,
#             --sm-load for 60 s (about 2). Each soak's folder
#             (soak.jsonl/.json/.junit.xml/.prom/.png) lands in $OUT/gpu-artifacts.tar.gz
#   pcie      what this machine's PCIe readers see (issue #25): /proc/cmdline, /sys/class/iommu, the IOMMU groups,
#             lspci -vvv of every NVIDIA device and its bridges, the kernel log's DMAR/AMD-Vi lines, and the doctor's
#             iommu and pcie_acs checks, into $OUT/pcie
#   pcie-pairs  the level-3 pair checks' machinery on one GPU (scripts/device/pair_machinery.py: copies and reads
#             GPU 0 to itself, the many-to-one round, nccl_pairs' two ranks on GPU 0 with P2P on and off, the watchdog
#             on a rank that never joins) and the doctor's gpu_peer_bandwidth, gpu_peer_stress and nccl_pairs at
#             level 3, into $OUT/pcie-pairs (about 2 minutes)
# GPU_TESTS names the pytest paths (default $QUICK_TESTS), PYTEST_K selects within them (pytest -k), GPU_TIMEOUT
# bounds them (default 560 s).
# Every process keeps NVLink multicast off (NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
# NVSHMEM_DISABLE_NVLS=1). Servers listen on 127.0.0.1 only.
# No server outlives its call: the harness records each server it starts in /tmp/sm120kit-gpu-servers.json
# (tests/lab/server_pids.py); a call starts by stopping what an earlier one left there, gputests stops what a pytest
# killed by GPU_TIMEOUT left, and a trap does the same when this script ends or is stopped (EXIT, TERM, INT). Only
# recorded pids still running the recorded command line from the recorded start are stopped.
set -uo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
out=${OUT:-$(mktemp -d)}
VENV=${VENV:-/tmp/sglang-venv}
JIT_VENV=${JIT_VENV:-/tmp/jit-venv}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
export PYTHONPATH="$root/python/sm120check/src:$root/tests"

log() { echo "== $(date -u +%H:%M:%S) $*"; }
# The quick GPU tests (gputests, server-base, server-spec); the long ones (policy, envelope, switch, soak) are named
# only by their own phases.
QUICK_TESTS="tests/gpu/test_comm_gpu.py tests/gpu/test_doctor_gpu.py tests/gpu/test_health_gpu.py"
QUICK_TESTS+=" tests/gpu/test_sglang_server.py"

stop_servers() {  # $1: --all also stops servers of a pytest still running (this script is ending)
  timeout 120 python3 tests/lab/server_pids.py stop ${1:-}
}
on_signal() {
  log "stopped by a signal: stopping the servers this call started"
  [[ -n ${pytest_pid:-} ]] && kill -TERM "$pytest_pid" 2>/dev/null
  stop_servers --all
  trap - EXIT
  exit 143
}
trap 'stop_servers --all' EXIT
trap on_signal TERM INT

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
  stop_servers  # what an earlier call left running
  SM120KIT_GPU_OUT="$out/gpu" timeout "${GPU_TIMEOUT:-560}" "$VENV/bin/python" -m pytest -m gpu \
    ${GPU_TESTS:-$QUICK_TESTS} \
    -p no:cacheprovider -rA \
    ${PYTEST_K:+-k "$PYTEST_K"} > "$out/pytest-gpu-full.txt" 2>&1 &
  pytest_pid=$!
  wait "$pytest_pid"
  local rc=$?
  pytest_pid=
  stop_servers  # a pytest killed by its timeout cannot stop its servers
  [[ $rc -eq 124 ]] && log "gputests: pytest stopped by GPU_TIMEOUT=${GPU_TIMEOUT:-560}"
  grep -E '^(FAILED|ERROR|PASSED|SKIPPED)' "$out/pytest-gpu-full.txt" | cut -c1-400
  grep -E '=+ .*(passed|failed|error|skipped).* =+$' "$out/pytest-gpu-full.txt" | tail -1 > "$out/pytest-gpu.txt"
  log "gputests summary: $(cat "$out/pytest-gpu.txt")"
  pack_traces
  tar -czf "$out/gpu-artifacts.tar.gz" -C "$out" --exclude='*.trace.json.gz' gpu && rm -rf "$out/gpu"
  return $rc
}

pack_traces() {  # profiler traces, first of each folder first, into $out/traces.tar while it stays under 15 MiB
  local list total=0 size f
  list=$(cd "$out" && find gpu -name '*.trace.json.gz' -printf '%f %p\n' | sort -t- -k3 | awk '{print $2}')
  [[ -z $list ]] && return 0
  : > "$out/traces.list"
  for f in $list; do
    size=$(stat -c %s "$out/$f")
    (( total + size > 15 * 1024 * 1024 )) && { log "traces: $f ($size bytes) left out"; continue; }
    total=$((total + size))
    echo "$f" >> "$out/traces.list"
  done
  tar -cf "$out/traces.tar" -C "$out" -T "$out/traces.list" && rm -f "$out/traces.list"
}

phase_server_base() {
  GPU_TESTS=$QUICK_TESTS PYTEST_K="not TestSpec" phase_gputests
}

phase_server_spec() {
  GPU_TESTS=tests/gpu/test_sglang_server.py PYTEST_K="TestSpec or patch_applies or revert${SERVER_SPEC_K:-}" \
    phase_gputests
}

phase_policy() {
  GPU_TESTS=tests/gpu/test_sglang_policy.py GPU_TIMEOUT=${GPU_TIMEOUT:-590} phase_gputests
}

phase_policy_curves() {
  GPU_TESTS=tests/gpu/test_sglang_policy.py PYTEST_K=TestCurves phase_gputests
}

phase_policy_zero() {
  GPU_TESTS="tests/gpu/test_sglang_policy.py tests/gpu/test_sglang_server.py" \
    PYTEST_K="TestZeroStep or openai_apis_count_what_the_eagle3_server_counts" phase_gputests
}

phase_policy_ours() {
  GPU_TESTS=tests/gpu/test_sglang_policy.py PYTEST_K=TestPolicy phase_gputests
}

phase_policy_anchor() {
  GPU_TESTS=tests/gpu/test_sglang_policy.py PYTEST_K=TestAnchor phase_gputests
}

phase_policy_deeper() {
  GPU_TESTS=tests/gpu/test_sglang_policy.py PYTEST_K=TestDeeper phase_gputests
}

phase_switch() {
  GPU_TESTS=tests/gpu/test_sglang_switch.py GPU_TIMEOUT=${GPU_TIMEOUT:-560} phase_gputests
}

envelope_tests() {  # $1: pytest -k; the servers count their GPU seconds per forward kind (bench records them)
  SGLANG_ENABLE_METRICS_DEVICE_TIMER=1 GPU_TESTS=tests/gpu/test_sglang_envelope.py PYTEST_K="$1" phase_gputests
}

phase_envelope_a() {
  envelope_tests "TestEnvelopeCurves and not spec-7"
}

phase_soak_base() {
  GPU_TESTS=tests/gpu/test_sglang_soak.py PYTEST_K=TestSoakBase GPU_TIMEOUT=${GPU_TIMEOUT:-580} phase_gputests
}

phase_soak_killed() {
  GPU_TESTS=tests/gpu/test_sglang_soak.py PYTEST_K=TestSoakKilled GPU_TIMEOUT=${GPU_TIMEOUT:-400} phase_gputests
}

phase_soak_spec() {
  GPU_TESTS=tests/gpu/test_sglang_soak.py PYTEST_K=TestSoakSpec GPU_TIMEOUT=${GPU_TIMEOUT:-580} phase_gputests
}

phase_soak_load() {
  GPU_TESTS=tests/gpu/test_sglang_soak.py PYTEST_K=TestSoakSmLoad GPU_TIMEOUT=${GPU_TIMEOUT:-300} phase_gputests
}

phase_envelope_b() {
  envelope_tests "spec-7 or test_sweep_the_policy_server"
}

phase_envelope_c() {
  envelope_tests "test_sweep_sglangs_adaptive_mode or test_the_policy_is_on_the_envelope"
}

phase_envelope_spread_a() {
  SM120KIT_ENVELOPE_SPREAD=${SM120KIT_ENVELOPE_SPREAD:-0.5} envelope_tests "TestEnvelopeCurves and (base or spec-7)"
}

phase_envelope_spread_b() {
  SM120KIT_ENVELOPE_SPREAD=${SM120KIT_ENVELOPE_SPREAD:-0.5} envelope_tests "test_sweep_the_policy_server or test_the_policy_is_on_the_envelope"
}

phase_envelope_repeat_a() {
  SM120KIT_ENVELOPE_REPEATS=${SM120KIT_ENVELOPE_REPEATS:-2} envelope_tests "TestEnvelopeCurves and base"
}

phase_envelope_repeat_b() {
  SM120KIT_ENVELOPE_REPEATS=${SM120KIT_ENVELOPE_REPEATS:-2} envelope_tests "TestEnvelopeCurves and spec-7"
}

phase_envelope_repeat_c() {
  SM120KIT_ENVELOPE_REPEATS=${SM120KIT_ENVELOPE_REPEATS:-2} envelope_tests "test_sweep_the_policy_server or test_the_policy_is_on_the_envelope"
}

phase_envelope_repeat_d() {
  SM120KIT_ENVELOPE_REPEATS=${SM120KIT_ENVELOPE_REPEATS:-1} envelope_tests "(TestEnvelopeCurves and spec-3) or test_sweep_sglangs_adaptive_mode or test_the_policy_is_on_the_envelope"
}

phase_envelope_gap() {
  SM120KIT_ENVELOPE_REPEATS=${SM120KIT_ENVELOPE_REPEATS:-2} envelope_tests "TestEnvelopeGap"
}

phase_envelope_host() {
  envelope_tests "TestEnvelopeHost"
}

phase_envelope_profile() {
  envelope_tests "TestEnvelopeProfile"
}

phase_jit_venv() {
  log "jit-venv: the carried JIT parts joined into $JIT_VENV, on top of $VENV"
  timeout 300 python3 scripts/device/jit_carry.py install --venv "$JIT_VENV" --on-top "$VENV"
}

phase_pcie_ipc_jit() {
  log "pcie-ipc-jit: FlashInfer's pcie_ipc_comm built cold for sm_90a and sm_120 (compile only), then the doctor's view"
  local dir="$out/pcie-ipc-jit" rc=0 arch
  local py="$JIT_VENV/bin/python"
  [[ -x $py ]] || { log "pcie-ipc-jit: no $py: carry the JIT parts and run the jit-venv phase first"; return 1; }
  mkdir -p "$dir"
  "$py" -c 'import flashinfer, tvm_ffi; print("flashinfer", flashinfer.__version__, "tvm_ffi", tvm_ffi.__version__)' \
    2>&1 | tee "$dir/versions.txt"
  for arch in 9.0a 12.0f; do
    PATH="$JIT_VENV/bin:$PATH" FLASHINFER_WORKSPACE_BASE="/tmp/fiws-${arch}" timeout 300 "$py" -m sm120check.jitcache \
      build --json --arch-list "$arch" --modules pcie_ipc_comm > "$dir/build-${arch}.json" 2> "$dir/build-${arch}.err" \
      || rc=1
    tail -c 1500 "$dir/build-${arch}.json"
  done
  PATH="$JIT_VENV/bin:$PATH" FLASHINFER_WORKSPACE_BASE=/tmp/fiws-9.0a timeout 120 "$py" -m sm120check doctor \
    --select flashinfer_jit > "$dir/doctor-flashinfer-jit.txt" 2>&1
  cat "$dir/doctor-flashinfer-jit.txt"
  return $rc
}

phase_pcie() {
  log "pcie: the readers on this machine"
  local dir="$out/pcie"
  mkdir -p "$dir"
  cat /proc/cmdline > "$dir/cmdline.txt" 2>&1
  ls -la /sys/class/iommu > "$dir/sys-class-iommu.txt" 2>&1
  find /sys/kernel/iommu_groups -maxdepth 3 > "$dir/iommu-groups.txt" 2>&1
  timeout 20 lspci -nn > "$dir/lspci-nn.txt" 2>&1
  timeout 20 lspci -tv > "$dir/lspci-tree.txt" 2>&1
  timeout 60 lspci -vvv > "$dir/lspci-vvv.txt" 2>&1
  (timeout 20 dmesg 2>&1 || timeout 20 journalctl -k -b --no-pager 2>&1) | grep -iE 'dmar|amd-vi|iommu|acs' | head -200 \
    > "$dir/kernel-log-iommu.txt"
  for dev in /sys/bus/pci/devices/*; do
    [[ $(cat "$dev/vendor" 2>/dev/null) == 0x10de ]] && readlink -f "$dev" >> "$dir/nvidia-sysfs-paths.txt"
  done
  timeout 120 python3 -m sm120check doctor --select iommu,pcie_acs --json > "$dir/doctor-pcie.json" 2> "$dir/doctor-pcie.err"
  local rc=$?
  timeout 120 python3 -m sm120check doctor --select iommu,pcie_acs > "$dir/doctor-pcie.txt" 2>&1
  cat "$dir/doctor-pcie.txt"
  [[ $rc -le 1 ]]
}

phase_pcie_pairs() {
  log "pcie-pairs: the pair checks' machinery on this machine's GPUs"
  local dir="$out/pcie-pairs" rc=0
  mkdir -p "$dir"
  PYTHONPATH="$PYTHONPATH:$root/scripts/device" timeout 240 "$VENV/bin/python" scripts/device/pair_machinery.py "$dir" \
    > "$dir/pair-machinery.txt" 2>&1 || rc=1
  tail -c 4000 "$dir/pair-machinery.txt"
  timeout 300 "$VENV/bin/python" -m sm120check doctor --level 3 --select gpu_peer_bandwidth,gpu_peer_stress,nccl_pairs \
    --json > "$dir/doctor-pairs.json" 2> "$dir/doctor-pairs.err"
  [[ $? -le 1 ]] || rc=1
  timeout 300 "$VENV/bin/python" -m sm120check doctor --level 3 --select gpu_peer_bandwidth,gpu_peer_stress,nccl_pairs \
    > "$dir/doctor-pairs.txt" 2>&1
  cat "$dir/doctor-pairs.txt"
  return $rc
}

failed=()
for phase in "$@"; do
  "phase_${phase//-/_}" || { log "phase $phase failed"; failed+=("$phase"); }
done
log "phases failed: ${failed[*]:-none}"
[[ ${#failed[@]} -eq 0 ]]
