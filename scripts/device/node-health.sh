#!/usr/bin/env bash
# Run the node-health probe on the GPU machine, print its payload and the verdicts, and time torch's CUDA start for
# comparison (issue 16). Runs from the repository root of the carried tree; needs only python3 and the driver.
#
# Usage (device): scripts/device/node-health.sh [PROBE ARGS...]   e.g. --gpus 0 or --no-load
# Writes $OUT/node-health.json (the payload) and $OUT/node-health-verdicts.txt when $OUT is set.
set -uo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
python=${PYTHON:-python3}
out=${OUT:-$(mktemp -d)}
export PYTHONPATH="$root/python/sm120check/src${PYTHONPATH:+:$PYTHONPATH}"

echo "== node_health probe (bounded: 120 s)"
start=$(date +%s.%N)
timeout -k 5 120 "$python" -m sm120check.doctor.probes.node_health "$@" >"$out/node-health.json" 2>"$out/node-health.stderr"
rc=$?
end=$(date +%s.%N)
echo "probe exit $rc in $(awk "BEGIN{printf \"%.2f\", $end - $start}") s; last step: $(grep '^sm120check-step:' "$out/node-health.stderr" | tail -1)"
tail -3 "$out/node-health.stderr" | grep -v '^sm120check-step:' || true
echo "== payload"
cat "$out/node-health.json"
echo "== verdicts"
"$python" -m sm120check.doctor.health.show "$out/node-health.json" | tee "$out/node-health-verdicts.txt"

echo "== torch CUDA start, for comparison (bounded: 180 s)"
start=$(date +%s.%N)
if timeout -k 5 180 "$python" -c 'import torch; torch.cuda.init(); torch.zeros(1).cuda()' 2>"$out/torch.stderr"; then
  end=$(date +%s.%N)
  echo "torch import + cuda init + first tensor: $(awk "BEGIN{printf \"%.2f\", $end - $start}") s"
else
  echo "torch start failed or absent: $(tail -1 "$out/torch.stderr")"
fi
exit "$rc"
