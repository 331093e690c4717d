"""The evaluation protocol of docs/evaluation.md: every setting, every seed, cdmpp beside its peers.

``run_protocol`` trains, per seed, the methods of ``ProtocolOptions.methods`` per setting and scores them. The
methods come by name from ``cdmpp.evaluation.methods.registry`` (cdmpp, the pooled GBT and its variants, the
GBT blend, TVM's XGBModel, the Tenset MLP) and the runner treats them alike, through the ``Method`` interface
(``fit``, ``predict_interval``, ``adapt``):

* ``random-new`` and ``cross-model``: train/val/test from ``cdmpp.evaluation.splits`` (grouped by program hash
  across devices; the cross-model DA pool is a held-out share that is never tested);
* ``cross-device-new`` and ``cross-device-seen``: one source model per seed, trained on the source
  device without any program of the target's test half (so it serves both settings; in the seen
  setting the twin's source label is an *input* at prediction time, never a training label); then
  k = 0, 16, 64 and 5 % target shots, KMeans (on the model's embeddings) vs random; every method gets
  the same shots: cdmpp and each peer through Amdahl's law use them through ``ShotChoice`` (the shipped
  k-shot path, as in leave-one-chip-out), the others through their ``adapt``; beside them the shots-only
  GBT and, with ``cdmpp-finetune``, the network fine-tuned on KMeans shots.

In the seen setting more predictors use the twin's measured latency: ``twin-ratio`` (the twin's
label × a small GBT of the log ratio on pooled features, fitted on the shots), ``twin-Amdahl``
(Amdahl's law from the two devices' thread counts and the program's parallel share; no shots),
``twin-roofline`` (the twin's label × the ratio of the program's roofline bounds on the two devices),
each ``x ratio GBT`` (the prior's prediction × the ratio GBT, so the shots fit what the physics leaves
over) and ``cdmpp + twin`` (the ratio GBT on pooled and physics features, what the priors predict and the
k-shot-tuned cdmpp model's program embedding; a correction only if cross-validation on the shots finds
one beating twin-Amdahl by a standard error, then a weighted geometric mean of the two priors and the
bare twin label, each corrected; twin-Amdahl without shots). A model trained on one source device cannot learn the device ratio from data (its device input
never varies), which is why the twin's label and the shots carry this setting, and why cdmpp (recipe
``amdahl_transfer``) and each GBT peer's ``, Amdahl transfer`` row predict the target on the source device
and move the prediction by Amdahl's law (``cdmpp.model.physics``).

Each scored row is appended to ``runs`` (JSON lines, so a long run keeps what it finished), and cdmpp's
training runs are saved after every epoch under ``states`` until their split's rows are written, so a
stopped protocol started again with the same options goes on from the last epoch (``Resumable``);
``pooled GBT, val-scaled`` multiplies the GBT by the factor with the lowest validation MAPE (``mape_scale``;
cdmpp's study tried it and dropped it), so that trick is never what separates the two.
The shipped recipe's cdmpp is itself blended with a pooled GBT on log latency (``TrainConfig.gbt_blend``);
its ablation is ``--set gbt_blend=false``.
``summary.aggregate`` turns rows into ``summary.json``: per setting and method, mean ± std over seeds.

``train_fractions`` makes a learning curve instead (``cdmpp learning-curve``): random-new and
cross-model trained on each share of each seed's training programs, the same validation and test sets;
its rows carry ``train_fraction``, ``aggregate`` leaves them out and ``aggregate_curve`` summarizes them.
"""

from __future__ import annotations

import datetime as _dt
import glob
import json
import math
import os
import re
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Sequence

import numpy as np

from cdmpp import defaults
from cdmpp.evaluation import metrics as ev
from cdmpp.evaluation import splits
from cdmpp.evaluation.splits import SETTINGS
from cdmpp.evaluation.summary import LOCO_KS, aggregate, aggregate_curve
from cdmpp.evaluation.methods.registry import GBT_BLEND  # noqa: F401  (the blend's row name, as before)

