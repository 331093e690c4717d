"""A hostile campaign against a real ``cdmpp serve`` (issue 53, items 2-5), by category, with counts:

    .venv/bin/python -m tests.service.campaign_http [--json out.json]

Starts its own server (``cdmpp serve --featurize-procs 2``, default limits), sends malformed bodies,
oversized lists and strings, browser-style requests (content types, origins, rebinding Hosts), wrong
types, bodies that never finish, and big concurrent requests with cached ones beside them; prints the
statuses per category, the 5xx that were not a designed 503 (saturated, with Retry-After), the largest
answer, the server's peak memory above idle, and the cached request's latencies under load.
"""

from __future__ import annotations

import argparse
import json
import random
import socket
import threading
import time
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor

import httpx

from cdmpp.bench.serve import start_server
from cdmpp.defaults import MODEL
from tests.processes import descendants, free_port
from tests.service.test_hostile import malformed_bodies, tvm_programs

JSON = {"content-type": "application/json"}


class Campaign:
    def __init__(self, url: str, pid: int):
        self.url, self.pid = url, pid
        self.port = int(url.rsplit(":", 1)[1])
        self.status: dict[str, Counter] = defaultdict(Counter)
        self.bad: list[str] = []  # 5xx that were not a designed 503
        self.biggest = (0, "")
        self.lock = threading.Lock()

    def record(self, cat: str, r: httpx.Response | int, what: str, size: int = 0) -> None:
        code = r if isinstance(r, int) else r.status_code
        size = size if isinstance(r, int) else len(r.content)
        designed = (code == 503 and not isinstance(r, int) and "retry-after" in r.headers)
        with self.lock:
            self.status[cat][code] += 1
            if code >= 500 and not designed:
                self.bad.append(f"{cat}: {code} for {what[:150]}")
            if size > self.biggest[0]:
                self.biggest = (size, f"{cat}: {what[:100]}")

    def post(self, cat: str, body: bytes, headers=JSON, path="/v1/predict", what: str = "", timeout=120):
        try:
            r = httpx.post(self.url + path, content=body, headers=headers, timeout=timeout)
        except httpx.TransportError as e:
            with self.lock:
                self.status[cat][f"transport:{type(e).__name__}"] += 1
            return None
        self.record(cat, r, what or repr(body[:100]))
        return r

    def get(self, cat: str, path: str, headers=None):
        r = httpx.get(self.url + path, headers=headers or {}, timeout=60)
        self.record(cat, r, f"GET {path} {headers}")
        return r

    def rss_mb(self) -> float:
        """Resident memory of the server and its process tree but the sandbox workers' (the server alone)."""
        return int(open(f"/proc/{self.pid}/status").read().split("VmRSS:")[1].split()[0]) / 1024


