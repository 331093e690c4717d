"""The HTTP front door against hostile callers (issue 53, items 2-5): bodies bounded while parsed and
off the event loop, browsers kept out (Content-Type, Origin, Host), admission and fairness under big
requests, short fields, strict types, no filesystem path, and a body that never comes."""

import json
import socket
import threading
import time

import pytest

from cdmpp.defaults import MODEL as DEFAULT_MODEL
from cdmpp.model.kinds import is_checkpoint
from tests.processes import app_server

pytestmark = pytest.mark.skipif(not is_checkpoint(DEFAULT_MODEL), reason="no shipped model")

httpx = pytest.importorskip("httpx")

JSON = {"content-type": "application/json"}


@pytest.fixture(scope="module")
def server(predictor):
    """Default limits (1,024 programs, 16 MiB), a 1 s body deadline, one allowed origin and host name."""
    with app_server(predictor, body_timeout_s=1.0, allowed_origins=("https://ui.example",),
                    allowed_hosts=("cdmpp.internal",)) as u:
        yield u


@pytest.fixture(scope="module")
def task(sampled):
    """(shared workload, JSON text of {"trace": ...}) of one sampled matmul schedule."""
    from cdmpp.program.inputs import workload_trace_json
    from cdmpp.zoo import workloads

    item = workload_trace_json(workloads.matmul(), sampled["matmul"][0].trace)
    return item["workload"], json.dumps({"trace": item["trace"]})


def fresh(trace_text: str, n: int, tag: int) -> list[str]:
    """``n`` programs the server has not seen: the same trace as texts that differ in trailing spaces
    (the caches key items by their bytes, so each is parsed and featurized anew)."""
    return [trace_text + " " * (tag * 4096 + k) for k in range(n)]


def rss_mb() -> float:
    return int(open("/proc/self/status").read().split("VmRSS:")[1].split()[0]) / 1024


class PeakRSS:
    """Peak resident memory of this process (the in-process server's) while the block runs."""

    def __enter__(self):
        self.base, self.peak, self._stop = rss_mb(), 0.0, threading.Event()
        self._t = threading.Thread(target=self._watch, daemon=True)
        self._t.start()
        return self

    def _watch(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_mb())
            time.sleep(0.01)

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()
        self.growth = self.peak - self.base


# ---- item 2: size before work ---------------------------------------------------------------------------
def test_million_programs_is_a_fast_small_413_and_healthz_answers_meanwhile(server, device):
    """Was: 24 s on the event loop, a 159 MB 422 and 3.9 GB RSS (the batch limit came after validation)."""
    body = b'{"device": "%s", "programs": [' % device.encode() + b",".join([b"0"] * 1_000_000) + b"]}"
    health: list[int] = []

    def probe():
        for _ in range(20):
            health.append(httpx.get(server + "/healthz", timeout=5).status_code)

    with PeakRSS() as mem:
        t = threading.Thread(target=probe)
        t.start()
        r = httpx.post(server + "/v1/predict", content=body, headers=JSON, timeout=60)
        t.join()
    assert r.status_code == 413 and r.json()["limit"] == 1024 and "CDMPP_MAX_BATCH" in r.json()["detail"]
    assert len(r.content) < 1000
    assert health == [200] * 20
    assert mem.growth < 300, f"RSS grew {mem.growth:.0f} MB for a refused body"
    for unit in (b'"ab"', b"{}"):  # valid items too
        body = b'{"device": "x", "programs": [' + b",".join([unit] * 1_000_000) + b"]}"
        assert httpx.post(server + "/v1/predict", content=body, headers=JSON, timeout=60).status_code == 413


@pytest.mark.slow
def test_worst_accepted_body_stays_under_1gb(server, device, task):
    """A 16 MiB body of millions of tiny JSON values inside one program: parsed, hashed and refused by the
    sandbox (not a program) with the server's memory < 1 GB above where it was."""
    wl, _ = task
    unit, n = b"[]", (16 * 1024 * 1024 - 200) // 3
    body = (b'{"device": "%s", "programs": [{"workload": "x", "trace": [' % device.encode()
            + b",".join([unit] * n) + b"]}]}")
    assert len(body) <= 16 * 1024 * 1024
    with PeakRSS() as mem:
        r = httpx.post(server + "/v1/predict", content=body, headers=JSON, timeout=120)
    assert r.status_code == 422, r.text[:300]
    assert mem.growth < 1024, f"RSS grew {mem.growth:.0f} MB"


