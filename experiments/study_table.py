"""What the studies of one split share (counts_dropout.py, ensemble_runs.py, cross_model_devices.py,
cross_model_arms.py): their command line (a development seed, an arm, or --table), a prediction's scores, and the
rows file as its table's groups (a rerun's row replaces the earlier one of the same run; a group's cells are means
over its seeds)."""
import argparse
import json
import sys
from collections import defaultdict

import numpy as np


def study_args(doc: str, arms, default_arm: str, more=None) -> argparse.Namespace:
    """``--seed S --arm A`` (a development seed: the locked ones are `cdmpp protocol --locked`'s) or ``--table``;
    ``more(parser)`` adds a study's own options."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int)
    ap.add_argument("--arm", choices=tuple(arms), default=default_arm)
    ap.add_argument("--table", action="store_true")
    if more is not None:
        more(ap)
    a = ap.parse_args()
    from cdmpp.evaluation.splits import LOCKED_SEEDS

    if not a.table and (a.seed is None or a.seed in LOCKED_SEEDS):
        sys.exit("a development seed (not 1000-1002: the locked ones are run by `cdmpp protocol --locked`)")
    return a


def scored(programs, seconds, order=None) -> dict:
    """MAPE, capped MAPE, fast-10 % and within-task Spearman (of ``order`` where given) of ``seconds``."""
    from cdmpp.evaluation import metrics as ev

    y = np.array([p.seconds for p in programs])
    m = ev.evaluate(y, [(p.device, p.task) for p in programs], seconds, rank_key=order)
    return dict(mape=m["mape"], mape_capped=m["mape_capped"], fast10=m["mape_fast10"], spearman=m["spearman"], n=len(y))


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
