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
    """The shipped recipe, small; without the GBT blend and the anchors unless ``kw`` turns them on."""
    return TrainConfig.recipe("default").replace(d_model=32, d_ff=64, n_layers=1, epochs=3, ensemble=1, batch_size=32,
                                                 lr_cycle_epochs=2,
                                                 progress=False, **{"gbt_blend": False, "amdahl_transfer": False, **kw})


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


@pytest.mark.parametrize("copies", [False, True])
def test_counts_withheld_from_a_store_are_those_withheld_in_memory(real, tmp_path, copies):
    """``assembly_withheld`` from a store: the same programs stand unbuilt as in memory (one seeded draw), their
    stats as a failed build's, the store on disk untouched, and the model the same, whether those programs lose
    their counts or are trained on twice, with and without them (``assembly_unbuilt_copies``; the GBT blend on)."""
    from cdmpp.model.network import N_ROOFLINE_STATS, assembly_stats
    from cdmpp.model.training import withheld_share
    from cdmpp.program.assembly import N_COUNTS

    _, ds = real
    rng = np.random.default_rng(3)  # SYNTHETIC: instruction counts standing in for the programs' builds
    programs = [dataclasses.replace(p, features=dataclasses.replace(p.features, asm=rng.integers(1, 500, N_COUNTS)
                                                                    .astype(np.float64))) for p in ds.programs[:240]]
    train, val = programs[:192], programs[192:]
    store = write_store(tmp_path / "s", train)
    drop = withheld_share(len(train), 0.25, seed=0)
    view = store.without_counts(drop)
    assert np.all(view.stats[drop, N_ROOFLINE_STATS:] == assembly_stats([None]))
    assert np.array_equal(view.stats[~drop], store.stats[~drop]) and store.stats[drop, -1].all()
    config = _tiny(assembly_counts=True, assembly_withheld=0.25, assembly_unbuilt_copies=copies, gbt_blend=True,
                   gbt_max_trees=20)
    table = _table()
    in_memory, from_store = fit(config, train, val, device_table=table), fit(config, store, val, device_table=table)
    feats, devs = [p.features for p in val], [p.device for p in val]
    assert np.array_equal(in_memory.predict_z(feats, devs), from_store.predict_z(feats, devs))
    assert np.allclose(in_memory.gbt.predict(val), from_store.gbt.predict(val), rtol=1e-5)


def test_the_shipped_recipe_trains_from_a_store_as_in_memory(real, tmp_path, monkeypatch):
    """GBT blend and Amdahl anchors on: the store's chunks (several, forced small) give the pooled GBT the inputs
    the programs give it in memory, the anchors the same fork/join costs, and the model the same predictions;
    tensor-core programs' labels are learned as FP32-equivalent time from either."""
    from cdmpp.model import feature_store
    from cdmpp.model.pooled_gbt import PooledGBT

    _, ds = real
    two, v100 = "amd-epyc-znver4-2t/llvm-avx512", "nvidia-v100/cuda-sm70"  # 2-thread twins: a fork/join cost to find

    def tensor_core(p):  # SYNTHETIC: a CPU program's features standing in for a V100 program, half its FLOPs on tensor cores
        return dataclasses.replace(p, device=v100, features=dataclasses.replace(p.features, tensor_flops=p.features.flops / 2))

    train = [tensor_core(p) if i % 6 == 5 else dataclasses.replace(p, device=two, seconds=0.6 * p.seconds) if i % 2 else p
             for i, p in enumerate(ds.programs[:192])]
    assert sum((p.features.tensor_flops or 0) > 0 for p in train) >= 20  # those with FLOPs of the 32
    val = ds.programs[192:240]
    table = _table()
    monkeypatch.setattr(feature_store, "CHUNK_ROWS", 100)
    store = write_store(tmp_path / "s", train, chunk=50)
    gbt = PooledGBT(table, target="latency")
    chunks = list(gbt.store_inputs(store))
    assert len(chunks) > 3
    assert np.array_equal(np.concatenate([x for x, _ in chunks]), gbt.inputs(train))
    assert np.array_equal(np.concatenate([y for _, y in chunks]), gbt._target(train))
    config = _tiny(gbt_blend=True, amdahl_transfer=True, gbt_max_trees=60)
    in_memory = fit(config, train, val, device_table=table)
    from_store = fit(config, store, val, device_table=table)
    assert in_memory.anchors == from_store.anchors and any(v > 0 for v in in_memory.anchors.values())
    assert from_store.gbt.booster_.num_boosted_rounds() == in_memory.gbt.booster_.num_boosted_rounds()
    feats, devs = [p.features for p in val], [p.device for p in val]
    assert np.allclose(in_memory.gbt.predict(val), from_store.gbt.predict(val), rtol=1e-6)
    for a, b in zip(in_memory.predict(feats, devs), from_store.predict(feats, devs)):
        assert np.allclose(a, b, rtol=1e-6)
    assert in_memory.calibration == pytest.approx(from_store.calibration, rel=1e-6)


