"""The HTTP service end to end: real uvicorn servers on 127.0.0.1 (ephemeral ports, background threads)
serving the shipped model, driven over real sockets by httpx and ``cdmpp.client.Client``."""

import json

import numpy as np
import pytest

from cdmpp.predictor import DEFAULT_MODEL

pytestmark = pytest.mark.skipif(not (DEFAULT_MODEL / "predictor.json").exists(),
                                reason=f"no shipped model at {DEFAULT_MODEL} yet")

httpx = pytest.importorskip("httpx")
TOKEN = "s3cret-token"


def _server(predictor, **settings):
    from cdmpp.service.app import Settings, create_app
    from cdmpp.service.background import BackgroundServer

    return BackgroundServer(create_app(Settings(**settings), predictor))


@pytest.fixture(scope="module")
def url(predictor):
    """A server for trusted callers: TVMScript allowed (the tests' programs are TVMScript text)."""
    with _server(predictor, allow_tvmscript=True) as u:
        yield u


@pytest.fixture(scope="module")
def strict_url(predictor):
    """Token required, at most 4 programs and 64 KiB per request."""
    with _server(predictor, token=TOKEN, max_batch=4, max_body_bytes=64 * 1024, allow_tvmscript=True) as u:
        yield u


@pytest.fixture(scope="module")
def texts(sampled):
    """TVMScript of sampled schedules of every test workload."""
    return [s.mod.script() for schs in sampled.values() for s in schs[:3]]


def test_health_devices_models_docs(url, predictor):
    h = httpx.get(url + "/healthz").json()
    assert h["status"] == "ok" and h["model_version"] == predictor.version
    devs = httpx.get(url + "/v1/devices").json()["devices"]
    assert [d["id"] for d in devs] == predictor.devices()
    assert all(d["specs"] for d in devs)
    m = httpx.get(url + "/v1/models").json()["models"][0]
    assert m["model_version"] == predictor.version and m["devices"] == predictor.devices()
    assert m["ensemble_members"] == len(predictor.model.members) and "n_train" in m["training"]
    assert httpx.get(url + "/docs").status_code == 200
    assert "/v1/predict" in httpx.get(url + "/openapi.json").json()["paths"]


def test_client_round_trip_equals_in_process(url, predictor, device, sampled, texts):
    from cdmpp import workloads
    from cdmpp.client import Client
    from cdmpp.program import workload_trace_json

    with Client(url) as c:
        assert c.health()["status"] == "ok"
        assert [d["id"] for d in c.devices()] == predictor.devices()
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


def _metric(url, name, headers=None):
    for line in httpx.get(url + "/metrics", headers=headers).text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            yield line


def test_metrics_and_caches(url, predictor, device, texts):
    def counter(name):
        return float(next(_metric(url, name)).split()[-1])

    body = {"device": device, "programs": texts[:5]}
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


def test_client_raises_program_error(url, device, texts):
    from cdmpp.client import Client
    from cdmpp.program import ProgramError

    with pytest.raises(ProgramError) as e:
        Client(url).predict([texts[0], "garbage"], device)
    assert [x["index"] for x in e.value.errors] == [1]


def test_unknown_device_404(url, predictor, texts):
    from cdmpp.client import Client
    from cdmpp.predictor import UnknownDeviceError

    r = httpx.post(url + "/v1/predict", json={"device": "no-such-gpu", "programs": texts[:1]})
    assert r.status_code == 404 and r.json()["known_devices"] == predictor.devices()
    with pytest.raises(UnknownDeviceError) as e:
        Client(url).predict(texts[:1], "no-such-gpu")
    assert e.value.known == predictor.devices() and e.value.device == "no-such-gpu"


def test_token_401(strict_url, device, texts):
    from cdmpp.client import Client, ServiceError

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
    from cdmpp.client import Client, ServiceError

    fresh = [s.mod.script() for s in sampled["conv2d"][3:6]]  # not seen by any server yet
    with _server(predictor, timeout_s=0.001, allow_tvmscript=True) as u:
        r = httpx.post(u + "/v1/predict", json={"device": device, "programs": fresh})
        assert r.status_code == 504 and "CDMPP_TIMEOUT_S" in r.json()["detail"]
        with pytest.raises(ServiceError) as e:
            Client(u, retries=0).predict(fresh, device)
        assert e.value.status == 504
        assert httpx.get(u + "/healthz").status_code == 200


def test_client_retries_5xx_then_succeeds():
    from cdmpp.client import Client, ServiceError

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
    from cdmpp.client import Client

    tries = []

    def handler(request):
        tries.append(1)
        raise httpx.ConnectError("refused", request=request)

    c = Client("http://cdmpp.test", retries=2, backoff_s=0.001, transport=httpx.MockTransport(handler))
    with pytest.raises(httpx.ConnectError):
        c.health()
    assert len(tries) == 3


def test_tvmscript_off_by_default_workload_trace_on(predictor, device, sampled, texts):
    """Over HTTP TVMScript is refused unless the operator allows it (422 naming the flag); the
    MetaSchedule workload+trace form always works, and TVM objects sent by Client travel in it."""
    from cdmpp import workloads
    from cdmpp.client import Client
    from cdmpp.program import workload_trace_json

    schs = sampled["matmul"][:3]
    items = [workload_trace_json(workloads.matmul(), s.trace) for s in schs]
    with _server(predictor) as u:
        r = httpx.post(u + "/v1/predict", json={"device": device, "programs": [items[0], texts[0]]})
        assert r.status_code == 422 and [e["index"] for e in r.json()["errors"]] == [1]
        assert "--allow-tvmscript" in r.json()["errors"][0]["reason"]
        r = httpx.post(u + "/v1/predict", json={"device": device, "programs": items})
        assert r.status_code == 200 and all(p["in_distribution"] in (True, False) for p in r.json()["predictions"])
        want = [p.seconds for p in predictor.predict(schs, device)]
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


