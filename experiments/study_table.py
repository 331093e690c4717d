"""The rows file of a study as its table's groups: a rerun's row replaces the earlier one of the same run, and a
group's cells are means over its seeds (one place for what counts_dropout.py, ensemble_runs.py and
cross_model_devices.py print)."""
import json
from collections import defaultdict

import numpy as np


def grouped(path, run_key, group_key) -> dict:
    """{group: [the last row of each of its runs]}; run_key / group_key map a row to its run / group."""
    last = {}
    with open(path) as f:
        for line in f:
            row = json.loads(line)
            last[run_key(row)] = row
    groups = defaultdict(list)
    for row in last.values():
        groups[group_key(row)].append(row)
    return groups


def cell(values, key: str, spread: bool = False) -> str:
    """A Spearman as a mean, an error as a mean in % (± its std over seeds when ``spread`` and there are several)."""
    v = np.asarray(values, dtype=float)
    if key == "spearman":
        return f"{v.mean():.3f}"
    return f"{100 * v.mean():.1f}" + (f" ± {100 * v.std():.1f}" if spread and len(v) > 1 else "")
