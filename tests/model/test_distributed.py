"""Where training runs: the device choice, and two CPU processes on gloo (DDP) against one."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from cdmpp.model.distributed import Runner, resolve_device
from cdmpp.model.training import TrainConfig, fit
from tests.data import DEVICES_JSON


def test_auto_is_the_cpu_without_a_gpu_and_cuda_without_one_says_so(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu") and resolve_device(None) == torch.device("cpu")
    with pytest.raises(ValueError, match="torch sees no GPU"):
        resolve_device("cuda")
    with pytest.raises(ValueError, match="expected one of auto, cpu, cuda"):
        resolve_device("tpu")
    r = Runner("cpu")
    assert (r.rank, r.world, r.is_main) == (0, 1, True)
    batches = [np.arange(5), np.arange(3)]
    assert r.shares(batches) is batches and r.agree(0.25) == 0.25 and r.any(False) is False


def _config() -> TrainConfig:
    """No dropout (the default recipe has none), no GBT blend, 192 programs in batches of 32: every batch
    splits into two shares of 16, so DDP's average of the two shares' gradients is the batch's gradient."""
    return TrainConfig.recipe("default").replace(d_model=32, d_ff=64, n_layers=1, epochs=3, ensemble=2, batch_size=32,
                                                 lr_cycle_epochs=1, gbt_blend=False, amdahl_transfer=False,
                                                 progress=False)


def _table():
    from cdmpp.devices.table import DeviceTable

    return DeviceTable(str(DEVICES_JSON)).spec_table()


def _rank(rank: int, world: int, init: str, train, val, out: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world)
    try:
        model = fit(_config(), train, val, device_table=_table())
        z = model.predict_z([p.features for p in val], [p.device for p in val])
        np.save(f"{out}-{rank}.npy", z)
        with open(f"{out}-{rank}.json", "w") as f:
            json.dump(model.summary, f)
    finally:
        dist.destroy_process_group()


def test_two_gloo_processes_train_what_one_process_trains(real, tmp_path):
    """Two ranks on halves of every batch against one process on whole batches: the same epochs, the same
    snapshot epochs, predictions within 1e-5 in label space (gradients summed in another order, batches padded
    to other widths: float rounding only)."""
    _, ds = real
    train, val = ds.programs[:192], ds.programs[192:240]
    one = fit(_config(), train, val, device_table=_table())
    z_one = one.predict_z([p.features for p in val], [p.device for p in val])
    torch.multiprocessing.spawn(_rank, args=(2, str(tmp_path / "init"), train, val, str(tmp_path / "r")), nprocs=2)
    z_two = np.load(tmp_path / "r-0.npy")
    s0, s1 = (json.loads((tmp_path / f"r-{r}.json").read_text()) for r in (0, 1))
    assert s0["world_size"] == 2 and s1["rank"] == 1  # rank 1 stops after training; rank 0 calibrates
    assert [h["members_from_epochs"] for h in s0["members"]] == [h["members_from_epochs"] for h in one.summary["members"]]
    assert z_two.shape == z_one.shape
    np.testing.assert_allclose(z_two, z_one, atol=1e-5)  # measured: 6e-8
    val_one = [e[2] for e in one.summary["members"][0]["history"]]
    val_two = [e[2] for e in s0["members"][0]["history"]]
    np.testing.assert_allclose(val_two, val_one, rtol=1e-3)
