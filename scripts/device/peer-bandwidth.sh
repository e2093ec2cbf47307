#!/usr/bin/env bash
# The two-GPU run of gpu_peer_bandwidth (issue #17): the peer probe's payload on --gpus 0,1 (or the GPUs given), then
# the check's verdict through the doctor. Runs from the repository root of the carried tree; needs python3 and the
# driver, no torch.
#
# Usage (device, kind nvidia-h200-x2 or larger): scripts/device/peer-bandwidth.sh [GPUS]   GPUS defaults to 0,1
# Writes $OUT/peer-bandwidth.json (the payload), $OUT/peer-bandwidth.stderr and $OUT/doctor-peer.json when $OUT is set.
set -uo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
python=${PYTHON:-python3}
out=${OUT:-$(mktemp -d)}
gpus=${1:-0,1}
export PYTHONPATH="$root/python/sm120check/src${PYTHONPATH:+:$PYTHONPATH}"

nvidia-smi topo -m || true
echo "== peer_bandwidth probe on GPUs $gpus (bounded: 120 s)"
timeout -k 5 120 "$python" -m sm120check.doctor.comm.peer_bandwidth_probe --gpus "$gpus" --timeout 110 \
  >"$out/peer-bandwidth.json" 2>"$out/peer-bandwidth.stderr"
rc=$?
echo "probe exit $rc; last step: $(grep '^sm120check-step:' "$out/peer-bandwidth.stderr" | tail -1)"
grep -v '^sm120check-step:' "$out/peer-bandwidth.stderr" | tail -3 || true
cat "$out/peer-bandwidth.json"
echo "== gpu_peer_bandwidth through the doctor (with topology beside it, bounded: 300 s)"
timeout -k 5 300 "$python" -m sm120check doctor --level 3 --json --gpus "$gpus" \
  --select driver,topology,gpu_peer_bandwidth >"$out/doctor-peer.json" 2>"$out/doctor-peer.stderr"
echo "doctor exit $? (1 on a FAIL verdict)"
"$python" - "$out/doctor-peer.json" <<'PY' || true
import json, sys
for r in json.load(open(sys.argv[1]))["results"]:
    print(f"{r['status'].upper():4} {r['id']} ({r['seconds']:.2f} s): {r['summary']}")
    if r["id"] == "gpu_peer_bandwidth":
        print(r["details"])
        print(json.dumps(r["data"]))
PY
exit "$rc"
