"""Issue 55 item 5: do features of the fast path (SIMD fill, parallel balance, working sets against the
device's caches) tell the latency GBT something its pooled TVM rows and raw device specs do not?

Each feature is a device-dependent function of a leaf's TVM row and the device's spec, so it also says
something on a chip the model never saw:

* SIMD fill: the innermost vectorized extent in float32 lanes of the device (``simd_width_bits / 32``),
  whether it is a whole number of vectors, and the share of the last vector left empty;
* parallel balance: the parallel extent against the device's threads: the share of thread time used when
  ceil(extent / threads) rounds run (1 / threads when nothing is parallel), and whether extent < threads;
* working set against the caches: per buffer (TVM's B0..B4, sorted by touched lines), log2 of its bytes
  touched between reuses and of its unique bytes over the device's L1d, L2 and L3 (per thread where the
  cache is shared), so "fits in L2" is one threshold at 0 on any chip.

Per program: the features of its leaf with the most float operations, and their max over leaves.

The arms: ``PooledGBT(target="latency")`` (the protocol's latency GBT) with and without these inputs, and with the
counts of ``experiments/lowered_vectorization.py`` beside them (``--arms``), scored on
**validation** only (DESIGN.md §5: choices are made there; the locked test is not touched), random-new on the
development seeds and cross-model on the development networks. Boosting stops early on the validation set
itself here, as in the peer; both arms get the same rule.

``.venv/bin/python experiments/fast_path_features.py [--seeds 0,1,2] [--settings random-new,cross-model]
[--nthread 2] [--out RUNS.jsonl]``: about 4 minutes a fit at 1 thread on the 2-core VM (12 fits for the
study: reports/fast-path-features.md).
"""

from __future__ import annotations

import argparse
import glob
import json

import numpy as np

from cdmpp.devices.table import DeviceTable
from cdmpp.evaluation.metrics import score
from cdmpp.evaluation.protocol import ProtocolOptions, load_pinned, setting_splits
from cdmpp.model.pooled_gbt import PooledGBT, program_rows
from cdmpp.program.features import FEATURE_NAMES

COL = {n: i for i, n in enumerate(FEATURE_NAMES)}
FLOAT_OPS = slice(0, 7)


def _raw(x):  # TVM's log2(x + 1) scaling undone
    return np.exp2(np.asarray(x, dtype=np.float64)) - 1.0


def leaf_fast_path(rows: np.ndarray, spec: dict) -> np.ndarray:
    """float64 [n_leaves, n]: the fast-path features of each leaf row on a device (``spec``: its spec dict)."""
    lanes = max(1.0, float(spec.get("simd_width_bits", 256)) / 32.0)
    threads = max(1.0, float(spec.get("cores", 1)))
    vec = np.rint(_raw(rows[:, COL["vec_len"]]))
    whole = np.where(vec > 0, (vec % lanes == 0).astype(float), 0.0)
    padded = np.maximum(np.ceil(vec / lanes) * lanes, lanes)  # vectors' lanes, at least one vector's
    empty = np.where(vec > 0, (padded - vec) / padded, 1.0)
    par = np.rint(_raw(rows[:, COL["parallel_prod"]]))
    used = np.where(par > 0, par / np.maximum(np.ceil(par / threads) * threads, 1.0), 1.0 / threads)
    under = ((par > 0) & (par < threads)).astype(float)
    caches = [1024.0 * float(spec.get(k, 0.0)) for k in ("l1d_kb", "l2_kb", "l3_kb")]
    caches[2] /= threads  # the L3 is shared: a thread's part of it
    cols = [np.log2(vec / lanes + 1.0), whole, empty, used, under]
    for b in range(5):
        for name in ("reuse_dis_bytes", "unique_bytes"):
            size = _raw(rows[:, COL[f"B{b}_{name}"]])
            cols += [np.log2((size + 1.0) / max(c, 1.0)) for c in caches]
    return np.stack(cols, axis=1)


N_FAST = 5 + 5 * 2 * 3


