"""Writes notebooks/accuracy.ipynb (run from the repository root; then execute it, README "Ways in")."""
import nbformat as nbf

nb = nbf.v4.new_notebook()
md, code = nbf.v4.new_markdown_cell, nbf.v4.new_code_cell
nb.cells = [
md("""# How accurate is cdmpp?

One section per question, each figure read from the report the README cites (`reports/`, every figure → file →
command in [reports/README.md](../reports/README.md)), then a small model trained here on the shipped data:

1. per setting, against the strongest peer (`reports/summary.json`);
2. across chips never trained on (`reports/leave-one-chip-out.json`);
3. inside a tuner (`reports/tune-256-taskval.json`, `tune-256-seeds23.json`);
4. whole networks (`reports/network-heldout-*.json`);
5. with more data (`reports/learning-curve.json`);
6. try it: the shipped model on a few programs, a cross-model model trained here (bounded in epochs), and
   fine-tuning with *k* measured programs chosen by KMeans or at random.

MAPE is the mean absolute percentage error on latency (lower is better); Spearman is the within-task rank
correlation (higher is better). Set `CDMPP_NOTEBOOK_QUICK=1` for a smoke run on a small subset (the test suite
does); its figures say so."""),
code("""%matplotlib inline
import json, os, time, warnings
import numpy as np
import matplotlib.pyplot as plt
from matplotlib.ticker import LogFormatter
import torch

QUICK = os.environ.get("CDMPP_NOTEBOOK_QUICK") == "1"
N_PROGRAMS = 600 if QUICK else 5000        # programs of one device loaded for section 6
EPOCHS = 3 if QUICK else 30                # section 6's training budget (TrainConfig.epochs)
BANNER = f"QUICK MODE: smoke figures on {N_PROGRAMS} programs, not accuracy results" if QUICK else ""
if QUICK:
    print(BANNER)
HERE = os.getcwd()
ROOT = os.environ.get("CDMPP_ROOT") or (os.path.dirname(HERE) if os.path.basename(HERE) == "notebooks" else HERE)
plt.rcParams.update({"figure.dpi": 75, "font.size": 9})
torch.set_num_threads(2)
warnings.filterwarnings("ignore", message="IProgress not found")  # tqdm in a kernel without ipywidgets


def report(name):
    \"\"\"reports/NAME as a dict, or None (with a sentence) when it is not there.\"\"\"
    path = os.path.join(ROOT, "reports", name)
    if not os.path.exists(path):
        print(f"{path} is not there: this section is skipped.")
        return None
    with open(path) as f:
        return json.load(f)


class PlainLog(LogFormatter):
    def _num_to_string(self, x, vmin, vmax):
        return f"{x:g}"


def plain_log(ax, axis="y"):
    \"\"\"A log axis labelled in plain numbers (0.2, 5, 10), not powers of ten.\"\"\"
    side = ax.yaxis if axis == "y" else ax.xaxis
    side.set_major_formatter(PlainLog()); side.set_minor_formatter(PlainLog(labelOnlyBase=False))


def titled(fig, text):
    fig.suptitle(text + (f"\\n{BANNER}" if QUICK else ""), color="red" if QUICK else "black")
    fig.tight_layout()


def split_name(name):
    \"\"\"'pooled GBT k=5% (kmeans)' -> ('pooled GBT', 'k=5% (kmeans)'); no shots -> (name, '').\"\"\"
    base, _, shots = name.partition(" k=")
    return base, ("k=" + shots if shots else "")


def best_peer(methods, shots, metric, higher):
    \"\"\"(name, entry) of the best method that is not cdmpp's, at these shots, on this metric.\"\"\"
    peers = [(split_name(n)[0], e) for n, e in methods.items() if split_name(n)[1] == shots
             and not n.startswith("cdmpp") and "(reference)" not in n and e.get(metric) is not None]
    return (max if higher else min)(peers, key=lambda p: p[1][metric], default=(None, None))


def compare(ax, groups, metric, higher):
    \"\"\"Horizontal bars: cdmpp beside the best peer on `metric`, per group (label, (cdmpp's name, its entry),
    methods, shots),
    each labelled with its value and the peer's name; a log axis where the values span more than 5x.\"\"\"
    pct = metric != "spearman"
    fmt = (lambda v: f"{100 * v:.1f} %") if pct else (lambda v: f"{v:.3f}")
    bars, missing = [], []
    for i, (label, (me, mine), methods, shots) in enumerate(groups):
        peer, theirs = best_peer(methods, shots, metric, higher)
        for y, e, name, color in ((i - 0.2, mine, me, "tab:blue"), (i + 0.2, theirs, peer, "tab:gray")):
            if e is None or e.get(metric) is None:
                missing.append((y, f"{name or 'no peer'}: not in the file"))
            else:
                bars.append((y, e[metric], e.get(metric + "_std") or 0.0, name, color))
    values = [v for _, v, _, _, _ in bars] or [1.0]
    log = pct and max(values) > 5 * min(values)
    for y, v, sd, name, color in bars:
        ax.barh(y, v, 0.4, xerr=sd, color=color, capsize=2)
        ax.text((v + sd) * 1.1 if log else v + sd + 0.01, y, f"{fmt(v)}  {name}", va="center", fontsize=7)
    for y, text in missing:
        ax.text(0.02, y, text, va="center", fontsize=7, transform=ax.get_yaxis_transform())
    ax.set_yticks(range(len(groups)), [g[0] for g in groups])
    if log:
        ax.set_xscale("log"); ax.set_xlim(min(values) / 2, max(values) * 12)
    else:
        ax.set_xlim(0, max(values) * 2.0 if pct else 1.0)
    name = {"mape": "MAPE", "spearman": "within-task Spearman"}.get(metric, metric)
    ax.set_xlabel(f"{name}, mean ± std over seeds ({'higher' if higher else 'lower'} is better)"
                  + (", log scale" if log else ""))
    if pct:
        ax.xaxis.set_major_formatter(plt.FuncFormatter(lambda v, _: f"{100 * v:g} %"))
        ax.xaxis.set_minor_formatter(plt.NullFormatter())"""),
md("""## 1. How accurate, per setting, against the strongest peer

`reports/summary.json`: the README's rows, mean ± std over 3 seeds (split and model). cdmpp (blue) beside the
best other method on the same splits for each metric (gray, named). In cross-device-seen cdmpp is given the
program's measured latency on its twin device (`cdmpp + twin`), like its peers there. Settings and peers:
docs/evaluation.md."""),
code("""summary = report("summary.json")
ROWS = [("random-new", "cdmpp", "", "random-new\\n(programs never seen)"),
        ("cross-model", "cdmpp", "", "cross-model\\n(networks never seen)"),
        ("cross-device-new", "cdmpp", "", "cross-device-new\\n(2 -> 1 thread, no shots)"),
        ("cross-device-new", "cdmpp", "k=5% (kmeans)", "cross-device-new\\n(5 % KMeans shots)"),
        ("cross-device-seen", "cdmpp + twin", "k=5% (kmeans)", "cross-device-seen\\n(twin label, 5 % shots)")]
if summary:
    print("regenerate with:", summary.get("command"))
    groups = []
    for setting, mine, shots, label in ROWS:
        methods = summary.get(setting, {})
        entry = methods.get(mine + (" " + shots if shots else ""))
        if entry is None:
            print(f"{setting}: no '{mine}' row at {shots or 'no shots'} in summary.json; skipped.")
            continue
        groups.append((f"{label}\\n{entry.get('programs', '?')} test programs", (mine, entry), methods, shots))
    if groups:
        fig, axes = plt.subplots(1, 2, figsize=(12, 0.9 * len(groups) + 1.5), sharey=True)
        compare(axes[0], groups, "mape", higher=False)
        compare(axes[1], groups, "spearman", higher=True)
        axes[0].invert_yaxis()  # first row on top (the panels share it)
        titled(fig, "cdmpp (blue) beside the best peer (gray) per setting (reports/summary.json)")
        plt.show()"""),
md("""## 2. Across chips never trained on (leave-one-chip-out)

`reports/leave-one-chip-out.json`: Zen 3 and the 16-thread Xeon held out in turn, trained on every other
device; cdmpp at 10 epochs, 3 seeds. With no measurement of the chip, then with 1 % / 5 % / 16 / 64 of its
programs measured (KMeans). Peers whose MAPE runs into the 10⁵ % (the shots-only GBT on a FLOP target) never
win a metric, so they do not appear; reports/leave-one-chip-out.md explains them."""),
code("""chips = report("leave-one-chip-out.json")
if chips and "leave-one-chip-out" in chips:
    print("regenerate with:", chips.get("command"))
    rows = chips["leave-one-chip-out"]
    by_chip = {}
    for name, e in rows.items():
        method, _, chip = name.partition(" @ ")
        by_chip.setdefault(chip, {})[method] = e
    groups = []
    for chip in sorted(by_chip, key=lambda c: (c == "every chip", c)):
        for shots in ("", "k=1% (kmeans)", "k=5% (kmeans)", "k=16 (kmeans)", "k=64 (kmeans)"):
            entry = by_chip[chip].get("cdmpp" + (" " + shots if shots else ""))
            if entry is not None:
                groups.append((f"{chip}: {shots or 'no shots'}", ("cdmpp", entry), by_chip[chip], shots))
    if groups:
        fig, axes = plt.subplots(1, 2, figsize=(12, 0.45 * len(groups) + 1.5), sharey=True)
        compare(axes[0], groups, "mape", higher=False)
        compare(axes[1], groups, "spearman", higher=True)
        axes[0].invert_yaxis()
        titled(fig, "held-out chip: cdmpp (blue) beside the best peer (gray) (reports/leave-one-chip-out.json)")
        plt.show()
    else:
        print("no cdmpp rows in leave-one-chip-out.json; skipped.")"""),
md("""## 3. Inside a tuner (MetaSchedule, 256 trials)

Best measured latency after each trial of MetaSchedule's search on 5 tasks of networks the model never saw,
with cdmpp as the cost model and with TVM's XGBoost model: median over the seeds (line) and their range (band).
Seeds 0/1 come from `tune-256-taskval.json`, 2/3 from `tune-256-seeds23.json` (two held-out checkpoints of the
same recipe; reports/tune-256.md)."""),
code("""runs = {}  # task -> cost model -> [run]
for name in ("tune-256-taskval.json", "tune-256-seeds23.json"):
    tune = report(name)
    for task, by_model in (tune or {}).get("tasks", {}).items():
        for kind, rs in by_model.items():
            runs.setdefault(task, {}).setdefault(kind, []).extend(rs)
if runs:
    fig, axes = plt.subplots(1, len(runs), figsize=(2.6 * len(runs), 3.2), squeeze=False)
    for ax, (task, by_model) in zip(axes[0], runs.items()):
        for kind, rs in by_model.items():
            curves = np.array([[np.nan if v is None else 1e3 * v for v in r["best_so_far"]] for r in rs])
            x = np.arange(1, curves.shape[1] + 1)
            ax.plot(x, np.nanmedian(curves, axis=0), label=f"{kind} ({len(rs)} seeds)")
            ax.fill_between(x, np.nanmin(curves, axis=0), np.nanmax(curves, axis=0), alpha=0.2)
            if kind == "cdmpp":
                hits = [r.get("trials_to_xgb_final") for r in rs]
                print(f"{task}: cdmpp reached XGBoost's final best after {hits} trials (per seed; None: never)")
        net, _, kernel = task.partition("/")
        ax.set_title(f"{net}\\n{kernel[:26]}", fontsize=8)
        ax.set_xlabel("trials"); ax.set_yscale("log"); plain_log(ax)
    axes[0][0].set_ylabel("best latency so far (ms, log)"); axes[0][0].legend(fontsize=7)
    titled(fig, "MetaSchedule search with cdmpp vs XGBoost as the cost model (reports/tune-256-*.json)")
    plt.show()"""),
md("""## 4. Whole networks the model never saw

`cdmpp bench network`: a network predicted as the weighted sum of its tasks' predicted kernels (dot and 90 %
interval) against the same build measured end to end, four times (crosses: the four report files). The
dotted band is ±15 %. reports/network.md explains bert_tiny (a data-dependent GELU kernel)."""),
code("""measured, predicted = {}, {}
for name in ("network-heldout-order.json", "network-heldout-order-2.json", "network-heldout-order-3.json",
             "network-heldout-r29.json"):
    for r in (report(name) or {}).get("networks", []):
        measured.setdefault(r["network"], []).append(1e3 * r["measured_seconds"])
        predicted[r["network"]] = (1e3 * r["predicted_s"], 1e3 * r["lo90"], 1e3 * r["hi90"])
if measured:
    fig, ax = plt.subplots(figsize=(6.5, 3.4))
    for i, net in enumerate(measured):
        p, lo, hi = predicted[net]
        m = np.median(measured[net])
        ax.errorbar(i - 0.1, p, yerr=[[p - lo], [hi - p]], fmt="o", color="tab:blue", capsize=3,
                    label="predicted, 90 % interval" if i == 0 else None)
        ax.plot([i + 0.1] * len(measured[net]), measured[net], "x", color="black",
                label="measured (each run)" if i == 0 else None)
        ax.fill_between([i - 0.3, i + 0.3], 0.85 * m, 1.15 * m, color="gray", alpha=0.2)
        ax.annotate(f"{p / m - 1:+.0%}", (i - 0.1, p), textcoords="offset points", xytext=(-30, 0), fontsize=8)
    ax.set_xticks(range(len(measured)), list(measured)); ax.set_yscale("log")
    plain_log(ax); ax.set_ylabel("network latency (ms, log)"); ax.legend(fontsize=8)
    titled(fig, "whole networks: predicted vs measured (reports/network-heldout-*.json)")
    plt.show()"""),
md("""## 5. With more data (learning curve)

`reports/learning-curve.json`: MAPE against the number of training programs on random-new and cross-model,
each seed's training set cut to 1/8 … 1 (nested), the same test set per seed; mean ± std over seeds, cdmpp
beside the pooled GBT. The legend gives the MAPE factor per doubling of the training data (below 1: more data
helps)."""),
code("""curve = report("learning-curve.json")
settings = [s for s in ("random-new", "cross-model") if s in (curve or {})]
if curve and not settings:
    print("learning-curve.json holds neither random-new nor cross-model; skipped.")
if settings:
    print("regenerate with:", curve.get("command"))
    fig, axes = plt.subplots(1, len(settings), figsize=(5.5 * len(settings), 3.6), squeeze=False)
    for ax, setting in zip(axes[0], settings):
        for meth, e in curve[setting].items():
            pts = [p for p in e.get("points", []) if "mape" in p]
            if not pts:
                continue
            n = np.array([p["n_train"] for p in pts]); y = np.array([p["mape"] for p in pts])
            sd = np.array([p.get("mape_std", 0.0) for p in pts])
            label = meth + (f" (×{e['mape_per_doubling']:.3f} per doubling)" if "mape_per_doubling" in e else "")
            ax.plot(n, 100 * y, "o-", label=label); ax.fill_between(n, 100 * (y - sd), 100 * (y + sd), alpha=0.2)
        ax.set_xscale("log", base=2); ax.set_yscale("log"); plain_log(ax); plain_log(ax, "x")  # log-log: a constant factor per doubling is a line
        ax.set_xlabel("training programs (log)"); ax.set_ylabel("MAPE, % (log)")
        ax.set_title(setting); ax.legend(fontsize=8)
    titled(fig, "MAPE against training-set size (reports/learning-curve.json)")
    plt.show()"""),
md("""## 6. Try it: the shipped model, then a model trained here

The shipped model predicts a few measured programs (it may have trained on them: this shows the API, not its
accuracy). Then a **cross-model** split of 5,000 programs (600 in quick mode) of one device (the 2-vCPU Zen 4 VM): train
without three networks, predict them. A first run featurizes the programs (a few minutes; cached after). The model is the shipped recipe (`train/default.toml`) cut to 30 epochs
(3 in quick mode) and without its GBT blend (whose budget is minutes), so it is a small demonstration, far below the
protocol's figures of section 1: a few minutes on 2 cores, not a result."""),
code("""from cdmpp import Predictor
from cdmpp.devices.table import DeviceTable
from cdmpp.evaluation.metrics import noise_floor, regression_metrics
from cdmpp.evaluation.splits import choose_shots, cross_model_split, model_free_embedding
from cdmpp.model.training import TrainConfig, finetune, finetune_steps, fit
from cdmpp.records.dataset import load_dataset
from cdmpp.zoo.tasks import TaskTable

DATASET = os.environ.get("CDMPP_NOTEBOOK_DATASET", os.path.join(ROOT, "datasets", "measurements"))
DEVICE = "amd-epyc-znver4-2t/llvm-avx512"
t0 = time.time()
tasks = TaskTable.load(os.path.join(ROOT, "datasets", "tasks-llvm.json.gz"))
devices = DeviceTable(os.path.join(ROOT, "datasets", "devices.json"))
ds = load_dataset(DATASET, tasks, devices=[DEVICE], limit=N_PROGRAMS, progress=False)
print(f"{len(ds)} measured programs of {ds.devices()} from {len(ds.networks())} networks, "
      f"loaded in {time.time() - t0:.0f} s")
floor = noise_floor(DATASET, [DEVICE])
print("run-to-run noise of the labels (median):", f"{floor['floor']:.1%}" if floor else "not measured")

predictor = Predictor.load()
print("shipped model", predictor.version, "trained on", predictor.model.summary.get("n_train"), "programs")
sample = list({p.task_name: p for p in reversed(ds.programs)}.values())[:5]  # one program of each of 5 tasks
for p, pred in zip(sample, predictor.predict_features([p.features for p in sample], DEVICE)):
    print(f"{p.task_name[:56]:56s} measured {p.seconds*1e3:8.3f} ms  predicted {pred.seconds*1e3:8.3f} ms  "
          f"90 % [{pred.lo90*1e3:.3f}, {pred.hi90*1e3:.3f}]")"""),
code("""preferred = ["resnet18", "mobilenet_v2", "bert_tiny"]
held = [n for n in preferred if n in ds.networks()] or ds.networks()[:1]
split = cross_model_split(ds, held_out_networks=held)
print(split.info["description"]); print({k: split.info[k] for k in ("n_train", "n_val", "n_test")})
cfg = TrainConfig.recipe("default")
cfg.epochs, cfg.patience, cfg.lr_cycle_epochs = EPOCHS, EPOCHS, max(1, EPOCHS // 3)
cfg.gbt_blend, cfg.progress = False, False
t0 = time.time()
model = fit(cfg, split.train, split.val, split.target_pool, device_table=devices)
print(f"trained {cfg.epochs} epochs in {time.time() - t0:.0f} s")
y = np.array([p.seconds for p in split.test])
pred, lo, hi = model.predict([p.features for p in split.test], [p.device for p in split.test])
m = regression_metrics(y, pred)
print({k: round(float(v), 3) for k, v in m.items()})
print("90 % interval coverage:", np.mean((y >= lo) & (y <= hi)).round(3))

fig, ax = plt.subplots(1, 2, figsize=(10, 4))
ax[0].loglog(1e3 * y, 1e3 * pred, ".", alpha=0.4); plain_log(ax[0], "x"); plain_log(ax[0], "y")
lim = [1e3 * min(y.min(), pred.min()) / 2, 1e3 * max(y.max(), pred.max()) * 2]
ax[0].plot(lim, lim, "k--", lw=1); ax[0].set_xlabel("measured (ms, log)"); ax[0].set_ylabel("predicted (ms, log)")
ax[0].set_title(f"{len(y)} programs of the held-out networks {', '.join(held)}")
rel = (pred - y) / y
ax[1].hist(np.clip(rel, -1, 3), bins=40); ax[1].set_xlabel("relative error (pred - measured) / measured, clipped to [-1, 3]")
ax[1].set_title(f"MAPE {m['mape']:.1%}, median APE {np.median(np.abs(rel)):.1%}")
titled(fig, f"cross-model, trained here: {split.info['n_train']} training programs, {cfg.epochs} epochs")
plt.show()"""),
md("""Fine-tune that model with *k* measured programs of the held-out networks, chosen by KMeans on a model-free
embedding or at random (`finetune_steps` Adam steps, as the protocol does), and score the rest."""),
code("""ks = [4, 16] if QUICK else [8, 32, 128]
emb = model_free_embedding(split.train, split.test)
adapt = {"kmeans": [], "random": []}
t0 = time.time()
for sampler in adapt:
    for k in ks:
        chosen = set(choose_shots(split.test, min(k, len(split.test) - 1), sampler, seed=0, embedding=emb).tolist())
        shots = [p for i, p in enumerate(split.test) if i in chosen]
        rest = [p for i, p in enumerate(split.test) if i not in chosen]
        tuned = finetune(model, shots, cfg, steps=finetune_steps(len(shots), cfg.batch_size), device_table=devices)
        yp, _, _ = tuned.predict([p.features for p in rest], [p.device for p in rest])
        yt = np.array([p.seconds for p in rest])
        adapt[sampler].append(float(np.mean(np.abs(yp - yt) / yt)))
print(f"fine-tuned {len(ks) * 2} times in {time.time() - t0:.0f} s")
for sampler, errs in adapt.items():
    print(sampler, {k: f"{e:.1%}" for k, e in zip(ks, errs)})
fig, ax = plt.subplots(figsize=(5.5, 3.6))
for sampler, errs in adapt.items():
    ax.plot(ks, 100 * np.array(errs), "o-", label=sampler)
ax.axhline(100 * m["mape"], color="gray", ls=":", label="no shots")
ax.set_xscale("log", base=2); ax.set_xticks(ks, [str(k) for k in ks])
ax.set_xlabel("k measured programs"); ax.set_ylabel("MAPE on the rest, %"); ax.legend()
titled(fig, "fine-tuning the model trained here with k shots")
plt.show()"""),
]
nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
nb.metadata["language_info"] = {"name": "python"}
nbf.write(nb, "notebooks/accuracy.ipynb")
