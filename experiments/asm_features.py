"""Does the machine code LLVM makes of a schedule tell the latency GBT what TVM's per-store rows do not?
(issue 55: random-new is at 34 %; a per-task correction and other chips' labels do not move it
(reports/random-new-levers.md): the error is spread among a task's programs, where the rows describe the
schedule as asked, not what the compiler made of it: vector widths it reached, spills, unrolled copies.)

    .venv/bin/python experiments/asm_features.py compile --part 0 --parts 2 &   # and --part 1: → datasets/assembly/llvm-znver4/
    .venv/bin/python experiments/asm_features.py study                           # the GBT with and without them
    .venv/bin/python experiments/asm_features.py network 0 --epochs 20           # the shipped recipe with and without them
    .venv/bin/python experiments/asm_features.py network 0 --arms recipe,predicted  # counts estimated from the TIR features
    .venv/bin/python experiments/asm_features.py network-table                    # mean ± sd over seeds

``compile`` builds the labelled random schedules of ``--tasks`` tasks (chosen at random with ``--seed``) of the
2-thread Zen 4 device (``--tasks 0``: every program of both Zen 4 devices, each once; resumable, nothing built
twice) with ``tvm.compile`` for that device's target (as the collector built them to measure) and counts
instruction classes in the assembly, over the whole module and over its innermost loops (static counts: a loop
body counts once; ``part2-*.npz``; 5 Dec's ``part-*.npz`` hold the whole module's only).

``study`` compares ``PooledGBT(target="latency")`` with those counts (``--arms``: all, or groups of classes) beside
its inputs, on the same 5 splits of those programs (train / validation / test by program, 70 / 10 / 20 %;
``--train-share`` trains on less), early stopping on validation; validation and test both printed, a development
study (no locked seed exists for a subset like this).

``network SEED`` trains the shipped recipe (transformer + latency GBT blend) on the protocol's random-new split (or
``--setting cross-model``: its held-out networks; development seed ``SEED``; the pinned devices, both Zen 4 thread
counts), kept to the programs with counts, with and without the counts as program-level inputs of both the
transformer and its GBT, or (``predicted``) with counts a GBT estimates from the TIR features (a tuner ranks
thousands of candidates it never builds); validation and test printed (choose on validation). reports/assembly-counts.md.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import time

import numpy as np

from cdmpp.program.assembly import CLASSES, count_inputs as asm_inputs, instruction_counts as asm_counts

DEVICE = "amd-epyc-znver4-2t/llvm-avx512"
COUNTS = "datasets/assembly/llvm-znver4"  # the package's counts folder for the Zen 4 devices' build (cdmpp assembly)


def choose(seed: int, n_tasks: int) -> list:
    """The labelled random schedules of ``n_tasks`` tasks of ``DEVICE`` drawn with ``seed`` (0: every task of
    both Zen 4 devices, each program once), in program-hash order."""
    from cdmpp.records.labels import label
    from cdmpp.records.store import RecordStore

    devices = (DEVICE, "amd-epyc-znver4-1t/llvm-avx512") if n_tasks == 0 else (DEVICE,)
    recs = {}
    for device in devices:
        for r in RecordStore("datasets/measurements").iter_records(device):
            if label(r) is not None and not r.get("search"):
                recs.setdefault(r["program_hash"], r)
    if n_tasks:
        tasks = sorted({r["task"] for r in recs.values()})
        chosen = set(np.random.default_rng(seed).choice(tasks, n_tasks, replace=False))
        recs = {h: r for h, r in recs.items() if r["task"] in chosen}
    return [recs[h] for h in sorted(recs)]


def compile_part(part: int, parts: int, seed: int, n_tasks: int) -> None:
    import tvm

    from cdmpp.devices.table import DeviceTable
    from cdmpp.program.inputs import apply_trace
    from cdmpp.zoo.tasks import TaskTable, load_task_mod

    target = DeviceTable("datasets/devices.json").get(DEVICE).make_target()  # the device's mcpu, not this VM's
    table = TaskTable.load("datasets/tasks-llvm.json.gz")
    path = f"{COUNTS}/part2-{'all' if n_tasks == 0 else f's{seed}'}-{part}.npz"  # part2: with the innermost loops'
    hashes, rows, inner = [], [], []
    if os.path.exists(path):  # resume
        z = np.load(path)
        hashes, rows, inner = list(z["hashes"]), list(z["counts"]), list(z["inner"])
    done = set(hashes) | set(load_counts())  # built before, in either format: not again
    recs = [r for r in choose(seed, n_tasks)[part::parts] if r["program_hash"] not in done]
    mods, t0 = {}, time.time()
    for i, r in enumerate(recs):
        if r["task"] not in mods:
            mods[r["task"]] = load_task_mod(table[r["task"]])
        try:
            asm = tvm.compile(apply_trace(mods[r["task"]], r["trace"]), target=target).mod.inspect_source("asm")
        except Exception as e:  # noqa: BLE001 - a study: report and go on
            print(f"{r['program_hash']}: {str(e).splitlines()[-1][:120]}", flush=True)
            continue
        hashes.append(r["program_hash"])
        whole, innermost = asm_counts(asm)
        rows.append(whole)
        inner.append(innermost)
        if i % 100 == 99:
            rate = (i + 1) / (time.time() - t0)
            print(f"part {part}: {i + 1}/{len(recs)} programs, {rate:.2f}/s, ETA {(len(recs) - i - 1) / rate / 60:.1f} min",
                  flush=True)
            _save(path, hashes, rows, inner)
    _save(path, hashes, rows, inner)


def _save(path: str, hashes: list, rows: list, inner: list) -> None:
    """Written whole, then renamed: a stop mid-write leaves the last complete file."""
    np.savez_compressed(path + ".tmp.npz", hashes=np.array(hashes), counts=np.array(rows), inner=np.array(inner))
    os.replace(path + ".tmp.npz", path)


def load_counts(inner: bool = False) -> dict:
    """Program hash → whole-module counts (``part-*``: 5 Dec's builds; ``part2-*``: 6 Dec's, with the innermost
    loops'); ``inner``: the innermost loops' counts appended, of the ``part2`` builds only."""
    out = {}
    for path in sorted(glob.glob(f"{COUNTS}/part2-*.npz" if inner else f"{COUNTS}/part*-*.npz")):
        z = np.load(path)
        out.update(zip(z["hashes"], np.hstack([z["counts"], z["inner"]]) if inner else z["counts"]))
    return out


GROUPS = {  # class groups for ``study --arms``: which part of the counts carries the gain
    "vector": [n for n, _ in CLASSES if n.split("_")[0] in ("fma", "arith", "mov") or n in ("broadcast", "gather", "shuffle")],
    "spill": ["spill"], "control": ["all", "branch", "call", "int", "blocks"],
}


def group_mask(arm: str, inner: bool = False) -> np.ndarray:
    """1 on the ``asm_inputs`` columns of the groups named in ``arm`` ("all", or groups joined by "+"; "+inner": the
    innermost loops' counts too, where ``inner`` says the inputs carry them)."""
    names = [n for n, _ in CLASSES] + ["blocks"]
    groups = [g for g in arm.split("+") if g != "inner"]
    keep = np.array([groups == ["all"] or any(n in GROUPS[g] for g in groups) for n in names], float)
    mask = np.concatenate([keep, keep[1:-1]])
    return np.concatenate([mask, np.full_like(mask, "inner" in arm.split("+"))]) if inner else mask


def count_inputs(c: np.ndarray) -> np.ndarray:
    """``asm_inputs`` of the whole module's counts, and of the innermost loops' where ``c`` carries them."""
    n = len(CLASSES) + 1
    return asm_inputs(c) if len(c) == n else np.concatenate([asm_inputs(c[:n]), asm_inputs(c[n:])])


def study(nthread: int, splits: int, train_share: float = 0.7, arms: tuple = ("all",)) -> None:
    from cdmpp.devices.table import DeviceTable
    from cdmpp.evaluation.metrics import score
    from cdmpp.evaluation.protocol import ProtocolOptions, load_pinned
    from cdmpp.model.pooled_gbt import PooledGBT

    inner = any("inner" in arm.split("+") for arm in arms)
    counts = load_counts(inner)  # with an inner arm: the programs of the part2 builds only, for every arm

    def asm_gbt(mask):
        class AsmGBT(PooledGBT):
            def inputs(self, programs):
                extra = np.stack([count_inputs(counts[p.features.program_hash]) * mask for p in programs])
                return np.hstack([super().inputs(programs), extra.astype(np.float32)])
        return AsmGBT

    methods = [("latency GBT", PooledGBT)] + [
        ("latency GBT + assembly counts" + ("" if arm == "all" else f" ({arm})"), asm_gbt(group_mask(arm, inner)))
        for arm in arms]

    opts = ProtocolOptions(device_ids=(DEVICE,))
    ds = load_pinned(opts)
    progs = [p for p in ds.programs if p.features.program_hash in counts and not np.isnan(p.seconds)]
    table = DeviceTable(opts.devices).spec_table()
    print(f"{len(progs)} programs of {len({p.task for p in progs})} tasks with assembly counts", flush=True)
    rows = []
    for s in range(splits):
        part = np.random.default_rng(s).random(len(progs))
        train = [p for p, u in zip(progs, part) if u < train_share]  # nested: a smaller share is part of a larger
        val = [p for p, u in zip(progs, part) if 0.7 <= u < 0.8]
        test = [p for p, u in zip(progs, part) if u >= 0.8]
        for name, cls in methods:
            m = cls(table, target="latency", nthread=nthread, random_state=s).fit(train, val)
            row = dict(split=s, method=name, n_train=len(train), n_programs=len(progs))
            for where, ps in (("val", val), ("test", test)):
                sc = score(ps, m.predict(ps))
                row.update({f"{where}_{k}": sc[k] for k in ("mape", "mape_fast10", "spearman")})
            print(json.dumps(row), flush=True)
            rows.append(row)
    os.makedirs("runs/asm", exist_ok=True)
    with open("runs/asm/study.jsonl", "a") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    for name, _ in methods:
        r = [x for x in rows if x["method"] == name]
        print(f"| {name} | " + " | ".join(
            f"{np.mean([x[k] for x in r]) * (1 if 'spearman' in k else 100):.3f} ± {np.std([x[k] for x in r]) * (1 if 'spearman' in k else 100):.3f}"
            for k in ("val_mape", "val_spearman", "test_mape", "test_spearman", "test_mape_fast10")) + " |")


def with_counts(counts: dict) -> None:
    """Append each program's ``asm_inputs`` to the transformer's program-level inputs (``PackedPrograms.stats``)
    and to the pooled GBT's inputs, for every model built after this call (a study's monkeypatch)."""
    from cdmpp.model.network import PackedPrograms
    from cdmpp.model.pooled_gbt import PooledGBT

    pack, gbt_inputs = PackedPrograms.from_programs.__func__, PooledGBT.inputs

    def from_programs(cls, programs, normalize=None):
        packed = pack(cls, programs, normalize)
        extra = np.stack([asm_inputs(counts[p.program_hash]) for p in programs])
        packed.stats = np.hstack([packed.stats, extra])
        return packed

    def inputs(self, programs):
        extra = np.stack([asm_inputs(counts[p.features.program_hash]) for p in programs])
        return np.hstack([gbt_inputs(self, programs), extra.astype(np.float32)])

    PackedPrograms.from_programs, PooledGBT.inputs = classmethod(from_programs), inputs


def predicted_counts(counts: dict, train: list, others: list, nthread: int, seed: int) -> dict:
    """Counts as a model of the TIR features predicts them (no build at prediction time): XGBoost on the pooled
    leaves → log1p counts, fitted on the training programs' real counts; a training program's estimate comes
    from the fold that did not see it (2 folds by program), every other program's from all training programs."""
    import xgboost as xgb

    from cdmpp.model.pooled_gbt import pooled_features

    def unique(progs):
        return list({p.features.program_hash: p for p in progs}.values())

    train, others = unique(train), unique(others)
    x_train, y_train = pooled_features(train), np.log1p(np.stack([counts[p.features.program_hash] for p in train]))
    fold = np.random.default_rng(seed).random(len(train)) < 0.5
    fit = lambda rows: xgb.XGBRegressor(n_estimators=300, max_depth=6, learning_rate=0.1, subsample=0.9,  # noqa: E731
                                        nthread=nthread, random_state=seed).fit(x_train[rows], y_train[rows])
    out = np.zeros_like(y_train)
    for half in (fold, ~fold):
        out[~half] = fit(half).predict(x_train[~half])
    est = dict(zip([p.features.program_hash for p in train], np.expm1(np.maximum(out, 0.0))))
    est.update(zip([p.features.program_hash for p in others],
                   np.expm1(np.maximum(fit(np.ones(len(train), bool)).predict(pooled_features(others)), 0.0))))
    err = np.abs(out - y_train).mean(axis=0)
    print("count estimates, out-of-fold mean |log1p error| per class: "
          + ", ".join(f"{n} {e:.2f}" for (n, _), e in zip(CLASSES + [("blocks", None)], err)), flush=True)
    return est


def network(seed: int, epochs: int, arms: list, threads: int, setting: str = "random-new") -> None:
    """The shipped recipe per arm on one protocol split kept to the programs with counts (the module's docstring);
    a row per arm in runs/asm/network.jsonl, the blend's two parts alone scored on test beside it."""
    import torch

    from cdmpp.devices.table import DeviceTable
    from cdmpp.evaluation.methods.cdmpp_model import CDMPP
    from cdmpp.evaluation.metrics import score
    from cdmpp.evaluation.protocol import ProtocolOptions, load_pinned, recipe_config, setting_splits

    torch.set_num_threads(threads)
    counts = load_counts()
    opts = ProtocolOptions()
    ds = load_pinned(opts)
    (_, split), = setting_splits(ds, setting, seed)
    kept = lambda progs: [p for p in progs if p.features.program_hash in counts]  # noqa: E731
    train, val, test = kept(split.train), kept(split.val), kept(split.test)
    print(f"{len(counts)} programs with counts; train {len(train)}/{len(split.train)}, val {len(val)}/{len(split.val)}, "
          f"test {len(test)}/{len(split.test)}", flush=True)
    table = DeviceTable(opts.devices).spec_table()
    os.makedirs("runs/asm", exist_ok=True)
    for arm in arms:  # "recipe" first, one patched arm last: a patch stays for the rest of the process
        if arm == "counts":
            with_counts(counts)
        elif arm == "predicted":
            with_counts(predicted_counts(counts, train, val + test, threads, seed))
        model = CDMPP(recipe_config("ablation-no-counts", seed=seed, epochs=epochs, progress=False), table).fit(train, val)
        row = dict(setting=setting, seed=seed, arm=arm, epochs=epochs, n_train=len(train), describe=model.describe())
        for where, ps in (("val", val), ("test", test)):
            sc = score(ps, model.predict(ps), rank_key=model.predict_order(ps))
            row.update({f"{where}_{k}": sc.get(k) for k in ("mape", "mape_fast10", "spearman")})
        gbt, model.model_.gbt = model.model_.gbt, None  # the blend's two parts alone, on test
        for part, pred in (("transformer", model.predict(test)), ("gbt", gbt.predict(test))):
            sc = score(test, pred)
            row.update({f"test_{part}_{k}": sc.get(k) for k in ("mape", "mape_fast10", "spearman")})
        model.model_.gbt = gbt
        print(json.dumps(row), flush=True)
        with open("runs/asm/network.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")


def network_table(rows_path: str) -> None:
    """Mean ± sd over seeds per setting and arm of ``network``'s rows (the last row of each setting, seed and arm)."""
    last = {}
    for line in open(rows_path):
        r = json.loads(line)
        last[(r.get("setting", "random-new"), r["arm"], r["seed"])] = r
    cols = [("val_mape", "val MAPE"), ("test_mape", "test MAPE"), ("test_mape_fast10", "fast-10 %"),
            ("test_spearman", "Spearman"), ("test_transformer_mape", "transformer alone"),
            ("test_transformer_spearman", "its Spearman"), ("test_gbt_mape", "its GBT alone"), ("test_gbt_spearman", "its Spearman"),
            ("test_gbt_mape_fast10", "its fast-10 %")]
    print("| setting | arm | seeds | train programs | " + " | ".join(c for _, c in cols) + " |")
    print("|---|---|---:|---:|" + "---:|" * len(cols))
    for setting, arm in sorted({k[:2] for k in last}, key=lambda k: (k[0], ("recipe", "predicted", "counts").index(k[1]))):
        rs = [r for k, r in sorted(last.items()) if k[:2] == (setting, arm)]
        cells = []
        for key, _ in cols:
            v = np.array([r[key] for r in rs if r.get(key) is not None], dtype=float)
            scale = 1 if "spearman" in key else 100
            cells.append("" if not len(v) else f"{v.mean() * scale:.{3 if scale == 1 else 1}f} ± {v.std() * scale:.{3 if scale == 1 else 1}f}")
        print(f"| {setting} | {arm} | {','.join(str(r['seed']) for r in rs)} | {np.mean([r['n_train'] for r in rs]):,.0f} | "
              + " | ".join(cells) + " |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("compile")
    c.add_argument("--part", type=int, default=0)
    c.add_argument("--parts", type=int, default=1)
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--tasks", type=int, default=70, help="0: every program of both Zen 4 devices (resumable)")
    s = sub.add_parser("study")
    s.add_argument("--nthread", type=int, default=2)
    s.add_argument("--splits", type=int, default=5)
    s.add_argument("--train-share", type=float, default=0.7, help="of all programs (≤ 0.7; validation and test stay)")
    s.add_argument("--arms", default="all", help=f"count groups, comma-separated: all, or {', '.join(GROUPS)} joined by +; +inner: the innermost loops' too")
    n = sub.add_parser("network")
    n.add_argument("seed", type=int)
    n.add_argument("--epochs", type=int, default=20)
    n.add_argument("--arms", default="recipe,counts", help="recipe, counts (real), predicted (from the TIR features)")
    n.add_argument("--threads", type=int, default=2)
    n.add_argument("--setting", default="random-new", choices=("random-new", "cross-model"))
    t = sub.add_parser("network-table")
    t.add_argument("rows", nargs="?", default="runs/asm/network.jsonl")
    a = ap.parse_args()
    if a.cmd == "network-table":
        network_table(a.rows)
    elif a.cmd == "network":
        patched = [arm for arm in a.arms.split(",") if arm != "recipe"]
        if len(patched) > 1 or a.arms.split(",")[-1] == "recipe" and patched:
            raise SystemExit("--arms: recipe first, then at most one of counts, predicted (a patch stays for the process)")
        network(a.seed, a.epochs, a.arms.split(","), a.threads, a.setting)
    elif a.cmd == "compile":
        os.makedirs(COUNTS, exist_ok=True)
        compile_part(a.part, a.parts, a.seed, a.tasks)
    else:
        study(a.nthread, a.splits, a.train_share, tuple(a.arms.split(",")))


if __name__ == "__main__":
    main()