def test_features_left_in_the_cache_read_back_as_cached(real, tmp_path):
    """``FeatureCache(on_disk=True)`` holds where each program's features are, not the features; ``read_cached``
    gives back the features the cache in memory gives, in the order asked, across cache chunks."""
    from cdmpp.records.dataset import CachedFeatures, FeatureCache, read_cached

    _, ds = real
    feats = list({p.features.program_hash: p.features for p in ds.programs}.values())[:60]
    cache = FeatureCache(str(tmp_path / "cache"))
    for part in (feats[:25], feats[25:]):  # two chunks
        for f in part:
            cache.put(f)
        cache.flush()
    on_disk = FeatureCache(str(tmp_path / "cache"), on_disk=True)
    refs = [on_disk.get(f.program_hash) for f in feats[::-1]]
    assert all(isinstance(r, CachedFeatures) for r in refs) and len({r.path for r in refs}) == 2
    assert [r.n_leaves for r in refs] == [f.n_leaves for f in feats[::-1]]
    for a, b in zip(read_cached(refs), feats[::-1]):
        assert (a.program_hash, a.flops) == (b.program_hash, b.flops)
        assert np.array_equal(a.leaf_features, b.leaf_features) and np.array_equal(a.positions, b.positions)
    with pytest.raises(RuntimeError, match="takes no new features"):
        on_disk.put(feats[0])


def test_a_large_first_load_is_cached_in_bounded_chunks(real, tmp_path, monkeypatch):
    """A chunk is read whole (``read_cached``, ``write_store``), so a first load of millions of programs must
    not become one chunk: ``put`` writes one every ``CHUNK_PROGRAMS`` new programs."""
    from cdmpp.records.dataset import FeatureCache

    _, ds = real
    feats = list({p.features.program_hash: p.features for p in ds.programs}.values())[:25]
    monkeypatch.setattr(FeatureCache, "CHUNK_PROGRAMS", 10)
    cache = FeatureCache(str(tmp_path / "cache"))
    for f in feats:
        cache.put(f)
    cache.flush()
    on_disk = FeatureCache(str(tmp_path / "cache"), on_disk=True)
    sizes = sorted(np.bincount(np.unique([r.path for r in on_disk.items.values()], return_inverse=True)[1]))
    assert sizes == [5, 10, 10] and set(on_disk.items) == {f.program_hash for f in feats}


