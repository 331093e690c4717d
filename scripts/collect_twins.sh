#!/bin/sh
# Background collection of twins: the 2-thread AVX-512 device's programs of three networks on the AVX2
# target (2 threads), so that device has data early; then all of them on the 1-thread device, then the rest
# on the AVX2 target. Resumable: run it again after a stop. Stop it with
#   kill -TERM $(cat datasets/collect-twins.pid)      (it ends after the program in flight)
# It pauses while any datasets/PAUSE* or datasets/measurements/PAUSE* file exists.
cd "$(dirname "$0")/.." || exit 1
echo $$ > datasets/collect-twins.pid
SRC=amd-epyc-znver4-2t/llvm-avx512
forget() { [ "$(cat datasets/collect-twins.pid 2>/dev/null)" = "$$" ] && rm -f datasets/collect-twins.pid; }  # not a newer run's
trap 'kill -TERM $child 2>/dev/null; wait $child; forget; exit 130' TERM INT
.venv/bin/cdmpp collect --threads 2 --mcpu x86-64-v3 --programs-from $SRC --per-task 0 \
  --networks resnet18,mobilenet_v2,bert_tiny & child=$!; wait $child || exit $?
.venv/bin/cdmpp collect --threads 1 --programs-from $SRC --per-task 0 & child=$!; wait $child || exit $?
.venv/bin/cdmpp collect --threads 2 --mcpu x86-64-v3 --programs-from $SRC --per-task 0 & child=$!; wait $child
forget
