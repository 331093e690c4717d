"""Does ``ShotChoice``'s cross-validation on the shots overrate corrections when the shots are programs the
model trained on elsewhere (their twins on the source device) and the test programs are not? On the
development seeds of the cross-device settings (2 -> 1 thread), every candidate's cross-validated MAPE on
the shots beside its MAPE on the test, and the choice of each rule tried.

    .venv/bin/python experiments/shot_choice_seen.py train 0      # -> runs/shot-choice/cd-0.pkl (~4 min)
    .venv/bin/python experiments/shot_choice_seen.py study runs/shot-choice/cd-*.pkl   # -> study.pkl (~6 min)
    .venv/bin/python experiments/shot_choice_seen.py table        # the table of reports/shot-choice-level.md

``train`` fits cdmpp on the seed's source split as ``cdmpp protocol --settings cross-device-new`` does and
keeps its (seconds, lo90, hi90, order) of every target program and the shots of each k and sampler;
``study`` refits ``ShotChoice`` on those shots without and with ``base_bias`` (the base's median log error on
the source's validation programs) and scores each choice on the test, no retraining.
"""

import os
import pickle
import sys

import numpy as np

KS = ("1%", "5%", "16", "64")
SAMPLERS = ("kmeans", "random")


def train(seed: int) -> str:
    import torch

    from cdmpp.devices.table import DeviceTable
    from cdmpp.evaluation import splits
    from cdmpp.evaluation.methods import registry
    from cdmpp.evaluation.methods.derived import Memo
    from cdmpp.evaluation.protocol import ProtocolOptions, _k_value, load_pinned, recipe_config

    opts = ProtocolOptions(threads=2)
    torch.set_num_threads(2)
    ds = load_pinned(opts)
    table = DeviceTable(opts.devices).spec_table()
    base = splits.cross_device_split(ds, opts.target_device, 0, seed=seed, programs="new")
    config = recipe_config("ablation-no-counts", seed=seed, progress=True)
    context = registry.Context(seed, table, 2, config, base.target_pool)
    model = context.one("cdmpp").fit(base.train, base.val)
    memo = Memo(model)
    target = [p for p in base.test] + list(base.target_pool)
    memo.predict_interval_and_order(target)
    val_seconds = memo.predict(base.val)  # the source's validation programs: the base's bias on new programs
    val_log_bias = float(np.median(np.log(val_seconds / np.array([p.seconds for p in base.val]))))
    shots = {}
    for k_name in KS:
        k = _k_value(k_name, base.info["n_target"])
        for sampler in SAMPLERS:
            for programs in ("new", "seen"):
                sp = splits.cross_device_split(ds, opts.target_device, k, sampler, seed, embed=model.embed,
                                               programs=programs)
                shots[(k_name, sampler, programs)] = [p.features.program_hash for p in sp.shots]
    os.makedirs("runs/shot-choice", exist_ok=True)
    path = f"runs/shot-choice/cd-{seed}.pkl"
    with open(path, "wb") as f:
        pickle.dump(dict(seed=seed, seen=memo.seen, shots=shots, val_log_bias=val_log_bias), f)
    return path


class _Frozen:
    """A base prediction read from the kept (seconds, lo, hi, order) of each (device, hash)."""

    def __init__(self, seen: dict, column: int = 0):
        self.seen, self.column = seen, column

    def __call__(self, programs):
        return np.array([self.seen[(p.device, p.features.program_hash)][self.column] for p in programs])


def _forced(choice, candidate, shots):
    """``choice`` (fitted) refitted to apply ``candidate`` whatever cross-validation said."""
    import copy

    forced = copy.copy(choice)
    forced.choice_ = candidate
    y = np.log([p.seconds for p in shots])
    forced._fit_final(shots, y, np.zeros(len(shots)), forced._log_base(shots))
    return forced


