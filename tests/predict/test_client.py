"""``Client``: the HTTP service's answers equal the in-process ones; errors and retries."""

import json

import numpy as np
import pytest

from cdmpp.defaults import MODEL as DEFAULT_MODEL
from cdmpp.model.kinds import is_checkpoint

pytestmark = pytest.mark.skipif(not is_checkpoint(DEFAULT_MODEL),
                                reason=f"no shipped model at {DEFAULT_MODEL} yet")


httpx = pytest.importorskip("httpx")


@pytest.mark.slow
def test_client_round_trip_equals_in_process(url, predictor, device, sampled, texts):
    from cdmpp.predict.client import Client
    from cdmpp.program.inputs import workload_trace_json
    from cdmpp.zoo import workloads

    with Client(url) as c:
        assert c.health()["status"] == "ok"
        assert c.devices() == predictor.devices()
        assert c.device(device).kind == predictor.device(device).kind == "llvm"
        assert c.models()[0]["model_version"] == predictor.version
        # text in, text in process
        got = c.predict(texts, device)
        want = predictor.predict(texts, device)
        np.testing.assert_allclose([p.seconds for p in got], [p.seconds for p in want], rtol=1e-5)
        np.testing.assert_allclose([p.hi90 for p in got], [p.hi90 for p in want], rtol=1e-5)
        # TVM objects: the client sends TVMScript; same answer as the in-process Predictor on the objects
        schs = sampled["matmul"][:4]
        np.testing.assert_allclose([p.seconds for p in c.predict(schs, device)],
                                   [p.seconds for p in predictor.predict(schs, device)], rtol=1e-5)
        # workload+trace items sharing one workload
        mod = workloads.matmul()
        items = [workload_trace_json(mod, s.trace) for s in schs]
        shared = items[0]["workload"]
        want_wt = [p.seconds for p in predictor.predict(items, device)]
        got = c.predict([{"trace": it["trace"]} for it in items], device, workload=shared)
        np.testing.assert_allclose([p.seconds for p in got], want_wt, rtol=1e-5)
        as_text = [json.dumps({"trace": it["trace"]}) for it in items]  # the fast form: JSON text per item
        np.testing.assert_allclose([p.seconds for p in c.predict(as_text, device, workload=shared)], want_wt, rtol=1e-5)
        # Schedules with their workload module: sent as traces, same answer
        np.testing.assert_allclose([p.seconds for p in c.predict(schs, device, workload=mod)], want_wt, rtol=1e-5)
        # batches larger than the client's batch size are split and reassembled in order
        small = Client(url, batch_size=4)
        np.testing.assert_allclose([p.seconds for p in small.predict(texts, device)],
                                   [p.seconds for p in want], rtol=1e-5)


def test_client_raises_program_error(url, device, texts):
    from cdmpp.predict.client import Client
    from cdmpp.program.inputs import ProgramError

    with pytest.raises(ProgramError) as e:
        Client(url).predict([texts[0], "garbage"], device)
    assert [x["index"] for x in e.value.errors] == [1]


def test_client_retries_5xx_then_succeeds():
    from cdmpp.predict.client import Client, ServiceError

    calls = []

    def handler(request):
        calls.append(request.url.path)
        if len(calls) < 3:
            return httpx.Response(503, json={"detail": "warming up"})
        return httpx.Response(200, json={"status": "ok", "model_version": "x", "uptime_s": 1.0})

    c = Client("http://cdmpp.test", retries=3, backoff_s=0.001, transport=httpx.MockTransport(handler))
    assert c.health()["status"] == "ok" and len(calls) == 3
    calls.clear()
    c = Client("http://cdmpp.test", retries=1, backoff_s=0.001, transport=httpx.MockTransport(handler))
    with pytest.raises(ServiceError) as e:
        c.health()
    assert e.value.status == 503 and len(calls) == 2


def test_client_retries_connection_errors():
    from cdmpp.predict.client import Client

    tries = []

    def handler(request):
        tries.append(1)
        raise httpx.ConnectError("refused", request=request)

    c = Client("http://cdmpp.test", retries=2, backoff_s=0.001, transport=httpx.MockTransport(handler))
    with pytest.raises(httpx.ConnectError):
        c.health()
    assert len(tries) == 3
