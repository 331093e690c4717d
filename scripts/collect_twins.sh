#!/bin/sh
# The chip routine (issue 54 item 4; datasets/README.md, "Twins in the background"): the VM's chip changes
# between sessions and each chip is a device worth having. This probes the chip, counts the labelled twins
# of the core program set (the 2-thread Zen 4 AVX-512 device's programs) that its 1-thread and all-thread
# devices hold, and measures the rest of them, 1 thread first, then all threads; a device with TARGET
# (20,000) twins or more is left alone. Then the all-thread device's other programs (the candidates of
# `cdmpp collect --from-search`) are measured on 1 thread too, so each has a twin. Resumable: run it again
# after a stop. Stop it with
#   kill -TERM $(cat datasets/collect-twins.pid)      (it ends after the program in flight)
# It pauses while any datasets/PAUSE* or datasets/measurements/PAUSE* file exists.
cd "$(dirname "$0")/.." || exit 1
echo $$ > datasets/collect-twins.pid
SRC=amd-epyc-znver4-2t/llvm-avx512
TARGET=${TARGET:-20000}
forget() { [ "$(cat datasets/collect-twins.pid 2>/dev/null)" = "$$" ] && rm -f datasets/collect-twins.pid; }  # not a newer run's
trap 'kill -TERM $child 2>/dev/null; wait $child; forget; exit 130' TERM INT
twins() {  # labelled programs of device $1 that are also labelled on $SRC
  .venv/bin/python - "$1" "$SRC" <<'EOF'
import sys
from cdmpp import defaults
from cdmpp.records.labels import label
from cdmpp.records.store import RecordStore
store = RecordStore(defaults.DATASET)
src = {r["program_hash"] for r in store.iter_records(sys.argv[2], traces=False) if label(r) is not None}
print(sum(1 for r in store.iter_records(sys.argv[1], traces=False) if label(r) is not None and r["program_hash"] in src))
EOF
}
for threads in 1 "$(nproc)"; do
  id=$(.venv/bin/cdmpp devices probe --threads "$threads" | .venv/bin/python -c 'import json,sys; print(json.load(sys.stdin)["id"])')
  [ "$threads" = 1 ] && one=$id || all=$id
  [ "$id" = "$SRC" ] && continue  # the core set's own device
  have=$(twins "$id")
  echo "$(date -u +%H:%M) $id: $have labelled twins of $SRC (target $TARGET)"
  [ "$have" -ge "$TARGET" ] && continue
  .venv/bin/cdmpp collect --threads "$threads" --programs-from $SRC --per-task 0 --seed 1 & child=$!
  wait $child || { forget; exit 1; }
done
# then every other program of the all-thread device (its `collect --from-search` candidates) twinned on 1 thread
if [ "$one" != "$all" ]; then
  echo "$(date -u +%H:%M) $one: twins of the rest of $all's programs"
  .venv/bin/cdmpp collect --threads 1 --programs-from "$all" --per-task 0 --seed 1 & child=$!
  wait $child || { forget; exit 1; }
fi
forget
