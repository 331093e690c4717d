"""``Client``: the HTTP service behind the same interface as an in-process ``Predictor``.

Code written against a ``Predictor`` (``predict(programs, device, target, workload, order)``,
``devices()``, ``device(id)``, ``version``) runs unchanged against a server (``Predictor.load(url)``
returns a ``Client``): the same return types (``Prediction``, ``Device``), the same errors
(``UnknownDeviceError`` with ``.known``, ``ProgramError``).
TVM objects are sent as MetaSchedule workload + trace (the scheduled module with an empty trace; servers
accept TVMScript only when their operator allows it); ``str``/``dict`` items go as they are. Big
batches are split to stay under the server's limits; connection errors and 5xx answers are retried
with exponential backoff, since a restarting worker behind a load balancer is routine. Importing this
module does not import TVM or torch.
"""

from __future__ import annotations

import json
import time
from typing import Any, Sequence

import httpx

from cdmpp.predict.devices import Device, UnknownDeviceError, target_kind
from cdmpp.predict.prediction import Prediction
from cdmpp.program.inputs import ProgramError

RETRY_STATUS = frozenset({500, 502, 503, 504})


class ServiceError(RuntimeError):
    """An answer the client cannot turn into a result (401, 413, a 5xx after all retries, ...)."""

    def __init__(self, status: int, detail: Any, body: Any = None):
        super().__init__(f"HTTP {status}: {detail}")
        self.status, self.detail, self.body = status, detail, body


def to_wire(program: Any, traces: bool = False) -> str | dict:
    """A program as the service takes it: text and workload+trace dicts as is, TVM objects as the JSON text
    of ``{"workload": <the scheduled module>, "trace": [[], []]}`` (what is featurized is the scheduled module).

    ``traces``: send a ``Schedule`` as the JSON text of ``{"trace": ...}`` (for a request with a shared
    workload): ~10 ms for the server to parse a new one, against ~60-140 ms for TVMScript.
    """
    if isinstance(program, (str, dict)):
        return program
    if traces and getattr(program, "trace", None) is not None and hasattr(program, "mod"):
        from cdmpp.program.inputs import to_json_value

        return json.dumps({"trace": to_json_value(program.trace.as_json())}, separators=(",", ":"))
    mod = getattr(program, "mod", None)  # tvm.s_tir.Schedule, cdmpp.program.inputs.Program
    obj = mod if mod is not None and hasattr(mod, "script") else program
    if hasattr(obj, "script"):  # IRModule, PrimFunc
        from cdmpp.program import tvm_env

        tvm = tvm_env.setup()
        from tvm.s_tir.meta_schedule.database import Workload

        if isinstance(obj, tvm.tirx.PrimFunc):
            obj = tvm.IRModule({"main": obj})
        return json.dumps({"workload": Workload(obj).as_json(), "trace": [[], []]}, separators=(",", ":"))
    raise TypeError(f"cannot send a {type(program).__name__}: expected TVMScript text, a workload+trace dict, "
                    "or a TVM PrimFunc / IRModule / Schedule")


