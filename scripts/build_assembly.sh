#!/bin/sh
# Builds every labelled program of every CPU device for its target and counts its instructions
# (`cdmpp assembly`, into datasets/assembly/<build_key>/; reports/assembly-counts.md), PARTS processes at once
# (default: one per core), device after device. Needs no quiet machine (nothing is timed), only cores.
# Resumable: run it again after a stop; a program built before is not built again. Stop it with
#   kill -TERM $(cat datasets/build-assembly.pid)
# Commit datasets/assembly/ as it grows: builds take hours (~0.35 s per program and core).
cd "$(dirname "$0")/.." || exit 1
echo $$ > datasets/build-assembly.pid
renice -n 19 $$ >/dev/null 2>&1
PARTS=${PARTS:-$(nproc)}
children=""
forget() { [ "$(cat datasets/build-assembly.pid 2>/dev/null)" = "$$" ] && rm -f datasets/build-assembly.pid; }  # not a newer run's
trap 'kill -TERM $children 2>/dev/null; wait; forget; exit 130' TERM INT
# the twins' chips first (leave-one-chip-out holds them out), then the rest; a device whose build key is done
# finds nothing to build
for device in amd-epyc-znver3-1t/llvm-avx2 amd-epyc-znver3-2t/llvm-avx2 intel-xeon-rocketlake-1t/llvm-avx512 \
    intel-xeon-rocketlake-2t/llvm-avx512 intel-xeon-emeraldrapids-16t/llvm-avx512 amd-epyc-znver4-2t/llvm-avx2 \
    unknown-avx2-cpu-4t/llvm-avx2 amd-epyc-znver4-2t/llvm-avx512 amd-epyc-znver4-1t/llvm-avx512 \
    amd-epyc-znver5-1t/llvm-avx512; do
  echo "$(date -u +%H:%M) $device"
  children=""
  part=0
  while [ "$part" -lt "$PARTS" ]; do
    .venv/bin/cdmpp assembly --device "$device" --part "$part" --parts "$PARTS" & children="$children $!"
    part=$((part + 1))
  done
  wait
done
forget