WITHIN_DEVICE = ("random-new", "cross-model", "paper", "paper-5-leaf")  # one split, cdmpp and the peers on it
KS = ("0", "16", "64", "5%")


@dataclass
class ProtocolOptions:
    dataset: str = defaults.DATASET
    task_table: str = defaults.TASK_TABLE
    devices: str = defaults.DEVICES
    device_ids: Sequence[str] = defaults.PROTOCOL_DEVICES  # pinned: data added later on other devices is not used
    target_device: str = defaults.PROTOCOL_TARGET
    settings: Sequence[str] = SETTINGS
    seeds: Sequence[int] = (0, 1, 2)
    ks: Sequence[str] = KS
    samplers: Sequence[str] = ("kmeans", "random")
    methods: Sequence[str] = ("cdmpp", "pooled-gbt")  # also "xgb" (TVM's XGBModel), "mlp" (Tenset MLP)
    peer_minutes: float = 2.0  # cap on one training run of the "xgb" / "mlp" peers
    recipe: str = "default"
    overrides: dict = field(default_factory=dict)  # TrainConfig keys on top of the recipe (ablations)
    label: str = "cdmpp"  # row name of the cdmpp model (an ablation's name in a study)
    gbt_label: str = "pooled GBT"  # row name of the pooled GBT (a study's variant of it)
    minutes: float = 120.0  # safety cap on one cdmpp training run: the recipe's epochs are the budget
    runs: str = defaults.PROTOCOL_RUNS
    threads: int = 1
    train_fractions: Sequence[float] = ()  # a learning curve: random-new / cross-model on these shares of training
    limit: int | None = None  # only the first N records (smoke runs)
    chips: Sequence[str] = ()  # leave-one-chip-out: chips to hold out (default: every chip with enough data)
    # leave-one-chip-out trains on the other devices of the chip's kind of code, as the shipped recipe trains one model
    # per kind (TrainConfig.per_kind), or on every other device ("all")
    chip_train: str = "same-kind"
    held_out: Sequence[str] = splits.HELD_OUT_NETWORKS  # cross-model's test networks (locked: LOCKED_HELD_OUT_NETWORKS)
    chip_ks: Sequence[str] = LOCO_KS  # leave-one-chip-out's shot counts
    progress: bool = False  # a bar (steps, rate, ETA) while cdmpp trains: a seed's training runs for an hour
    states: str | None = None  # where training runs are saved each epoch to resume from; default <runs>.states/


def recipe_config(recipe: str, **overrides):
    """The recipe's ``TrainConfig`` with ``overrides`` (TrainConfig keys: an ablation's, a study's) on top."""
    from cdmpp.model.training import TrainConfig

    return TrainConfig.from_dict({**TrainConfig.recipe(recipe).to_dict(), **overrides})


def load_pinned(opts: ProtocolOptions, every_device: bool = False, innermost: bool = False):
    """The dataset of ``opts.device_ids`` (pinned; empty: every device), or with ``every_device`` of every
    device (what leave-one-chip-out trains on: all other chips); random schedules and imports only, no search
    candidates (``load_dataset(searched=False)``), so a search collected later does not move a figure.
    ``innermost``: the programs also carry their builds' innermost loops' counts (``TrainConfig.assembly_inner``)."""
    from cdmpp.records.dataset import load_dataset
    from cdmpp.zoo.tasks import TaskTable

    return load_dataset(opts.dataset, TaskTable.load(opts.task_table),
                        devices=None if every_device else list(opts.device_ids) or None, limit=opts.limit, progress=False,
                        searched=False, innermost=innermost)


def setting_splits(ds, setting: str, seed: int, fractions: Sequence[float] = (),
                   held_out: Sequence[str] = splits.HELD_OUT_NETWORKS, steady: set[str] | None = None) -> list:
    """[(fraction, split)] of ``random-new``, ``cross-model`` (``held_out`` networks) or the paper's protocol
    (``steady``: the record ids its repeat filter keeps): without ``fractions`` the whole split (fraction
    None); else one split per fraction of its training programs (nested: a smaller share is part of every
    larger one), validation and test those of the whole split."""
    if setting in ("paper", "paper-5-leaf"):
        full = splits.paper_split(ds, seed, steady, five_leaf=setting == "paper-5-leaf")
    elif setting == "random-new":
        full = splits.random_split(ds, seed)
    else:
        full = splits.cross_model_split(ds, held_out, seed=seed)
    if not fractions:
        return [(None, full)]
    return [(f, splits.subsample_train(replace(full, info=dict(full.info)), f, seed)) for f in fractions]


