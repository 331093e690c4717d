"""Request and response bodies of the HTTP service (pydantic models, so /docs shows every field)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

ProgramItem = str | dict[str, Any]
MAX_NAME = 200  # characters of a device id or target: longer is a 422, refused before it is decoded


class PredictRequest(BaseModel):
    model_config = ConfigDict(strict=True)  # JSON types as sent: "order": "true" is a 422, not true

    device: str = Field(max_length=MAX_NAME, description="device id, one of GET /v1/devices",
                        examples=["amd-epyc-znver4-2t/llvm-avx512"])
    programs: list[ProgramItem] = Field(
        description="scheduled programs: MetaSchedule workload+trace objects "
                    '({"workload": Workload.as_json(), "trace": Trace.as_json()}), as objects or as their JSON '
                    'text; an object may leave out "workload" when the request gives a shared one. Fastest: '
                    'JSON text of {"trace": ...} with a shared workload (a trace as JSON values is thousands '
                    "of tiny objects to parse; as text it is parsed only if the server has not seen it). "
                    "TVMScript text only where the server runs with --allow-tvmscript (trusted callers)")
    target: str | None = Field(None, max_length=MAX_NAME, description='"llvm" or "cuda"; default: the device\'s target kind')
    workload: Any = Field(None, description="a workload shared by every workload+trace item without its own "
                                            "(the candidates of one tuning task share it; saves ~50 KB per item)")
    order: bool = Field(False, description="true: seconds that order the programs of one task best (a compiler's "
                                           "search asks this), not the best estimate of each one's latency")
    build: bool = Field(True, description="false: predict the programs unbuilt, as a tuner's candidates (a model that "
                                          "reads built programs' instruction counts then goes without them, flagged "
                                          "assembly_not_built; a new program costs its featurizing only, not its "
                                          "~0.3 s build)")


class PredictionOut(BaseModel):
    seconds: float = Field(description="predicted latency")
    lo90: float = Field(description="lower end of the 90 % interval")
    hi90: float = Field(description="upper end of the 90 % interval")
    in_distribution: bool = Field(True, description="false when the program or device lies outside what the "
                                                    "model was trained on (see ood)")
    ood: list[str] = Field(default_factory=list, description="why not: device_untrained (no training data for "
                           "the device), target_kind_mismatch (the device does not run this target kind), "
                           "features_out_of_range (a feature far outside the training values), assembly_not_built "
                           "(a model that reads built programs' instruction counts predicted one it did not build)")


class PredictResponse(BaseModel):
    model_version: str
    device: str
    predictions: list[PredictionOut]


class ItemError(BaseModel):
    index: int = Field(description="position of the program in the request's list")
    reason: str


class ErrorBody(BaseModel):
    """Every error the service raises itself: ``detail`` says what to fix; the other fields help a program."""

    detail: str
    errors: list[ItemError] | None = Field(None, description="422: each bad program")
    known_devices: list[str] | None = Field(None, description="404: the devices this model predicts")
    limit: float | None = Field(None, description="413/504: the limit that was hit")


class DeviceOut(BaseModel):
    id: str
    specs: dict[str, float] = Field(description="the spec vector the model sees (clock, cores, caches, "
                                                "bandwidth, peak)")
    info: dict[str, Any] = Field(default_factory=dict, description="anything else the checkpoint records")


class DevicesResponse(BaseModel):
    devices: list[DeviceOut]


class ModelResponse(BaseModel):
    model_version: str
    shipped: bool = Field(description="the model shipped with cdmpp (else one the operator chose; its path is "
                                      "not shown)")
    featurizer_version: str = Field(description="featurizer the checkpoint was trained with")
    runtime_featurizer_version: str = Field(description="featurizer this server runs")
    devices: list[str] = Field(description="devices it answers for: those it was trained on and those of the "
                                           "device table, predicted from their specs (flag device_untrained)")
    trained_devices: list[str] = Field(description="devices whose measurements it was trained on")
    ensemble_members: int
    calibration: dict[str, Any]
    training: dict[str, Any] = Field(description="training summary (sizes, validation accuracy, time)")


class ModelsResponse(BaseModel):
    models: list[ModelResponse]


class HealthResponse(BaseModel):
    status: str = Field(description='"ok", or "degraded" while sandbox workers restart')
    saturated: bool = Field(False, description="new work would wait past the deadline (GET /readyz is then 503)")
    model_version: str
    uptime_s: float
    workers_ready: int = Field(description="sandbox workers ready to parse and featurize")
    workers: int = Field(description="sandbox workers configured")
    worker_restarts: int = Field(description="workers killed (deadline, limits, crashes) and replaced so far")
    confinement: str = Field("", description="the layers sandbox workers run under (serve/README.md, Threat model)")


class NetworkRequest(BaseModel):
    model_config = ConfigDict(strict=True)

    network: str = Field(max_length=100, description="network@batch from the server's task table",
                         examples=["resnet18@1"])
    device: str = Field(max_length=MAX_NAME, description="device id, one of GET /v1/devices",
                        examples=["amd-epyc-znver4-2t/llvm-avx512"])
    schedules: Literal["best-measured", "default"] = Field(
        "best-measured", description="best-measured: per task the fastest program stored for the device in the "
                                     "server's dataset; default: TVM's unscheduled code")


class NetworkTaskOut(BaseModel):
    task: str
    weight: int = Field(description="kernel calls of this task in the network")
    source: str = Field(description="where the task's program came from: best-measured or default")
    seconds: float
    lo90: float
    hi90: float


class NetworkResponse(BaseModel):
    model_version: str
    network: str
    device: str
    schedules: str
    seconds: float = Field(description="predicted latency of the whole network: sum of weight x task seconds")
    lo90: float = Field(description="sum of the tasks' lower bounds")
    hi90: float = Field(description="sum of the tasks' upper bounds")
    tasks: list[NetworkTaskOut]