def test_a_split_store_written_from_the_cache_is_the_one_the_dataset_in_memory_gives(real, tmp_path):
    """``write_split_store`` holds labels and ids only, the features read from the cache a chunk at a time; its
    stores hold every array (and meta.json) that writing the split from the dataset in memory gives."""
    import json

    from cdmpp.program.features import FEATURIZER_VERSION
    from cdmpp.records.dataset import CachedFeatures, load_dataset
    from cdmpp.workflows import training_split, write_split_store
    from cdmpp.zoo.tasks import TaskTable
    from tests.data import TASKS

    folder, _ = real
    write_split_store(str(tmp_path / "streamed"), str(folder), str(TASKS), val=0.2, limit=120, val_by="program",
                      progress=False)
    lazy = load_dataset(str(folder), TaskTable.load(str(TASKS)), limit=120, progress=False, features_on_disk=True)
    assert all(isinstance(p.features, CachedFeatures) for p in lazy.programs)
    write_store(tmp_path / "small-chunks", training_split(lazy, 0, 0.2, "program").train, str(FEATURIZER_VERSION),
                chunk=16)
    ds = load_dataset(str(folder), TaskTable.load(str(TASKS)), limit=120, progress=False)
    split = training_split(ds, 0, 0.2, "program")
    for part, programs in (("train", split.train), ("val", split.val)):
        write_store(tmp_path / "memory" / part, programs, featurizer_version=str(FEATURIZER_VERSION))
    pairs = [(tmp_path / "memory" / part, tmp_path / "streamed" / part) for part in ("train", "val")]
    pairs.append((tmp_path / "memory" / "train", tmp_path / "small-chunks"))
    for mem, disk in pairs:
        names = sorted(f.name for f in mem.iterdir())
        assert names == sorted(f.name for f in disk.iterdir()) and "leaves.npy" in names
        for name in names:
            if name.endswith(".npy"):
                a, b = np.load(mem / name), np.load(disk / name)
                assert a.dtype == b.dtype and np.array_equal(a, b), (disk, name)
        assert json.loads((mem / "meta.json").read_text()) == json.loads((disk / "meta.json").read_text())
    assert len(FeatureStore(tmp_path / "streamed" / "train")) == len(split.train) > 0


def test_writing_from_the_cache_reads_each_cache_chunk_once(real, tmp_path, monkeypatch):
    """Programs shuffled across several cache chunks, written a few at a time: each cache chunk is read (decompressed)
    once, not once per store chunk, and every file of the store is the one the same programs in memory give."""
    import json

    from cdmpp.program.features import ProgramFeatures
    from cdmpp.records import dataset
    from cdmpp.records.dataset import FeatureCache

    _, ds = real
    programs = list({p.features.program_hash: p for p in ds.programs}.values())[:90]
    n_features = programs[0].features.leaf_features.shape[1]
    empty = ProgramFeatures(np.zeros((0, n_features), np.float32), np.zeros(0, np.int64), 0.0, "e" * 16)
    programs.append(dataclasses.replace(programs[0], features=empty))  # one zero leaf, in memory and from the cache
    cache = FeatureCache(str(tmp_path / "cache"))
    for a in range(0, len(programs), 20):  # five chunks
        for p in programs[a:a + 20]:
            cache.put(p.features)
        cache.flush()
    on_disk = FeatureCache(str(tmp_path / "cache"), on_disk=True)
    order = np.random.default_rng(0).permutation(len(programs))
    in_memory = [programs[i] for i in order]
    cached = [dataclasses.replace(p, features=on_disk.get(p.features.program_hash)) for p in in_memory]
    reads = []
    read_chunk = dataset._read_chunk
    monkeypatch.setattr(dataset, "_read_chunk", lambda path, rows=True: reads.append(path) or read_chunk(path, rows))
    write_store(tmp_path / "cached", cached, "v", chunk=8)
    assert sorted(reads) == sorted({p.features.path for p in cached}) and len(reads) == 5
    write_store(tmp_path / "memory", in_memory, "v", chunk=8)
    names = sorted(f.name for f in (tmp_path / "memory").iterdir())
    assert names == sorted(f.name for f in (tmp_path / "cached").iterdir()) and "stats.npy" in names
    for name in names:
        assert (tmp_path / "memory" / name).read_bytes() == (tmp_path / "cached" / name).read_bytes(), name
    assert json.loads((tmp_path / "cached" / "meta.json").read_text())["n"] == len(programs)
    mem = PackedPrograms.from_programs([p.features for p in in_memory])  # one pack of all: the same numbers
    disk = FeatureStore(tmp_path / "cached").pack()
    for name in ("leaves", "positions", "offsets", "stats"):
        assert np.array_equal(getattr(mem, name), getattr(disk, name)), name


def test_a_store_gives_back_its_programs(real, tmp_path):
    _, ds = real
    store = write_store(tmp_path / "s", ds.programs[:40], chunk=16)
    back = store.programs()
    assert [p.features.program_hash for p in back] == [p.features.program_hash for p in ds.programs[:40]]
    assert [(p.device, p.task, p.seconds, p.features.flops, p.features.tensor_flops) for p in back] == \
        [(p.device, p.task, p.seconds, p.features.flops, p.features.tensor_flops or 0.0) for p in ds.programs[:40]]
    for a, b in zip(back, ds.programs[:40]):
        assert np.array_equal(a.features.leaf_features, b.features.leaf_features)
        assert np.array_equal(a.features.positions, b.features.positions)


def test_a_missing_old_or_corrupt_store_is_refused(real, tmp_path):
    import json

    _, ds = real
    with pytest.raises(FileNotFoundError, match="no feature store"):
        FeatureStore(tmp_path / "none")
    path = tmp_path / "s"
    store = write_store(path, ds.programs[:40])
    with pytest.raises(ValueError, match="validation set"):
        fit(_tiny(), store, None, device_table=_table())
    meta = json.loads((path / "meta.json").read_text())
    (path / "meta.json").write_text(json.dumps({**meta, "format": 1}))
    with pytest.raises(ValueError, match="format 1.*write it again"):
        FeatureStore(path)
    (path / "meta.json").write_text(json.dumps(meta))
    np.save(path / "seconds.npy", np.ones(39))
    with pytest.raises(ValueError, match="seconds disagree.*corrupt"):
        FeatureStore(path)
    (path / "flops.npy").write_bytes((path / "flops.npy").read_bytes()[:100])
    with pytest.raises(ValueError, match="flops.npy: unreadable"):
        FeatureStore(path)


def test_a_replicated_store_repeats_the_programs(real, tmp_path):
    _, ds = real
    src = write_store(tmp_path / "s", ds.programs[:30])
    big = replicate_store(src, tmp_path / "big", 75)  # two copies and half of one
    assert len(big) == 75 and big.meta["replicated_from"] == str(src.path)
    a, b = src.pack(), big.pack()
    assert np.array_equal(b.lengths, np.concatenate([a.lengths, a.lengths, a.lengths[:15]]))
    assert np.array_equal(b.leaves[b.offsets[60]:b.offsets[75]], a.leaves[:a.offsets[15]])
    assert np.array_equal(big.seconds, np.concatenate([src.seconds] * 2 + [src.seconds[:15]]))


def test_unbuilt_copies_are_trained_on_beside_their_programs(real, monkeypatch):
    """``assembly_unbuilt_copies``: an epoch runs every training program with its counts and, after them, the
    withheld share again with its counts absent (the program inputs a program asked unbuilt gets)."""
    from cdmpp.model import training
    from cdmpp.model.network import N_ROOFLINE_STATS, N_STATS
    from cdmpp.program.assembly import N_COUNTS

    def store_stats(programs):
        return PackedPrograms.from_programs([p.features for p in programs]).stats

    _, ds = real
    rng = np.random.default_rng(4)  # SYNTHETIC: instruction counts standing in for the programs' builds
    programs = [dataclasses.replace(p, features=dataclasses.replace(p.features, asm=rng.integers(1, 500, N_COUNTS)
                                                                    .astype(np.float64))) for p in ds.programs[:240]]
    train, val = programs[:192], programs[192:]
    seen = []
    forward = training.Runner.forward_module

    def recording(self, model):
        step = forward(self, model)

        def run(leaves, positions, mask, dev, inputs, target):
            seen.append(inputs.detach().clone())
            return step(leaves, positions, mask, dev, inputs, target)
        return run

    monkeypatch.setattr(training.Runner, "forward_module", recording)
    model = fit(_tiny(assembly_counts=True, assembly_withheld=0.25), train, val, device_table=_table())  # 3 epochs
    rows = torch.cat(seen)
    copies = int(training.withheld_share(len(train), 0.25, seed=0).sum())
    absent = model.scaled_stats(training.unbuilt_stats(np.zeros((1, N_STATS))))[0, N_ROOFLINE_STATS:]
    assert 30 < copies < 70 and len(rows) == 3 * (len(train) + copies)
    unbuilt = torch.isclose(rows[:, N_ROOFLINE_STATS:], absent).all(dim=1)
    assert int(unbuilt.sum()) == 3 * copies
    sizes = model.scaled_stats(np.array(store_stats(train)))[:, :N_ROOFLINE_STATS]  # a copy keeps its program's size
    assert all(torch.isclose(sizes, r[:N_ROOFLINE_STATS]).all(dim=1).any() for r in rows[unbuilt])