def steady_records(dataset: str, devices: Sequence[str]) -> set[str]:
    """Record ids of ``devices`` whose label's repeats agree within ``splits.PAPER_MAX_SPREAD`` (or are too
    few to judge): the paper's repeat filter, read from the stored repeats."""
    from cdmpp.records.labels import label
    from cdmpp.records.store import RecordStore

    store = RecordStore(dataset)
    keep = set()
    for device in devices:
        for r in store.iter_records(device, traces=False):
            if label(r) is not None:
                spread = splits.repeat_spread(r["seconds"])
                if spread is None or spread <= splits.PAPER_MAX_SPREAD:
                    keep.add(r["id"])
    return keep


def _k_value(k: str, n_target: int) -> int:
    return max(1, round(float(k.rstrip("%")) / 100 * n_target)) if k.endswith("%") else int(k)


def _seconds(programs) -> np.ndarray:
    return np.array([p.seconds for p in programs])


class _Writer:
    def __init__(self, path: str, base: dict):
        self.path, self.base = path, base
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)

    def row(self, setting: str, method: str, metrics: dict, **extra) -> None:
        rec = {**self.base, "setting": setting, "method": method, **extra, "metrics": _finite(metrics),
               "time": _dt.datetime.now().isoformat(timespec="seconds")}
        with open(self.path, "a") as f:
            f.write(json.dumps(rec) + "\n")
        part = f" (train fraction {extra['train_fraction']:g})" if extra.get("train_fraction") is not None else ""
        print(f"protocol: seed {self.base['seed']} {setting}{part} {method}: MAPE {100 * metrics.get('mape', math.nan):.1f} %, "
              f"capped {100 * metrics.get('mape_capped', math.nan):.1f} %, Spearman {metrics.get('spearman', math.nan):.3f}",
              file=sys.stderr)


def _finite(obj):
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    return obj


def twin_priors(sp, device_table: dict) -> list:
    """The seen setting's physics on the twin's label, cdmpp + twin's first prior first: Amdahl's law for
    the thread counts, the ratio of the two devices' roofline bounds. None with several source devices."""
    from cdmpp.evaluation.methods.twin_ratio import TwinAmdahl, TwinRoofline

    source, target = sp.info["source_devices"], sp.info["target_device"]
    if len(source) != 1:
        return []
    s_spec, t_spec = device_table[source[0]], device_table[target]
    amdahl = TwinAmdahl(sp.twins, s_spec["cores"], t_spec["cores"])
    return [amdahl.fit([p for p in sp.train if p.device == source[0]]), TwinRoofline(sp.twins, s_spec, t_spec)]


def score(method, test) -> dict:
    """``method``'s metrics on ``test``: ranking only for a method that predicts scores; else its seconds, with
    its interval and its own order where it has them (``predict_interval_and_order``: one pass for both)."""
    if method.predicts == "score":  # higher = faster within a task
        return ev.evaluate(_seconds(test), [(p.device, p.task) for p in test], rank_key=-method.predict(test))
    both = getattr(method, "predict_interval_and_order", None)
    if both is not None:
        mean, lo, hi, order = both(test)
    else:
        mean, lo, hi = method.predict_interval(test)
        order = method.predict_order(test) if hasattr(method, "predict_order") else None
    return ev.score(test, mean, lo, hi, order)


