"""The protocol's rows (``protocol-runs.jsonl``) summarized: per setting and method, mean ± standard deviation
over seeds (``aggregate``, ``summary.json``); a learning curve (``aggregate_curve``); and their Markdown
tables (``markdown``, ``curve_markdown``, ``summary_markdown`` with the README's ``headline`` and leave-one-chip-out's
``chips_markdown``)."""

from __future__ import annotations

import datetime as _dt
import json
import math
from typing import Sequence

import numpy as np

from cdmpp.evaluation.splits import SETTINGS

SUMMARY_KEYS = ("mape", "mape_capped", "mape_fast10", "median_ape", "within_10", "within_25", "spearman", "top1",
                "top5", "coverage90")


def _latest_rows(runs_path: str, select: dict | None, curve: bool) -> dict:
    """{(setting, method, train fraction, seed): row} of ``runs_path``, the latest row of each (a rerun
    replaces). ``curve``: only learning-curve rows (those with a ``train_fraction``), else only the others."""
    rows: dict = {}
    with open(runs_path) as f:
        for line in f:
            r = json.loads(line)
            if select and any(r.get(k) != v for k, v in select.items()):
                continue
            if (r.get("train_fraction") is not None) != curve:
                continue
            method = r["method"] + (f" @ {r['chip']}" if r.get("chip") else "")  # leave-one-chip-out: per chip
            rows[(r["setting"], method, r.get("train_fraction"), r["seed"])] = r
    return rows


def _mean_std(rs: list) -> dict:
    """Mean and (population) std over seeds of every metric of SUMMARY_KEYS the rows have."""
    entry: dict = {}
    for key in SUMMARY_KEYS:
        vals = [r["metrics"].get(key) for r in rs if r["metrics"].get(key) is not None]
        if vals:
            entry[key] = float(np.mean(vals))
            entry[f"{key}_std"] = float(np.std(vals))
    return entry


def aggregate(runs_path: str, command: str, select: dict | None = None) -> dict:
    """Rows of ``runs_path`` → ``{setting: {method: {mape, mape_std, ..., seeds, k, programs}}}``.

    Rows of the same (setting, method) from different seeds are averaged; with several rows per seed
    (a rerun) the latest counts. ``select`` keeps rows whose fields equal its values (e.g. minutes).
    Learning-curve rows (trained on a fraction of the training set) are left to ``aggregate_curve``.
    """
    grouped: dict = {}
    for (setting, method, _, seed), r in sorted(_latest_rows(runs_path, select, curve=False).items()):
        grouped.setdefault(setting, {}).setdefault(method, []).append(r)
    out: dict = {"command": command, "created": _dt.datetime.now().isoformat(timespec="seconds")}
    if grouped:  # the seeds the rows came from, which summary_markdown names
        out["seeds"] = sorted({r["seed"] for rs in grouped.values() for m in rs.values() for r in m})
    for setting in [s for s in SETTINGS if s in grouped]:
        out[setting] = {}
        for method, rs in grouped[setting].items():
            entry = _mean_std(rs)
            entry.update(seeds=len(rs), k=rs[0].get("k"), sampler=rs[0].get("sampler"),
                         programs=int(round(np.mean([r["programs"] for r in rs]))),
                         train_seconds=float(np.mean([r.get("train_seconds") or 0.0 for r in rs])))
            out[setting][method] = entry
        if setting == "leave-one-chip-out":
            out[setting].update(_over_chips(grouped[setting]))
    return out


OVER_CHIPS = {"cpu": "every chip", "gpu": "every GPU chip"}  # a row's ``kind`` (no kind: a CPU chip's row)
LOCO_KS = ("0", "1%", "5%", "16", "64")  # leave-one-chip-out's shot counts, in the order its tables show them


