"""``cdmpp bench train``: peak memory of training from a feature store of N programs, per million programs.

A memory benchmark, not a training run: the store's N programs are the first ``--base`` real featurized
programs of the dataset repeated (labels and all) until there are N (``replicate_store``). A fresh process
opens the store memory-mapped and trains the shipped recipe, its budgets cut to ``--steps`` transformer steps
and ``--gbt-trees`` trees of the blended GBT: the normalizer's passes over every leaf, the labels, program
inputs and batches of the whole store, the GBT's quantized matrix built from the store's chunks, the Amdahl
anchors' pass over every leaf, validation on ``--val`` real programs held in memory. Its peak
resident set (``VmHWM``: mapped file pages it holds count, the page cache does not) is what is reported,
also per million programs, beside the same process's resident set once torch and cdmpp were imported.
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing as mp
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path


def _peak_rss_mb() -> float:
    """This process's peak resident set: ``VmHWM``, the high-water mark of its own address space. Not
    ``ru_maxrss``, which Linux carries across fork + exec: a process spawned by one holding 3 GB reports 3 GB."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024.0
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def _train(store_path: str, val, table: dict, steps: int, gbt_trees: int, batch_size: int, device: str, threads: int,
           queue) -> None:
    """In a fresh process (its own peak RSS): open the store, train ``steps`` steps, report."""
    import torch

    torch.set_num_threads(threads)
    from cdmpp.model.feature_store import FeatureStore
    from cdmpp.model.training import TrainConfig, fit

    imported = _peak_rss_mb()
    t0 = time.monotonic()
    config = dataclasses.replace(TrainConfig.recipe("default"), epochs=1, max_steps=steps, gbt_max_trees=gbt_trees,
                                 batch_size=batch_size, progress=False)
    model = fit(config, FeatureStore(store_path), val, device_table=table, device=device)
    member = model.summary["members"][0]
    queue.put(dict(rss_after_imports_mb=round(imported, 1), peak_rss_mb=round(_peak_rss_mb(), 1),
                   fit_seconds=round(time.monotonic() - t0, 1), steps=steps, stopped=member["stopped"],
                   gbt_blend=config.gbt_blend, gbt_trees=model.gbt.booster_.num_boosted_rounds() if model.gbt else 0,
                   amdahl_transfer=config.amdahl_transfer, anchors=model.anchors))


def run(n: int, base: int, n_val: int, steps: int, gbt_trees: int, batch_size: int, device: str, threads: int,
        dataset: str, task_table: str, devices: str, store_dir: str | None, keep: bool) -> dict:
    from cdmpp.devices.table import DeviceTable
    from cdmpp.model.feature_store import FeatureStore, replicate_store, write_store
    from cdmpp.records.dataset import load_dataset
    from cdmpp.zoo.tasks import TaskTable

    root = Path(store_dir or tempfile.mkdtemp(prefix="cdmpp-bench-train-"))
    path = root / f"store-{n}"
    ds = load_dataset(dataset, TaskTable.load(task_table), limit=base + n_val, progress=False)
    if len(ds) < n_val + 2:
        raise ValueError(f"{dataset}: {len(ds)} labelled programs, the benchmark needs more than --val {n_val}")
    real, val = ds.programs[:-n_val], ds.programs[-n_val:]
    t0 = time.monotonic()
    if not (path / "meta.json").exists() or FeatureStore(path).meta.get("n") != n:
        src = write_store(root / "base", real)
        replicate_store(src, path, n)
    build_s = time.monotonic() - t0
    store = FeatureStore(path)
    size = sum(f.stat().st_size for f in path.iterdir())
    table = DeviceTable(devices).spec_table()
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_train, args=(str(path), val, table, steps, gbt_trees, batch_size, device, threads,
                                                      queue))
    proc.start()
    result = None
    while result is None and (proc.is_alive() or not queue.empty()):
        try:
            result = queue.get(timeout=1.0)
        except Exception:  # queue.Empty: still training
            pass
    proc.join()
    if result is None:
        raise RuntimeError(f"the training process ended with status {proc.exitcode} and no result (its error above)")
    out = dict(programs=n, real_programs=len(real), leaf_rows=int(store.offsets[-1]), store_mb=round(size / 2**20, 1),
               store_build_seconds=round(build_s, 1), batch_size=batch_size, device=device, threads=threads, **result)
    out["peak_rss_mb_per_million_programs"] = round(out["peak_rss_mb"] / (n / 1e6), 1)
    out["note"] = (f"memory benchmark: {len(real)} real featurized programs repeated to {n}; "
                   f"validation on {n_val} other real programs in memory")
    if not keep:
        shutil.rmtree(root if store_dir is None else path, ignore_errors=True)
        if store_dir is not None:
            shutil.rmtree(root / "base", ignore_errors=True)
    return out


def main(args) -> int:
    out = run(args.programs, args.base, args.val, args.steps, args.gbt_trees, args.batch_size, args.device, args.threads,
              args.dataset, args.task_table, args.devices, args.store, args.keep)
    print(f"{out['programs']:,} programs ({out['note']}), store {out['store_mb']:,.0f} MB; {out['steps']} steps, "
          f"{out['gbt_trees']} GBT trees: "
          f"peak RSS {out['peak_rss_mb']:,.0f} MB ({out['rss_after_imports_mb']:,.0f} MB after imports), "
          f"{out['peak_rss_mb_per_million_programs']:,.0f} MB per million programs; fit {out['fit_seconds']} s")
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
        print(f"wrote {args.json}", file=sys.stderr)
    return 0