def _children(pid: int) -> set[int]:
    """Pids whose parent is ``pid`` (from /proc)."""
    import os

    out = set()
    for d in filter(str.isdigit, os.listdir("/proc")):
        try:
            if int(open(f"/proc/{d}/stat").read().rsplit(")", 1)[1].split()[1]) == pid:
                out.add(int(d))
        except OSError:
            pass
    return out


def _running(pid: int) -> bool:
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _descendants(pid: int) -> set[int]:
    out, todo = set(), [pid]
    while todo:
        kids = _children(todo.pop())
        out |= kids
        todo += kids
    return out


@pytest.mark.skipif(not __import__("os").path.isdir("/proc"), reason="needs /proc")
def test_killed_server_leaves_no_featurizer_processes(tmp_path):
    """``cdmpp serve`` killed with SIGKILL: its forkserver and sandbox workers notice, exit and remove
    their folders."""
    import signal
    import time

    from cdmpp.bench_serve import _free_port, start_server

    proc, url = start_server(None, workers=1, threads=1, port=_free_port(), featurize_procs=2,
                             env_extra={"TMPDIR": str(tmp_path)})
    assert len(list(tmp_path.glob("cdmpp-sandbox-*"))) == 2
    try:
        workers = _descendants(proc.pid)
        assert len(workers) >= 3  # the forkserver and two workers
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and any(map(_running, workers)):
        time.sleep(0.2)
    assert not [w for w in workers if _running(w)], "featurizer processes outlived the server"
    # workers remove their own folders where they may (not here, when they run as nobody under a root-only
    # folder); the next sandbox started removes what is left
    from cdmpp.sandbox import remove_stale_folders

    remove_stale_folders(str(tmp_path))
    assert not list(tmp_path.glob("cdmpp-sandbox-*")), "worker folders left behind"


def test_ood_flags_in_prediction(predictor, device, sampled):
    """Each prediction says why it may lie outside what the model was trained on: a device without
    training data, a target kind the device does not run, features outside the training range."""
    import copy

    from cdmpp.features import featurize
    from cdmpp.predictor import DEVICE_UNTRAINED, FEATURES_OUT_OF_RANGE, TARGET_MISMATCH, Predictor
    from cdmpp.transforms import FeatureNormalizer

    feats = [featurize(s.mod) for s in sampled["matmul"][:3]]
    model = copy.copy(predictor.model)
    norm = FeatureNormalizer().fit(np.concatenate([f.leaf_features for f in feats[:2]]))
    model.feature_normalizer = norm  # a model "trained" on two programs, on one device only
    others = [d for d in predictor.devices() if d != device]
    model.summary = {**predictor.model.summary, "train_devices": [device]}
    p = Predictor(model)
    assert [x.ood for x in p.predict_features(feats[:2], device, "llvm")] == [(), ()]
    assert all(x.in_distribution for x in p.predict_features(feats[:2], device, "llvm"))
    far = copy.copy(feats[0])
    far.leaf_features = feats[0].leaf_features * 4 + 1  # every value beyond the training maximum
    assert p.predict_features([far], device, "llvm")[0].ood == (FEATURES_OUT_OF_RANGE,)
    assert p.predict_features(feats[:1], device, "cuda")[0].ood == (TARGET_MISMATCH,)
    if others:
        assert DEVICE_UNTRAINED in p.predict_features(feats[:1], others[0], "llvm")[0].ood
    # a checkpoint without the range still flags values a constant training column never had
    del norm.min_, norm.max_
    const = int(np.nonzero(norm.inv_scale_ == 0)[0][0])
    odd = copy.copy(feats[0])
    odd.leaf_features = feats[0].leaf_features.copy()
    odd.leaf_features[:, const] += 5
    assert p.predict_features([odd], device, "llvm")[0].ood == (FEATURES_OUT_OF_RANGE,)


def test_network_endpoint_answers_as_the_cli_does(predictor, tmp_path):
    """POST /v1/network: the same weighted sum ``cdmpp network`` computes; unknown names are 404s."""
    from pathlib import Path

    from cdmpp import network
    from cdmpp.devices import DeviceTable
    from cdmpp.zoo.tasks import TaskTable

    data = Path(__file__).resolve().parent.parent / "datasets"
    dev = "amd-epyc-znver4-2t/llvm-avx512"
    with _server(predictor, dataset=str(data / "measurements"), task_table=str(data / "tasks-llvm.json.gz")) as u:
        r = httpx.post(u + "/v1/network", json={"network": "bert_tiny@1", "device": dev}, timeout=120)
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


def test_bench_serve_in_process_reference(tvm, device):
    """``cdmpp bench serve --in-process``: the requests' programs parsed, featurized and predicted in this
    process, the reference that the wire path's cost per new program is compared with."""
    import json

    from tvm.s_tir.meta_schedule.database import Workload

    from cdmpp import schedules, tvm_env, workloads
    from cdmpp.bench_serve import TaskPrograms, _body, in_process
    from cdmpp.program import to_json_value

    mod = workloads.matmul(32, 32, 32)
    schs = schedules.sample_schedules(mod, tvm_env.make_target("llvm", num_cores=2), 4, 0)
    items = [json.dumps(json.dumps({"trace": to_json_value(s.trace.as_json())}, separators=(",", ":"))).encode()
             for s in schs]
    tp = TaskPrograms("matmul", Workload(mod).as_json(), items)
    r = in_process([_body(tp, [0, 1]), _body(tp, [2, 3])], device, None)
    assert r["programs"] == 4 and r["programs_per_s"] > 0
