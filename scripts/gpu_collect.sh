#!/bin/bash
# On a lent GPU machine, the call after `bash scripts/gpu_env.sh` stashed part 1 (scripts/gpu_transfer.py):
#   bash scripts/gpu_collect.sh MINUTES SEED [TWIN_SOURCE]
# measures CUDA programs with the fast measurer into $OUT/ds (first twins of TWIN_SOURCE's programs, whose
# record parts the call carries in build/gpu-ds), notes where the time goes in $OUT/diag.txt (nvidia-smi, lscpu,
# then top and py-spy stacks of the collector and three of its workers at 1, 2.5, 4 and 5.5 minutes, py-spy when
# build/pyspy/py-spy is carried) and packs $OUT/ds.tgz: four files, as a call brings back at most eight.
# Back here: unpack it, `cdmpp devices add` the probed spec from devices-gpu.json if the device is new, and
# `python -m cdmpp.records.importers <folder>/ds`.
source scripts/gpu_env.sh || exit 1
minutes=${1:-6} seed=${2:-1} src=$3
mkdir -p "$OUT/ds"
diag=$OUT/diag.txt
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv; lscpu; } > "$diag" 2>&1
from=()
cp datasets/devices.json "$OUT/devices-gpu.json"  # --programs-from names a device of this table
if [ -n "$src" ]; then cp build/gpu-ds/* "$OUT/ds/"; from=(--programs-from "$src"); fi
export PYTHONUNBUFFERED=1
timeout -k 20 -s TERM $(( ${minutes%.*} * 60 + 90 )) python -m cdmpp.cli collect --target cuda --dataset "$OUT/ds" \
  --devices "$OUT/devices-gpu.json" --per-task 8 --budget-minutes "$minutes" --quiet-share 1 --artifacts none \
  --seed "$seed" --min-repeat-ms 10 --run-budget-s 0.5 "${from[@]}" > "$OUT/collect.log" 2>&1 &
pid=$! start=$SECONDS
for at in 60 150 240 330; do
  while kill -0 $pid 2>/dev/null && (( SECONDS - start < at )); do sleep 2; done
  kill -0 $pid 2>/dev/null || break
  { echo "==== at ${at} s: $(date -u)"; top -b -n1 -w 200 | head -45; } >> "$diag" 2>&1
  if [ -x build/pyspy/py-spy ]; then
    coll=$(pgrep -f "cdmpp.cli collect" | grep -vx "$$" | tail -1)
    for p in $coll $(pgrep -P "$coll" | head -3); do
      echo "== pid $p: $(tr '\0' ' ' < /proc/$p/cmdline | cut -c1-120)"; build/pyspy/py-spy dump --pid "$p" 2>&1 | head -60
    done >> "$diag" 2>&1
  fi
done
wait $pid; echo "collector exit $?" >> "$OUT/collect.log"
for f in build/gpu-ds/*; do rm -f "$OUT/ds/${f##*/}"; done  # only what this call measured goes back
tar czf "$OUT/ds.tgz" -C "$OUT" ds devices-gpu.json && rm -rf "$OUT/ds"
tail -c 3000 "$OUT/collect.log"
