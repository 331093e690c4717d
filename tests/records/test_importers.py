"""Importing records measured elsewhere."""

import pytest

from cdmpp.records.importers import import_store
from cdmpp.records.store import RecordStore


def test_import_appends_records_and_runs_once(tmp_path):
    src = RecordStore(str(tmp_path / "lent"))
    src.append("gpu-x/cuda-sm90", [{"id": f"gpu-x/cuda-sm90|t|{i}", "device": "gpu-x/cuda-sm90", "task": "t",
                                    "program_hash": str(i), "seconds": [1e-5], "error": None, "run": "r1"}
                                   for i in range(3)])
    src.add_run({"run": "r1", "device": "gpu-x/cuda-sm90"})
    (tmp_path / "lent" / "PROVENANCE.md").write_text("how it was measured")
    dst = str(tmp_path / "ds")
    r = import_store(str(tmp_path / "lent"), dst)
    assert r["records"] == 3 and r["runs"] == 1 and r["devices"] == ["gpu-x/cuda-sm90"]
    store = RecordStore(dst)
    assert len(list(store.iter_records("gpu-x/cuda-sm90"))) == 3 and store.files("gpu-x/cuda-sm90")[0].endswith(".gz")
    assert store.runs()["r1"]["imported"]["from"].endswith("lent")
    assert (tmp_path / "ds" / "provenance-gpu-x_cuda-sm90.md").read_text() == "how it was measured"
    again = import_store(str(tmp_path / "lent"), dst)
    assert again["records"] == 0 and again["runs"] == 0 and again["already_present"] == 3
    with pytest.raises(ValueError, match="no record files"):
        import_store(str(tmp_path / "ds" / "nothing"), dst) if (tmp_path / "ds" / "nothing").mkdir() is None else None
