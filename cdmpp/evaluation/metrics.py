"""The numbers every cdmpp report uses (docs/evaluation.md), computed one way for every method.

* On absolute latency: MAPE, RMSE, the share of programs within ±10 % and ±25 %. A tuner compares
  predictions across tasks and devices, so errors are judged on seconds, not on a transformed label.
* Per tuning task (tasks with at least ``min_group`` test programs): Spearman ρ and Kendall τ between
  predicted and measured latency, and the top-k score: the best measured latency among the k programs
  the model ranks fastest, divided by the best measured latency of the task (1.0 = the model found the
  best program; 1.3 = a tuner trusting it would run 30 % slower code). Averaged over tasks with equal
  weight, because a search ranks within one task at a time.
* The share of measured latencies inside the predicted 90 % interval, when a method gives intervals.

Ranking metrics need only an ordering, so a cost model that scores programs (higher = faster, like
MetaSchedule's XGBModel) is evaluated through ``-score`` as its latency-like key.
"""

from __future__ import annotations

import glob
import json
import os
import warnings
from collections import defaultdict
from typing import Sequence

import numpy as np
from scipy import stats

from cdmpp.ranking import within_task_spearman

TOP_K = (1, 5)


def regression_metrics(seconds: Sequence[float], predicted: Sequence[float]) -> dict:
    """MAPE, RMSE (seconds), share within ±10 % / ±25 % of the measured latency; also the median APE
    and the MAPE with each APE capped at 100 % (``mape_capped``), because a few tiny programs predicted
    100x too slow can dominate the MAPE."""
    y = np.asarray(seconds, dtype=np.float64)
    p = np.asarray(predicted, dtype=np.float64)
    if len(y) == 0:
        return dict(n=0, mape=float("nan"), rmse=float("nan"), within_10=float("nan"), within_25=float("nan"),
                    median_ape=float("nan"), mape_capped=float("nan"))
    rel = np.abs(p - y) / y
    return dict(n=int(len(y)), mape=float(rel.mean()), median_ape=float(np.median(rel)),
                mape_capped=float(np.minimum(rel, 1.0).mean()),
                rmse=float(np.sqrt(np.mean((p - y) ** 2))),
                within_10=float((rel <= 0.10).mean()), within_25=float((rel <= 0.25).mean()))


def top_k_score(seconds: Sequence[float], key: Sequence[float], k: int) -> float:
    """Best measured latency among the ``k`` programs with the lowest ``key``, over the true best (≥ 1).

    Ties in ``key`` are broken by position (stable sort), so a constant predictor is not rewarded.
    """
    y = np.asarray(seconds, dtype=np.float64)
    order = np.argsort(np.asarray(key, dtype=np.float64), kind="stable")
    return float(y[order[:k]].min() / y.min())


def ranking_metrics(seconds: Sequence[float], key: Sequence[float], tasks: Sequence[str],
                    min_group: int = 3, top_k: Sequence[int] = TOP_K) -> dict:
    """Per-task Spearman ρ, Kendall τ and top-k scores, averaged over tasks with ≥ ``min_group`` programs
    (top-k only over those with more than k programs, where picking k is not trivially perfect).

    ``key`` is anything that orders programs from fast to slow (predicted latency, or ``-score``). A
    task whose predictions are all equal has an undefined correlation; it counts as 0 (no ranking
    information), so a model cannot improve its average by predicting constants.
    """
    y = np.asarray(seconds, dtype=np.float64)
    key = np.asarray(key, dtype=np.float64)
    groups: dict[str, list[int]] = defaultdict(list)
    for i, t in enumerate(tasks):
        groups[t].append(i)
    tau, tops = [], {k: [] for k in top_k}
    for idx in groups.values():
        if len(idx) < min_group:
            continue
        yt, kt = y[idx], key[idx]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # constant input: nan, handled below
            t = stats.kendalltau(kt, yt).statistic
        tau.append(0.0 if not np.isfinite(t) else float(t))
        for k in top_k:
            if len(idx) > k:  # with k >= the task's programs every model scores a trivial 1.0
                tops[k].append(top_k_score(yt, kt, k))
    out = dict(n_tasks=len(tau), spearman=within_task_spearman(y, key, tasks, min_group), kendall=_mean(tau))
    for k, v in tops.items():
        out[f"top{k}"], out[f"top{k}_tasks"] = _mean(v), len(v)
    return out