def _over_chips(by_method: dict) -> dict:
    """``{"<method> @ every chip": entry}``: per seed the mean over held-out CPU chips, then mean ± std over
    seeds (the issue's headline), for each method scored on every held-out chip; the same over GPU chips as
    ``"<method> @ every GPU chip"`` (a GPU's error is of another scale: averaged apart)."""
    out = {}
    for kind, name in OVER_CHIPS.items():
        rows = [r for rs in by_method.values() for r in rs if r.get("kind", "cpu") == kind]
        chips = {r["chip"] for r in rows}
        per: dict = {}
        for r in rows:
            per.setdefault(r["method"], {}).setdefault(r["seed"], []).append(r)
        for method, by_seed in per.items():
            seeds = [rs for rs in by_seed.values() if {r["chip"] for r in rs} == chips]
            if len(chips) < 2 or not seeds:
                continue
            means = [{"metrics": {key: float(np.mean([r["metrics"][key] for r in rs]))
                                  for key in SUMMARY_KEYS if all(r["metrics"].get(key) is not None for r in rs)}}
                     for rs in seeds]
            entry = _mean_std(means)
            entry.update(seeds=len(seeds), k=None, sampler=seeds[0][0].get("sampler"),
                         programs=int(sum(r["programs"] for r in seeds[0])), train_seconds=None, chips=sorted(chips))
            out[f"{method} @ {name}"] = entry
    return out


def aggregate_curve(runs_path: str, command: str, select: dict | None = None) -> dict:
    """Learning-curve rows of ``runs_path`` → ``{"command", "fractions", setting: {method: {"points": [{fraction,
    n_train, n_test, mape, mape_std, ..., seeds}, ...], "mape_per_doubling", "mape_per_doubling_std"}}}``.

    A point is the mean ± std over seeds at one fraction. ``mape_per_doubling`` is the factor by which
    MAPE changes when the training set doubles: exp of the slope of log(MAPE) on log2(n_train), fitted
    per seed over its fractions, mean ± std over seeds (below 1: more data helps).
    """
    grouped: dict = {}
    for (setting, method, fraction, seed), r in sorted(_latest_rows(runs_path, select, curve=True).items()):
        grouped.setdefault(setting, {}).setdefault(method, {}).setdefault(fraction, []).append(r)
    fractions = sorted({f for by_method in grouped.values() for by_f in by_method.values() for f in by_f})
    out: dict = {"command": command, "created": _dt.datetime.now().isoformat(timespec="seconds"),
                 "fractions": fractions}
    for setting in [s for s in SETTINGS if s in grouped]:
        out[setting] = {}
        for method, by_f in grouped[setting].items():
            points = []
            for fraction, rs in sorted(by_f.items()):
                point = dict(fraction=fraction, n_train=int(round(np.mean([r["n_train"] for r in rs]))),
                             n_test=int(round(np.mean([r["programs"] for r in rs]))), **_mean_std(rs),
                             seeds=len(rs), train_seconds=float(np.mean([r.get("train_seconds") or 0.0 for r in rs])))
                if any(r.get("epochs") is not None for r in rs):
                    point["epochs"] = float(np.mean([r["epochs"] for r in rs if r.get("epochs") is not None]))
                points.append(point)
            entry: dict = {"points": points}
            factors = [_per_doubling([r for rs in by_f.values() for r in rs if r["seed"] == seed])
                       for seed in sorted({r["seed"] for rs in by_f.values() for r in rs})]
            factors = [f for f in factors if f is not None]
            if factors:
                entry.update(mape_per_doubling=float(np.mean(factors)), mape_per_doubling_std=float(np.std(factors)))
            out[setting][method] = entry
    return out


def _per_doubling(rows: list) -> float | None:
    """exp(slope) of log(MAPE) on log2(n_train) over one seed's rows; None with fewer than 2 sizes."""
    pts = [(r["n_train"], r["metrics"]["mape"]) for r in rows if (r["metrics"].get("mape") or 0) > 0]
    if len({n for n, _ in pts}) < 2:
        return None
    x, y = np.log2([n for n, _ in pts]), np.log([m for _, m in pts])
    return float(np.exp(np.polyfit(x, y, 1)[0]))


