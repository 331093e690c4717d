"""Why Zen 3 is the hard held-out chip: the ISA of its code (issue 52; reports/leave-one-chip-out.md, "Zen 3 and
its ISA"). Part 1 moves measured twins' labels to Zen 3 (1 thread, AVX2) from Zen 4's 1-thread AVX-512 device
by the per-thread peak ratio (today's transfer) and, beside it, times each program's AVX2/AVX-512 label ratio
on Zen 4 at 2 threads (the chip that ran both ISAs): no model, labels only. Part 2 asks the same of the pooled
GBT of the leave-one-chip-out split (seed 0): today's spec transfer vs the same times the GBT's own predicted
AVX2/AVX-512 ratio. ``--levels``: a chip's level instead, Zen 4 1-thread labels moved to each other 1-thread chip
(``CHIPS``) by one constant (the measured median ratio, the per-thread peak ratio, the bandwidth ratio, their
geometric mean; "Zen 5 held out" in the same report; and the ratio of 16 fixed programs, what a probe of a few
reference kernels would measure), and for each chip the spec rule the other chips' twins choose. ``--multi-thread``:
the 16-thread Xeon from Zen 4 at 2 threads, Amdahl's law then each rule (needs its programs' features). ``--efficiency``: the same twins' ratio against each program's share of
Zen 4's peak (FLOP/s reached / probed peak), by quantile bin: does a fast program move by a different factor?
Run from the checkout: ``.venv/bin/python experiments/isa_transfer.py [--gbt | --levels | --multi-thread | --efficiency]``."""
import collections, dataclasses, json, sys
import numpy as np
from cdmpp import defaults
from cdmpp.devices.reference import kernel_hashes
from cdmpp.devices.table import DeviceTable
from cdmpp.model.physics import chip_ratio
from cdmpp.ranking import within_task_spearman
from cdmpp.records.labels import label
from cdmpp.records.store import RecordStore

A1, A2, B2, Z3 = ("amd-epyc-znver4-1t/llvm-avx512", "amd-epyc-znver4-2t/llvm-avx512", "amd-epyc-znver4-2t/llvm-avx2",
                  "amd-epyc-znver3-1t/llvm-avx2")
table = DeviceTable(defaults.DEVICES).spec_table()
CHIPS = ("amd-epyc-znver5-1t/llvm-avx512", Z3, "intel-xeon-rocketlake-1t/llvm-avx512")  # 1-thread devices of other chips


def show(name, y, p, tasks):
    ape = np.abs(p - y) / y
    print(f"{name:58s} MAPE {ape.mean() * 100:5.1f} %  capped {np.minimum(ape, 1).mean() * 100:5.1f} %  "
          f"Spearman {within_task_spearman(y, p, tasks):.3f}", flush=True)


store = RecordStore(defaults.DATASET)
lab, task = collections.defaultdict(dict), {}
for d in (A1, A2, B2, *CHIPS):
    for r in store.iter_records(d, traces=False):
        if (y := label(r)) is not None:
            lab[d][r["program_hash"]], task[r["program_hash"]] = y, r["task"]
if "--levels" in sys.argv:
    rules = ("per-thread peak ratio (today)", "bandwidth ratio", "geometric mean of the two")
    # the measured spec a probe takes: the reference kernels' level (cdmpp.devices.reference; the same 16 programs
    # this script drew at first: rng(0) among those every chip has), ``reference_s`` in the table; they are not scored
    kernels = kernel_hashes()
    mape = {}
    for d in CHIPS:
        hs = [h for h in lab[d] if h in lab[A1] and h not in kernels]
        x1, yd = np.array([lab[A1][h] for h in hs]), np.array([lab[d][h] for h in hs])
        peak, bw = chip_ratio(A1, d, table, reference=False), table[A1]["mem_bw_gbs"] / table[d]["mem_bw_gbs"]
        probe = chip_ratio(A1, d, table)
        for name, c in (("measured median ratio", np.median(yd / x1)), *zip(rules, (peak, bw, np.sqrt(peak * bw))),
                        ("reference kernels' ratio (reference_s)", probe)):
            mape[d, name] = np.mean(np.abs(x1 * c - yd) / yd)
            print(f"{d} from Zen 4 1t, {len(hs)} twins: {name:34s} {c:.3f}  MAPE {mape[d, name] * 100:5.1f} %")
    # the rule a held-out chip would get if it were chosen on the other chips' twins (lowest mean MAPE there)
    for d in CHIPS:
        rule = min(rules, key=lambda r: np.mean([mape[o, r] for o in CHIPS if o != d]))
        print(f"{d} held out: the others choose the {rule}: MAPE {mape[d, rule] * 100:.1f} % "
              f"(today's {mape[d, rules[0]] * 100:.1f} %)")
    sys.exit()
