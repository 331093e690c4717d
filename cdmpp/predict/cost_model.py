"""``CDMPPCostModel``: cdmpp as a MetaSchedule cost model (``ms.tune_tir(..., cost_model=CDMPPCostModel())``).

A search asks its cost model to score thousands of candidate schedules per iteration and then measures
a few. Scores must be higher-is-better and non-negative: MetaSchedule's evolutionary search clamps them
at 0 and samples mutation parents in proportion to them. So the score is predicted *throughput*
relative to a fixed per-task reference (the fastest prediction of the first call for that task),
``ref / seconds``, like XGBoost's normalized throughput; the order is that of -log(seconds), the seconds
being those that order a task's programs best (``TrainedModel.predict(order=True)``).

``update`` keeps the measured (program, seconds) pairs. With ``correct`` (the default), once a task has
``min_correct`` of them, a small boosted-tree model of log(measured / predicted) on their summed per-store
features (the view TVM's XGBModel learns from) corrects the model's predictions for that task: the
pre-trained model carries the first iterations, where a model of the task alone has nothing to learn
from, and the correction learns what the task's own measurements teach, as XGBoost does late in a
search. With ``online_finetune`` the in-process transformer is instead (or also) fine-tuned
(``cdmpp.model.training.finetune``) on them every ``finetune_every`` new results. The caller's
``Predictor``'s model is never modified: the fine-tuned model is this cost model's own. With ``url`` the
predictor is a cdmpp server (``Predictor.load(url)``, a ``cdmpp.predict.client.Client``); candidates
travel as traces over one shared workload, and there is nothing to correct or fine-tune in process.

A thin adapter: devices are the ``Predictor``'s (``Predictor.device``: target and kind from the device
table), and so are features (``Predictor.featurize_candidates``: an evolutionary search scores many
candidates more than once, a parent kept unmutated, the measured best re-seeded every round, about a
sixth of them in a ResNet-18 conv2d search; the predictor's feature cache keeps them by structural hash,
so a repeat costs a hash instead of TVM's feature extraction, nearly all of a prediction's time).
"""

from __future__ import annotations

import contextlib
import json
import math
import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from cdmpp.model.pooled_gbt import summed_rows
from cdmpp.program import tvm_env

tvm_env.setup()
from tvm.ir.utils import derived_object  # noqa: E402
from tvm.s_tir.meta_schedule.cost_model import PyCostModel  # noqa: E402


def fit_task_correction(features: list, log_ratio: np.ndarray, base_score: float = 0.0):
    """The boosted trees of a task's ``log_ratio`` (log measured / predicted) on its programs' summed per-store
    features: shallow, shrunk and regularized, so a few dozen programs do not turn into a memorized table."""
    import xgboost as xgb

    params = {"max_depth": 4, "eta": 0.1, "lambda": 5.0, "min_child_weight": 2, "subsample": 1.0,
              "base_score": base_score, "nthread": 1, "verbosity": 0}
    return xgb.train(params, xgb.DMatrix(summed_rows(features), np.asarray(log_ratio)), num_boost_round=60)


