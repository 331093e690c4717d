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
