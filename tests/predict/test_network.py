"""Whole-network latency from the tasks' predicted kernels."""

from pathlib import Path

import numpy as np
import pytest

from cdmpp.defaults import MODEL as DEFAULT_MODEL
from cdmpp.model.kinds import is_checkpoint

pytestmark = pytest.mark.skipif(not is_checkpoint(DEFAULT_MODEL),
                                reason=f"no shipped model at {DEFAULT_MODEL} yet")


DATA = Path(__file__).resolve().parents[2] / "datasets"


DEVICE = "amd-epyc-znver4-2t/llvm-avx512"


NETWORK = "bert_tiny@1"


@pytest.fixture(scope="module")
def table():
    from cdmpp.zoo.tasks import TaskTable

    return TaskTable.load(str(DATA / "tasks-llvm.json.gz"))


@pytest.fixture(scope="module")
def target(tvm):
    from cdmpp.devices.table import DeviceTable

    return DeviceTable(DATA / "devices.json").get(DEVICE).make_target()


@pytest.fixture(scope="module")
def programs(table, target):
    from cdmpp.predict import network

    return network.task_programs(NETWORK, table, "best-measured", DEVICE, str(DATA / "measurements"), target)


def test_network_prediction_is_the_weighted_sum_of_its_tasks(predictor, programs, table):
    from cdmpp.predict import network

    assert len(programs) == len(table.tasks_of(NETWORK)) and all(p.source == "best-measured" for p in programs)
    pred = network.predict_network(predictor, NETWORK, DEVICE, programs)
    each = predictor.predict_seconds([p.mod for p in programs], DEVICE)
    assert pred.seconds == pytest.approx(sum(p.weight * s for p, s in zip(programs, each)))
    assert pred.lo90 <= pred.seconds <= pred.hi90


def test_schedules_come_from_a_metaschedule_database(tmp_path, programs, table, target):
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo

    from cdmpp.predict import network

    db = ms.database.JSONDatabase(work_dir=str(tmp_path))
    for p in programs[:3]:
        db.commit_tuning_record(ms.database.TuningRecord(p.trace, db.commit_workload(p.workload), run_secs=[1e-3],
                                                         target=target, args_info=ArgInfo.from_prim_func(p.mod["main"])))
    got = network.task_programs(NETWORK, table, str(tmp_path), DEVICE, str(DATA / "measurements"), target)
    assert [g.source for g in got] == ["database"] * 3 + ["default"] * (len(got) - 3)
    import tvm_ffi

    assert all(tvm_ffi.structural_equal(g.mod, p.mod) for g, p in zip(got[:3], programs))


@pytest.mark.slow
def test_the_compiled_network_runs_the_chosen_programs(programs, target):
    """Every kernel TVM builds for the network is one of the chosen scheduled programs."""
    import tvm_ffi
    from tvm import relax

    from cdmpp.predict import network
    from cdmpp.zoo.tasks import network_to_relax

    mod = network_to_relax("bert_tiny", 1)
    db = network._database(programs, target)
    with target, db:
        mod = relax.transform.MetaScheduleApplyDatabase(enable_warning=False)(mod)
    chosen = [p.mod["main"].body for p in programs]
    funcs = [f for _, f in mod.functions.items() if hasattr(f, "body") and "tirx.is_scheduled" in (f.attrs or {})]
    assert len(funcs) == len(programs)
    assert all(any(tvm_ffi.structural_equal(f.body, c) for c in chosen) for f in funcs)

    from cdmpp.devices.probe import local_hardware
    from cdmpp.devices.table import DeviceTable

    executable = network.compile_network(NETWORK, programs, target)
    spec = DeviceTable(DATA / "devices.json").get(DEVICE)
    if spec.hardware != local_hardware():  # another chip: its code may not run here, and would time this chip
        with pytest.raises(ValueError, match="measure it on its own machine"):
            network.measure_network(executable, NETWORK, spec)
        pytest.skip(f"{DEVICE} is {spec.hardware}; this machine is {local_hardware()}")
    measured = network.measure_network(executable, NETWORK, spec, repeat=2, min_repeat_ms=1, max_wait_s=0, rounds=2,
                                       pause_s=0)
    assert np.isfinite(measured["seconds"]) and 0 < measured["seconds"] <= measured["median_s"]
    assert measured["rounds"] == 2
