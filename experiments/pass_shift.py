"""How later passes moved the labels. Per collection run: a run that hit a uniform slow spell would show
its second passes faster across the board (median well below 1); per-program noise shows as wide tails.
How many valid passes the labels have, and per pass count how far the last pass moved the label (the
fastest repeat over all passes); if a third pass rarely moves it, more passes would not change the data.

    python benchmarks/pass_shift.py [DEVICE] [DATASET]
"""
import sys
from collections import Counter, defaultdict

import numpy as np

from cdmpp.records.labels import label, usable
from cdmpp.records.store import RecordStore

device = sys.argv[1] if len(sys.argv) > 1 else "amd-epyc-znver4-2t/llvm-avx512"
dataset = sys.argv[2] if len(sys.argv) > 2 else "datasets/measurements"
by_run, moved, passes = defaultdict(list), defaultdict(list), Counter()
for r in RecordStore(dataset).iter_records(device):
    later = [p for p in r.get("remeasures", []) if usable(p)]
    if label(r) is not None:
        passes[1 + len(later)] += 1
    if r.get("error") is None and r.get("seconds") and later:
        fastest = [min(p["seconds"]) for p in [r] + later]  # each pass's fastest repeat, in order
        by_run[r["run"]].append(fastest[1] / fastest[0])
        moved[len(fastest)].append(1 - min(fastest) / min(fastest[:-1]))
for run, ratios in sorted(by_run.items()):
    x = np.array(ratios)
    print(f"{run}: {len(x)} programs, second / first pass: median {np.median(x):.3f}, p10 {np.percentile(x, 10):.3f}, "
          f"p90 {np.percentile(x, 90):.3f}; > 10 % faster {np.mean(x < 0.9):.1%}, > 10 % slower {np.mean(x > 1.1):.1%}")
for n, shifts in sorted(moved.items()):
    x = np.array(shifts)
    print(f"{len(x)} labels with {n} passes, how much pass {n} lowered each: median {np.median(x):.1%}, p90 {np.percentile(x, 90):.1%}; "
          f"by > 3 % {np.mean(x > 0.03):.1%}, by > 10 % {np.mean(x > 0.10):.1%}")
print(f"{sum(passes.values())} labels; " + ", ".join(f"{passes[n]} with {n} passes" for n in sorted(passes)))
