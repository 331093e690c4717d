"""The cdmpp HTTP service: a FastAPI app factory around one loaded ``Predictor``.

Run it with ``cdmpp serve`` (or ``uvicorn --factory cdmpp.service.app:create_app``); configure it with
environment variables (see ``Settings``). Bad input never costs more than a 4xx: web pages are kept out
(Host, Origin, Content-Type: ``BrowserGuard``), bodies are size-checked and must arrive in time before
parsing, bodies are parsed strictly in a thread (UTF-8, finite numbers, no lone surrogates, bounded
nesting, batch and string limits applied while parsing), bad programs are named by index, and every
prediction runs in a bounded lane (``cdmpp.service.lanes``) that refuses at once what it could not
start before the deadline, so the event loop keeps answering health checks and small requests are not
stuck behind big ones. Program text and JSON are parsed and featurized only in sandbox workers
(``cdmpp.sandbox.pool``; threat model in serve/README.md).
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import os
import threading
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import anyio
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, PlainTextResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from cdmpp import defaults
from cdmpp.defaults import MODEL as SHIPPED_MODEL
from cdmpp.predict.predictor import Predictor, UnknownDeviceError
from cdmpp.program.inputs import ProgramError
from cdmpp.sandbox.pool import Sandbox
from cdmpp.service.engine import BadPrograms, Cancelled, PredictEngine
from cdmpp.service.metrics import Metrics
from cdmpp.service.schemas import (DeviceOut, DevicesResponse, ErrorBody, HealthResponse, ItemError, ModelResponse,
                                   ModelsResponse, NetworkRequest, NetworkResponse, NetworkTaskOut, PredictionOut,
                                   PredictRequest, PredictResponse)
from cdmpp.service.body import ApiError, error_response, validated, validation_errors
from cdmpp.service.lanes import JOB_UNITS, SMALL, Lane, Saturated
from cdmpp.service.middleware import BodyLimit, BrowserGuard, RecordMetrics


@dataclass
class Settings:
    """Service configuration; ``from_env`` reads the ``CDMPP_*`` variables a deployment sets."""

    model: str | None = None  # checkpoint folder; None = the model shipped with cdmpp
    max_batch: int = 1024  # programs per request
    max_body_bytes: int = 16 * 1024 * 1024
    timeout_s: float = 30.0  # per request, queueing included
    token: str | None = None  # bearer token for /v1/* and /metrics; None = no auth
    threads: int = 2  # prediction threads (CPU-bound work runs here, never on the event loop)
    torch_threads: int = 1  # intra-op threads per prediction; >1 fights the other threads for cores
    cache_size: int = 50_000  # entries of the feature cache (of the predictor loaded here) and of the prediction cache
    featurize_procs: int = 1  # sandbox workers that parse and featurize new programs (at least 1)
    allow_tvmscript: bool = False  # TVMScript is Python: accept it only when every caller is trusted
    item_cpu_s: float = 20.0  # CPU seconds a worker may spend on one program before it is killed (TVMScript
    # of 2,000 blocks: ~12 s to parse here)
    worker_mem_mb: int = 4096  # address-space limit of a worker (TVM + featurizer use ~1.1 GB)
    worker_user: str = "nobody"  # who the workers run as when the server runs as root
    dataset: str = defaults.DATASET  # /v1/network: measured programs (best-measured schedules)
    task_table: str = defaults.TASK_TABLE  # /v1/network: the networks and their tasks
    body_timeout_s: float = 30.0  # the whole body must arrive within this (408 otherwise)
    allowed_hosts: tuple[str, ...] = ()  # Host names besides loopback and the bound address ("name", "name:port", "*")
    allowed_origins: tuple[str, ...] = ()  # browser origins allowed to call (e.g. "https://ui.example"; "*": any)

    @classmethod
    def from_env(cls, env: dict | None = None) -> "Settings":
        env = os.environ if env is None else env
        d = cls()
        return cls(
            model=env.get("CDMPP_MODEL") or None,
            max_batch=int(env.get("CDMPP_MAX_BATCH", d.max_batch)),
            max_body_bytes=int(env.get("CDMPP_MAX_BODY_BYTES", d.max_body_bytes)),
            timeout_s=float(env.get("CDMPP_TIMEOUT_S", d.timeout_s)),
            token=env.get("CDMPP_TOKEN") or None,
            threads=int(env.get("CDMPP_THREADS", d.threads)),
            torch_threads=int(env.get("CDMPP_TORCH_THREADS", d.torch_threads)),
            cache_size=int(env.get("CDMPP_CACHE_SIZE", d.cache_size)),
            featurize_procs=int(env.get("CDMPP_FEATURIZE_PROCS", d.featurize_procs)),
            allow_tvmscript=env.get("CDMPP_ALLOW_TVMSCRIPT", "").strip().lower() in ("1", "true", "yes", "on"),
            item_cpu_s=float(env.get("CDMPP_ITEM_CPU_S", d.item_cpu_s)),
            worker_mem_mb=int(env.get("CDMPP_WORKER_MEM_MB", d.worker_mem_mb)),
            worker_user=env.get("CDMPP_WORKER_USER") or d.worker_user,
            dataset=env.get("CDMPP_DATASET") or d.dataset,
            task_table=env.get("CDMPP_TASK_TABLE") or d.task_table,
            body_timeout_s=float(env.get("CDMPP_BODY_TIMEOUT_S", d.body_timeout_s)),
            allowed_hosts=_names(env.get("CDMPP_ALLOWED_HOSTS", "")),
            allowed_origins=_names(env.get("CDMPP_ALLOW_ORIGINS", "")),
        )


def _names(value: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in value.replace(" ", ",").split(",") if x.strip())


ERRORS = {s: {"model": ErrorBody} for s in (400, 401, 403, 404, 408, 413, 415, 421, 422, 503, 504)}


# ---- dependencies ---------------------------------------------------------------------------------------
def get_predictor(request: Request) -> Predictor:
    return request.app.state.predictor


def get_engine(request: Request) -> PredictEngine:
    return request.app.state.engine


_bearer = HTTPBearer(auto_error=False, description="required when the server sets CDMPP_TOKEN")


def require_token(request: Request, creds: HTTPAuthorizationCredentials | None = Depends(_bearer)) -> None:
    expected = request.app.state.settings.token
    if expected is None:
        return
    given = creds.credentials if creds is not None else ""
    if not hmac.compare_digest(given.encode(), expected.encode()):
        raise ApiError(401, ErrorBody(detail="missing or wrong bearer token (Authorization: Bearer <CDMPP_TOKEN>)"),
                       {"WWW-Authenticate": "Bearer"})


# ---- the app --------------------------------------------------------------------------------------------
def _warm_up(predictor: Predictor, engine: PredictEngine, timeout_s: float = 300.0) -> None:
    """Wait for the sandbox workers and run the model once, so the first request is not slow. The
    shipped sample is package data, so the workers may parse it as TVMScript."""
    if not engine.sandbox.wait_ready(timeout_s):
        raise RuntimeError(f"sandbox workers not ready in {timeout_s:g} s: {engine.sandbox.start_errors[-3:]}")
    devices = [predictor.device(d) for d in predictor.devices()]
    if not devices:
        return
    text = (resources.files("cdmpp") / "samples" / "conv2d.tvmscript").read_text()
    device = next((d for d in devices if d.kind in engine.sandbox.kinds), devices[0])
    if device.kind == "llvm":
        try:
            feats = predictor.featurize([text], "llvm", sandbox=engine.sandbox)
        except ProgramError as e:
            raise RuntimeError(f"warm-up program failed: {getattr(e, 'errors', None) or e}") from None
        predictor.predict_features(feats, device, "llvm")


def create_app(settings: Settings | None = None, predictor: Predictor | None = None) -> FastAPI:
    """The FastAPI app. ``settings`` default to the environment; ``predictor`` (tests, notebooks) skips
    loading ``settings.model``. With no arguments it suits ``uvicorn --factory``."""
    settings = settings or Settings.from_env()
    metrics = Metrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        import torch

        torch.set_num_threads(max(1, settings.torch_threads))
        pred = predictor or Predictor.load(settings.model, cache_size=settings.cache_size)
        kinds = tuple({pred.device(d).kind for d in pred.devices()}) or ("llvm",)
        sandbox = Sandbox(settings.featurize_procs, item_cpu_s=settings.item_cpu_s, mem_mb=settings.worker_mem_mb,
                          user=settings.worker_user, kinds=kinds)
        engine = PredictEngine(pred, settings.cache_size, sandbox, settings.allow_tvmscript)
        try:
            await asyncio.get_running_loop().run_in_executor(None, _warm_up, pred, engine)
        except BaseException:
            engine.close()
            raise
        app.state.predictor = pred
        app.state.engine = engine
        # jobs are weighed in new programs (+ JOB_UNITS for a job's own work: hashing, the model); prior
        # pace: a new program costs ~11 ms of a sandbox worker's CPU, more when jobs share the workers
        app.state.small = Lane("small", settings.threads, 0.02)  # requests of <= SMALL new programs
        app.state.large = Lane("large", settings.threads, 0.02)  # the rest, in chunks of SMALL programs
        app.state.parsing = anyio.CapacityLimiter(max(1, settings.threads))  # bodies parsed at once
        app.state.started = time.monotonic()
        try:
            yield
        finally:
            app.state.small.shutdown()
            app.state.large.shutdown()
            engine.close()

    app = FastAPI(title="cdmpp", version="1", lifespan=lifespan,
                  description="Latency prediction for TVM tensor programs (CDMPP). Batch endpoint for compilers.")
    app.state.settings = settings
    app.state.metrics = metrics
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes, timeout_s=settings.body_timeout_s)
    if settings.allowed_origins:  # answers the CORS preflight of the allowed origins' pages
        app.add_middleware(CORSMiddleware, allow_origins=list(settings.allowed_origins), allow_methods=["GET", "POST"],
                           allow_headers=["Authorization", "Content-Type"])
    app.add_middleware(BrowserGuard, allowed_hosts=settings.allowed_hosts, allowed_origins=settings.allowed_origins)
    app.add_middleware(RecordMetrics, metrics=metrics)  # added last = outermost: sees the 413s too

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError):
        return error_response(exc.status, exc.body, exc.headers)

    @app.exception_handler(Saturated)
    async def _saturated(request: Request, exc: Saturated):
        return error_response(503, ErrorBody(detail=f"{exc}, past the {settings.timeout_s:g} s deadline "
                                                    "(CDMPP_TIMEOUT_S); retry later", limit=settings.timeout_s),
                              {"Retry-After": str(exc.retry_after)})

    async def read(request: Request, model, list_field: str | None = None, max_items: int = 1 << 62):
        """The body as ``model``, parsed in a worker thread (a 16 MiB body takes seconds to parse), at most
        ``threads`` bodies at once, so that many big bodies cannot hold many times their size in objects."""
        raw = await request.body()
        return await anyio.to_thread.run_sync(validated, model, raw, list_field, max_items,
                                              limiter=request.app.state.parsing)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        return error_response(422, validation_errors(exc.errors()))

    body_schema = {"requestBody": {"required": True, "content": {"application/json": {
        "schema": PredictRequest.model_json_schema(ref_template="#/components/schemas/{model}")}}}}

    @app.post("/v1/predict", response_model=PredictResponse, responses=ERRORS, dependencies=[Depends(require_token)],
              openapi_extra=body_schema)
    async def predict(request: Request, predictor: Predictor = Depends(get_predictor),
                      engine: PredictEngine = Depends(get_engine)) -> PredictResponse:
        """Predict the latency of a batch of programs on one device.

        Body: ``PredictRequest`` as strict JSON (parsed here, not by FastAPI, so that NaN, huge numbers,
        lone surrogates, invalid UTF-8, deep nesting and too many programs are refused while parsing, with
        a 422 or 413 that says where).

        A request answered wholly from the prediction cache is answered at once; one of at most ``SMALL``
        new programs runs in the small lane, others in the large lane, in chunks (``cdmpp.service.lanes``);
        a lane that could not do the work before the deadline answers 503 with Retry-After at once."""
        deadline = time.monotonic() + settings.timeout_s
        try:  # parsing waits for a slot too (a body of 16 MiB takes seconds): bounded by the deadline as well
            req = await asyncio.wait_for(read(request, PredictRequest, "programs", settings.max_batch),
                                         settings.timeout_s)
        except asyncio.TimeoutError:
            raise Saturated("body parsing", settings.timeout_s) from None
        try:  # resolved once: the engine and the predictor take the Device
            device = predictor.device(req.device)
        except UnknownDeviceError as e:
            raise _unknown_device(e) from None
        cancel = threading.Event()
        small, large = request.app.state.small, request.app.state.large
        args = (req.programs, device, req.target, req.workload, cancel, deadline, req.order, req.build)

        async def work():
            # the cache first, on a thread of its own (a hash and a lookup per item): a wholly cached
            # request never queues behind new work, and the rest is weighed by its new programs
            cached = await anyio.to_thread.run_sync(engine.cached, req.programs, device, req.target,
                                                    req.workload, req.order, req.build)
            new = len(req.programs) if cached is None else sum(p is None for p in cached)
            if new == 0:
                return cached
            if new <= SMALL:
                return await small.run(new + JOB_UNITS, deadline, cancel, engine.predict, *args)
            return await large.run(new + JOB_UNITS * -(-len(req.programs) // SMALL), deadline, cancel, _in_chunks,
                                   engine, *args, report=True)

        try:
            preds = await asyncio.wait_for(work(), max(0.0, deadline - time.monotonic()))
        except (asyncio.TimeoutError, Cancelled):
            cancel.set()  # a queued job never starts; a running one stops and its workers are killed
            raise ApiError(504, ErrorBody(detail=f"prediction took over {settings.timeout_s:g} s (CDMPP_TIMEOUT_S); "
                                                 "send smaller batches or retry later", limit=settings.timeout_s))
        except BadPrograms as e:
            raise ApiError(422, ErrorBody(detail=str(e), errors=[ItemError(index=i, reason=r) for i, r in e.errors]))
        except ProgramError as e:
            raise ApiError(422, ErrorBody(detail=str(e)))
        except UnknownDeviceError as e:
            raise _unknown_device(e)
        except RecursionError:
            raise ApiError(422, ErrorBody(detail="a program is nested too deeply"))
        return PredictResponse(model_version=predictor.version, device=req.device,
                               predictions=[PredictionOut(seconds=p.seconds, lo90=p.lo90, hi90=p.hi90,
                                                          in_distribution=not p.ood, ood=list(p.ood))
                                            for p in preds])

    @functools.lru_cache(maxsize=64)
    def network_prediction(network: str, device: str, schedules: str):
        """Trusted content only: the network is looked up by name in the server's task table and its
        programs come from the server's own dataset, so TVM may run here."""
        from cdmpp.predict import network as net
        from cdmpp.program.inputs import parse_target
        from cdmpp.zoo.tasks import TaskTable

        pred = app.state.predictor
        try:
            table = TaskTable.load(settings.task_table)
        except FileNotFoundError:
            raise ApiError(503, ErrorBody(detail=f"this server has no task table at {settings.task_table} "
                                                 "(CDMPP_TASK_TABLE): it cannot predict networks"))
        if not table.tasks_of(network):
            raise ApiError(404, ErrorBody(detail=f"unknown network {network!r}; known: "
                                                 f"{', '.join(table.occurrences())}"))
        dev = pred.device(device)
        target = parse_target(dev.target or dev.kind)
        if schedules == "best-measured" and not os.path.isdir(settings.dataset):
            raise ApiError(503, ErrorBody(detail=f"this server has no dataset at {settings.dataset} (CDMPP_DATASET) "
                                                 "for best-measured schedules; ask for schedules=default"))
        programs = net.task_programs(network, table, schedules, device, settings.dataset, target)
        return net.predict_network(pred, network, device, programs)

    @app.post("/v1/network", response_model=NetworkResponse, responses=ERRORS, dependencies=[Depends(require_token)])
    async def network(request: Request, predictor: Predictor = Depends(get_predictor)) -> NetworkResponse:
        """Predict a whole network's latency on one device: the weighted sum of its tasks' programs
        (``cdmpp network``)."""
        req = await read(request, NetworkRequest)
        try:
            predictor.device(req.device)
        except UnknownDeviceError as e:
            raise _unknown_device(e) from None
        deadline = time.monotonic() + settings.timeout_s
        job = request.app.state.large.run(SMALL, deadline, threading.Event(), network_prediction, req.network,
                                          req.device, req.schedules, learn=False)
        try:
            p = await asyncio.wait_for(job, settings.timeout_s)
        except asyncio.TimeoutError:
            raise ApiError(504, ErrorBody(detail=f"the network took over {settings.timeout_s:g} s (CDMPP_TIMEOUT_S); "
                                                 "it is cached once done, retry later", limit=settings.timeout_s))
        return NetworkResponse(model_version=predictor.version, network=p.network, device=p.device,
                               schedules=req.schedules, seconds=p.seconds, lo90=p.lo90, hi90=p.hi90,
                               tasks=[NetworkTaskOut(**{k: t[k] for k in NetworkTaskOut.model_fields})
                                      for t in p.tasks])

    @app.get("/v1/devices", response_model=DevicesResponse, responses=ERRORS, dependencies=[Depends(require_token)])
    def devices(predictor: Predictor = Depends(get_predictor)) -> DevicesResponse:
        """The devices this model predicts, with the spec vector it sees for each."""
        out = []
        for d in predictor.devices():
            info = {k: v for k, v in predictor.device(d).info.items() if k != "id"}
            specs = {k: float(v) for k, v in (info.pop("specs", None) or {}).items()}
            out.append(DeviceOut(id=d, specs=specs, info=info))
        return DevicesResponse(devices=out)

    @app.get("/v1/models", response_model=ModelsResponse, responses=ERRORS, dependencies=[Depends(require_token)])
    def models(predictor: Predictor = Depends(get_predictor)) -> ModelsResponse:
        """The loaded model: version, featurizer versions, devices and its training summary."""
        from cdmpp.program.features import FEATURIZER_VERSION

        m = predictor.model
        training = {k: v for k, v in m.summary.items() if k not in ("members", "devices")}
        training["members"] = [{k: v for k, v in h.items() if k != "history"} for h in m.summary.get("members", [])]
        shipped = predictor.path is None or Path(predictor.path).resolve() == Path(SHIPPED_MODEL).resolve()
        return ModelsResponse(models=[ModelResponse(  # never the path: it tells a caller about the host
            model_version=predictor.version, shipped=shipped, featurizer_version=str(m.featurizer_version),
            runtime_featurizer_version=FEATURIZER_VERSION, devices=predictor.devices(),
            trained_devices=sorted(m.summary.get("train_devices") or m.device_ids()),
            ensemble_members=len(m.members), calibration=m.calibration, training=training)])

    def health(request: Request) -> HealthResponse:
        sandbox, state = request.app.state.engine.sandbox, request.app.state
        ready = sandbox.ready()
        return HealthResponse(status="ok" if ready >= sandbox.procs else "degraded",
                              saturated=state.small.saturated(settings.timeout_s) or
                              state.large.saturated(settings.timeout_s),
                              model_version=state.predictor.version,
                              uptime_s=round(time.monotonic() - state.started, 3),
                              workers_ready=ready, workers=sandbox.procs, worker_restarts=sandbox.restarts,
                              confinement=sandbox.confined())

    @app.get("/healthz", response_model=HealthResponse)
    async def healthz(request: Request) -> HealthResponse:
        """Liveness: "ok" once the model is loaded and every sandbox worker is ready; "degraded" (still
        200: it answers, with less capacity) while killed or crashed workers restart; ``saturated`` when
        new work would wait past the deadline. Answered on the event loop, never behind queued work."""
        return health(request)

    @app.get("/readyz", response_model=HealthResponse, responses={503: {"model": HealthResponse}})
    async def readyz(request: Request):
        """Readiness for a load balancer: 200 while the server can take work, 503 (with Retry-After) while
        it is saturated or has no sandbox worker ready; the body is that of /healthz."""
        h = health(request)
        if h.saturated or h.workers_ready == 0:
            return JSONResponse(h.model_dump(), status_code=503, headers={"Retry-After": "1"})
        return h

    @app.get("/metrics", response_class=PlainTextResponse, dependencies=[Depends(require_token)])
    def prometheus(request: Request) -> PlainTextResponse:
        """Prometheus text format: requests, latency histogram, programs predicted, feature-cache hits."""
        state = request.app.state
        return PlainTextResponse(metrics.render(state.engine, (state.small, state.large)),
                                 media_type="text/plain; version=0.0.4; charset=utf-8")

    return app


def _unknown_device(e: UnknownDeviceError) -> ApiError:
    return ApiError(404, ErrorBody(detail=str(e), known_devices=e.known))


def _in_chunks(engine: PredictEngine, programs, device, target, workload, cancel, deadline, order, build, progress):
    """A large request as jobs of ``SMALL`` programs, so that between two of them the sandbox workers can
    take a small request's job; ``progress`` learns the lane's pace from each. Bad programs of every chunk
    are reported together, by request index."""
    out, errors = [], []
    for start in range(0, len(programs), SMALL):
        if cancel.is_set():
            raise Cancelled("request timed out")
        chunk = programs[start:start + SMALL]
        try:
            out += engine.predict(chunk, device, target, workload, cancel, deadline, order, build)
        except BadPrograms as e:
            errors += [(i + start, r) for i, r in e.errors]
        progress(len(chunk) + JOB_UNITS)
    if errors:
        raise BadPrograms(errors, len(programs))
    return out