def interval_coverage(seconds: Sequence[float], lo: Sequence[float], hi: Sequence[float]) -> float:
    y = np.asarray(seconds, dtype=np.float64)
    return float(np.mean((y >= np.asarray(lo)) & (y <= np.asarray(hi)))) if len(y) else float("nan")


def evaluate(seconds, tasks, predicted=None, lo=None, hi=None, rank_key=None, min_group: int = 3) -> dict:
    """All metrics for one method on one test set.

    ``predicted``: latencies in seconds (regression + ranking metrics); ``rank_key``: an ordering
    only (ranking metrics; defaults to ``predicted``); ``lo``/``hi``: the 90 % interval.
    """
    out: dict = {"n": len(seconds)}
    if predicted is not None:
        p = np.asarray(predicted, dtype=np.float64)
        if not np.all(np.isfinite(p)):
            raise ValueError(f"{int((~np.isfinite(p)).sum())} predictions are not finite")
        out.update(regression_metrics(seconds, p))
        out["mape_fast10"] = fast_share_mape(seconds, p, tasks)
    key = rank_key if rank_key is not None else predicted
    if key is not None:
        out.update(ranking_metrics(seconds, key, tasks, min_group))
    if lo is not None and hi is not None:
        out["coverage90"] = interval_coverage(seconds, lo, hi)
    return out


def score(test, predicted=None, lo=None, hi=None, rank_key=None) -> dict:
    """``evaluate`` of ``predicted`` on ``test`` (labelled programs, tasks keyed by device and task); the
    ranking metrics of ``rank_key`` where a method orders a task's programs by another prediction than its
    seconds (cdmpp's order weight)."""
    return evaluate([p.seconds for p in test], [(p.device, p.task) for p in test], predicted, lo, hi, rank_key)


def fast_share_mape(seconds, predicted, tasks, share: float = 0.1) -> float:
    """MAPE on each task's fastest ``share`` of programs (at least one per task): where a tuner looks,
    and where random schedules rarely go (DESIGN.md §5, "Fast programs")."""
    y, p = np.asarray(seconds, dtype=np.float64), np.asarray(predicted, dtype=np.float64)
    groups: dict = {}
    for i, t in enumerate(tasks):
        groups.setdefault(t, []).append(i)
    fast = [i for idx in groups.values() for i in sorted(idx, key=lambda j: y[j])[:max(1, int(round(share * len(idx))))]]
    return float(np.mean(np.abs(p[fast] - y[fast]) / y[fast])) if fast else float("nan")


def _mean(values: list[float]) -> float:
    return float(np.mean(values)) if values else float("nan")


# ---- noise floor ---------------------------------------------------------------------------------

def noise_floors(dataset_dir: str) -> dict[str, dict]:
    """{device: its latest run-to-run re-measurement} from the dataset's ``noise-<device>.json`` files.

    A model cannot be judged below the noise of its labels: if re-measuring the same program differs by
    8 % (median), a MAPE of 9 % is near perfect. Each file holds a list of runs; the last one counts.
    ``floor`` is the figure the tables print: the like-for-like median (a check of as many passes as the
    label) where the check has it, since a single check pass shows its own slow spells; else the median.
    """
    out: dict[str, dict] = {}
    for path in sorted(glob.glob(os.path.join(dataset_dir, "noise-*.json"))):
        try:
            with open(path) as f:
                runs = json.load(f)
        except (OSError, json.JSONDecodeError):
            continue
        runs = [r for r in (runs if isinstance(runs, list) else [runs]) if isinstance(r, dict) and "median_rel_diff" in r]
        if runs:
            last = runs[-1]
            device = last.get("device") or os.path.basename(path)[len("noise-"):-len(".json")]
            out[device] = dict(file=os.path.basename(path), device=device,
                               median_rel_diff=float(last["median_rel_diff"]),
                               p90_rel_diff=float(last.get("p90_rel_diff", float("nan"))),
                               programs=last.get("programs", last.get("n")), date=last.get("date"),
                               **{k: last[k] for k in ("first_pass_median_rel_diff", "first_pass_p90_rel_diff",
                                                       "same_passes_median_rel_diff", "same_passes_p90_rel_diff")
                                  if last.get(k) is not None})
            out[device]["floor"] = out[device].get("same_passes_median_rel_diff", out[device]["median_rel_diff"])
    return out


