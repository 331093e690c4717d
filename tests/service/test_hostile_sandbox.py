"""The engine behind ``/v1/predict`` against poisoned numbers and TVMScript (issue 53, items 1 and 6):
non-finite features, FLOPs or predictions are a 422 naming the item and never cached; what a worker that
ran TVMScript computed never enters a cache other callers read."""

import json
import math

import pytest

from cdmpp.defaults import MODEL as DEFAULT_MODEL
from cdmpp.model.kinds import is_checkpoint
from tests.attacks import SAMPLE

pytestmark = pytest.mark.skipif(not is_checkpoint(DEFAULT_MODEL), reason="no shipped model")


@pytest.fixture(scope="module")
def items():
    """(a good workload + trace item, one whose loops of 2**31 - 1 iterations make a feature +inf)."""
    from cdmpp.program import tvm_env
    from cdmpp.program.inputs import load_program, parse_target

    tvm = tvm_env.setup(1)
    from tvm import te
    from tvm.s_tir.meta_schedule.database import Workload

    good = {"workload": Workload(load_program(SAMPLE, parse_target("llvm")).mod).as_json(), "trace": [[], []]}
    a = te.placeholder((16,), "float32", name="A")
    huge = te.compute((2**31 - 1,) * 3, lambda i, j, k: a[k % 16] * 2.0, name="big")
    inf = {"workload": Workload(tvm.IRModule({"main": te.create_prim_func([a, huge])})).as_json(),
           "trace": [[], []]}
    return json.dumps(good), json.dumps(inf)


@pytest.fixture(scope="module")
def engine(predictor):
    from cdmpp.sandbox.pool import Sandbox
    from cdmpp.service.engine import PredictEngine

    e = PredictEngine(predictor, sandbox=Sandbox(1), allow_tvmscript=True)
    yield e
    e.close()


def _clear(engine):
    from cdmpp.lru import LRU

    engine.predictor.features.clear()
    engine._preds = LRU(engine.cache_size)


def test_non_finite_features_are_a_422_naming_the_item_and_are_not_cached(engine, device, items):
    """The GBT raised on the +inf feature: the whole batch was a 500, and cached features made it permanent."""
    from cdmpp.service.engine import BadPrograms

    _clear(engine)
    good, inf = items
    for _ in range(2):  # the same answer the second time: nothing of it was cached
        with pytest.raises(BadPrograms) as e:
            engine.predict([good, inf], device)
        assert [i for i, _ in e.value.errors] == [1] and "finite" in e.value.errors[0][1]
    pred, = engine.predict([good], device)
    assert math.isfinite(pred.seconds)
    assert engine.cache_len() == 1 and len(engine._preds) == 1  # the good item alone


def test_non_finite_predictions_are_a_422_and_are_not_cached(engine, device, items, monkeypatch):
    from cdmpp.predict.predictor import Prediction
    from cdmpp.service.engine import BadPrograms

    _clear(engine)
    good, _ = items
    monkeypatch.setattr(engine.predictor, "predict_features",
                        lambda feats, *a, **k: [Prediction(math.inf, 1.0, math.inf) for _ in feats])
    with pytest.raises(BadPrograms) as e:
        engine.predict([good], device)
    assert [i for i, _ in e.value.errors] == [0] and "finite" in e.value.errors[0][1]
    assert len(engine._preds) == 0
    monkeypatch.undo()
    assert math.isfinite(engine.predict([good], device)[0].seconds)


def test_what_a_tvmscript_worker_computed_is_never_cached(engine, device, items):
    """A TVMScript worker may have rewritten itself: its features and the predictions from them stay with
    the request, while the workload + trace items of the same request are cached as usual."""
    _clear(engine)
    good, _ = items
    a, b = engine.predict([SAMPLE, good], device)
    assert math.isfinite(a.seconds) and abs(a.seconds - b.seconds) <= 1e-6 * b.seconds  # the same program
    assert engine.cache_len() == 1 and len(engine._preds) == 1
    assert engine.predict([SAMPLE], device)[0].seconds == pytest.approx(a.seconds)
    assert engine.cache_len() == 1 and len(engine._preds) == 1
    assert engine.sandbox.restarts == 0  # TVMScript workers were retired as planned, not as failures


@pytest.mark.slow  # the app's sandbox warms up every target kind of the model (cuda: ~25 s)
def test_over_http_the_poisoned_item_is_a_422_not_a_500(predictor, device, items):
    """The issue's request: a 500 for the whole batch, the same 500 ever after. Now a 422 naming item 1,
    the same the second time, and the good item alone is answered."""
    httpx = pytest.importorskip("httpx")
    from cdmpp.service.app import Settings, create_app
    from cdmpp.service.background import BackgroundServer

    good, inf = items
    with BackgroundServer(create_app(Settings(featurize_procs=1), predictor)) as u:
        for _ in range(2):
            r = httpx.post(u + "/v1/predict", json={"device": device, "programs": [good, inf]}, timeout=120)
            assert r.status_code == 422, r.text
            assert [e["index"] for e in r.json()["errors"]] == [1] and "finite" in r.json()["errors"][0]["reason"]
        r = httpx.post(u + "/v1/predict", json={"device": device, "programs": [good]}, timeout=120)
        assert r.status_code == 200 and math.isfinite(r.json()["predictions"][0]["seconds"])


def test_tvmscript_stays_refused_though_the_predictor_parsed_it_for_a_trusted_caller(predictor, device):
    """The service shares its predictor's feature cache (issue 57), which holds what in-process callers
    featurized: a TVMScript text parsed for a trusted caller is still refused over HTTP when TVMScript
    is off, before the cache is looked at."""
    import types

    from cdmpp.sandbox.wire import TVMSCRIPT_OFF
    from cdmpp.service.engine import BadPrograms, PredictEngine

    predictor.predict([SAMPLE], device, trusted=True)  # now in the predictor's feature cache
    e = PredictEngine(predictor, sandbox=types.SimpleNamespace(close=lambda: None), allow_tvmscript=False)
    with pytest.raises(BadPrograms) as err:
        e.predict([SAMPLE], device)
    assert err.value.errors == [(0, TVMSCRIPT_OFF)]
