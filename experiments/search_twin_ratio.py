"""How the 1-thread label relates to the 2-thread one on the Zen 4 VM, for search candidates and for random programs
(every search candidate of amd-epyc-znver4-2t has a 1-thread twin since 8 Dec): the spread the thread transfer
(Amdahl's law, at most 2x from 2 threads to 1) has to carry on the programs a tuner looks at.

    .venv/bin/python experiments/search_twin_ratio.py     # ~5 s
"""

import numpy as np

from cdmpp.records.labels import label
from cdmpp.records.store import RecordStore

s = RecordStore('datasets/measurements')
two = {}
for r in s.iter_records('amd-epyc-znver4-2t/llvm-avx512', traces=False):
    y = label(r)
    if y is not None:
        two[r['program_hash']] = (y, bool(r.get('search')), r['task'])
one = {r['program_hash']: label(r) for r in s.iter_records('amd-epyc-znver4-1t/llvm-avx512', traces=False) if label(r) is not None}
for name, want in (('search candidates', True), ('random programs', False)):
    pairs = [(one[h], v[0], v[2]) for h, v in two.items() if v[1] == want and h in one]
    r = np.array([a / b for a, b, _ in pairs])
    # fastest tenth of each task (by the 2-thread label)
    by = {}
    for a, b, t in pairs:
        by.setdefault(t, []).append((b, a / b))
    fast = [x for v in by.values() for _, x in sorted(v)[:max(1, len(v) // 10)]]
    q = np.percentile(r, [10, 50, 90])
    print(f"{name}: n={len(r)}, ratio t1/t2 p10/p50/p90 = {q[0]:.2f}/{q[1]:.2f}/{q[2]:.2f}, "
          f"share > 1.8 = {np.mean(r > 1.8):.2f}; fastest tenth per task n={len(fast)} median {np.median(fast):.2f}")
