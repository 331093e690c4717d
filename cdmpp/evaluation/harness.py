"""``cdmpp eval``: one setting of the protocol (``cdmpp.evaluation.protocol``) for one seed, with cdmpp's
ablations beside it, as one report. There is one evaluation runner, the protocol's ``run_seed``; this module
maps the eval's options onto it: ``split`` random / cross-model / cross-device is the setting random-new /
cross-model / cross-device-new, ``peers`` are registry names (``xgb`` also brings the XGBoost regressor),
each ablation is one more cdmpp row trained with the ablation recipe's keys on top of ``recipe``
(``random-sampler``: random shots beside KMeans ones). Budgets: ``minutes_per_method`` (or ``max_minutes``)
caps each cdmpp training run and each peer's; the recipe's epochs are the budget.

Results: ``<reports_dir>/<name>-runs.jsonl`` (the rows), ``<name>.json`` (their summary, with the options)
and ``<name>.md`` (the protocol's tables and the labels' noise floor).
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import sys
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from cdmpp import defaults
from cdmpp.evaluation import splits
from cdmpp.evaluation.protocol import recipe_config  # noqa: F401  (the studies in experiments/ import it from here)
from cdmpp.evaluation.protocol import ProtocolOptions, load_pinned, run_seed

ABLATIONS = {"no-pe": "ablation-no-pe", "no-da": "ablation-no-da", "random-sampler": None}
SETTING = {"random": "random-new", "cross-model": "cross-model", "cross-device": "cross-device-new"}


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
    max_minutes: float = 8.0  # the cap on each trained model, unless minutes_per_method is given
    minutes_per_method: float | None = None
    reports_dir: str = defaults.REPORTS
    limit: int | None = None
    train_fraction: float = 1.0  # random / cross-model: train on this share of the training programs
    seed: int = 0
    device_table: dict | None = None  # {device: spec dict}; default: read from ``devices``
    progress: bool = False  # kept for callers; the protocol logs one line per row
    threads: int = 1  # torch and XGBoost threads for every method


def ablation_keys(ablation: str) -> dict:
    """The TrainConfig keys an ablation recipe sets itself (not its base), so an ablation of ``--recipe big``
    ablates ``big``, not ``default``."""
    if ablation not in ABLATIONS:
        raise ValueError(f"unknown ablation {ablation!r}: expected one of {sorted(ABLATIONS)}")
    if not ABLATIONS[ablation]:
        return {}
    with open(defaults.RECIPES / f"{ABLATIONS[ablation]}.toml", "rb") as f:
        own = tomllib.load(f)
    own.pop("base", None)
    return own


def protocol_runs(opts: EvalOptions) -> list:
    """The ``ProtocolOptions`` of ``opts``: cdmpp with the pooled GBT and the peers, then one cdmpp per
    trained ablation (same runs file, the ablation's name as its row label)."""
    if opts.split not in SETTING:
        raise ValueError(f"unknown split {opts.split!r}: expected random, cross-model or cross-device")
    if opts.split == "cross-device" and not opts.target_device:
        raise ValueError("cross-device needs --target-device")
    if opts.split == "cross-device" and opts.train_fraction != 1:
        raise ValueError("--train-fraction applies to the random and cross-model splits")
    ablations = {a: ablation_keys(a) for a in opts.ablations}
    minutes = opts.minutes_per_method or opts.max_minutes
    peers = [p for name in opts.peers for p in ([name, "xgb-regressor"] if name == "xgb" else [name])]
    base = ProtocolOptions(
        dataset=opts.dataset, task_table=opts.task_table, devices=opts.devices, device_ids=(),
        target_device=opts.target_device or defaults.PROTOCOL_TARGET, settings=(SETTING[opts.split],),
        seeds=(opts.seed,), ks=tuple(str(k) for k in opts.ks),
        samplers=("kmeans", "random") if "random-sampler" in ablations else ("kmeans",),
        methods=("cdmpp", "pooled-gbt", *peers), peer_minutes=minutes, recipe=opts.recipe, minutes=minutes,
        runs=str(Path(opts.reports_dir) / f"{opts.name}-runs.jsonl"), threads=opts.threads, limit=opts.limit,
        held_out=tuple(opts.held_out), train_fractions=(opts.train_fraction,) if opts.train_fraction != 1 else ())
    variants = [dataclasses.replace(base, methods=("cdmpp",), overrides=keys, label=f"cdmpp {a}")
                for a, keys in ablations.items() if keys]
    return [base, *variants]


def run_eval(opts: EvalOptions, ds=None, command: str | None = None) -> dict:
    """Run ``opts`` through the protocol's runner and write ``<name>-runs.jsonl``, ``<name>.json`` and
    ``.md`` under ``reports_dir``; returns the summary (``elapsed_seconds`` added)."""
    from cdmpp.evaluation import metrics as ev
    from cdmpp.evaluation.summary import aggregate, aggregate_curve, curve_markdown, summary_markdown
    from cdmpp.provenance import git_commit

    start = time.monotonic()
    runs = protocol_runs(opts)
    out = Path(opts.reports_dir)
    out.mkdir(parents=True, exist_ok=True)
    Path(runs[0].runs).unlink(missing_ok=True)  # a report of this run only
    if ds is None:
        ds = load_pinned(runs[0])
    table = opts.device_table
    if table is None:
        from cdmpp.devices.table import DeviceTable

        table = DeviceTable(opts.devices).spec_table()
    missing = sorted(set(ds.devices()) - set(table))
    if missing:
        raise ValueError(f"devices {missing} have no spec in {opts.devices}; add them (cdmpp devices) first")
    for popts in runs:
        run_seed(popts, opts.seed, ds=ds, device_table=table)
    command = command or "cdmpp eval " + shlex.join(sys.argv[2:])
    curve = bool(runs[0].train_fractions)
    summary = (aggregate_curve if curve else aggregate)(runs[0].runs, command)
    test_devices = [opts.target_device] if opts.split == "cross-device" else ds.devices()
    summary.update(options={**dataclasses.asdict(opts), "device_table": None}, git_commit=git_commit(),
                   elapsed_seconds=round(time.monotonic() - start, 1))
    (out / f"{opts.name}.json").write_text(json.dumps(summary, indent=1, default=str))
    text = curve_markdown(summary) if curve else summary_markdown(summary)
    noise = ev.noise_line(ev.noise_floor(opts.dataset, test_devices))
    (out / f"{opts.name}.md").write_text(f"# cdmpp eval: {opts.name}\n\n{noise}\n\n{text}")
    return summary