def test_short_fields_are_bounded_and_not_echoed(server, device, task):
    """Was: a 15 MiB device id gave a 15 MiB 404."""
    wl, tr = task
    huge = "d" * (15 * 1024 * 1024)
    for body in ({"device": huge, "programs": [tr], "workload": wl},
                 {"device": device, "programs": [tr], "workload": wl, "target": huge},
                 {"device": "d" * 201, "programs": [tr], "workload": wl}):
        r = httpx.post(server + "/v1/predict", content=json.dumps(body), headers=JSON, timeout=60)
        assert r.status_code == 422 and len(r.content) < 1000 and "200 characters" in r.json()["detail"]
    r = httpx.post(server + "/v1/predict", json={"device": "x" * 200, "programs": [tr], "workload": wl})
    assert r.status_code == 404 and len(r.content) < 4000  # an unknown device of legal length: named, bounded


def test_strict_types_and_duplicate_fields(server, device, task):
    """Was: ``"order": "true"`` was taken as true."""
    wl, tr = task
    for bad in ({"order": "true"}, {"order": 1}, {"device": 5}, {"programs": {"0": tr}}):
        r = httpx.post(server + "/v1/predict", json={"device": device, "programs": [tr], "workload": wl, **bad})
        assert r.status_code == 422, (bad, r.text)
    body = b'{"device": "%s", "device": "other", "programs": []}' % device.encode()
    r = httpx.post(server + "/v1/predict", content=body, headers=JSON)
    assert r.status_code == 422 and "twice" in r.json()["detail"]
    r = httpx.post(server + "/v1/predict", json={"device": device, "programs": [tr], "workload": wl, "order": True})
    assert r.status_code == 200


def test_models_shows_no_path(server, predictor):
    r = httpx.get(server + "/v1/models")
    m = r.json()["models"][0]
    assert r.status_code == 200 and "path" not in m and m["shipped"] is True
    assert str(DEFAULT_MODEL) not in r.text and str(DEFAULT_MODEL.parent) not in r.text


def test_body_shorter_than_content_length_gets_408(server):
    """Was: the connection was held until the client gave up."""
    host, port = server.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=15) as s:
        t0 = time.monotonic()
        s.sendall(f"POST /v1/predict HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
                  "Content-Length: 1000\r\n\r\n{\"device\": ".encode())
        answer = s.recv(4096)
        took = time.monotonic() - t0
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert took < 10
    assert httpx.get(server + "/healthz").status_code == 200


# ---- item 3: a browser is an attacker -------------------------------------------------------------------
def test_browser_requests_are_refused(server, device, task):
    """Was: a text/plain POST from Origin: http://evil.example with a foreign Host got a 200."""
    wl, tr = task
    body = json.dumps({"device": device, "programs": [tr], "workload": wl})
    port = server.rsplit(":", 1)[1]

    def post(**headers):
        return httpx.post(server + "/v1/predict", content=body, headers=headers, timeout=60)

    # a simple (no preflight) cross-site request: text/plain, a form, or no type at all
    for ctype in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", None):
        r = post(**({"content-type": ctype} if ctype else {}))
        assert r.status_code == 415, (ctype, r.status_code)
    # the request: refused whatever else is wrong with it
    r = post(**{"content-type": "text/plain", "origin": "http://evil.example", "host": "evil.example"})
    assert r.status_code in (403, 415, 421)
    assert post(**{**JSON, "origin": "http://evil.example"}).status_code == 403
    assert post(**{**JSON, "origin": "null"}).status_code == 403
    assert httpx.get(server + "/v1/devices", headers={"origin": "http://evil.example"}).status_code == 403
    # DNS rebinding: the attacker's name resolves to us, the browser sends it as Host
    for host in ("evil.example", f"evil.example:{port}", f"127.0.0.1.evil.example:{port}", f"localhost:{int(port) + 1}",
                 "", "[::1]:x"):
        r = post(**{**JSON, "host": host})
        assert r.status_code in (400, 421), (host, r.status_code)
    assert httpx.get(server + "/v1/models", headers={"host": "evil.example"}).status_code == 421
    # what is allowed: our own names at our port, the operator's host names and origins
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"LOCALHOST:{port}", "cdmpp.internal",
                 "cdmpp.internal:443"):
        assert post(**{**JSON, "host": host}).status_code == 200, host
    assert post(**{"content-type": "application/json; charset=utf-8"}).status_code == 200
    r = post(**{**JSON, "origin": "https://ui.example"})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "https://ui.example"
    pre = httpx.options(server + "/v1/predict", headers={"origin": "https://ui.example",
                                                         "access-control-request-method": "POST",
                                                         "access-control-request-headers": "content-type"})
    assert pre.status_code == 200 and "POST" in pre.headers["access-control-allow-methods"]
    # load balancers probe with any Host, and the probes stay answerable
    assert httpx.get(server + "/healthz", headers={"host": "10.1.2.3:8000"}).status_code == 200
    assert httpx.get(server + "/readyz", headers={"host": "lb.example"}).status_code == 200