@derived_object
class CDMPPCostModel(PyCostModel):
    """MetaSchedule cost model backed by a cdmpp ``Predictor`` (in process) or a cdmpp server (``url``).

    ``device``: the device id the tuned programs run on; default: the model's device whose target has
    the tuning target's mcpu and core count. Counters (``n_predict_calls``, ``n_predicted``,
    ``n_results``, ``n_finetunes``) say what the search asked.
    """

    def __init__(self, predictor=None, url: str | None = None, device: str | None = None,
                 online_finetune: bool = False, finetune_every: int = 16, finetune_steps: int = 20,
                 max_buffer: int = 1024, token: str | None = None, model: str | None = None,
                 correct: bool = True, min_correct: int = 16):
        super().__init__()
        if predictor is not None and url is not None:
            raise ValueError("pass a predictor or a url, not both")
        from cdmpp.predict.predictor import Predictor

        self.url = url
        self.predictor = Predictor.load(url, token=token) if url is not None else (
            predictor if predictor is not None else Predictor.load(model))
        self.remote = url is not None
        self.device = device
        self.online_finetune = bool(online_finetune and not self.remote)
        self.finetune_every, self.finetune_steps, self.max_buffer = finetune_every, finetune_steps, max_buffer
        self.correct, self.min_correct = bool(correct and not self.remote), min_correct
        self.corrections_: dict[str, object] = {}  # task -> xgboost Booster of log(measured / predicted)
        self.model_ = None  # the fine-tuned TrainedModel, once there is one
        self.predicted_: dict = {}  # (program hash, device) -> the current model's seconds, for the corrections
        self.buffer_: list = []  # cdmpp.records.dataset.LabeledProgram of every measured candidate (newest last)
        self.since_finetune_ = 0
        self.reference_: dict[str, float] = {}  # task (workload hash) -> reference seconds of its scores
        self.n_predict_calls = self.n_predicted = self.n_results = self.n_failed_results = self.n_finetunes = 0

    # ---- MetaSchedule interface -----------------------------------------------------------------------
    def load(self, path: str) -> None:
        """No-op: the predictor is a cdmpp checkpoint (``Predictor.load``); measured pairs are not reloaded."""

    def save(self, path: str) -> None:
        """Write the measured (program hash, seconds) pairs as JSON, for inspection; not a checkpoint."""
        with open(path, "w") as f:
            json.dump({"device": self.device, "n_finetunes": self.n_finetunes,
                       "measured": [{"program_hash": s.features.program_hash, "seconds": s.seconds, "task": s.task}
                                    for s in self.buffer_]}, f)

    def predict(self, context, candidates) -> np.ndarray:
        self.n_predict_calls += 1
        self.n_predicted += len(candidates)
        if not candidates:
            return np.zeros(0, dtype="float64")
        device = self._device(context)
        key = _task_id(context.mod)
        seconds = (self._remote(context, candidates, device) if self.remote
                   else self._local(context, candidates, device, key))
        ok = np.isfinite(seconds) & (seconds > 0)
        if key not in self.reference_ and ok.any():
            self.reference_[key] = float(seconds[ok].min())
        ref = self.reference_.get(key, 1.0)
        return np.where(ok, ref / np.where(ok, seconds, 1.0), 0.0).astype("float64")

    def update(self, context, candidates, results) -> None:
        from cdmpp.records.dataset import LabeledProgram

        measured = []
        for c, r in zip(candidates, results):
            secs = [float(s) for s in (r.run_secs or [])]
            if r.error_msg is None and secs and all(math.isfinite(s) and 0 < s < 1e9 for s in secs):
                measured.append((c, float(np.median(secs))))
            else:
                self.n_failed_results += 1
        self.n_results += len(measured)
        if not measured or self.remote:
            return
        feats = self.predictor.featurize_candidates(context, [c for c, _ in measured])
        task = _task_id(context.mod)
        device = self._device(context)
        self.buffer_ += [LabeledProgram(f, device, s, task) for f, (_, s) in zip(feats, measured) if f is not None]
        del self.buffer_[:-self.max_buffer]
        self.since_finetune_ += len(measured)
        if self.online_finetune and self.since_finetune_ >= self.finetune_every:
            self.finetune()
        if self.correct:
            self._fit_correction(task, device)

    # ---- cdmpp --------------------------------------------------------------------------------------
    def finetune(self) -> None:
        """Fine-tune the current model (pre-trained or already fine-tuned) on every buffered measurement."""
        from cdmpp.model.training import finetune

        if not self.buffer_:
            return
        base = self.model_ or self.predictor.model_for(self.buffer_[-1].device)
        self.model_ = finetune(base, self.buffer_, steps=self.finetune_steps)
        self.predicted_.clear()
        self.since_finetune_ = 0
        self.n_finetunes += 1

    def _fit_correction(self, task: str, device: str) -> None:
        """Refit the task's correction on all its buffered measurements, against the current model."""
        mine = [b for b in self.buffer_ if b.task == task]
        if len(mine) < self.min_correct:
            return
        model = self.model_ if self.model_ is not None else self.predictor.model_for(device)
        new = [b for b in mine if (b.features.program_hash, device) not in self.predicted_]
        if new:  # each measured program is predicted once per model, not on every refit
            with _torch_threads(1):
                seconds = model.predict([b.features for b in new], device, order=True)[0]
            self.predicted_.update(((b.features.program_hash, device), float(s)) for b, s in zip(new, seconds))
        predicted = np.array([self.predicted_[(b.features.program_hash, device)] for b in mine])
        residual = np.log([b.seconds for b in mine]) - np.log(predicted)
        self.corrections_[task] = fit_task_correction([b.features for b in mine], residual)

    def _corrected(self, seconds: np.ndarray, feats: list, task: str) -> np.ndarray:
        """``seconds`` times the task's correction, where it has one."""
        booster = self.corrections_.get(task)
        good = [i for i, f in enumerate(feats) if f is not None and f.n_leaves > 0 and np.isfinite(seconds[i])]
        if booster is None or not good:
            return seconds
        import xgboost as xgb

        log_ratio = booster.predict(xgb.DMatrix(summed_rows([feats[i] for i in good])))
        seconds = seconds.copy()
        seconds[good] *= np.exp(log_ratio)
        return seconds

    def _device(self, context) -> str:
        """The device id scored: ``device=``, else the predictor's device whose target matches the tuning
        target (``_match_device``)."""
        if self.device is None:
            p = self.predictor
            self.device = _match_device({d: p.device(d).target for d in p.devices()}, context.target)
        return self.device

    def _local(self, context, candidates, device: str, task: str) -> np.ndarray:
        """Seconds per candidate (NaN where a candidate does not featurize).

        With a tuning context of n > 1 threads, n threads featurize chunks of the candidates
        (``Predictor.featurize_candidates``) on a one-thread TVM context: TVM's hash and extractor release
        the GIL, so one thread's compact-AST walk runs while another extracts. Meanwhile this thread scores what is
        featurized, in order, in a few large model calls: the model's fixed cost per call is several ms,
        so small calls per chunk cost more than the forward itself, and torch on more than one thread
        spins against the featurizing threads. The thread count is the tuner's, as for XGBModel's
        extractor and booster."""
        candidates = list(candidates)
        n = len(candidates)
        seconds = np.full(n, np.nan)
        self.predictor.device(device)  # UnknownDeviceError; a device of the table joins the model, once
        model = self.model_ if self.model_ is not None else self.predictor.model_for(device)
        featurize = self.predictor.featurize_candidates
        threads = max(1, min(int(context.num_threads), n // 8))
        with _torch_threads(1):
            if threads == 1:
                feats = featurize(context, candidates)
                self._score(model, device, feats, range(n), seconds)
                return self._corrected(seconds, feats, task)
            one = self.predictor.features.featurizer()._context(context.target)  # one thread, the same target
            size = max(4, -(-n // (4 * threads)))  # a few chunks per thread: none waits long on the last
            batch = max(64, min(256, n // 4))  # programs per model call
            feats: list = [None] * n
            with ThreadPoolExecutor(threads, thread_name_prefix="cdmpp-costmodel") as pool:
                chunks = [range(a, min(n, a + size)) for a in range(0, n, size)]
                parts = [pool.submit(featurize, one, candidates[c.start:c.stop]) for c in chunks]
                ready: list[int] = []
                for chunk, part in zip(chunks, parts):
                    if len(ready) >= batch:
                        self._score(model, device, feats, ready, seconds)
                        ready = []
                    feats[chunk.start:chunk.stop] = part.result()
                    ready += chunk
                self._score(model, device, feats, ready, seconds)
        return self._corrected(seconds, feats, task)

    @staticmethod
    def _score(model, device: str, feats: list, idx, out: np.ndarray) -> None:
        """Write the predicted seconds of ``feats[i]`` (None: not featurized) into ``out[i]`` for i in ``idx``."""
        good = [i for i in idx if feats[i] is not None and feats[i].n_leaves > 0]
        if good:
            out[np.asarray(good)] = model.predict([feats[i] for i in good], device, order=True)[0]

    def _remote(self, context, candidates, device: str) -> np.ndarray:
        from cdmpp.program.inputs import ProgramError, to_json_value
        from tvm.s_tir.meta_schedule.database import Workload

        # JSON text of each {"trace": ...}: the server parses text only for programs it has not seen
        items: list[Any] = [json.dumps({"trace": to_json_value(c.sch.trace.as_json())}, separators=(",", ":"))
                            for c in candidates]
        workload = Workload(context.mod).as_json()
        seconds = np.full(len(candidates), np.nan)
        try:
            preds = self.predictor.predict(items, device, target=str(context.target.kind.name), workload=workload,
                                        order=True, build=False)
            seconds[:] = [p.seconds for p in preds]
        except ProgramError as e:  # score the bad candidates 0 and ask again for the rest
            bad = {int(x["index"]) for x in getattr(e, "errors", None) or []}
            keep = [i for i in range(len(items)) if i not in bad]
            if bad and keep:
                preds = self.predictor.predict([items[i] for i in keep], device, target=str(context.target.kind.name),
                                            workload=workload, order=True, build=False)
                seconds[keep] = [p.seconds for p in preds]
        return seconds


@contextlib.contextmanager
def _torch_threads(n: int):
    """Run torch on ``n`` intra-op threads meanwhile: a batch of candidates is small work, and torch's
    default (one thread per core) spins against the tuner's own threads (20-70x slower when they are busy)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _task_id(mod) -> str:
    """The tuned workload's structural hash, as 16 hex digits."""
    import tvm_ffi

    return f"{int(tvm_ffi.structural_hash(mod)) & (2**64 - 1):016x}"


def _match_device(devices: dict[str, dict], target) -> str:
    """The device whose recorded target has the tuning target's kind, mcpu and core count; failing that,
    one of the same kind and core count, with a warning (a search ranks candidates of one task, which a
    model of a kindred CPU still orders), else a ValueError."""
    kind = str(target.kind.name)
    attrs = {str(k): v for k, v in target.attrs.items()}
    mcpu, cores = str(attrs.get("mcpu", "")), int(attrs.get("num-cores", 0) or 0)
    same = [d for d, t in sorted(devices.items())
            if t.get("kind") == kind and (kind != "llvm" or int(t.get("num-cores", 0) or 0) == cores)]
    for d in same:
        if str(devices[d].get("mcpu", "")) == mcpu:
            return d
    if same:
        warnings.warn(f"no device of the model has target {target}; scoring as {same[0]} (same kind and core "
                      f"count); pass device= to choose", stacklevel=3)
        return same[0]
    raise ValueError(f"no device of the model matches target {target}; "
                     f"pass device= one of {', '.join(sorted(devices))}")
