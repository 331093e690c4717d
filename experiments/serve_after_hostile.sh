#!/bin/bash
# Issue 18, item 8: cdmpp bench serve before and after the hostile suite, with controls of the same length
# (a CPU burn, idle). Run it alone: /work/cpu-slot benchmarks/serve_after_hostile.sh [OUT_DIR] [REPS]
# Per repetition: 3 benchmarks back to back (run-to-run spread), the hostile suite, 2 benchmarks, a CPU
# burn as long as the suite, 1 benchmark, idle as long, 1 benchmark. Each step's machine counters
# (/proc/stat, /proc/vmstat, /proc/meminfo, page reporting, TIME_WAIT sockets, sandbox folders) go to
# snaps.txt; one line per step to summary.txt (mixed-phase programs/s, CPU jiffies the step used).
D=${1:-serve-after-hostile}; REPS=${2:-1}; mkdir -p "$D"
PY=${PY:-python}
snap() {
  { echo "== $1 $(date +%T)"; head -1 /proc/stat
    grep -E "^(MemFree|Cached|AnonPages):" /proc/meminfo | tr -s ' ' | tr '\n' ' '; echo
    grep -E "^(pgfault|pgmajfault|pgpgin) " /proc/vmstat | tr '\n' ' '; echo
    echo "reported_kib $(cat /sys/module/page_reporting/parameters/reported_kib 2>/dev/null) time_wait $(ss -tan state time-wait | wc -l)" \
         "sandbox_dirs $(ls -d "${TMPDIR:-/tmp}"/cdmpp-sandbox-* 2>/dev/null | wc -l) python $(pgrep -c python)"
  } >> "$D/snaps.txt"
}
busy() { head -1 /proc/stat | awk '{print $2 + $3 + $4}'; }
bench() {
  snap "before-$1"; c0=$(busy)
  $PY -m cdmpp.cli bench serve --duration 45 --json "$D/$1.json" > "$D/$1.txt" 2> "$D/$1.err"
  echo "$1 mixed $(grep -o 'mixed.*programs/s' "$D/$1.txt" | awk '{print $(NF-1)}') programs/s," \
       "cpu $(( $(busy) - c0 )) jiffies" >> "$D/summary.txt"
  snap "after-$1"
}
for r in $(seq "$REPS"); do
  bench r$r-b1; bench r$r-b2; bench r$r-b3
  snap "before-hostile-$r"; t0=$(date +%s)
  $PY -m pytest -q -p no:cacheprovider tests/service/test_hostile.py > "$D/r$r-hostile.txt" 2>&1
  T=$(( $(date +%s) - t0 )); echo "r$r hostile suite $T s: $(tail -1 "$D/r$r-hostile.txt")" >> "$D/summary.txt"
  snap "after-hostile-$r"
  bench r$r-b4; bench r$r-b5
  for i in 1 2; do timeout "$T" $PY -c "while True: pass" & done; wait
  echo "r$r CPU burn $T s" >> "$D/summary.txt"
  bench r$r-b6
  sleep "$T"; echo "r$r idle $T s" >> "$D/summary.txt"
  bench r$r-b7
done
cat "$D/summary.txt"
