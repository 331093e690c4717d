"""The HTTP service: endpoints, errors, limits, caches, workers."""

import json

import numpy as np
import pytest

from cdmpp.defaults import MODEL as DEFAULT_MODEL
from cdmpp.model.kinds import is_checkpoint
from tests.processes import app_server, descendants, free_port, running

pytestmark = pytest.mark.skipif(not is_checkpoint(DEFAULT_MODEL),
                                reason=f"no shipped model at {DEFAULT_MODEL} yet")


httpx = pytest.importorskip("httpx")


TOKEN = "s3cret-token"


@pytest.fixture(scope="module")
def strict_url(predictor):
    """Token required, at most 4 programs and 64 KiB per request."""
    with app_server(predictor, token=TOKEN, max_batch=4, max_body_bytes=64 * 1024, allow_tvmscript=True) as u:
        yield u


def _metric(url, name, headers=None):
    for line in httpx.get(url + "/metrics", headers=headers).text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            yield line


def test_health_devices_models_docs(url, predictor):
    h = httpx.get(url + "/healthz").json()
    assert h["status"] == "ok" and h["model_version"] == predictor.version
    devs = httpx.get(url + "/v1/devices").json()["devices"]
    assert [d["id"] for d in devs] == predictor.devices()
    assert all(d["specs"] for d in devs)
    m = httpx.get(url + "/v1/models").json()["models"][0]
    assert m["model_version"] == predictor.version and m["devices"] == predictor.devices()
    assert m["ensemble_members"] == len(predictor.model.members) and "n_train" in m["training"]
    assert m["trained_devices"] == sorted(predictor.model.summary["train_devices"]) and set(m["trained_devices"]) <= set(m["devices"])
    assert h["confinement"]  # which layers the sandbox workers run under
    assert httpx.get(url + "/docs").status_code == 200
    assert "/v1/predict" in httpx.get(url + "/openapi.json").json()["paths"]


@pytest.fixture(scope="module")
def items(sampled):
    """Workload+trace items of sampled schedules: their answers are cached (TVMScript's never are)."""
    from cdmpp.program.inputs import workload_trace_json
    from cdmpp.zoo import workloads

    return [workload_trace_json(workloads.SAMPLES[name](), s.trace) for name, schs in sampled.items()
            for s in schs[:3]]


def test_metrics_and_caches(url, predictor, device, items):
    def counter(name):
        return float(next(_metric(url, name)).split()[-1])

    body = {"device": device, "programs": items[:5]}
    assert httpx.post(url + "/v1/predict", json=body).status_code == 200
    preds, feats = counter("cdmpp_prediction_cache_hits_total"), counter("cdmpp_feature_cache_hits_total")
    first = httpx.post(url + "/v1/predict", json=body).json()["predictions"]
    assert counter("cdmpp_prediction_cache_hits_total") - preds == 5  # re-asked: no parsing, no model
    other = [d for d in predictor.devices() if d != device and predictor.target_kind(d) == "llvm"]
    if other:  # same programs, another device: features reused, model run
        r = httpx.post(url + "/v1/predict", json={**body, "device": other[0]})
        assert r.status_code == 200 and counter("cdmpp_feature_cache_hits_total") - feats == 5
    assert first == httpx.post(url + "/v1/predict", json=body).json()["predictions"]
    text = httpx.get(url + "/metrics").text
    assert 'cdmpp_requests_total{endpoint="/v1/predict",status="200"}' in text
    assert 'cdmpp_request_duration_seconds_bucket{endpoint="/v1/predict",le="+Inf"}' in text
    assert counter("cdmpp_programs_predicted_total") >= 15


def test_bad_programs_422_name_items(url, device, texts):
    body = {"device": device, "programs": [texts[0], "def nonsense(:", texts[1], {"workload": 1, "trace": []}]}
    r = httpx.post(url + "/v1/predict", json=body)
    assert r.status_code == 422
    errors = {e["index"]: e["reason"] for e in r.json()["errors"]}
    assert set(errors) == {1, 3} and all(errors.values())
    assert "program 1" in r.json()["detail"]
    # a target the service does not know, a malformed body, wrong types: 422, never 500
    assert httpx.post(url + "/v1/predict", json={**body, "programs": texts[:1], "target": "vulkan"}).status_code == 422
    assert httpx.post(url + "/v1/predict", content=b"{not json",
                      headers={"content-type": "application/json"}).status_code == 422
    assert httpx.post(url + "/v1/predict", json={"programs": texts[:1]}).status_code == 422
    r = httpx.post(url + "/v1/predict", json={"device": device, "programs": [texts[0], 5]})
    assert r.status_code == 422 and [e["index"] for e in r.json()["errors"]] == [1]
    r = httpx.post(url + "/v1/predict", json={"device": device, "programs": [{"trace": []}], "workload": "junk"})
    assert r.status_code == 422 and "shared workload" in r.json()["detail"]
    # the service is unhurt
    assert httpx.post(url + "/v1/predict", json={"device": device, "programs": texts[:2]}).status_code == 200