def program_fast_path(features, spec: dict) -> np.ndarray:
    rows = program_rows(features)
    f = leaf_fast_path(rows, spec)
    main = int(np.argmax(rows[:, FLOAT_OPS].sum(axis=1)))
    return np.concatenate([f[main], f.max(axis=0)])


class FastPathGBT(PooledGBT):
    label = "latency GBT + fast path"

    def inputs(self, programs):
        extra = np.stack([program_fast_path(p.features, self.specs.table[p.device]) for p in programs])
        return np.hstack([super().inputs(programs), extra.astype(np.float32)])


LOWERED: dict[str, np.ndarray] = {}  # program hash -> experiments/lowered_vectorization.py's counts


def load_lowered(pattern: str = "runs/lowered-vectorization-*.npz") -> None:
    for path in sorted(glob.glob(pattern)):
        with np.load(path) as z:
            LOWERED.update(zip(map(str, z["hashes"]), z["counts"]))
    print(f"lowered vectorization of {len(LOWERED):,} programs", flush=True)


def lowered_facts(features) -> np.ndarray:
    """Vectorized loops the schedule asked for, stores and vector stores after lowering, the vector share, and
    whether every vectorized loop was scalarized (loops asked for, no vector store); NaN where not computed."""
    c = LOWERED.get(features.program_hash)
    if c is None:
        return np.full(5, np.nan)
    loops, stores, vector = (float(x) for x in c)
    return np.array([loops, stores, vector, vector / max(stores, 1.0), float(loops > 0 and vector == 0)])


class LoweredGBT(FastPathGBT):
    label = "latency GBT + fast path + lowered"

    def inputs(self, programs):
        extra = np.stack([lowered_facts(p.features) for p in programs])
        return np.hstack([super().inputs(programs), extra.astype(np.float32)])


ARMS = {"latency GBT": PooledGBT, FastPathGBT.label: FastPathGBT, LoweredGBT.label: LoweredGBT}


def run(setting: str, seed: int, ds, table: dict, nthread: int, arms=tuple(ARMS)) -> list[dict]:
    (_, split), = setting_splits(ds, setting, seed)
    out = []
    for name in arms:
        m = ARMS[name](table, target="latency", nthread=nthread, random_state=seed).fit(split.train, split.val)
        s = score(split.val, m.predict(split.val))
        row = dict(setting=setting, seed=seed, method=name,
                   trees=int(m.booster_.num_boosted_rounds()), **{k: s[k] for k in ("mape", "mape_fast10", "spearman")})
        print(json.dumps(row), flush=True)
        out.append(row)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--settings", default="random-new,cross-model")
    ap.add_argument("--nthread", type=int, default=2)
    ap.add_argument("--out", default="", help="append the rows (JSON lines) here")
    ap.add_argument("--arms", default="latency GBT,latency GBT + fast path",
                    help=f"comma-separated, of: {', '.join(ARMS)} (the last reads experiments/lowered_vectorization.py's "
                         "runs/lowered-vectorization-*.npz)")
    args = ap.parse_args()
    arms = args.arms.split(",")
    if LoweredGBT.label in arms:
        load_lowered()
    opts = ProtocolOptions()
    ds = load_pinned(opts)
    table = DeviceTable(opts.devices).spec_table()
    rows = []
    for setting in args.settings.split(","):
        for seed in (int(s) for s in args.seeds.split(",")):
            rows += run(setting, seed, ds, table, args.nthread, arms)
    if args.out:
        with open(args.out, "a") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    for setting in args.settings.split(","):
        for method in arms:
            r = [x for x in rows if x["setting"] == setting and x["method"] == method]
            print(f"{setting:12s} {method:26s} " + "  ".join(
                f"{k} {100 * np.mean([x[k] for x in r]) if k != 'spearman' else np.mean([x[k] for x in r]):.3f}"
                f"±{(100 if k != 'spearman' else 1) * np.std([x[k] for x in r]):.3f}"
                for k in ("mape", "mape_fast10", "spearman")))


if __name__ == "__main__":
    main()
