"""notebooks/accuracy.ipynb runs top to bottom on a small subset of the shipped data (quick mode)."""

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_accuracy_notebook_runs(tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    data = ROOT / "datasets" / "measurements"
    if not any(data.glob("*.jsonl*")):
        pytest.skip("no shipped measurements yet")
    monkeypatch.setenv("CDMPP_NOTEBOOK_QUICK", "1")
    monkeypatch.setenv("CDMPP_ROOT", str(ROOT))
    monkeypatch.setenv("CDMPP_CACHE", str(tmp_path / "cache"))
    nb = nbformat.read(ROOT / "notebooks" / "accuracy.ipynb", as_version=4)
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}})
    monkeypatch.chdir(ROOT)
    client.execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    text = "".join(o.get("text", "") for o in outputs)
    assert "QUICK MODE: smoke figures on" in text and "mape" in text and "kmeans" in text
    # figures are shown inline (one per section with its report present, two trained here), none written to disk
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) >= 3, f"{len(images)} inline figures"
    assert not list(tmp_path.glob("*.png")) and not list((ROOT / "notebooks").glob("*.png"))