def study(paths) -> None:
    """Per run (seed, setting, k, sampler): the choice and its test MAPE without and with ``base_bias`` (the
    base's median log error on its validation programs), every candidate's CV and test MAPE beside."""
    from cdmpp.evaluation import splits
    from cdmpp.evaluation.protocol import ProtocolOptions, load_pinned
    from cdmpp.model.shots import Candidate, ShotChoice

    from cdmpp.model import shots as shots_module

    features, cache = shots_module.pooled_features, {}

    def cached(programs):  # the test's pooled features once, not once per candidate
        key = (len(programs), id(programs[0]), id(programs[-1])) if len(programs) else ()
        if key not in cache:
            cache[key] = features(programs)
        return cache[key]

    shots_module.pooled_features = cached
    opts = ProtocolOptions()
    ds = load_pinned(opts)
    by_hash = {p.features.program_hash: p for p in splits._programs(ds) if p.device == opts.target_device}
    rows = []
    for path in paths:
        with open(path, "rb") as f:
            kept = pickle.load(f)
        seed, base = kept["seed"], _Frozen(kept["seen"])
        for programs in ("new", "seen"):
            test = splits.cross_device_split(ds, opts.target_device, 0, seed=seed, programs=programs).test
            base_test, y_test = base(test), np.array([p.seconds for p in test])
            for k_name in KS:
                for sampler in SAMPLERS:
                    shots = [by_hash[h] for h in kept["shots"][(k_name, sampler, programs)]]
                    for rule, bias in (("as is", 0.0), ("base bias", kept["val_log_bias"])):
                        choice = ShotChoice(base, seed=seed, nthread=2, base_bias=bias).fit(shots)
                        every = {}
                        for c in {choice.choice_, Candidate("base")}:
                            pred = _forced(choice, c, shots).predict(test, base_seconds=base_test)
                            ape = np.abs(pred / y_test - 1)
                            every[c] = (choice.cv_.get(c, float("nan")), float(ape.mean()), float(np.median(ape)),
                                        float(np.median(np.log(pred / y_test))))
                        rows.append(dict(seed=seed, programs=programs, k=k_name, sampler=sampler, rule=rule, bias=bias,
                                         chosen=choice.choice_, every=every))
                        chosen = every[choice.choice_]
                        print(f"{seed} {programs:4s} {k_name:>3s} {sampler:6s} {rule:9s} bias {bias:+.3f}: "
                              f"{str(tuple(choice.choice_)):22s} test {100 * chosen[1]:5.1f} "
                              f"(base {100 * every[Candidate('base')][1]:5.1f}, cv {100 * chosen[0]:5.1f}, "
                              f"log bias {chosen[3]:+.3f})", flush=True)
    with open("runs/shot-choice/study.pkl", "wb") as f:
        pickle.dump(rows, f)


def table(path: str = "runs/shot-choice/study.pkl") -> None:
    """The report's table: mean test MAPE over seeds per setting, k and sampler, each rule's choice."""
    from collections import defaultdict

    with open(path, "rb") as f:
        rows = pickle.load(f)
    mape, taken = defaultdict(list), defaultdict(list)
    for r in rows:
        key = (r["programs"], r["k"], r["sampler"])
        mape[(r["rule"],) + key].append(r["every"][r["chosen"]][1])
        taken[(r["rule"],) + key].append(r["chosen"].kind != "base")
        if r["rule"] == "as is":
            mape[("base",) + key].append([v for c, v in r["every"].items() if c.kind == "base"][0][1])
    print("| setting | k | shots | base (no shots) | `ShotChoice` before | corrections taken | with `base_bias` "
          "| corrections taken |\n|---|---:|---|---:|---:|---:|---:|---:|")
    for key in sorted({k[1:] for k in mape}, key=lambda k: (k[0], KS.index(k[1]), k[2])):
        cells = [f"{100 * np.mean(mape[('base',) + key]):.1f} %"]
        for rule in ("as is", "base bias"):
            v = mape[(rule,) + key]
            cells += [f"{100 * np.mean(v):.1f} ± {100 * np.std(v):.1f} %", f"{sum(taken[(rule,) + key])}/{len(v)}"]
        print(f"| cross-device-{key[0]} | {key[1]} | {key[2]} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    if sys.argv[1] == "train":
        print(train(int(sys.argv[2])))
    elif sys.argv[1] == "study":
        study(sys.argv[2:])
    else:
        table(*sys.argv[2:])
