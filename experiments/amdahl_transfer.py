"""The Amdahl transfer on the protocol's cross-device source models of seeds 0-2 (saved by
benchmarks/finetune_steps_model.py SEED; trained on 2 threads only), paired on the same model: MAPE and median
APE on the new test programs of the 1-thread target with the model's own prediction for the target, its
2-thread prediction as is, moved by Amdahl's law (``TrainedModel.anchors`` filled from the source training
programs) and moved by the ratio of roofline bounds; then, for each k given (e.g. ``16,64,5%``) and each
sampler given (default ``kmeans,random``), through the transfer: no fine-tune against a fine-tune on the
shots (moved to the source device), MAPE on the test programs and on the target's other programs (the pool
less the shots: a development set that is not the test; reports/study-issue19.md, round 25)."""
import sys, time
import numpy as np, torch
from cdmpp.devices.table import DeviceTable
from cdmpp.evaluation import protocol as P, splits
from cdmpp.evaluation.methods.twin_ratio import TwinRoofline
from cdmpp.model.checkpoint import TrainedModel
from cdmpp.model.physics import fork_join_by_device
from cdmpp.model.training import TrainConfig, _with_devices, finetune, finetune_steps

torch.set_num_threads(2)
ks = sys.argv[1].split(",") if len(sys.argv) > 1 else []
samplers = sys.argv[2].split(",") if len(sys.argv) > 2 else ["kmeans", "random"]
opts = P.ProtocolOptions(); ds = P.load_pinned(opts); target = opts.target_device
table = DeviceTable(opts.devices).spec_table()
for seed in (0, 1, 2):
    model = _with_devices(TrainedModel.load(f"runs/models/xd-seed{seed}"), table); cfg = TrainConfig.from_dict(model.config)
    sp = splits.cross_device_split(ds, target, 0, seed=seed, programs="new")
    src = sp.info["source_devices"][0]
    test = sp.test; y = np.array([p.seconds for p in test]); feats = [p.features for p in test]
    ape = lambda pr: np.abs(pr - y) / y
    anchors = fork_join_by_device(sp.train, table)
    rows = {"own target prediction": model.predict(feats, target)[0], "2-thread prediction": model.predict(feats, src)[0]}
    rows["roofline ratio"] = TwinRoofline({f.program_hash: s for f, s in zip(feats, rows["2-thread prediction"])},
                                          table[src], table[target]).predict(test)
    model.anchors = anchors
    rows["Amdahl transfer"] = model.predict(feats, target)[0]
    for name, pr in rows.items():
        print(f"seed {seed} k=0 {name}: MAPE {ape(pr).mean():.4f}, median APE {np.median(ape(pr)):.4f}", flush=True)
    for k_name in ks:
        k = P._k_value(k_name, sp.info["n_target"])
        for sampler in samplers:
            t = time.time()
            shots = list(splits.cross_device_split(ds, target, k, sampler, seed, embed=model.embed, programs="new").shots)
            known = {p.record_id for p in test + shots}
            dev = [p for p in splits._programs(ds) if p.device == target and p.record_id not in known]
            y_dev = np.array([p.seconds for p in dev]); f_dev = [p.features for p in dev]
            dev_mape = lambda pr: float(np.mean(np.abs(pr - y_dev) / y_dev))
            tuned = finetune(model, shots, cfg, finetune_steps(len(shots), cfg.batch_size), device_table=table)
            none_dev = dev_mape(model.predict(f_dev, target)[0])
            print(f"seed {seed} k={k_name} {sampler}, through the transfer: test MAPE none {ape(rows['Amdahl transfer']).mean():.4f}, "
                  f"fine-tuned {ape(tuned.predict(feats, target)[0]).mean():.4f}; dev MAPE none {none_dev:.4f}, "
                  f"fine-tuned {dev_mape(tuned.predict(f_dev, target)[0]):.4f} ({time.time() - t:.0f} s)", flush=True)