def fit_info(method) -> dict:
    """What a row tells of how its method was fitted: ``row_info()`` where the method has it; the trees of a
    pooled GBT; cdmpp's validation MAPE, epochs and (after ``adapt``) what its fine-tune check found."""
    from cdmpp.evaluation.methods.cdmpp_model import CDMPP
    from cdmpp.model.pooled_gbt import PooledGBT

    if hasattr(method, "row_info"):
        return method.row_info()
    if isinstance(method, PooledGBT):
        return {"trees": int(method.model_.best_iteration) + 1}
    if isinstance(method, CDMPP):
        s = method.model_.summary
        info = {"val_mape": s["val"]["mape"]} if "val" in s else {}
        if "members" in s:
            info["epochs"] = sum(len(r.get("history", [])) for r in s["members"])
        tuned = s.get("finetune", {})
        info.update({name: tuned[key] for name, key in (("finetune_check", "check"), ("order_weight", "order_weight"))
                     if key in tuned})
        return info
    return {}


class Resumable:
    """Where cdmpp's training runs of one split of one seed are saved to resume from (``fit(resume=...)``): one file
    per method with a ``resume`` attribute, named by ``where`` (setting, chip, train fraction) and its row name,
    under ``opts.states``. ``finish()``, once the split's rows are written, removes them and leaves a mark
    (``<split>.done``) holding the options its rows came from: the same command started again after a stop skips
    that split (``done()``) instead of training it again; other options (another recipe, methods, shot counts;
    ``settings``: those one split writes rows of, as the cross-device settings share theirs) run it."""

    _NOT_OF_THE_ROWS = ("seeds", "settings", "chips", "threads", "progress", "states", "runs")  # the split's name or pace
    _FILES = ("dataset", "task_table", "devices")  # named by where they are, not by how they were reached

    def __init__(self, opts: ProtocolOptions, seed: int, *where, settings: Sequence[str] = ()):
        self.folder = opts.states or os.path.splitext(opts.runs)[0] + ".states"
        self.prefix = "-".join(str(w) for w in (*where, f"seed{seed}") if w not in (None, ""))
        self.files: list[str] = []
        self.mark = os.path.join(self.folder, re.sub(r"[^\w.%+-]+", "_", self.prefix) + ".done")
        options = {k: v for k, v in asdict(opts).items() if k not in self._NOT_OF_THE_ROWS}
        options.update({k: os.path.realpath(options[k]) for k in self._FILES})
        self.options = json.loads(json.dumps({**options, "settings": sorted(settings)}, default=str))

    def __call__(self, method) -> None:
        if hasattr(method, "resume"):
            method.resume = os.path.join(self.folder, re.sub(r"[^\w.%+-]+", "_", f"{self.prefix}-{method.label}") + ".pt")
            self.files.append(method.resume)

    def done(self) -> bool:
        """Whether this split's rows were written by a run with the same options (its mark says so, and so does
        the log): the caller skips the split."""
        if not os.path.exists(self.mark):
            return False
        with open(self.mark) as f:
            same = json.load(f) == self.options
        if same:
            print(f"protocol: {self.prefix}: its rows are written (a run before this one); skipped", file=sys.stderr)
        return same

    def finish(self) -> None:
        for path in [p for f in self.files for p in glob.glob(glob.escape(f) + "*")]:  # fit's .tmp, .no-da, .runN
            os.remove(path)
        os.makedirs(self.folder, exist_ok=True)
        with open(self.mark, "w") as f:
            json.dump(self.options, f)


def fit_methods(opts: ProtocolOptions, split, context, scope: str, resume=None) -> list[tuple]:
    """[(method, training seconds)]: every method of ``opts.methods`` (``registry.build``) that is scored in
    ``scope`` ("within-device" or "cross-device"), fitted on ``split``'s train / val in order (parts first;
    a derived method's seconds include its parts'). ``resume``: this split's ``Resumable``."""
    from cdmpp.evaluation.methods import registry

    fitted, secs = [], {}
    for method, budget in registry.build(opts.methods, context):
        if resume is not None:
            resume(method)
        t = time.monotonic()
        method.fit(split.train, split.val, budget)
        secs[id(method)] = time.monotonic() - t + sum(secs.get(id(p), 0.0) for p in getattr(method, "parts", ()))
        if scope in getattr(method, "scope", (scope,)):
            fitted.append((method, round(secs[id(method)], 1)))
    return fitted


