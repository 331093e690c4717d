"""Label agreement of single-pass collections: two ``--dataset`` folders of ``cdmpp bench collect`` (same
seed, so the same programs) against each other, and each against the stored labels of the programs that
are also in the dataset (fastest repeat over their passes), |new - old| / old, median / p90 (signed median).

    python benchmarks/compare_passes.py /tmp/qb1 /tmp/qb2 [--stored datasets/measurements]
"""
import argparse
import statistics
import sys


def spread(pairs):
    d = sorted(abs(a - b) / b for a, b in pairs)
    s = [(a - b) / b for a, b in pairs]
    if not d:
        return "no pairs"
    return (f"{len(d)} programs: {100 * statistics.median(d):.1f} % / {100 * d[int(0.9 * (len(d) - 1))]:.1f} %"
            f" (signed {100 * statistics.median(s):+.1f} %)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dirs", nargs="+")
    ap.add_argument("--stored", default="datasets/measurements")
    a = ap.parse_args()
    from cdmpp.records.labels import label
    from cdmpp.records.store import RecordStore

    runs = [{r["id"]: label(r) for r in RecordStore(d).iter_records() if label(r)} for d in a.dirs]
    ids = set().union(*runs)
    stored = {r["id"]: label(r) for r in RecordStore(a.stored).iter_records() if r["id"] in ids and label(r)}
    for i, (d, labels) in enumerate(zip(a.dirs, runs)):
        print(f"{d} against the stored labels:", spread([(v, stored[k]) for k, v in labels.items() if k in stored]))
        for d2, l2 in list(zip(a.dirs, runs))[i + 1:]:
            print(f"{d2} against {d}:", spread([(v, labels[k]) for k, v in l2.items() if k in labels]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
