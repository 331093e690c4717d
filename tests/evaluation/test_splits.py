"""Leak-free splits and k-shot selection on real programs."""

from __future__ import annotations

import math

import pytest

from cdmpp.evaluation import splits
from tests.data import FAKE_DEVICE


def _ids(programs):
    return {p.record_id for p in programs}


def test_random_split_is_disjoint_deterministic_and_complete(real):
    real = real[1]
    a, b = splits.random_split(real, seed=0), splits.random_split(real, seed=0)
    assert _ids(a.test) == _ids(b.test) and _ids(a.val) == _ids(b.val)
    assert set(a.overlaps().values()) == {0}
    assert _ids(a.train) | _ids(a.val) | _ids(a.test) == _ids(real.programs)
    assert len(a.test) == pytest.approx(0.2 * len(real), abs=3)
    assert _ids(splits.random_split(real, seed=1).test) != _ids(a.test)


def test_train_fraction_shrinks_only_training(real):
    full = splits.random_split(real[1], seed=0)
    half = splits.subsample_train(splits.random_split(real[1], seed=0), 0.5)
    assert _ids(half.train) < _ids(full.train)
    assert len(half.train) == round(0.5 * len(full.train)) and half.info["n_train"] == len(half.train)
    assert _ids(half.test) == _ids(full.test) and _ids(half.val) == _ids(full.val)
    again = splits.subsample_train(splits.random_split(real[1], seed=0), 0.5)
    assert _ids(again.train) == _ids(half.train)
    with pytest.raises(ValueError, match="train fraction"):
        splits.subsample_train(full, 0)


def test_cross_model_split_keeps_held_out_tasks_out_of_training(real, held):
    real = real[1]
    sp = splits.cross_model_split(real, held)
    nets = lambda p: {o.split("@")[0] for o in p.networks}  # noqa: E731
    test_tasks = {p.task for p in sp.test}
    assert sp.test and sp.train and sp.val
    assert not test_tasks & {p.task for p in sp.train + sp.val}  # no test task in train or val
    assert not {p.task for p in sp.train} & {p.task for p in sp.val}  # val is carved by task
    assert all(nets(p) & set(held) for p in sp.test)
    assert all(not nets(p) & set(held) for p in sp.train + sp.val)
    pool_hashes = {u.features.program_hash for u in sp.target_pool}
    assert sp.target_pool and not pool_hashes & {p.features.program_hash for p in sp.test}  # DA pool is never tested
    assert len(_ids(sp.train) | _ids(sp.val) | _ids(sp.test)) + len(sp.target_pool) == len(real.programs)
    assert all(math.isnan(u.seconds) for u in sp.target_pool)


@pytest.mark.parametrize("sampler", ["kmeans", "random"])
def test_cross_device_k_shot_picks_k_distinct_programs_excluded_from_test(two_devices, sampler):
    pool = [p for p in two_devices.programs if p.device == FAKE_DEVICE]
    sp = splits.cross_device_split(two_devices, FAKE_DEVICE, k=8, sampler=sampler)
    assert len(sp.shots) == 8 and len(_ids(sp.shots)) == 8
    assert all(p.device == FAKE_DEVICE for p in sp.shots + sp.test)
    assert not _ids(sp.shots) & _ids(sp.test)
    test_hashes = {p.features.program_hash for p in sp.test}
    assert not test_hashes & {u.features.program_hash for u in sp.target_pool}  # DA pool: never a test program
    assert not test_hashes & {p.features.program_hash for p in sp.train + sp.val}  # "new": no twin in training
    assert all(p.device != FAKE_DEVICE for p in sp.train + sp.val)
    assert set(sp.overlaps().values()) == {0}
    zero = splits.cross_device_split(two_devices, FAKE_DEVICE, k=0)
    assert not zero.shots and _ids(zero.test) == _ids(sp.test)  # the test half depends on the seed only
    again = splits.cross_device_split(two_devices, FAKE_DEVICE, k=8, sampler=sampler)
    assert _ids(again.shots) == _ids(sp.shots)
    other = splits.cross_device_split(two_devices, FAKE_DEVICE, k=8, sampler=sampler, draw=7)
    assert _ids(other.test) == _ids(sp.test) and _ids(other.shots) != _ids(sp.shots)  # another draw: other shots only
    seen = splits.cross_device_split(two_devices, FAKE_DEVICE, k=0, programs="seen")
    assert all(seen.twins[p.features.program_hash] > 0 for p in seen.test)
    assert _ids(seen.test) <= _ids(sp.test)


