"""k-shot adaptation at small k on the protocol's cross-device source models of seeds 0-2
(benchmarks/finetune_steps_model.py SEED): for each seed's split and three shot draws per sampler, MAPE on
the new test programs and on the target's other programs (the pool less the shots: a development set that
is not the test) with no adaptation and with the transformer fine-tuned while the blended GBT takes 0, 8,
16, 32 or 50 shallow trees on the shots (``PooledGBT.adapt``), and the shots' held-out predictions of each
under a 4-fold check, so check rules can be compared afterwards (reports/study-issue19.md, round 24).
Arguments: k (default 16), output JSON lines file, shot draws per sampler (default 3)."""
import copy, json, sys, time
import numpy as np, torch
from cdmpp.devices.table import DeviceTable
from cdmpp.evaluation import protocol as P, splits
from cdmpp.model.checkpoint import TrainedModel
from cdmpp.model.training import TrainConfig, _with_devices, finetune, finetune_steps

torch.set_num_threads(2)
k = int(sys.argv[1]) if len(sys.argv) > 1 else 16
out_path = sys.argv[2] if len(sys.argv) > 2 else f"runs/finetune-small-k{k}.jsonl"
draws = int(sys.argv[3]) if len(sys.argv) > 3 else 3
ROUNDS = (0, 8, 16, 32, 50)
opts = P.ProtocolOptions(); ds = P.load_pinned(opts); target = opts.target_device
table = DeviceTable(opts.devices).spec_table()


def pred(m, ps):
    return m.predict([p.features for p in ps], [p.device for p in ps])[0]


def variants(model, base, cfg, shots, steps):
    """The fine-tuned transformer with the base GBT adapted by each of ROUNDS."""
    ft = finetune(model, shots, cfg, steps, device_table=table)
    out = {}
    for rounds in ROUNDS:
        m = copy.copy(ft)
        m.gbt = base.gbt.adapt(shots, rounds) if rounds else base.gbt
        out[rounds] = m
    return out


for seed in (0, 1, 2):
    model = TrainedModel.load(f"runs/models/xd-seed{seed}"); cfg = TrainConfig.from_dict(model.config)
    base = _with_devices(model, table)
    test = y = base_test = None
    for sampler in ("kmeans", "random"):
        for draw in (seed, seed + 10, seed + 20)[:draws]:
            t0 = time.time()
            sp = splits.cross_device_split(ds, target, k, sampler, seed, embed=model.embed, programs="new", draw=draw)
            if test is None:
                test = sp.test; y = np.array([p.seconds for p in test]); base_test = pred(base, test)
            mape = lambda pr: float(np.mean(np.abs(pr - y) / y))
            shots = list(sp.shots)
            known = {p.record_id for p in test + shots}
            dev = [p for p in splits._programs(ds) if p.device == target and p.record_id not in known]
            y_dev = np.array([p.seconds for p in dev])
            mape_dev = lambda pr: float(np.mean(np.abs(pr - y_dev) / y_dev))
            steps = finetune_steps(len(shots), cfg.batch_size)
            fold_of = np.random.default_rng(len(shots)).permutation(len(shots)) % 4
            held = {r: np.empty(len(shots)) for r in ROUNDS}
            for f in range(4):
                idx = np.flatnonzero(fold_of == f)
                for r, m in variants(model, base, cfg, [s for i, s in enumerate(shots) if fold_of[i] != f], steps).items():
                    held[r][idx] = pred(m, [shots[i] for i in idx])
            adapted = variants(model, base, cfg, shots, steps)
            row = dict(seed=seed, sampler=sampler, draw=draw, k=len(shots), steps=steps, mape_none=mape(base_test),
                       mape={r: mape(pred(m, test)) for r, m in adapted.items()}, n_dev=len(dev),
                       dev_mape_none=mape_dev(pred(base, dev)), dev_mape={r: mape_dev(pred(m, dev)) for r, m in adapted.items()},
                       shots_seconds=[s.seconds for s in shots], shots_unadapted=pred(base, shots).tolist(),
                       shots_fold4={r: v.tolist() for r, v in held.items()})
            with open(out_path, "a") as f:
                f.write(json.dumps(row) + "\n")
            print(f"seed {seed} {sampler} draw {draw}: test | dev: none {100 * row['mape_none']:.1f} | {100 * row['dev_mape_none']:.1f}, "
                  + ", ".join(f"GBT {r}: {100 * row['mape'][r]:.1f} | {100 * row['dev_mape'][r]:.1f}" for r in ROUNDS)
                  + f" ({time.time() - t0:.0f} s)", flush=True)