def _adapt(method, shots, adapted: dict, seed: int, threads: int, memo=None, base_bias: float = 0.0,
           assembly_counts: bool = False):
    """``method`` adapted with ``shots``: through ``ShotChoice`` where it reaches the target by transfer
    (``shot_choice``: the shipped k-shot path; ``memo``: its predictions kept across shot counts, a
    ``derived.Memo``; ``base_bias``: its median log error on validation); one made of parts it can reuse
    (``on_parts``) on its parts as already adapted, so a shared part is adapted once (an adapt draws on
    xgboost's process-wide random state). ``assembly_counts``: the choice's GBTs read the counts (the recipe does)."""
    if getattr(method, "shot_choice", False):
        from cdmpp.evaluation.methods.derived import ShotChosen

        return ShotChosen.for_shots(memo or method, shots, seed, threads, base_bias, assembly_counts)
    reuse = getattr(method, "on_parts", None)
    if reuse is not None and all(id(p) in adapted for p in method.parts):
        return reuse([adapted[id(p)] for p in method.parts])
    return method.adapt(shots)


def run_seed(opts: ProtocolOptions, seed: int, ds=None, device_table: dict | None = None, every=None) -> None:
    """Every setting of ``opts`` for one seed (split seed = model seed), rows appended to ``opts.runs``.
    ``every``: the dataset of every device (leave-one-chip-out); without it a caller's ``ds`` is used as
    is, else every device is loaded.

    The methods come from ``cdmpp.evaluation.methods.registry`` by name and are all handled alike: fitted on
    the split, scored on its test programs and, cross-device, adapted with each k's shots (a ranking-only
    method only at k = 0). The seen setting adds the twin-based predictors and, for a method with
    embeddings (cdmpp), ``<label> + twin``."""
    import torch

    from cdmpp.evaluation.methods import registry
    from cdmpp.evaluation.methods.derived import Memo
    from cdmpp.evaluation.methods.twin_ratio import TwinAmdahl, TwinRatio
    from cdmpp.model.shots import MIN_SHOTS_FOR_MODELS, ShotChoice, median_log_error

    registry.check(opts.methods)
    torch.set_num_threads(max(1, opts.threads))
    given = ds
    only_chips = set(opts.settings) == {"leave-one-chip-out"}
    ds = ds if ds is not None or only_chips else load_pinned(opts)
    if device_table is None:
        from cdmpp.devices.table import DeviceTable

        device_table = DeviceTable(opts.devices).spec_table()
    config = recipe_config(opts.recipe, seed=seed, max_minutes=opts.minutes, progress=opts.progress, **opts.overrides)
    common = dict(seed=seed, recipe=opts.recipe, overrides=opts.overrides, minutes=opts.minutes)
    if "leave-one-chip-out" in opts.settings:
        every = every if every is not None else given if given is not None else load_pinned(opts, every_device=True)
    read = ds if ds is not None else every
    if config.assembly_counts and read is not None:  # a program not built is marked absent: say how many are
        programs = getattr(read, "programs", read)
        common["assembly_built"] = round(sum(p.features.asm is not None for p in programs) / max(len(programs), 1), 4)
        print(f"protocol: seed {seed}: {common['assembly_built']:.1%} of {len(programs)} programs have assembly counts",
              file=sys.stderr, flush=True)
    out = _Writer(opts.runs, common if opts.threads == 1 else {**common, "threads": opts.threads})

    def context(pool) -> registry.Context:
        return registry.Context(seed, device_table, opts.threads, config, pool, opts.label, opts.gbt_label,
                                60.0 * opts.peer_minutes)

    steady = steady_records(opts.dataset, opts.device_ids) if {"paper", "paper-5-leaf"} & set(opts.settings) else None
    for setting in [s for s in opts.settings if s in WITHIN_DEVICE]:
        for fraction, split in setting_splits(ds, setting, seed, opts.train_fractions, opts.held_out, steady):
            n = dict(programs=len(split.test), n_train=len(split.train))
            if fraction is not None:  # a learning-curve row: kept out of the summary (see aggregate)
                n["train_fraction"] = fraction
            resume = Resumable(opts, seed, setting, fraction)
            if resume.done():
                continue
            for method, secs in fit_methods(opts, split, context(split.target_pool or None), "within-device", resume):
                out.row(setting, method.label, score(method, split.test), k=None, train_seconds=secs,
                        **fit_info(method), **n)
            resume.finish()

    if "leave-one-chip-out" in opts.settings:
        from cdmpp.evaluation.chips import held_out_chips, of_chips_kind, run_chip

        for chip in held_out_chips(opts, every, device_table):
            data = of_chips_kind(every, chip, device_table) if opts.chip_train == "same-kind" else every
            resume = Resumable(opts, seed, "chip", chip)
            if resume.done():
                continue
            run_chip(opts, seed, data, device_table, chip, out, context, _k_value, resume)
        del every

    device_settings = [s for s in opts.settings if s.startswith("cross-device")]
    if not device_settings:
        return
    target = opts.target_device
    base = splits.cross_device_split(ds, target, 0, seed=seed, programs="new")
    resume = Resumable(opts, seed, "cross-device", settings=device_settings)
    if resume.done():
        return
    fitted = fit_methods(opts, base, context(base.target_pool), "cross-device", resume)
    fitted.sort(key=lambda mf: hasattr(mf[0], "parts"))  # parts first (as fitted), then what is made of them
    embed = next((m.embed for m, _ in fitted if hasattr(m, "embed")), None)  # KMeans shots on its embeddings
    twins = bool({"pooled-gbt", "twins"} & set(opts.methods))
    memos = {id(m): Memo(m) for m, _ in fitted if getattr(m, "shot_choice", False)}  # each program predicted once
    biases = {key: median_log_error(memo.predict(base.val), _seconds(base.val)) for key, memo in memos.items()}
    finetune = "cdmpp-finetune" in opts.methods  # the network fine-tuned on KMeans shots, a row beside ShotChoice's
    n_target = base.info["n_target"]
    for k_name in opts.ks:
        k = _k_value(k_name, n_target) if k_name != "0" else 0
        for sampler in (opts.samplers if k else ["kmeans"]):
            key = dict(k=k, k_name=k_name, sampler=sampler if k else None)
            for setting in device_settings:
                programs = setting.rsplit("-", 1)[1]
                sp = splits.cross_device_split(ds, target, k, sampler, seed, embed=embed, programs=programs)
                test = sp.test
                n = dict(programs=len(test), n_train=len(sp.train), **key)
                suffix = "" if not k else f" k={k_name} ({sampler})"
                priors = twin_priors(sp, device_table) if programs == "seen" else []
                adapted: dict = {}  # id(method) -> the method adapted with these shots (each once)
                for method, secs in fitted:
                    if method.predicts == "score" and k:  # a ranking-only peer (XGBModel) only at k = 0
                        continue
                    m = method
                    if k:
                        m = adapted[id(method)] = _adapt(method, sp.shots, adapted, seed, opts.threads,
                                                         memos.get(id(method)), biases.get(id(method), 0.0),
                                                         config.assembly_counts)
                    out.row(setting, m.label + suffix, score(m, test), train_seconds=secs, **fit_info(m), **n)
                    if k and finetune and hasattr(method, "embed") and sampler == "kmeans":  # for comparison
                        tuned = method.adapt(sp.shots)
                        out.row(setting, m.label + ", fine-tune" + suffix, score(tuned, test), train_seconds=secs,
                                **fit_info(tuned), **n)
                    if programs == "seen" and hasattr(method, "embed"):  # the physics priors x a GBT of the log ratio
                        tr = TwinRatio(sp.twins, nthread=opts.threads, random_state=seed, prior=priors, inputs="both",
                                       embed=lambda ps, e=method.embed: e([p.features for p in ps])).fit(sp.shots)
                        out.row(setting, m.label + " + twin" + suffix, score(tr, test), train_seconds=secs, **n)
                if len(sp.shots) >= MIN_SHOTS_FOR_MODELS:  # the peer with no other device: XGBoost on the shots alone
                    alone = ShotChoice(None, seed=seed, nthread=opts.threads, only=("shots",),
                                       assembly_counts=config.assembly_counts).fit(sp.shots)
                    out.row(setting, "shots-only GBT" + suffix, ev.score(test, alone.predict(test)), train_seconds=0.0,
                            choice=alone.describe(), **n)
                for physics in priors if twins else ():
                    extra = {"overhead_s": physics.overhead_} if isinstance(physics, TwinAmdahl) else {}
                    out.row(setting, physics.label + suffix, score(physics, test), train_seconds=0.0, **extra, **n)
                    tr = TwinRatio(sp.twins, nthread=opts.threads, random_state=seed, prior=physics).fit(sp.shots)
                    out.row(setting, physics.label + " x ratio GBT" + suffix, score(tr, test), train_seconds=0.0, **n)
                if programs == "seen" and twins:
                    for inputs, name in (("pooled", "twin-ratio"), ("physics", "twin-ratio, physics inputs")):
                        tr = TwinRatio(sp.twins, nthread=opts.threads, random_state=seed, inputs=inputs).fit(sp.shots)
                        out.row(setting, name + suffix, score(tr, test), train_seconds=0.0, **n)
    resume.finish()