def test_other_devices_join_training_but_never_what_is_scored(two_devices, held):
    """Trained also on other devices (experiments/cross_model_devices.py): another device's programs train only
    where they share no program with validation, test or the DA pool, and across models no task with them."""
    pinned = [p for p in two_devices.programs if p.device != FAKE_DEVICE]
    others = [p for p in two_devices.programs if p.device == FAKE_DEVICE]
    hashes = lambda part: {p.features.program_hash for p in part}  # noqa: E731
    for sp in (splits.cross_model_split(pinned, held), splits.random_split(pinned, seed=0)):
        wide = splits.with_other_devices(sp, others, held if sp.kind == "cross-model" else ())
        added = wide.train[len(sp.train):]
        assert added and all(p.device == FAKE_DEVICE for p in added) and wide.info["n_train"] == len(wide.train)
        assert _ids(wide.val) == _ids(sp.val) and _ids(wide.test) == _ids(sp.test)
        assert not hashes(added) & (hashes(sp.val) | hashes(sp.test) | hashes(sp.target_pool))
        if sp.kind == "cross-model":
            assert not {p.task for p in added} & {p.task for p in sp.val + sp.test}
        # every other-device program left out is a twin of something scored or, across models, of a scored task
        kept = _ids(added)
        left = [p for p in others if p.record_id not in kept]
        scored_tasks = {p.task for p in sp.val + sp.test} if sp.kind == "cross-model" else set()
        assert all(p.features.program_hash in hashes(sp.val) | hashes(sp.test) | hashes(sp.target_pool)
                   or p.task in scored_tasks for p in left)


def test_random_split_keeps_twins_on_one_side(two_devices):
    sp = splits.random_split(two_devices, seed=0)
    side = lambda part: {p.features.program_hash for p in part}  # noqa: E731
    assert not side(sp.train) & side(sp.test) and not side(sp.val) & side(sp.test) and not side(sp.train) & side(sp.val)


def test_random_split_by_task_holds_out_whole_tasks(real):
    """``by="task"``: validation (what ``cdmpp train`` selects on) holds only tasks training never saw."""
    real = real[1]
    sp = splits.random_split(real, seed=0, val=0.3, test=0.0, by="task")
    tasks = lambda part: {p.task for p in part}  # noqa: E731
    assert sp.val and sp.train and not tasks(sp.train) & tasks(sp.val)
    assert _ids(sp.train) | _ids(sp.val) == _ids(real.programs)
    with pytest.raises(ValueError, match="by = 'device'"):
        splits.random_split(real, by="device")


def test_paper_split_filters_then_cuts_every_task_at_random(real):
    from collections import Counter

    from cdmpp.evaluation.protocol import steady_records

    folder, ds = real
    steady = steady_records(str(folder), sorted({p.device for p in ds.programs}))
    assert 0 < len(steady & _ids(ds.programs)) < len(ds)  # some repeats spread more than 1 %
    a, b = splits.paper_split(ds, 0, steady, min_programs=6), splits.paper_split(ds, 0, steady, min_programs=6)
    assert _ids(a.test) == _ids(b.test) and set(a.overlaps().values()) == {0}
    kept = _ids(a.train) | _ids(a.val) | _ids(a.test)
    assert kept <= steady  # only programs whose repeats agree
    sizes = Counter(p.task for p in ds.programs if p.record_id in steady)
    assert {p.task for p in a.train} == {t for t, n in sizes.items() if n >= 6}  # every kept task, all in training
    assert {p.task for p in a.test} <= {p.task for p in a.train}  # a within-task split: no new tasks
    five = splits.paper_split(ds, 0, None, five_leaf=True, min_programs=1)
    assert {p.features.n_leaves for p in five.train + five.val + five.test} == {5}
    with pytest.raises(ValueError, match="no task has 10000 programs"):
        splits.paper_split(ds, 0, steady, min_programs=10000)
    assert splits.repeat_spread([1.0, 1.5, 1.005, 1.01]) == pytest.approx(0.01)
    assert splits.repeat_spread([2.0, 2.1]) is None
