#!/usr/bin/env bash
# Run the node-health probe on the GPU machine, print its payload and the verdicts, then time torch's CUDA start
# and `sm120check doctor --level 2 --json` (3 runs each, medians; issue 16's target: doctor <= 1.1 x torch). Runs from the repository root of the carried tree; needs only python3 and the driver.
#
# Usage (device): scripts/device/node-health.sh [PROBE ARGS...]   e.g. --gpus 0 or --no-load
# Writes $OUT/node-health.json (the payload), $OUT/node-health-verdicts.txt, $OUT/doctor-{1,2,3}.json and the
# times ($OUT/torch-times.txt, $OUT/doctor-times.txt) when $OUT is set.
set -uo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
python=${PYTHON:-python3}
out=${OUT:-$(mktemp -d)}
export PYTHONPATH="$root/python/sm120check/src${PYTHONPATH:+:$PYTHONPATH}"

echo "== node_health probe (bounded: 120 s)"
start=$(date +%s.%N)
timeout -k 5 120 "$python" -m sm120check.doctor.gpu.node_health_probe "$@" >"$out/node-health.json" 2>"$out/node-health.stderr"
rc=$?
end=$(date +%s.%N)
echo "probe exit $rc in $(awk "BEGIN{printf \"%.2f\", $end - $start}") s; last step: $(grep '^sm120check-step:' "$out/node-health.stderr" | tail -1)"
tail -3 "$out/node-health.stderr" | grep -v '^sm120check-step:' || true
echo "== payload"
cat "$out/node-health.json"
echo "== verdicts"
"$python" "$root/scripts/device/health_show.py" "$out/node-health.json" | tee "$out/node-health-verdicts.txt"

# Three runs each, medians: the doctor at level 2 (every check, the health probe beside them) against the torch
# one-liner; issue 16's target is doctor <= 1.1 x torch. Each run is bounded; a failed run still counts its time.
# seconds FILE CMD...: run CMD, append its wall time to FILE, return its exit status
seconds() {
  local file=$1 s e r; shift
  s=$(date +%s.%N); "$@"; r=$?; e=$(date +%s.%N)
  awk "BEGIN{printf \"%.3f\n\", $e - $s}" >>"$file"
  return $r
}
median() { sort -g | awk '{a[NR]=$1} END{print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }

# One discarded run of each first (cold page cache, first CUDA start after boot), then RUNS pairs interleaved
# (torch, doctor, torch, doctor, ...) so a noisy neighbour or a clock change hits both alike.
runs=${RUNS:-5}
torch_start() { timeout -k 5 180 "$python" -c 'import torch; torch.cuda.init(); torch.zeros(1).cuda()' 2>>"$out/torch.stderr"; }
doctor_run() { timeout -k 5 300 "$python" -m sm120check doctor --level 2 --json >"$out/doctor-$1.json" 2>>"$out/doctor.stderr"; }
echo "== warm-up: torch CUDA start, doctor --level 2 (not counted)"
torch_start || echo "torch warm-up failed: $(tail -1 "$out/torch.stderr")"
doctor_run 0; echo "doctor warm-up exit $?"
echo "== $runs interleaved pairs: torch one-liner (bounded 180 s), doctor --level 2 --json (bounded 300 s)"
: >"$out/torch-times.txt"
: >"$out/doctor-times.txt"
for i in $(seq 1 "$runs"); do
  seconds "$out/torch-times.txt" torch_start || echo "torch run $i failed: $(tail -1 "$out/torch.stderr")"
  seconds "$out/doctor-times.txt" doctor_run "$i"
  # the doctor's own JSON went to doctor-$i.json; its exit is 1 on a FAIL verdict, which is not a broken run
  echo "pair $i: doctor exit $?"
done
echo "torch import + cuda init + first tensor: $(tr '\n' ' ' <"$out/torch-times.txt")s; median $(median <"$out/torch-times.txt") s"
"$python" - "$out"/doctor-[1-9]*.json <<'PY' || true
import json, sys
inner = [json.load(open(path))["seconds"] for path in sys.argv[1:]]
print("doctor's own run time (facts + checks, without interpreter start-up and imports):", " ".join(f"{s:.3f}" for s in inner), "s")
doc = json.load(open(sys.argv[1]))
for r in doc["results"]:
    if r.get("family") == "node_health":
        print(f"{r['status'].upper():4} {r['id']} ({r['seconds']:.2f} s): {r['summary']}")
slow = sorted(doc["results"], key=lambda r: -r["seconds"])[:5]
print("slowest checks:", ", ".join(f"{r['id']} {r['seconds']:.2f} s" for r in slow))
PY
t=$(median <"$out/torch-times.txt"); d=$(median <"$out/doctor-times.txt")
echo "doctor level 2: $(tr '\n' ' ' <"$out/doctor-times.txt")s; median $d s = $(awk "BEGIN{printf \"%.2f\", $d / ($t > 0 ? $t : 1)}") x torch (target <= 1.1)"
exit "$rc"
