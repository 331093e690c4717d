"""``cdmpp eval``: cdmpp, its ablations and its peers trained and scored on one split, one report.

Every method sees the same train/val/test programs; every fitted thing (normalizers, Box-Cox, early
stopping, interval calibration) sees train/val only. The time budget is shared out as training goes:
each method gets ``remaining time x its weight / remaining weight``, so a method that stops early
leaves its time to the next. A shared budget starves the slowest learner, so ``minutes_per_method``
instead gives every trained model the same cap; peers that converge sooner
stop by their own early stopping. Results go to ``reports/<name>.json`` (everything) and ``.md`` (a table).
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import sys
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from cdmpp import defaults
from cdmpp.evaluation import metrics as ev
from cdmpp.evaluation import splits
from cdmpp.evaluation.methods.cdmpp_model import CDMPP
from cdmpp.evaluation.methods.peers import make_peers
from cdmpp.provenance import git_commit
from cdmpp.records.dataset import per_device_counts

ABLATIONS = {"no-pe": "ablation-no-pe", "no-da": "ablation-no-da", "random-sampler": None}


@dataclass
class EvalOptions:
    name: str
    split: str = "random"  # random | cross-model | cross-device
    dataset: str = defaults.DATASET
    task_table: str = defaults.TASK_TABLE
    devices: str = defaults.DEVICES
    held_out: Sequence[str] = splits.HELD_OUT_NETWORKS
    target_device: str | None = None
    ks: Sequence[int] = (0, 16, 64)
    recipe: str = "default"
    peers: Sequence[str] = ("xgb", "mlp")
    ablations: Sequence[str] = ("no-pe", "no-da", "random-sampler")
    max_minutes: float = 8.0
    minutes_per_method: float | None = None  # set: every trained model gets this cap instead of a share
    reports_dir: str = defaults.REPORTS
    limit: int | None = None
    train_fraction: float = 1.0  # random / cross-model: train on this share of the training programs
    seed: int = 0
    device_table: dict | None = None  # {device: spec dict}; default: read from ``devices``
    progress: bool = False
    threads: int = 1  # torch and XGBoost threads for every method (see run_eval)


@dataclass
class _Clock:
    """The shared budget: ``share(w)`` = seconds for a job of weight ``w`` out of the weight still to run;
    or, with ``fixed`` seconds, the same cap for every job."""

    deadline: float
    pending: float
    reserve: float = 0.1  # kept for predictions and the report
    fixed: float | None = None

    def share(self, weight: float) -> float:
        if self.fixed is not None:
            return self.fixed
        left = (self.deadline - time.monotonic()) * (1 - self.reserve)
        s = max(5.0, left * weight / max(self.pending, weight))
        self.pending = max(0.0, self.pending - weight)
        return s


def recipe_config(recipe: str, ablation: str | None = None, **overrides):
    """The recipe's config with an ablation's own keys on top (not the ablation file's base), so
    ``--recipe big --ablations no-pe`` ablates ``big``, not ``default``."""
    from cdmpp.model.training import TrainConfig

    values = TrainConfig.recipe(recipe).to_dict()
    if ablation:
        with open(defaults.RECIPES / f"{ABLATIONS[ablation]}.toml", "rb") as f:
            own = tomllib.load(f)
        own.pop("base", None)
        values.update(own)
    values.update(overrides)
    return TrainConfig.from_dict(values)


def _throughput(predict, programs: Sequence, at_least: int = 2000) -> float:
    """Programs per second of ``predict`` on the test programs, repeated to at least ``at_least``."""
    if not programs:
        return float("nan")
    reps = max(1, math.ceil(at_least / len(programs)))
    batch = list(programs) * reps
    t = time.perf_counter()
    predict(batch)
    return len(batch) / max(time.perf_counter() - t, 1e-9)


def _row(method: str, test: Sequence, *, predicted=None, lo=None, hi=None, rank_key=None, train_seconds=None,
         predict_per_s=None, note: str = "", **extra) -> dict:
    y = [p.seconds for p in test]
    metrics = ev.evaluate(y, [(p.device, p.task) for p in test], predicted, lo, hi, rank_key)
    return dict(method=method, metrics=metrics, train_seconds=train_seconds, predict_per_s=predict_per_s,
                note=note, **extra)


def _method_row(method, test: Sequence, train_seconds: float, name: str | None = None, **extra) -> dict:
    """A method's row on ``test``: its metrics (ranking only for a method that predicts scores), its
    training time, its prediction throughput and how it was fitted."""
    pred, lo, hi = method.predict_interval(test)
    tp = _throughput(method.predict, test)
    note = method.describe()
    if method.predicts == "score":
        return _row(name or method.label, test, rank_key=-pred, train_seconds=train_seconds, predict_per_s=tp,
                    note=note, **extra)
    order = getattr(method, "predict_order", None)  # seconds for ranking, where a method has its own
    return _row(name or method.label, test, predicted=pred, lo=lo, hi=hi, rank_key=order(test) if order else None,
                train_seconds=train_seconds, predict_per_s=tp, note=note, **extra)


def _fit(method, train: Sequence, val: Sequence, budget_s: float | None):
    t = time.monotonic()
    method.fit(train, val, budget_s)
    return method, time.monotonic() - t


def _variants(opts: EvalOptions) -> list[tuple[str, str | None]]:
    """(row label, ablation) of the cdmpp models to train: cdmpp itself, then every trained ablation."""
    out = [("cdmpp", None)]
    for a in opts.ablations:
        if a not in ABLATIONS:
            raise ValueError(f"unknown ablation {a!r}: expected one of {sorted(ABLATIONS)}")
        if ABLATIONS[a]:
            out.append((f"cdmpp {a}", a))
    return out


def _run_same_split(opts: EvalOptions, split: splits.Split, device_table: dict, clock: _Clock, rows: list) -> None:
    """Random and cross-model: train every method once on train/val, score it on test."""
    pool_allowed = split.kind == "cross-model"
    for label, ablation in _variants(opts):
        if ablation == "no-da" and not pool_allowed:
            rows.append(dict(method=label, metrics={}, skipped=True,
                             note="skipped: a random split has no target domain, so it is the same model as cdmpp"))
            continue
        config = recipe_config(opts.recipe, ablation, progress=opts.progress, seed=opts.seed)
        pool = split.target_pool if pool_allowed and ablation != "no-da" else None
        model, secs = _fit(CDMPP(config, device_table, pool, label), split.train, split.val,
                           clock.share(CDMPP.budget_weight))
        rows.append(_method_row(model, split.test, secs))
        _log(rows[-1])
    if "random-sampler" in opts.ablations:
        rows.append(dict(method="cdmpp random-sampler", metrics={}, skipped=True,
                         note="skipped: shot sampling applies to cross-device k-shot only"))
    for peer in make_peers(opts.peers, nthread=opts.threads, seed=opts.seed, device_table=device_table):
        peer, secs = _fit(peer, split.train, split.val, clock.share(peer.budget_weight))
        rows.append(_method_row(peer, split.test, secs))
        _log(rows[-1])


def _run_cross_device(opts: EvalOptions, ds, device_table: dict, clock: _Clock, rows: list) -> dict:
    """Train on the source devices once per method; zero-shot, then k-shot (KMeans vs random shots)."""
    base = splits.cross_device_split(ds, opts.target_device, 0, seed=opts.seed)
    ks = sorted({int(k) for k in opts.ks})
    for label, ablation in _variants(opts):
        config = recipe_config(opts.recipe, ablation, progress=opts.progress, seed=opts.seed)
        pool = base.target_pool if ablation != "no-da" else None
        model, secs = _fit(CDMPP(config, device_table, pool, label), base.train, base.val,
                           clock.share(CDMPP.budget_weight))
        samplers = ["kmeans"] + (["random"] if label == "cdmpp" and "random-sampler" in opts.ablations else [])
        for k in ks:
            for sampler in samplers if k else ["kmeans"]:
                sp = splits.cross_device_split(ds, opts.target_device, k, sampler, opts.seed, embed=model.embed)
                m = model.adapt(sp.shots) if k else model
                name = f"{label} k={k}" + (f" ({sampler} shots)" if k else " (zero-shot)")
                rows.append(_method_row(m, sp.test, secs, name, k=k, sampler=sampler if k else None))
                _log(rows[-1])
    for peer in make_peers(opts.peers, nthread=opts.threads, seed=opts.seed, device_table=device_table):
        peer, secs = _fit(peer, base.train, base.val, clock.share(peer.budget_weight))
        for k in ks:
            sp = splits.cross_device_split(ds, opts.target_device, k, "kmeans", opts.seed)
            p = peer.adapt(sp.shots) if k else peer
            name = f"{peer.label} k={k}" + (" (kmeans shots, model-free)" if k else " (zero-shot)")
            rows.append(_method_row(p, sp.test, secs, name, k=k))
            _log(rows[-1])
    return base.info


def _log(row: dict) -> None:
    m = row.get("metrics", {})
    print(f"eval: {row['method']}: " + ", ".join(f"{k} {v:.3g}" for k, v in m.items() if isinstance(v, float)),
          file=sys.stderr)


# ---- the command ---------------------------------------------------------------------------------

def run_eval(opts: EvalOptions, ds=None) -> dict:
    """Run one evaluation and write ``<reports_dir>/<name>.json`` and ``.md``; returns the report.

    Every method runs with ``opts.threads`` threads (torch intra-op and XGBoost): on the 2-core dev
    machine shared with a measurement job, 2 threads made small-batch torch steps up to 100x slower and
    XGBoost 18x slower (OpenMP spin-waiting), which would have ranked methods by contention.
    """
    import torch

    start = time.monotonic()
    torch.set_num_threads(max(1, opts.threads))
    fixed = 60 * opts.minutes_per_method if opts.minutes_per_method else None
    clock = _Clock(start + 60 * opts.max_minutes, 0.0, fixed=fixed)
    if ds is None:
        ds = load(opts)
    device_table = opts.device_table if opts.device_table is not None else _device_table(opts.devices)
    missing = sorted(set(ds.devices()) - set(device_table))
    if missing:
        raise ValueError(f"devices {missing} have no spec in {opts.devices}; add them (cdmpp devices) first")
    n_cdmpp = len(_variants(opts)) - (1 if opts.split == "random" and "no-da" in opts.ablations else 0)
    clock.pending = n_cdmpp * CDMPP.budget_weight + sum(p.budget_weight for p in make_peers(opts.peers))
    rows: list[dict] = []
    if opts.split == "random":
        split = splits.subsample_train(splits.random_split(ds, opts.seed), opts.train_fraction, opts.seed)
        _run_same_split(opts, split, device_table, clock, rows)
        info = split.info
    elif opts.split == "cross-model":
        split = splits.subsample_train(splits.cross_model_split(ds, opts.held_out, seed=opts.seed),
                                       opts.train_fraction, opts.seed)
        _run_same_split(opts, split, device_table, clock, rows)
        info = split.info
    elif opts.split == "cross-device":
        if not opts.target_device:
            raise ValueError("cross-device needs --target-device")
        if opts.train_fraction != 1:
            raise ValueError("--train-fraction applies to the random and cross-model splits")
        info = _run_cross_device(opts, ds, device_table, clock, rows)
    else:
        raise ValueError(f"unknown split {opts.split!r}: expected random, cross-model or cross-device")
    test_devices = [opts.target_device] if opts.split == "cross-device" else sorted({p.device for p in split.test})
    report = dict(
        name=opts.name, created=_dt.datetime.now().isoformat(timespec="seconds"), git_commit=git_commit(),
        split=info, recipe=opts.recipe, config=recipe_config(opts.recipe).to_dict(), max_minutes=opts.max_minutes,
        minutes_per_method=opts.minutes_per_method, threads=opts.threads,
        data=dict(dataset=opts.dataset, programs=len(ds), devices=ds.devices(), per_device=per_device_counts(ds),
                  limit=opts.limit),
        noise_floor=ev.noise_floor(opts.dataset, test_devices), methods=rows, elapsed_seconds=round(time.monotonic() - start, 1))
    out = Path(opts.reports_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{opts.name}.json").write_text(json.dumps(_finite(report), indent=1, default=_json_default))
    (out / f"{opts.name}.md").write_text(ev.markdown_report(report))
    return report


def load(opts: EvalOptions):
    from cdmpp.records.dataset import load_dataset
    from cdmpp.zoo.tasks import TaskTable

    return load_dataset(opts.dataset, TaskTable.load(opts.task_table), limit=opts.limit, progress=opts.progress)


def _device_table(path: str) -> dict:
    from cdmpp.devices.table import DeviceTable

    return DeviceTable(path).spec_table()



def _json_default(obj):
    if isinstance(obj, (np.integer, np.floating)):
        return obj.item()
    if isinstance(obj, (np.ndarray, set)):
        return list(obj)
    raise TypeError(f"{type(obj).__name__} is not JSON serializable")


def _finite(obj):
    """NaN/inf → None, so the JSON report is valid JSON for every reader."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj




