"""The dataset's feature cache."""

import os

import numpy as np

from cdmpp.program.features import FEATURIZER_VERSION, ProgramFeatures
from cdmpp.records.dataset import FeatureCache


def _feat(h: str) -> ProgramFeatures:
    return ProgramFeatures(np.full((2, 164), 1.0, np.float32), np.array([1, 3]), 8.0, h)


def test_feature_cache_chunks_never_collide(tmp_path):
    c = FeatureCache(str(tmp_path))
    for h in ("a", "b", "c"):
        c.put(_feat(h))
        c.flush()
    name = f"features-v{FEATURIZER_VERSION}-{{:04d}}.npz"
    assert sorted(os.listdir(tmp_path)) == [name.format(k) for k in range(3)]
    os.rename(tmp_path / name.format(0), tmp_path / (name.format(0) + ".bad"))  # the count is now 2
    chunk2 = (tmp_path / name.format(2)).read_bytes()
    c.put(_feat("d"))
    c.flush()
    assert (tmp_path / name.format(2)).read_bytes() == chunk2
    assert (tmp_path / name.format(3)).exists()
    assert set(FeatureCache(str(tmp_path)).items) == {"b", "c", "d"}


def test_loops_survive_the_feature_cache_and_the_wire(tmp_path):
    """Loop tokens are optional in the cache and on the sandbox wire: present, they round-trip; absent
    (features cached before loop tokens), they load as None."""
    from cdmpp.sandbox.wire import decode_features, encode_features

    with_loops = _feat("a")
    with_loops.loops = np.array([[1, 7.0, 0], [2, 3.0, 1]], np.float32)
    c = FeatureCache(str(tmp_path))
    c.put(with_loops)
    c.flush()
    c.put(_feat("b"))
    c.flush()
    again = FeatureCache(str(tmp_path)).items
    assert np.array_equal(again["a"].loops, with_loops.loops) and again["b"].loops is None
    for f in (with_loops, _feat("b")):
        back = decode_features(encode_features(f))
        assert (back.loops is None) == (f.loops is None)
        assert f.loops is None or np.array_equal(back.loops, f.loops)


def test_twins_are_featurized_once(real, tmp_path, monkeypatch):
    """Records of one program on several devices share its features, so a fresh cache extracts each once."""
    import dataclasses

    from cdmpp.program.features import Featurizer
    from cdmpp.records.dataset import _featurize_records
    from cdmpp.records.store import RecordStore
    from cdmpp.zoo.tasks import TaskTable
    from tests.data import TASKS

    folder, _ = real
    records = [r for _, r in zip(range(6), RecordStore(str(folder)).records())]
    twins = [dataclasses.replace(r, id=r.id + "-twin", device="other/llvm") for r in records[:3]]
    calls = []
    extract = Featurizer.__call__

    def counted(self, programs, *args, **kwargs):
        calls.append(len(programs))
        return extract(self, programs, *args, **kwargs)

    monkeypatch.setattr(Featurizer, "__call__", counted)
    cache = FeatureCache(str(tmp_path))
    _featurize_records(records + twins, TaskTable.load(str(TASKS)), cache, progress=False)
    hashes = {r.program_hash for r in records}
    assert sum(calls) == len(hashes) and all(cache.get(h) is not None for h in hashes)


def test_searched_candidates_can_be_left_out(real, tmp_path):
    """The protocol loads with ``searched=False``: search candidates added to a pinned device later must
    not change its splits, nor their twins measured on another device (`collect --programs-from`, unmarked)."""
    import dataclasses

    from cdmpp.records.dataset import load_dataset
    from cdmpp.records.store import RecordStore
    from cdmpp.zoo.tasks import TaskTable
    from tests.data import TASKS

    folder, _ = real
    records = [r for _, r in zip(range(12), RecordStore(str(folder)).records())]
    tagged = [dataclasses.replace(r, extra={**r.extra, "search": {"strategy": "evolutionary", "trial": i}})
              if i % 3 == 0 else r for i, r in enumerate(records)]
    RecordStore(str(tmp_path)).append(records[0].device, tagged)
    other = "amd-epyc-znver4-1t/llvm-avx512" if records[0].device != "amd-epyc-znver4-1t/llvm-avx512" \
        else "amd-epyc-znver4-2t/llvm-avx512"
    twins = [dataclasses.replace(r, device=other, id=r.id.replace(r.device, other, 1)) for r in records[:6]]
    RecordStore(str(tmp_path)).append(other, twins)
    tagged += twins
    table = TaskTable.load(str(TASKS))
    every = load_dataset(str(tmp_path), table, cache_dir=str(tmp_path / "cache"), progress=False)
    random_only = load_dataset(str(tmp_path), table, cache_dir=str(tmp_path / "cache"), progress=False,
                               searched=False)
    searched_ids = {r.id for r in tagged if r.extra.get("search")}
    searched_ids |= {t.id for t in twins if t.program_hash in {r.program_hash for r in records if r.id in searched_ids}}
    assert len(searched_ids) == 4 + 2  # records 0, 3, 6, 9 and the twins of 0 and 3
    assert {p.record_id for p in every.programs} >= searched_ids
    assert {p.record_id for p in random_only.programs} == {p.record_id for p in every.programs} - searched_ids
    assert len(random_only) == len(every) - len(searched_ids) > 0


def test_features_cached_before_tensor_core_flops_load_as_uncounted_and_a_recount_replaces_them(tmp_path):
    """A chunk written before tensor-core FLOPs were counted has no ``tensor_flops``: its programs load with None
    (the dataset recounts a GPU program's, keeping its rows), and the recount's later chunk wins on the next read."""
    old = _feat("gpu")
    np.savez_compressed(tmp_path / f"features-v{FEATURIZER_VERSION}-0000.npz", rows=old.leaf_features,
                        positions=old.positions, offsets=np.array([0, 2]), flops=np.array([8.0]),
                        hashes=np.array(["gpu"]))
    c = FeatureCache(str(tmp_path))
    assert c.get("gpu").tensor_flops is None
    assert FeatureCache(str(tmp_path), on_disk=True).get("gpu").tensor_flops is None
    c.put(ProgramFeatures(old.leaf_features, old.positions, 16.0, "gpu", None, 8.0))
    c.put(_feat("cpu"))
    c.flush()
    again = FeatureCache(str(tmp_path))
    assert (again.get("gpu").flops, again.get("gpu").tensor_flops) == (16.0, 8.0)
    assert again.get("cpu").tensor_flops == 0.0
    assert FeatureCache(str(tmp_path), on_disk=True).get("gpu").tensor_flops == 8.0
    again.put(_feat("gpu"))  # a counted entry is never replaced
    assert again.get("gpu").flops == 16.0