class Client:
    """A cdmpp service client. ``retries`` is the number of retries after the first try."""

    def __init__(self, base_url: str = "http://127.0.0.1:8000", token: str | None = None, timeout: float = 60.0,
                 retries: int = 3, backoff_s: float = 0.25, batch_size: int = 512, transport=None):
        self.base_url = base_url.rstrip("/")
        self.retries, self.backoff_s, self.batch_size = retries, backoff_s, batch_size
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout, transport=transport)
        self._devices: dict[str, Device] | None = None

    # ---- the Predictor API --------------------------------------------------------------------------
    def predict(self, programs: Sequence, device: str | Device, target: str | None = None,
                workload: Any = None, order: bool = False, build: bool = True, *,
                trusted: bool = False) -> list[Prediction]:
        """Latency with a 90 % interval per program on ``device``, as ``Predictor.predict`` returns it
        (``order`` and ``build`` too; ``trusted`` is the server's to decide: it parses what it is sent in its
        sandbox).

        ``workload``: the unscheduled task shared by the programs (``Workload.as_json()``, or the TVM
        module itself). With it, workload+trace items may leave out their workload, and ``Schedule``s of
        that module travel as their traces: the fast form for a compiler's candidates.
        """
        device = device.id if isinstance(device, Device) else device
        if workload is not None and not isinstance(workload, (str, list, dict)):  # a TVM module
            from tvm.s_tir.meta_schedule.database import Workload

            from cdmpp.program import tvm_env

            tvm_env.setup()
            workload = Workload(workload).as_json()
        items = [to_wire(p, traces=workload is not None) for p in programs]
        out: list[Prediction] = []
        for start in range(0, len(items), self.batch_size):
            body: dict[str, Any] = {"device": device, "programs": items[start:start + self.batch_size]}
            if target is not None:
                body["target"] = target
            if workload is not None:
                body["workload"] = workload
            if order:
                body["order"] = True
            if not build:
                body["build"] = False
            try:
                data = self._request("POST", "/v1/predict", json=body, device=device)
            except ProgramError as e:
                if start:  # name items by their index in the caller's list
                    err = ProgramError(f"{e} (indices relative to item {start})")
                    err.errors = [{**x, "index": x["index"] + start} for x in getattr(e, "errors", [])]
                    raise err from None
                raise
            out += [Prediction(p["seconds"], p["lo90"], p["hi90"]) for p in data["predictions"]]
        return out

    def predict_seconds(self, programs: Sequence, device: str | Device, trusted: bool = False):
        import numpy as np

        return np.array([p.seconds for p in self.predict(programs, device)])

    def devices(self) -> list[str]:
        """The ids of the devices the served model predicts."""
        return list(self._device_table())

    def device(self, device: str | Device) -> Device:
        """``device`` as the server resolved it (``GET /v1/devices``, asked once); ``UnknownDeviceError``."""
        if isinstance(device, Device):
            return device
        table = self._device_table()
        if device not in table:
            raise UnknownDeviceError(device, list(table))
        return table[device]

    @property
    def version(self) -> str:
        return str(self.models()[0]["model_version"])

    def _device_table(self) -> dict[str, Device]:
        if self._devices is None:
            trained = set(self.models()[0].get("trained_devices") or ())
            out = {}
            for d in self._request("GET", "/v1/devices")["devices"]:
                info = {**d.get("info", {}), "specs": d.get("specs", {})}
                target = info.get("target") if isinstance(info.get("target"), dict) else {}
                out[d["id"]] = Device(d["id"], target_kind(target), target, dict(d.get("specs", {})),
                                      d["id"] in trained, info)
            self._devices = out
        return self._devices

    def models(self) -> list[dict]:
        return self._request("GET", "/v1/models")["models"]

    def health(self) -> dict:
        return self._request("GET", "/healthz")

    # ---- transport ----------------------------------------------------------------------------------
    def _request(self, method: str, path: str, device: str = "", **kwargs) -> Any:
        for attempt in range(self.retries + 1):
            last = attempt == self.retries
            try:
                r = self._http.request(method, path, **kwargs)
            except httpx.TransportError:
                if last:
                    raise
                time.sleep(self.backoff_s * 2 ** attempt)
                continue
            if r.status_code in RETRY_STATUS and not last:
                time.sleep(_retry_after(r) or self.backoff_s * 2 ** attempt)
                continue
            return _result(r, device)
        raise AssertionError("unreachable")

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _retry_after(r: httpx.Response) -> float | None:
    v = r.headers.get("Retry-After", "")
    return min(float(v), 30.0) if v.replace(".", "", 1).isdigit() else None


def _result(r: httpx.Response, device: str = "") -> Any:
    try:
        body = r.json()
    except ValueError:
        body = None
    if r.is_success:
        return body
    detail = body.get("detail", r.text) if isinstance(body, dict) else r.text
    if r.status_code == 404 and isinstance(body, dict) and "known_devices" in body:
        raise UnknownDeviceError(device, body["known_devices"])
    if r.status_code == 422 and isinstance(body, dict) and isinstance(detail, str):
        err = ProgramError(detail)
        err.errors = body.get("errors") or []  # [{"index", "reason"}] of the bad programs
        raise err
    raise ServiceError(r.status_code, detail, body)