def run(json_out: str | None) -> dict:
    rng = random.Random(53)
    good, odd = tvm_programs()
    port = free_port()
    proc, url = start_server(None, workers=1, threads=2, port=port, featurize_procs=2)
    out: dict = {}
    try:
        # the server is the uvicorn process itself (python -m cdmpp.cli serve)
        c = Campaign(url, proc.pid)
        device = next(d["id"] for d in httpx.get(url + "/v1/devices").json()["devices"] if "llvm" in d["id"])
        wl, tr = good[0]["workload"], json.dumps({"trace": good[0]["trace"]})
        valid = {"device": device, "programs": [tr], "workload": wl}
        assert c.post("valid", json.dumps(valid).encode()).status_code == 200
        idle = c.rss_mb()
        peak = [idle]
        stop = threading.Event()

        def watch():
            while not stop.is_set():
                try:
                    peak[0] = max(peak[0], c.rss_mb())
                except (OSError, IndexError):  # the server ended (the campaign failed)
                    return
                time.sleep(0.02)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()

        # 1. bodies that are not strict JSON or not a request
        for seed in (1, 2, 3):
            for b in malformed_bodies(device, good, random.Random(seed)):
                c.post("malformed", b)

        # 2. size: counts and string lengths bounded while parsing
        t_big = []
        for n, unit in ((1_000_000, b"{}"), (1_000_000, b'"ab"'), (2_000_000, b"0"), (1025, b"{}"), (5000, b"[]")):
            for _ in range(3):
                body = b'{"device": "%s", "programs": [' % device.encode() + b",".join([unit] * n) + b"]}"
                t0 = time.monotonic()
                c.post("size", body, what=f"{n} x {unit!r}")
                t_big.append(time.monotonic() - t0)
        for field in ("device", "target"):
            for n in (201, 10_000, 15 * 1024 * 1024):
                c.post("size", json.dumps({**valid, field: "d" * n}).encode(), what=f"{field} of {n}")
        for _ in range(3):
            c.post("size", b'{"device": "x", "programs": ["' + b"x" * (17 * 1024 * 1024) + b'"]}', what="17 MiB")
            c.post("size", b'{"device": "x", "programs": [' + b"[" * 100_000 + b"]" * 100_000 + b"]}", what="deep")
            c.post("size", b'{' + b",".join(b'"k%d": 0' % i for i in range(100)) + b"}", what="100 fields")
        n = (16 * 1024 * 1024 - 200) // 3
        for _ in range(2):  # the worst accepted body: millions of tiny values inside one program
            c.post("size", b'{"device": "%s", "programs": [{"workload": "x", "trace": [' % device.encode()
                   + b",".join([b"[]"] * n) + b"]}]}", what="16 MiB of []")
        out["size_max_s"] = round(max(t_big), 3)

        # 3. browsers: content type, Origin, Host (DNS rebinding), repeated headers
        body = json.dumps(valid).encode()
        ctypes = ["text/plain", "text/plain; charset=utf-8", "application/x-www-form-urlencoded",
                  "multipart/form-data; boundary=x", "application/jsonx", "text/json", "application/xml", ""]
        origins = ["http://evil.example", "null", "https://evil.example:8443", f"http://localhost:{port + 1}",
                   f"http://127.0.0.1:{port}.evil.example", "file://", "chrome-extension://abc"]
        hosts = ["evil.example", f"evil.example:{port}", f"127.0.0.1.nip.io:{port}", f"localhost:{port + 1}",
                 f"127.0.0.2:{port}", "0.0.0.0", f"[::2]:{port}", "x" * 300, f"localhost:{port}:1", "[::1]:x"]
        for _ in range(3):
            for path in ("/v1/predict", "/v1/network"):
                for ct in ctypes:
                    c.post("browser", body, {"content-type": ct} if ct else {}, path, f"ct={ct!r}")
                for o in origins:
                    c.post("browser", body, {**JSON, "origin": o}, path, f"origin={o}")
                    c.post("browser", body, {"content-type": "text/plain", "origin": o}, path, f"plain origin={o}")
                for h in hosts:
                    c.post("browser", body, {**JSON, "host": h}, path, f"host={h}")
            for path in ("/v1/devices", "/v1/models", "/metrics", "/docs", "/openapi.json"):
                for o in origins:
                    c.get("browser", path, {"origin": o})
                for h in hosts:
                    c.get("browser", path, {"host": h})
        for hdrs in ([("host", f"127.0.0.1:{port}"), ("host", "evil.example")],
                     [("origin", "http://a"), ("origin", "http://b")],
                     [("content-type", "application/json"), ("content-type", "text/plain")]):
            for _ in range(5):
                c.post("browser", body, httpx.Headers(hdrs), what=f"repeated {hdrs[0][0]}")

        # 4. strict types and fields
        for v in ("true", "false", 1, 0, None, "yes", [], {}, 1.0):
            for _ in range(3):
                c.post("types", json.dumps({**valid, "order": v}).encode(), what=f"order={v!r}")
        for k, v in (("device", 5), ("device", None), ("device", ["x"]), ("target", 1), ("target", ["llvm"]),
                     ("programs", {"0": tr}), ("programs", tr), ("programs", None)):
            for _ in range(3):
                c.post("types", json.dumps({**valid, k: v}).encode(), what=f"{k}={v!r}")
        for _ in range(10):
            c.post("types", b'{"device": "%s", "device": "x", "programs": []}' % device.encode(), what="dup")
            c.post("types", json.dumps({"k" * 100: 1, **valid}).encode(), what="long key")

        # 5. leaks: the model's path, echoes of long ids
        for _ in range(10):
            r = c.get("leaks", "/v1/models")
            assert "path" not in r.json()["models"][0] and str(MODEL.parent) not in r.text
            r = c.post("leaks", json.dumps({**valid, "device": "z" * 200}).encode(), what="unknown device 200")
            assert len(r.content) < 4096

        # 6. bodies that never finish: Content-Length larger than what is sent
        def short_body(k: int):
            with socket.create_connection(("127.0.0.1", port), timeout=90) as s:
                t0 = time.monotonic()
                s.sendall(f"POST /v1/predict HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
                          f"Content-Length: {1000 + k}\r\n\r\n{{\"device\": ".encode())
                try:
                    ans = s.recv(64)
                except socket.timeout:
                    ans = b""
                took = time.monotonic() - t0
            code = int(ans.split()[1]) if ans.startswith(b"HTTP/1.1") else 0
            c.record("slow-body", code, "content-length > body")
            return took

        with ThreadPoolExecutor(20) as pool:
            out["slow_body_max_s"] = round(max(pool.map(short_body, range(20))), 2)

        # 7. admission and fairness: cached one-program requests beside 2, then 6, big new requests
        for big, tag in ((2, 1), (6, 2)):
            lat: list[float] = []
            ready: Counter = Counter()
            threads = []
            for k in range(big):
                items = [tr + " " * j + "\n" * (8 * tag + k) for j in range(1024)]  # new to the server
                b = json.dumps({"device": device, "programs": items, "workload": wl}).encode()
                threads.append(threading.Thread(target=c.post, args=("admission", b), kwargs={"what": "1024 new"}))
            for t in threads:
                t.start()
                time.sleep(0.3)
            while any(t.is_alive() for t in threads):
                t0 = time.monotonic()
                c.post("admission", json.dumps(valid).encode(), what="cached one-program")
                lat.append(time.monotonic() - t0)
                ready[httpx.get(url + "/readyz").status_code] += 1
                time.sleep(0.2)
            for t in threads:
                t.join()
            out[f"cached_latency_under_{big}_large_s"] = {"n": len(lat), "max": round(max(lat), 3),
                                                          "p50": round(sorted(lat)[len(lat) // 2], 3)}
            out[f"readyz_under_{big}_large"] = dict(ready)
        stop.set()
        watcher.join()
        out["server_rss_idle_mb"], out["server_rss_peak_mb"] = round(idle), round(peak[0])
        # the server is unhurt and says so
        assert c.post("valid", json.dumps(valid).encode()).status_code == 200
        metrics = httpx.get(url + "/metrics").text
        out["metrics_500s"] = sum(int(line.split()[-1]) for line in metrics.splitlines()
                                  if line.startswith("cdmpp_requests_total") and 'status="500"' in line)
        out["statuses"] = {k: dict(sorted(((str(s), n) for s, n in v.items()))) for k, v in c.status.items()}
        out["requests"] = {k: sum(v.values()) for k, v in c.status.items()}
        out["total"] = sum(out["requests"].values())
        out["unexpected_5xx"] = len(c.bad)
        out["unexpected_5xx_first"] = c.bad[:5]
        out["largest_answer_bytes"] = c.biggest
        out["workers"] = len(descendants(proc.pid))
    finally:
        proc.terminate()
        proc.wait(30)
    print(json.dumps(out, indent=1))
    if json_out:
        with open(json_out, "w") as f:
            json.dump(out, f, indent=1)
    return out


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json")
    run(ap.parse_args().json)