def curve_markdown(curve: dict) -> str:
    """One table per setting: method, fraction, training programs, MAPE ± std, median APE, Spearman; then
    the MAPE factor per doubling of the training set."""
    lines = [f"Command: `{curve.get('command', '')}` ({curve.get('created', '')}); mean ± std over seeds.", ""]
    for setting in [s for s in SETTINGS if s in curve]:
        lines += [f"**{setting}**", "", "| method | fraction | train programs | test programs | MAPE | median APE | "
                  "Spearman | seeds |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
        for method, e in curve[setting].items():
            for p in e["points"]:
                pct = lambda k: f"{100 * p[k]:.1f} ± {100 * p[k + '_std']:.1f} %" if k in p else "—"  # noqa: E731
                lines.append(f"| {method} | {p['fraction']:g} | {p['n_train']} | {p['n_test']} | {pct('mape')} | "
                             f"{pct('median_ape')} | {p.get('spearman', math.nan):.3f} ± "
                             f"{p.get('spearman_std', math.nan):.3f} | {p['seeds']} |")
        doubling = [(m, e) for m, e in curve[setting].items() if "mape_per_doubling" in e]
        if doubling:
            lines += ["", "MAPE × per doubling of the training set: " + "; ".join(
                f"{m} {e['mape_per_doubling']:.3f} ± {e['mape_per_doubling_std']:.3f}" for m, e in doubling)]
        lines.append("")
    return "\n".join(lines)


def markdown(summary: dict, methods: Sequence[str] | None = None) -> str:
    """One table per setting: method, MAPE ± std, capped MAPE, median APE, Spearman, seeds, programs."""
    lines = []
    for setting in [s for s in SETTINGS if s in summary]:
        lines += [f"**{setting}**", "", "| method | k | MAPE | MAPE (APE ≤ 100 %) | fast-10 % MAPE | median APE | ±25 % | Spearman | top-1 | seeds | test programs |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for method, e in summary[setting].items():
            if methods and not any(method.startswith(m) for m in methods):
                continue
            pct = lambda k: f"{100 * e[k]:.1f} ± {100 * e[k + '_std']:.1f} %" if k in e else "—"  # noqa: E731
            lines.append(f"| {method} | {e['k'] if e['k'] is not None else '—'} | {pct('mape')} | {pct('mape_capped')} | {pct('mape_fast10')} | "
                         f"{pct('median_ape')} | {pct('within_25')} | "
                         f"{e.get('spearman', math.nan):.3f} ± {e.get('spearman_std', math.nan):.3f} | "
                         f"{e.get('top1', math.nan):.3f} | {e['seeds']} | {e['programs']} |")
        lines.append("")
    return "\n".join(lines)


def headline(summary: dict, label: str = "cdmpp") -> str:
    """The README's short table: per setting (cross-device at k = 0 and 64 KMeans shots), MAPE ± std of
    cdmpp, the pooled GBT (FLOP and latency targets, MAPE loss), the Tenset MLP and (seen programs) the
    twin-based predictors; a column no row has is left out; "" when the summary has none of these settings."""
    cols = [label, "pooled GBT", "pooled GBT, latency target", "pooled GBT, MAPE loss", "Tenset MLP", "twin-ratio", "twin-Amdahl",
            "twin-Amdahl x ratio GBT", "twin-roofline", "twin-roofline x ratio GBT", f"{label} + twin"]
    rows = [("random-new", ""), ("cross-model", ""), ("cross-device-new", ""), ("cross-device-new", " k=64 (kmeans)"),
            ("cross-device-seen", " k=64 (kmeans)"), ("cross-device-seen", " k=5% (kmeans)")]
    table = {(setting, suffix): [summary[setting].get(c + suffix) for c in cols]
             for setting, suffix in rows if setting in summary}
    if not table:
        return ""
    keep = [i for i in range(len(cols)) if any(cells[i] for cells in table.values())]
    lines = ["| setting | " + " | ".join(cols[i] for i in keep) + " |", "|---|" + "---:|" * len(keep)]
    for (setting, suffix), cells in table.items():
        shown = [f"{100 * cells[i]['mape']:.1f} ± {100 * cells[i]['mape_std']:.1f} %" if cells[i] else "—" for i in keep]
        lines.append(f"| {setting}{suffix.replace(' (kmeans)', ', KMeans shots')} | " + " | ".join(shown) + " |")
    return "\n".join(lines)


def summary_markdown(summary: dict) -> str:
    """``reports/summary.md``: the command, the headline table and every setting's table."""
    opts = summary.get("options", {})
    # the seeds the rows came from (a --summarize-only run's options hold only the default seeds)
    seeds = ", ".join(str(s) for s in summary.get("seeds") or opts.get("seeds", [])) or "see rows"
    head = headline(summary)
    return "\n".join([
        "# cdmpp protocol summary", "",
        f"Command: `{summary.get('command', '')}` ({summary.get('created', '')}); protocol: docs/evaluation.md; "
        f"every row of every seed: {opts.get('runs', 'reports/protocol-runs.jsonl')}. Mean ± std over seeds {seeds}.", "",
        *(["## Headline (MAPE)", "", head, ""] if head else []),
        *(["## Leave-one-chip-out (each k: cdmpp beside the best peer on each metric)", "", chips_markdown(summary)]
          if "leave-one-chip-out" in summary else []),
        "## Every setting and method", "", markdown(summary)]) + "\n"


PEERS = ("pooled GBT", "pooled GBT, spec transfer", "shots-only GBT")


def chips_markdown(summary: dict, label: str = "cdmpp", sampler: str = "kmeans") -> str:
    """Per held-out chip and over every chip: for each k, cdmpp's MAPE and within-task Spearman beside the
    best peer on each metric (``PEERS``, the best chosen per metric and row), the network fine-tune and
    the chip's own full-data GBT (a ceiling)."""
    rows = summary.get("leave-one-chip-out", {})
    over = list(OVER_CHIPS.values())
    chips = sorted({m.rsplit(" @ ", 1)[1] for m in rows if " @ " in m} - set(over))
    ks = [*LOCO_KS, *sorted({m.split(" k=", 1)[1].split(" (", 1)[0] for m in rows if m.startswith(label + " k=")}
                            - set(LOCO_KS))]  # e.g. "100%": every pool program, the k-shot path's ceiling
    lines = []
    for chip in [*over, *chips]:
        if not any(m.endswith(" @ " + chip) for m in rows):
            continue
        ref = rows.get(f"chip's own GBT (reference) @ {chip}")
        lines += [f"**{chip}**" + (f" (the chip's own GBT on all its other programs: MAPE {100 * ref['mape']:.1f} %, "
                                    f"Spearman {ref['spearman']:.3f})" if ref else ""), "",
                  f"| k ({sampler} shots) | {label} MAPE | best peer MAPE | {label} / peer | {label} Spearman | "
                  f"best peer Spearman | {label}, fine-tune MAPE | seeds |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
        for k in ks:
            suffix = "" if k == "0" else f" k={k} ({sampler})"
            e = rows.get(f"{label}{suffix} @ {chip}")
            peers = [(p, rows[f"{p}{suffix} @ {chip}"]) for p in PEERS if f"{p}{suffix} @ {chip}" in rows]
            if not e or not peers:
                continue
            best = min(peers, key=lambda pe: pe[1]["mape"])
            rank = max(peers, key=lambda pe: pe[1].get("spearman", -1.0))
            tuned = rows.get(f"{label}, fine-tune{suffix} @ {chip}")
            lines.append(f"| {k} | {_pct(e, 'mape')} | {_pct(best[1], 'mape')} ({best[0]}) | "
                         f"{e['mape'] / best[1]['mape']:.2f} | {e['spearman']:.3f} | {rank[1]['spearman']:.3f} ({rank[0]}) | "
                         f"{_pct(tuned, 'mape')} | {e['seeds']} |")
        lines.append("")
    return "\n".join(lines)


def _pct(entry: dict | None, key: str) -> str:
    return f"{100 * entry[key]:.1f} ± {100 * entry[key + '_std']:.1f} %" if entry and key in entry else "—"
