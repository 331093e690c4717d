"""The feature store: real featurized programs written to .npy columns and read memory-mapped train as the
same programs in memory do."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from cdmpp.model.feature_store import FeatureStore, replicate_store, write_store
from cdmpp.model.network import PackedPrograms, bucketed_batches
from cdmpp.model.training import TrainConfig, fit
from cdmpp.model.transforms import FeatureNormalizer
from tests.data import DEVICES_JSON


def _tiny(**kw) -> TrainConfig:
    """The shipped recipe, small, without the parts that read every program at once (GBT blend, anchors)."""
    return TrainConfig.recipe("default").replace(d_model=32, d_ff=64, n_layers=1, epochs=3, ensemble=1, batch_size=32,
                                                 lr_cycle_epochs=2, gbt_blend=False, amdahl_transfer=False,
                                                 progress=False, **kw)


def _table():
    from cdmpp.devices.table import DeviceTable

    return DeviceTable(str(DEVICES_JSON)).spec_table()


def test_a_store_holds_what_the_in_memory_pack_holds(real, tmp_path):
    _, ds = real
    programs = ds.programs[:150]
    store = write_store(tmp_path / "s", programs, chunk=64)  # several chunks
    assert isinstance(store.leaves, np.memmap) and len(store) == 150
    mem = PackedPrograms.from_programs([p.features for p in programs])
    disk = FeatureStore(tmp_path / "s").pack()
    for name in ("leaves", "positions", "offsets", "stats"):
        assert np.array_equal(getattr(mem, name), getattr(disk, name)), name
    assert store.device_names() == [p.device for p in programs]
    assert np.array_equal(store.seconds, [p.seconds for p in programs])
    norm = FeatureNormalizer().fit(mem.leaves)
    half = len(mem.leaves) // 2
    chunked = FeatureNormalizer().fit_chunks(lambda: iter([mem.leaves[:half], mem.leaves[half:]]))
    assert np.allclose(norm.center_, chunked.center_, rtol=1e-6, atol=1e-6)
    assert np.allclose(norm.inv_scale_, chunked.inv_scale_, rtol=1e-5)
    eager, lazy = mem.with_leaves(norm.transform(mem.leaves)), disk.with_transform(norm.transform)
    for idx in bucketed_batches(mem.lengths, 32, np.random.default_rng(0)):
        for a, b in zip(eager.batch(idx), lazy.batch(idx)):
            assert torch.equal(a, b)


def test_training_from_a_store_gives_the_in_memory_result(real, tmp_path):
    """Same batches, same normalizer (one chunk computes what ``fit`` does), same steps: the same predictions."""
    _, ds = real
    train, val = ds.programs[:192], ds.programs[192:240]
    table = _table()
    config = _tiny()
    in_memory = fit(config, train, val, device_table=table)
    from_store = fit(config, write_store(tmp_path / "s", train), val, device_table=table)
    feats, devs = [p.features for p in val], [p.device for p in val]
    assert np.array_equal(in_memory.predict_z(feats, devs), from_store.predict_z(feats, devs))
    assert in_memory.summary["members"][0]["history"] == from_store.summary["members"][0]["history"]


def test_a_store_refuses_recipes_that_read_every_program(real, tmp_path):
    _, ds = real
    store = write_store(tmp_path / "s", ds.programs[:40])
    with pytest.raises(ValueError, match="gbt_blend"):
        fit(dataclasses.replace(_tiny(), gbt_blend=True), store, ds.programs[40:60], device_table=_table())
    with pytest.raises(ValueError, match="validation set"):
        fit(_tiny(), store, None, device_table=_table())


def test_a_replicated_store_repeats_the_programs(real, tmp_path):
    _, ds = real
    src = write_store(tmp_path / "s", ds.programs[:30])
    big = replicate_store(src, tmp_path / "big", 75)  # two copies and half of one
    assert len(big) == 75 and big.meta["replicated_from"] == str(src.path)
    a, b = src.pack(), big.pack()
    assert np.array_equal(b.lengths, np.concatenate([a.lengths, a.lengths, a.lengths[:15]]))
    assert np.array_equal(b.leaves[b.offsets[60]:b.offsets[75]], a.leaves[:a.offsets[15]])
    assert np.array_equal(big.seconds, np.concatenate([src.seconds] * 2 + [src.seconds[:15]]))