# ---- item 4: admission and fairness ---------------------------------------------------------------------
@pytest.mark.slow
def test_cached_request_is_not_stuck_behind_two_large_ones(predictor, device, task):
    """Was: two requests of 1,024 new programs made a one-program cached request wait 16.5 s. A tuner's candidates,
    as a tuner sends them (unbuilt: ``build`` false)."""
    wl, tr = task
    with app_server(predictor, featurize_procs=2, threads=2, timeout_s=120) as u:
        small = {"device": device, "programs": [tr], "workload": wl, "build": False}
        assert httpx.post(u + "/v1/predict", json=small, timeout=60).status_code == 200  # now cached
        done: dict[str, float] = {}
        codes: dict[str, int] = {}

        def large(tag: int):
            body = {"device": device, "programs": fresh(tr, 1024, tag), "workload": wl, "build": False}
            r = httpx.post(u + "/v1/predict", json=body, timeout=300)
            codes[f"large{tag}"], done[f"large{tag}"] = r.status_code, time.monotonic()

        threads = [threading.Thread(target=large, args=(k,)) for k in (1, 2)]
        for t in threads:
            t.start()
        time.sleep(2.0)  # both are parsed and running by now
        latencies = []
        for _ in range(5):
            t0 = time.monotonic()
            r = httpx.post(u + "/v1/predict", json=small, timeout=60)
            latencies.append(time.monotonic() - t0)
            assert r.status_code == 200
        done["cached"] = time.monotonic()
        for t in threads:
            t.join()
    print(f"cached one-program request under two 1,024-program requests: {[round(x, 3) for x in latencies]} s")
    assert codes == {"large1": 200, "large2": 200}
    assert done["cached"] < min(done["large1"], done["large2"]), "the cached request waited for a large one"
    assert max(latencies) < 5.0  # the target is < 1 s; the bound is loose for a loaded test machine


@pytest.mark.slow
def test_work_that_cannot_start_in_time_is_refused_at_once(predictor, device, task):
    """Was: queued requests waited to a 504 at the deadline while /healthz said ok. A tuner's candidates (unbuilt)."""
    from cdmpp.predict.predictor import Predictor

    wl, tr = task
    cold = Predictor(predictor.model)  # a feature cache of its own: the session's has seen fresh(tr, 1024, 1)
    with app_server(cold, featurize_procs=1, threads=1, timeout_s=6) as u:
        small = {"device": device, "programs": [tr], "workload": wl, "build": False}
        assert httpx.post(u + "/v1/predict", json=small, timeout=60).status_code == 200
        warm = {**small, "programs": fresh(tr, 128, 3)}  # the large lane learns its pace
        assert httpx.post(u + "/v1/predict", json=warm, timeout=60).status_code == 200
        assert httpx.get(u + "/readyz").status_code == 200
        first: list = []
        t = threading.Thread(target=lambda: first.append(httpx.post(
            u + "/v1/predict", json={**small, "programs": fresh(tr, 1024, 1)}, timeout=60)))
        t.start()
        deadline = time.monotonic() + 30
        while httpx.get(u + "/healthz").json()["saturated"] is False:  # parsed and started
            assert time.monotonic() < deadline, "a 1,024-program job on one thread never saturated the lane"
            time.sleep(0.05)
        ready = httpx.get(u + "/readyz")
        assert ready.status_code == 503 and ready.headers["retry-after"]
        t0 = time.monotonic()
        r = httpx.post(u + "/v1/predict", json={**small, "programs": fresh(tr, 1024, 2)}, timeout=60)
        refused_in = time.monotonic() - t0
        assert r.status_code == 503 and int(r.headers["retry-after"]) >= 1 and "saturated" in r.json()["detail"]
        assert refused_in < 3.0  # at once, not at the 6 s deadline
        assert httpx.post(u + "/v1/predict", json=small, timeout=60).status_code == 200  # cached: still served
        assert 'cdmpp_lane_refused_total{lane="large"} 1' in httpx.get(u + "/metrics").text
        t.join()
        assert first[0].status_code in (200, 504)
        deadline = time.monotonic() + 30
        while httpx.get(u + "/readyz").status_code != 200:
            assert time.monotonic() < deadline, "readyz never recovered"
            time.sleep(0.1)


def test_operator_names_from_the_environment_and_host_parsing():
    from cdmpp.service.app import Settings
    from cdmpp.service.middleware import _split_host

    s = Settings.from_env({"CDMPP_ALLOWED_HOSTS": "cdmpp.internal, api.example:443", "CDMPP_ALLOW_ORIGINS":
                           "https://ui.example", "CDMPP_BODY_TIMEOUT_S": "5"})
    assert s.allowed_hosts == ("cdmpp.internal", "api.example:443") and s.allowed_origins == ("https://ui.example",)
    assert s.body_timeout_s == 5.0 and Settings.from_env({}).allowed_hosts == ()
    assert _split_host("LocalHost.:8000") == ("localhost", 8000)
    assert _split_host("[::1]:8000") == ("::1", 8000) and _split_host("[::1]") == ("::1", None)
    assert _split_host("a:b") == ("", None) and _split_host("[::1]x") == ("", None)