if "--multi-thread" in sys.argv:  # the 16-thread Xeon from Zen 4 2t: Amdahl's law first, then each rule
    from cdmpp.model import physics
    from cdmpp.records.dataset import load_dataset
    from cdmpp.zoo.tasks import TaskTable

    E = "intel-xeon-emeraldrapids-16t/llvm-avx512"
    ds = load_dataset(defaults.DATASET, TaskTable.load(defaults.TASK_TABLE), devices=[E], progress=False)
    ps = [p for p in ds.programs if p.features.program_hash in lab[A2]]
    y, x = np.array([p.seconds for p in ps]), np.array([lab[A2][p.features.program_hash] for p in ps])
    features = [p.features for p in ps]
    moved = physics.amdahl_seconds(x, features, 2, 16, physics.fork_join_seconds(x, features))
    peak = chip_ratio(A2, E, table, reference=False)
    bw = (table[A2]["mem_bw_gbs"] / table[A2]["cores"]) / (table[E]["mem_bw_gbs"] / table[E]["cores"])  # per thread
    for name, c in (("Amdahl's law alone", 1.0), ("per-thread peak ratio (today)", peak), ("bandwidth ratio, per thread", bw),
                    ("geometric mean of the two", np.sqrt(peak * bw)), ("measured median ratio", np.median(y / moved))):
        print(f"{E} from Zen 4 2t, {len(ps)} twins: {name:30s} {c:.3f}  MAPE {np.mean(np.abs(moved * c - y) / y) * 100:5.1f} %")
    sys.exit()
if "--efficiency" in sys.argv:
    from cdmpp.records.dataset import FeatureCache

    cache = FeatureCache(defaults.cache_dir(defaults.DATASET))
    for d in CHIPS:
        hs = [h for h in lab[d] if h in lab[A1] and cache.get(h) is not None and cache.get(h).flops > 0]
        x1, yd = np.array([lab[A1][h] for h in hs]), np.array([lab[d][h] for h in hs])
        share = np.array([cache.get(h).flops for h in hs]) / x1 / (table[A1]["peak_gflops"] * 1e9)
        print(f"{d} from Zen 4 1t, {len(hs)} twins (per-thread peak ratio {chip_ratio(A1, d, table, reference=False):.3f}):")
        edges = np.quantile(share, [0, .1, .25, .5, .75, .9, .97, 1])
        for lo, hi in zip(edges[:-1], edges[1:]):
            r = (yd / x1)[(share >= lo) & (share <= hi)]
            print(f"  share of peak {lo:.3f}-{hi:.3f}: {len(r):5d} twins, ratio median {np.median(r):.3f} "
                  f"(quartiles {np.quantile(r, .25):.3f}-{np.quantile(r, .75):.3f})")
    sys.exit()
both = [h for h in lab[B2] if all(h in lab[d] for d in (A1, A2, Z3))]
x = lambda d: np.array([lab[d][h] for h in both])
y, tasks = x(Z3), [task[h] for h in both]
print(f"part 1: {len(both)} programs labelled on all four devices")
show("Zen 4 1t AVX-512 label x peak ratio (today's transfer)", y, x(A1) * chip_ratio(A1, Z3, table, reference=False), tasks)
show("  x its AVX2/AVX-512 ratio on Zen 4 2t", y, x(A1) * x(B2) / x(A2) * chip_ratio(B2, Z3, table, reference=False), tasks)
show("  x the median AVX2/AVX-512 ratio (a constant)", y,
     x(A1) * np.median(x(B2) / x(A2)) * chip_ratio(B2, Z3, table, reference=False), tasks)

if "--gbt" in sys.argv:
    from cdmpp.evaluation import metrics, splits
    from cdmpp.evaluation.methods.twin_ratio import AmdahlTransfer
    from cdmpp.model import physics
    from cdmpp.model.pooled_gbt import PooledGBT
    from cdmpp.records.dataset import load_dataset
    from cdmpp.zoo.tasks import TaskTable

    ds = load_dataset(defaults.DATASET, TaskTable.load(defaults.TASK_TABLE), progress=False)
    base = splits.leave_one_chip_out_split(ds, "amd-epyc-znver3", table, 0, seed=0)
    gbt = PooledGBT(table, nthread=2, random_state=0).fit(base.train, base.val)
    fork_join = physics.fork_join_by_device(base.train, table)
    today = AmdahlTransfer(gbt, fork_join, table).predict(base.test)
    on = lambda d: [dataclasses.replace(p, device=d) for p in base.test]
    ratio = gbt.predict(on(B2)) / gbt.predict(on(A2))
    anchor = physics.anchor_device(Z3, list(fork_join), table)
    moved = today * ratio * chip_ratio(B2, Z3, table, reference=False) / chip_ratio(anchor, Z3, table, reference=False)
    print(f"part 2: {len(base.test)} test programs, {sum(p.device == B2 for p in base.train)} AVX2 Zen 4 programs in training")
    for name, p in (("pooled GBT, spec transfer (anchor " + anchor + ")", today), ("  x its own AVX2/AVX-512 ratio", moved)):
        s = metrics.score(base.test, p)
        print(name, json.dumps({k: round(s[k], 4) for k in ("mape", "mape_capped", "mape_fast10", "spearman")}))