def noise_floor(dataset_dir: str, devices=None) -> dict | None:
    """The noise floor of the test devices: the single device's entry, or (several devices) the worst
    one, naming all in ``per_device``; None when none of them was re-measured."""
    floors = noise_floors(dataset_dir)
    if devices is not None:
        floors = {d: f for d, f in floors.items() if d in set(devices)}
    if not floors:
        return None
    worst = max(floors.values(), key=lambda f: f["floor"])
    return {**worst, "per_device": floors} if len(floors) > 1 else worst


# ---- Markdown ------------------------------------------------------------------------------------

COLUMNS = [("MAPE", "mape", "pct"), ("median APE", "median_ape", "pct"), ("noise floor", None, "noise"), ("RMSE ms", "rmse", "ms"),
           ("±10 %", "within_10", "pct"), ("±25 %", "within_25", "pct"), ("Spearman", "spearman", "f3"),
           ("Kendall", "kendall", "f3"), ("top-1", "top1", "f3"), ("top-5", "top5", "f3"),
           ("90 % cov.", "coverage90", "pct"), ("train s", "train_seconds", "f1"),
           ("pred/s", "predict_per_s", "int")]


def _cell(value, fmt: str) -> str:
    if value is None or (isinstance(value, float) and not np.isfinite(value)):
        return "—"
    if fmt == "pct":
        return f"{100 * value:.1f} %"
    if fmt == "ms":
        return f"{1000 * value:.3g}"
    if fmt == "f3":
        return f"{value:.3f}"
    if fmt == "f1":
        return f"{value:.1f}"
    return f"{value:,.0f}"


def markdown_table(rows: list[dict], noise: dict | None) -> str:
    """Method × metrics; each row is ``{"method": ..., "metrics": {...}, "train_seconds": ..., ...}``."""
    floor = f"{100 * noise['floor']:.1f} %" if noise else "not measured yet"
    lines = ["| method | " + " | ".join(c for c, _, _ in COLUMNS) + " |",
             "|---|" + "---:|" * len(COLUMNS)]
    for r in rows:
        if r.get("skipped"):
            continue
        values = {**r.get("metrics", {}), "train_seconds": r.get("train_seconds"),
                  "predict_per_s": r.get("predict_per_s")}
        cells = [floor if fmt == "noise" and "mape" in values else ("—" if fmt == "noise" else _cell(values.get(key), fmt))
                 for _, key, fmt in COLUMNS]
        lines.append(f"| {r['method']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _pass_detail(floor: dict) -> str:
    """The same check against single-pass labels (what most records are until ``cdmpp remeasure``
    has run over them) and like for like, where the check file has them."""
    out = ""
    if "first_pass_median_rel_diff" in floor:
        out += (f"; against single-pass labels {100 * floor['first_pass_median_rel_diff']:.1f} % / "
                f"{100 * floor['first_pass_p90_rel_diff']:.1f} %")
    if "same_passes_median_rel_diff" in floor:
        out += (f"; like for like (check of as many passes as the label) {100 * floor['same_passes_median_rel_diff']:.1f} % / "
                f"{100 * floor['same_passes_p90_rel_diff']:.1f} %")
    return out


def noise_line(noise: dict | None) -> str:
    """A report's line on the labels' noise floor (``noise_floor``): how far a re-measurement moves them."""
    if not noise:
        return "- noise floor: not measured yet"
    floors = noise.get("per_device") or {noise["device"]: noise}
    parts = [f"{d}: {100 * f['median_rel_diff']:.1f} % median, {100 * f['p90_rel_diff']:.1f} % p90 "
             f"({f.get('programs')} programs re-measured, {f['file']}{_pass_detail(f)})" for d, f in floors.items()]
    head = "- noise floor (run-to-run re-measurement, |new - old| / old"
    if len(parts) > 1:
        head += "; the table shows the worst device, like for like where measured"
    elif "same_passes_median_rel_diff" in noise:
        head += "; the table shows the like-for-like median"
    return head + "): " + "; ".join(parts)


def mape_scale(predicted: np.ndarray, seconds: np.ndarray) -> float:
    """The factor c in [0.5, 1.2] (step 0.01) minimizing MAPE(c·predicted) on validation data.

    The MAPE-optimal point prediction of an uncertain latency is below its median (over-predicting by
    10x costs 900 %, under-predicting at most 100 %); a model trained in log space predicts near the
    median, so one scalar chosen on validation moves it to where the reported metric is lowest."""
    grid = np.arange(0.5, 1.2001, 0.01)
    return float(grid[int(np.argmin([np.mean(np.abs(c * predicted - seconds) / seconds) for c in grid]))])
