"""Later passes: which labels get one, and when a pass counts as stable."""

def test_stability_of_a_pass_and_which_labels_get_a_later_pass():
    from cdmpp.measure.measurer import MeasureConfig
    from cdmpp.measure.remeasure import _drawn
    from cdmpp.measure.results import is_stable

    cfg = MeasureConfig()  # at least 5 repeats, 1 %, 3 repeats of patience
    assert is_stable([1.0, 0.9, 0.91, 0.9, 0.905], cfg) is True
    assert is_stable([1.0, 0.99, 0.98, 0.97, 0.9], cfg) is False  # still improving when it stopped
    assert is_stable([0.5, 0.5], cfg) is None  # a slow program's few repeats
    assert is_stable([0.05, 0.051, 0.0502], cfg) is True  # one call per repeat: 3 repeats, patience 2
    assert is_stable([0.05, 0.051, 0.045], cfg) is False
    ids = [f"d|t|{i}" for i in range(2000)]
    drawn = [i for i in ids if _drawn(i, 0.05, 0)]
    assert 50 < len(drawn) < 150 and drawn == [i for i in ids if _drawn(i, 0.05, 0)]
    assert not any(_drawn(i, 0.0, 0) for i in ids)


def test_implausible_twins_are_pairs_no_thread_count_explains(tmp_path):
    """1 vs 2 threads: a 2x speedup, a slowdown of tiny kernels (fork/join) and a 2.4x speedup are
    physics; a long kernel 3x slower on 2 threads, or 4x faster, is a label to check."""
    from types import SimpleNamespace

    import pytest

    from cdmpp.measure.remeasure import implausible_twins
    from cdmpp.records.store import RecordStore

    one, two = SimpleNamespace(id="cpu-1t/llvm", threads=1), SimpleNamespace(id="cpu-2t/llvm", threads=2)
    pairs = {"ok": (1e-3, 5e-4), "tiny": (2e-6, 1e-5), "cache": (1e-3, 4.2e-4), "slow": (68e-3, 0.2),
             "superlinear": (1e-2, 2.5e-3), "alone": (1e-3, None)}
    store = RecordStore(str(tmp_path))
    for dev, i in ((one, 0), (two, 1)):
        store.append(dev.id, [{"id": f"{dev.id}|{h}", "device": dev.id, "task": "t", "program_hash": h,
                               "seconds": [t[i]], "error": None} for h, t in pairs.items() if t[i] is not None])
    assert implausible_twins(str(tmp_path), two, one) == {"slow", "superlinear"}
    assert implausible_twins(str(tmp_path), one, two) == {"slow", "superlinear"}
    with pytest.raises(ValueError, match="same number of threads"):
        implausible_twins(str(tmp_path), one, one)
