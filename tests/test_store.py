"""Store safety: sealed parts and feature-cache chunks never overwrite an existing file."""

import gzip
import json
import os

import numpy as np

from cdmpp.records.dataset import FeatureCache
from cdmpp.program.features import FEATURIZER_VERSION, ProgramFeatures
from cdmpp.records.store import RecordStore


def _ids(path):
    return [json.loads(ln)["id"] for ln in gzip.open(path, "rt")]


def test_quarantined_part_then_seal_overwrites_nothing(tmp_path):
    store = RecordStore(str(tmp_path), seal_every=2)
    for k in range(3):  # parts 0000, 0001, 0002
        store.append("d", [{"id": f"d|t|{k}a"}, {"id": f"d|t|{k}b"}])
    parts = sorted(p for p in os.listdir(tmp_path) if ".part-" in p)
    assert parts == [f"d.part-{k:04d}.jsonl.gz" for k in range(3)]
    before = {p: (tmp_path / p).read_bytes() for p in parts}
    # a user moves a corrupt part aside, as the loader's error invites
    os.rename(tmp_path / "d.part-0001.jsonl.gz", tmp_path / "d.part-0001.jsonl.gz.bad")
    store.append("d", [{"id": "d|t|3a"}, {"id": "d|t|3b"}])
    assert _ids(tmp_path / "d.part-0003.jsonl.gz") == ["d|t|3a", "d|t|3b"]
    for p, data in before.items():  # every earlier part (moved or not) byte for byte unchanged
        where = tmp_path / (p + ".bad" if p.endswith("0001.jsonl.gz") else p)
        assert where.read_bytes() == data
    # the quarantined file's number is still taken: the next seal goes after it, not into the gap
    store.append("d", [{"id": "d|t|4a"}, {"id": "d|t|4b"}])
    assert _ids(tmp_path / "d.part-0004.jsonl.gz") == ["d|t|4a", "d|t|4b"]
    assert not (tmp_path / "d.part-0001.jsonl.gz").exists()
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]
    assert sorted(r["id"] for r in store.iter_records()) == sorted(
        f"d|t|{k}{x}" for k in (0, 2, 3, 4) for x in "ab")


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