def run_in_processes(fn, tasks: list[tuple], jobs: int) -> None:
    """``fn(*task)`` for every task, ``jobs`` spawned processes at a time. A failed task or a stop (Ctrl-C,
    or SIGTERM through ``cdmpp.cli``) cancels the queued tasks and kills the running ones: leaving the pool's
    ``with`` block would otherwise wait for every queued task to run to its end (minutes of training each).
    Rows of tasks that finished are already in the runs file."""
    import concurrent.futures as cf
    import multiprocessing as mp

    with cf.ProcessPoolExecutor(jobs, mp_context=mp.get_context("spawn")) as pool:
        futures = [pool.submit(fn, *task) for task in tasks]
        try:
            for f in futures:
                f.result()
        except BaseException:
            for p in list((getattr(pool, "_processes", None) or {}).values()):
                p.kill()
            pool.shutdown(wait=False, cancel_futures=True)
            raise


def run_protocol(opts: ProtocolOptions, jobs: int = 1, command: str = "", summary_path: str | None = None) -> dict:
    """All seeds and settings (``jobs`` processes in parallel, one (seed, model) job each), then the
    summary of ``opts.runs`` (with ``opts.train_fractions``: its learning curve, ``aggregate_curve``)."""
    from cdmpp.evaluation.methods import registry

    registry.check(opts.methods)  # before any data is read
    if opts.train_fractions:
        if any(s.startswith("cross-device") for s in opts.settings):
            raise ValueError("train fractions apply to the random-new and cross-model settings only")
        if not all(0 < f <= 1 for f in opts.train_fractions):
            raise ValueError(f"train fractions must be in (0, 1], got {list(opts.train_fractions)}")
    start = _dt.datetime.now().isoformat(timespec="seconds")
    if jobs > 1:  # one job per (seed, group of settings that share a trained model)
        groups = [[s] for s in opts.settings if not s.startswith("cross-device")]
        groups += [[s for s in opts.settings if s.startswith("cross-device")]]
        tasks = [(replace(opts, settings=g), seed) for g in groups if g for seed in opts.seeds]
        tasks.sort(key=lambda t: (not t[0].settings[0].startswith("cross-device"), t[1]))  # longest first
        run_in_processes(run_seed, tasks, jobs)
    else:
        ds = load_pinned(opts) if set(opts.settings) - {"leave-one-chip-out"} else None
        every = load_pinned(opts, every_device=True) if "leave-one-chip-out" in opts.settings else None
        for s in opts.seeds:
            run_seed(opts, s, ds, every=every)
    summary = (aggregate_curve if opts.train_fractions else aggregate)(opts.runs, command)
    summary["options"] = {**asdict(opts), "started": start}
    if summary_path:
        with open(summary_path, "w") as f:
            json.dump(summary, f, indent=1)
    return summary
