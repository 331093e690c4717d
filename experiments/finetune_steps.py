"""k-shot adaptations of the seed-0 cross-device source model (benchmarks/finetune_steps_model.py): the
shots' median ratio alone, fine-tunes of 20 and 100 steps, on KMeans and random shots of three draws each;
MAPE on the new test programs (reports/study-issue19.md, round 23). Argument: k (default 16)."""
import sys, numpy as np, torch
from cdmpp.devices.table import DeviceTable
from cdmpp.evaluation import protocol as P, splits
from cdmpp.model.checkpoint import TrainedModel
from cdmpp.model.training import finetune, TrainConfig
torch.set_num_threads(2)
opts = P.ProtocolOptions(); ds = P.load_pinned(opts); target = opts.target_device
table = DeviceTable(opts.devices).spec_table()
model = TrainedModel.load("runs/models/xd-seed0")
cfg = TrainConfig.from_dict(model.config)
k = int(sys.argv[1]) if len(sys.argv) > 1 else 16
embed = lambda feats: model.embed(feats)
def pred(m, ps): return m.predict([p.features for p in ps], [p.device for p in ps])[0]
test = None
for sampler, seed in [("kmeans", 0), ("kmeans", 1), ("kmeans", 2), ("random", 0), ("random", 1), ("random", 2)]:
    sp = splits.cross_device_split(ds, target, k, sampler, 0, embed=embed, programs="new", draw=seed)
    if test is None:
        test = sp.test; y = np.array([p.seconds for p in test]); base = pred(model, test)
        print(f"k=0: {100*np.mean(np.abs(base-y)/y):.1f}", flush=True)
    mape = lambda pr: 100 * np.mean(np.abs(pr - y) / y)
    ys = np.array([p.seconds for p in sp.shots]); ps = pred(model, sp.shots)
    r = np.log(ys / ps)
    out = [f"scale x{np.exp(np.median(r)):.3f}: {mape(base*np.exp(np.median(r))):.1f}"]
    for steps in (20, 100):
        ft = finetune(model, sp.shots, cfg, steps, device_table=table)
        out.append(f"ft{steps}: {mape(pred(ft, test)):.1f}")
    print(sampler, seed, " ".join(out), flush=True)