def test_unknown_device_404(url, predictor, texts):
    from cdmpp.predict.client import Client
    from cdmpp.predict.predictor import UnknownDeviceError

    r = httpx.post(url + "/v1/predict", json={"device": "no-such-gpu", "programs": texts[:1]})
    assert r.status_code == 404 and r.json()["known_devices"] == predictor.devices()
    with pytest.raises(UnknownDeviceError) as e:
        Client(url).predict(texts[:1], "no-such-gpu")
    assert e.value.known == predictor.devices() and e.value.device == "no-such-gpu"


def test_token_401(strict_url, device, texts):
    from cdmpp.predict.client import Client, ServiceError

    body = {"device": device, "programs": texts[:1]}
    assert httpx.post(strict_url + "/v1/predict", json=body).status_code == 401
    r = httpx.post(strict_url + "/v1/predict", json=body, headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    assert httpx.get(strict_url + "/v1/devices").status_code == 401
    assert httpx.get(strict_url + "/metrics").status_code == 401
    assert httpx.get(strict_url + "/healthz").status_code == 200  # load balancers probe without a token
    with pytest.raises(ServiceError) as e:
        Client(strict_url, retries=0).predict(texts[:1], device)
    assert e.value.status == 401
    assert len(Client(strict_url, token=TOKEN).predict(texts[:1], device)) == 1


def test_batch_over_limit_413(strict_url, device, texts):
    auth = {"Authorization": f"Bearer {TOKEN}"}
    r = httpx.post(strict_url + "/v1/predict", json={"device": device, "programs": texts[:1] * 5}, headers=auth)
    assert r.status_code == 413 and r.json()["limit"] == 4 and "CDMPP_MAX_BATCH" in r.json()["detail"]


def test_body_too_large_413(strict_url, device):
    auth = {"Authorization": f"Bearer {TOKEN}", "content-type": "application/json"}
    big = json.dumps({"device": device, "programs": ["x" * (100 * 1024)]}).encode()
    r = httpx.post(strict_url + "/v1/predict", content=big, headers=auth)  # judged on Content-Length
    assert r.status_code == 413 and r.json()["limit"] == 64 * 1024

    def chunks():  # no Content-Length: judged on the bytes that arrive
        yield b'{"device": "x", "programs": ["'
        for _ in range(20):
            yield b"y" * 8192
        yield b'"]}'

    r = httpx.post(strict_url + "/v1/predict", content=chunks(), headers=auth)
    assert r.status_code == 413
    assert httpx.get(strict_url + "/healthz").status_code == 200
    assert 'endpoint="/v1/predict",status="413"' in httpx.get(strict_url + "/metrics", headers=auth).text


def test_timeout_504(predictor, device, sampled):
    from cdmpp.predict.client import Client, ServiceError

    fresh = [s.mod.script() for s in sampled["conv2d"][3:6]]  # not seen by any server yet
    with app_server(predictor, timeout_s=0.001, allow_tvmscript=True) as u:
        r = httpx.post(u + "/v1/predict", json={"device": device, "programs": fresh})
        # 504: the sandbox's work overran; on a loaded machine the 1 ms may pass while the body is still parsed (503)
        assert (r.status_code == 504 or (r.status_code == 503 and "body parsing" in r.json()["detail"]))
        assert "CDMPP_TIMEOUT_S" in r.json()["detail"]
        with pytest.raises(ServiceError) as e:
            Client(u, retries=0).predict(fresh, device)
        # the first overrun taught admission this server's pace: it may now refuse at once (503) instead
        assert e.value.status in (503, 504)
        assert httpx.get(u + "/healthz").status_code == 200


def test_tvmscript_off_by_default_workload_trace_on(predictor, device, sampled, texts):
    """Over HTTP TVMScript is refused unless the operator allows it (422 naming the flag); the
    MetaSchedule workload+trace form always works, and TVM objects sent by Client travel in it, for seconds
    or for order."""
    from cdmpp.predict.client import Client
    from cdmpp.program.inputs import workload_trace_json
    from cdmpp.zoo import workloads

    schs = sampled["matmul"][:3]
    items = [workload_trace_json(workloads.matmul(), s.trace) for s in schs]
    with app_server(predictor) as u:
        r = httpx.post(u + "/v1/predict", json={"device": device, "programs": [items[0], texts[0]]})
        assert r.status_code == 422 and [e["index"] for e in r.json()["errors"]] == [1]
        assert "--allow-tvmscript" in r.json()["errors"][0]["reason"]
        r = httpx.post(u + "/v1/predict", json={"device": device, "programs": items})
        assert r.status_code == 200 and all(p["in_distribution"] in (True, False) for p in r.json()["predictions"])
        want = [p.seconds for p in predictor.predict(schs, device)]
        np.testing.assert_allclose([p.seconds for p in Client(u).predict(schs, device)], want, rtol=1e-5)
        # the seconds that order a task's programs (a search's question) are cached apart from the seconds
        ordered = [p.seconds for p in predictor.predict(schs, device, order=True)]
        np.testing.assert_allclose([p.seconds for p in Client(u).predict(schs, device, order=True)], ordered, rtol=1e-5)
        np.testing.assert_allclose([p.seconds for p in Client(u).predict(schs, device)], want, rtol=1e-5)


def test_killed_workers_are_replaced_and_healthz_says_degraded(predictor, device, sampled):
    """Workers killed from outside (as the deadline or a crash kills them): /healthz reports the pool
    short, the next request is still answered, and the pool is whole again within seconds."""
    import os
    import signal
    import time

    from cdmpp.service.app import Settings, create_app
    from cdmpp.service.background import BackgroundServer

    fresh = [s.mod.script() for s in sampled["layer_norm"][3:5]]
    app = create_app(Settings(featurize_procs=2, allow_tvmscript=True), predictor)
    with BackgroundServer(app) as u:
        sandbox = app.state.engine.sandbox
        for w in list(sandbox._all):
            os.kill(w.proc.pid, signal.SIGKILL)
        r = httpx.post(u + "/v1/predict", json={"device": device, "programs": fresh}, timeout=120)
        assert r.status_code == 200 and len(r.json()["predictions"]) == 2
        assert sandbox.restarts >= 1
        deadline = time.monotonic() + 10
        while httpx.get(u + "/healthz").json()["status"] != "ok":
            assert time.monotonic() < deadline, "pool not whole again within 10 s"
            time.sleep(0.1)
        h = httpx.get(u + "/healthz").json()
        assert h["workers_ready"] == h["workers"] == 2


@pytest.mark.slow
@pytest.mark.skipif(not __import__("os").path.isdir("/proc"), reason="needs /proc")
def test_killed_server_leaves_no_featurizer_processes(tmp_path):
    """``cdmpp serve`` killed with SIGKILL: its forkserver and sandbox workers notice, exit and remove
    their folders."""
    import signal
    import time

    from cdmpp.bench.serve import start_server

    proc, url = start_server(None, workers=1, threads=1, port=free_port(), featurize_procs=2,
                             env_extra={"TMPDIR": str(tmp_path)})
    assert len(list(tmp_path.glob("cdmpp-sandbox-*"))) == 2
    try:
        workers = descendants(proc.pid)
        assert len(workers) >= 3  # the forkserver and two workers
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and any(map(running, workers)):
        time.sleep(0.2)
    assert not [w for w in workers if running(w)], "featurizer processes outlived the server"
    # workers remove their own folders where they may (not here, when they run as nobody under a root-only
    # folder); the next sandbox started removes what is left
    from cdmpp.sandbox.pool import remove_stale_folders

    remove_stale_folders(str(tmp_path))
    assert not list(tmp_path.glob("cdmpp-sandbox-*")), "worker folders left behind"


@pytest.mark.slow
def test_network_endpoint_answers_as_the_cli_does(predictor, tmp_path):
    """POST /v1/network: the same weighted sum ``cdmpp network`` computes; unknown names are 404s."""
    from pathlib import Path

    from cdmpp.devices.table import DeviceTable
    from cdmpp.predict import network
    from cdmpp.zoo.tasks import TaskTable

    data = Path(__file__).resolve().parents[2] / "datasets"
    dev = "amd-epyc-znver4-2t/llvm-avx512"
    # timeout_s: a fresh clone under load rebuilds the network's programs from their records for over the
    # default 30 s (a 504 saying "retry later"); this test is about the answer, not the time
    with app_server(predictor, dataset=str(data / "measurements"), task_table=str(data / "tasks-llvm.json.gz"),
                    timeout_s=600) as u:
        r = httpx.post(u + "/v1/network", json={"network": "bert_tiny@1", "device": dev}, timeout=600)
        assert r.status_code == 200, r.text
        got = r.json()
        assert httpx.post(u + "/v1/network", json={"network": "nosuch@1", "device": dev}).status_code == 404
        assert httpx.post(u + "/v1/network", json={"network": "bert_tiny@1", "device": "nosuch"}).status_code == 404
        assert httpx.post(u + "/v1/network", json={"network": "bert_tiny@1", "device": dev,
                                                   "schedules": "tuned"}).status_code == 422
    programs = network.task_programs("bert_tiny@1", TaskTable.load(str(data / "tasks-llvm.json.gz")), "best-measured",
                                     dev, str(data / "measurements"),
                                     DeviceTable(data / "devices.json").get(dev).make_target())
    want = network.predict_network(predictor, "bert_tiny@1", dev, programs)
    assert got["seconds"] == pytest.approx(want.seconds, rel=1e-5)
    assert [t["task"] for t in got["tasks"]] == [t["task"] for t in want.tasks]
    assert got["lo90"] <= got["seconds"] <= got["hi90"]
