import nbformat as nbf
nb = nbf.v4.new_notebook()
md, code = nbf.v4.new_markdown_cell, nbf.v4.new_code_cell
nb.cells = [
md("""# cdmpp accuracy on the shipped data

Loads the measured dataset shipped in `datasets/` and the shipped model, then

1. predicted vs measured latency on **networks the model never saw** (a cross-model split: no task of a
   held-out network is in training),
2. the distribution of the relative error,
3. the adaptation curve: error on the held-out networks after fine-tuning with *k* measured programs,
   chosen by KMeans versus at random.

Set `CDMPP_NOTEBOOK_QUICK=1` to run on a small subset with short training (the test suite does)."""),
code("""import os, time
import numpy as np
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch

from cdmpp.records.dataset import load_dataset
from cdmpp.devices.table import DeviceTable
from cdmpp.evaluation.metrics import noise_floor, regression_metrics
from cdmpp.predict.predictor import Predictor
from cdmpp.evaluation.splits import cross_model_split, choose_shots, model_free_embedding
from cdmpp.model.training import TrainConfig, fit, finetune
from cdmpp.zoo.tasks import TaskTable

QUICK = os.environ.get("CDMPP_NOTEBOOK_QUICK") == "1"
HERE = os.getcwd()
ROOT = os.environ.get("CDMPP_ROOT") or (os.path.dirname(HERE) if os.path.basename(HERE) == "notebooks" else HERE)
DATASET = os.environ.get("CDMPP_NOTEBOOK_DATASET", os.path.join(ROOT, "datasets", "measurements"))
torch.set_num_threads(1)
tasks = TaskTable.load(os.path.join(ROOT, "datasets", "tasks-llvm.json.gz"))
devices = DeviceTable(os.path.join(ROOT, "datasets", "devices.json"))
ds = load_dataset(DATASET, tasks, limit=600 if QUICK else None, progress=False)
print(len(ds), "measured programs on", ds.devices(), "from networks", ds.networks())
print("run-to-run noise floor:", noise_floor(DATASET))"""),
md("""## The protocol's figures (reports/summary.json)

Every setting of docs/evaluation.md, mean ± std over 3 seeds (split and model), cdmpp beside the pooled
GBT (the strongest peer) and, for programs already measured on another device, the twin-ratio baseline.
The file holds the command that regenerates it."""),
code("""import json
summary = json.load(open(os.path.join(ROOT, "reports", "summary.json")))
print("regenerate with:", summary["command"])
rows = [("random-new", ""), ("cross-model", ""), ("cross-device-new", ""), ("cross-device-new", " k=64 (kmeans)"),
        ("cross-device-seen", " k=64 (kmeans)")]
methods = ["cdmpp", "pooled GBT", "cdmpp ⊕ pooled GBT", "twin-ratio", "cdmpp + twin"]
fig, ax = plt.subplots(figsize=(10, 4))
width = 0.16
for j, meth in enumerate(methods):
    xs, ys, es = [], [], []
    for i, (setting, suffix) in enumerate(rows):
        e = summary.get(setting, {}).get(meth + suffix)
        if e:
            xs.append(i + (j - 2) * width); ys.append(e["mape"]); es.append(e["mape_std"])
    ax.bar(xs, ys, width, yerr=es, capsize=3, label=meth)
ax.set_xticks(range(len(rows)), [s + k.replace(" (kmeans)", "") for s, k in rows], rotation=15)
ax.set_ylabel("MAPE (mean ± std, 3 seeds)"); ax.legend(fontsize=8); fig.tight_layout(); fig.savefig("protocol.png", dpi=80)"""),
md("""## Tuning with cdmpp (reports/tune-256.json, `cdmpp bench tune`)

Best measured latency after each trial of MetaSchedule's search on tasks of networks the model did not
see, with cdmpp (pretrained, learning from the tuner's measurements) and with TVM's XGBoost model, per
seed. The file holds the settings; `cdmpp bench tune ... --out reports/tune-256.json` resumes it."""),
code("""path = os.path.join(ROOT, "reports", "tune-256.json")
if not os.path.exists(path):
    print("no tuning report yet:", path)
else:
    tune = json.load(open(path))
    specs = list(tune["tasks"])
    fig, axes = plt.subplots(1, len(specs), figsize=(3.2 * len(specs), 3.2), squeeze=False)
    for ax, spec in zip(axes[0], specs):
        for kind, runs in tune["tasks"][spec].items():
            for r in runs:
                curve = [np.nan if v is None else 1e3 * v for v in r["best_so_far"]]
                ax.plot(range(1, len(curve) + 1), curve, label=f"{kind} (seed {r['seed']})")
        ax.set_title(spec.split("/")[0] + "\\n" + spec.split("/")[1][:28], fontsize=8)
        ax.set_xlabel("trials"); ax.set_yscale("log")
    axes[0][0].set_ylabel("best latency (ms)"); axes[0][-1].legend(fontsize=7)
    fig.tight_layout(); fig.savefig("tuning.png", dpi=80)
    for spec, runs in tune["tasks"].items():
        for kind, rs in runs.items():
            print(spec[:50], kind, [(r["seed"], r["trials_to_xgb_final"], r["final_best_s"]) for r in rs])"""),
md("""## Learning curve (reports/learning-curve.json, `cdmpp learning-curve`)

MAPE against the number of training programs: random-new and cross-model, each seed's training set cut
to 1/8 … 1 (nested), the same test set per seed; mean ± std over seeds (bands), cdmpp beside the pooled
GBT. The legend gives the MAPE factor per doubling of the training data (below 1: more data helps).
The file holds the command that regenerates it."""),
code("""path = os.path.join(ROOT, "reports", "learning-curve.json")
if not os.path.exists(path):
    print("no learning curve yet:", path)
else:
    curve = json.load(open(path))
    print("regenerate with:", curve["command"])
    settings = [s for s in ("random-new", "cross-model") if s in curve]
    fig, axes = plt.subplots(1, len(settings), figsize=(5.5 * len(settings), 4), squeeze=False)
    for ax, setting in zip(axes[0], settings):
        for meth in ("cdmpp", "pooled GBT"):
            e = curve[setting].get(meth)
            pts = [p for p in (e or {}).get("points", []) if "mape" in p]
            if not pts:
                continue
            n = np.array([p["n_train"] for p in pts]); y = np.array([p["mape"] for p in pts])
            sd = np.array([p["mape_std"] for p in pts])
            label = meth + (f" (×{e['mape_per_doubling']:.2f} per doubling)" if "mape_per_doubling" in e else "")
            ax.plot(n, y, "o-", label=label); ax.fill_between(n, np.maximum(y - sd, 0.01), y + sd, alpha=0.2)
        ax.set_xscale("log", base=2); ax.set_yscale("log")  # log-log: a constant factor per doubling is a line
        ax.set_xlabel("training programs"); ax.set_ylabel("MAPE (mean ± std over seeds)")
        ax.set_title(setting); ax.legend(fontsize=8)
    fig.tight_layout(); fig.savefig("learning-curve.png", dpi=80)"""),
md("## The shipped model"),
code("""predictor = Predictor.load()
print("model", predictor.version, "knows devices", predictor.devices())
print("trained on", predictor.model.summary.get("n_train"), "programs; validation", predictor.model.summary.get("val"))
sample = ds.programs[:5]
for p, pred in zip(sample, predictor.predict_features([p.features for p in sample], sample[0].device)):
    print(f"{p.task_name:40s} measured {p.seconds*1e3:9.3f} ms  predicted {pred.seconds*1e3:9.3f} ms  "
          f"[{pred.lo90*1e3:.3f}, {pred.hi90*1e3:.3f}]")"""),
md("## Cross-model: train without the held-out networks, predict them"),
code("""# hold out the networks with the most programs among the usual three (or whatever the subset has)
preferred = ["resnet18", "mobilenet_v2", "bert_tiny"]
held = [n for n in preferred if n in ds.networks()] or ds.networks()[:1]
split = cross_model_split(ds, held_out_networks=held)
print(split.info["description"]); print({k: split.info[k] for k in ("n_train", "n_val", "n_test")})
cfg = TrainConfig.recipe("default")
cfg.progress = False
cfg.max_minutes = 0.25 if QUICK else 5
t0 = time.time()
model = fit(cfg, split.train, split.val, split.target_pool, device_table=devices)
print(f"trained in {time.time() - t0:.0f} s")
y = np.array([p.seconds for p in split.test])
pred, lo, hi = model.predict([p.features for p in split.test], [p.device for p in split.test])
m = regression_metrics(y, pred)
print({k: round(v, 3) for k, v in m.items()})
print("90% interval coverage:", np.mean((y >= lo) & (y <= hi)).round(3))"""),
code("""fig, ax = plt.subplots(1, 2, figsize=(11, 4.5))
ax[0].loglog(y, pred, ".", alpha=0.5)
lim = [min(y.min(), pred.min()) / 2, max(y.max(), pred.max()) * 2]
ax[0].plot(lim, lim, "k--", lw=1); ax[0].set_xlabel("measured (s)"); ax[0].set_ylabel("predicted (s)")
ax[0].set_title(f"held-out networks {', '.join(held)}")
rel = (pred - y) / y
ax[1].hist(np.clip(rel, -1, 3), bins=40); ax[1].set_xlabel("relative error (clipped to [-1, 3])")
ax[1].set_title(f"MAPE {m['mape']:.1%}, median {np.median(np.abs(rel)):.1%}")
fig.tight_layout(); fig.savefig("accuracy.png", dpi=80)"""),
md("## Adaptation curve: fine-tune with k measured programs of the held-out networks"),
code("""ks = [4, 16] if QUICK else [8, 16, 32, 64, 128]
emb = model_free_embedding(split.train, split.test)
curve = {"kmeans": [], "random": []}
for sampler in curve:
    for k in ks:
        k = min(k, len(split.test) - 1)
        chosen = set(choose_shots(split.test, k, sampler, seed=0, embedding=emb).tolist())
        shots = [p for i, p in enumerate(split.test) if i in chosen]
        rest = [p for i, p in enumerate(split.test) if i not in chosen]
        tuned = finetune(model, shots, cfg, steps=20 if QUICK else 100, device_table=devices)
        yp, _, _ = tuned.predict([p.features for p in rest], [p.device for p in rest])
        yt = np.array([p.seconds for p in rest])
        curve[sampler].append(float(np.mean(np.abs(yp - yt) / yt)))
print(curve)
fig, ax = plt.subplots(figsize=(5.5, 4))
for sampler, errs in curve.items():
    ax.plot(ks[: len(errs)], errs, "o-", label=sampler)
ax.axhline(m["mape"], color="gray", ls=":", label="zero-shot")
ax.set_xscale("log"); ax.set_xlabel("k measured programs"); ax.set_ylabel("MAPE on the rest"); ax.legend()
fig.tight_layout(); fig.savefig("adaptation.png", dpi=80)"""),
]
nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
nbf.write(nb, "notebooks/accuracy.ipynb")
