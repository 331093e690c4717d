"""Train, fine-tune and (through ``TrainedModel``) save the CDMPP predictor.

The loop is plain PyTorch, readable in one sitting:

* labels: ``LogLatency`` (standardized log seconds) fitted on the training latencies only;
* inputs: ``FeatureNormalizer`` fitted on the training leaves only, the programs' log FLOPs and bytes
  (``TrainedModel.extra_inputs``); device specs via ``DeviceSpecs``;
* loss: the reported metric itself, MAPE on seconds (``mape_loss``), plus ``da_weight`` x CMD (or MMD)
  between the program embeddings of the source batch and of a batch of the unlabeled target pool, when
  training is given one holding a device without training labels;
* Adam with a triangular cyclic learning rate, gradient-norm clipping;
* model selection and early stopping on the validation split only (never the test split);
* an ensemble of snapshots (the best state of each of the best LR cycles of one run, Huang et al. 2017), or of the
  best states of independent runs (``ensemble_of = "runs"``)
  whose spread, conformally calibrated on the validation split, gives the 90 % interval;
* the pooled GBT blended in, and Amdahl anchors for thread counts without labels (``gbt_blend``,
  ``amdahl_transfer``);
* ``resume``: the run's state saved after every epoch (and the blend's GBT once fitted) and picked up where
  it stopped (``RunState``): a run of an hour survives a stop.

Hyperparameters live in ``TrainConfig`` (``cdmpp.model.config``; the network's in ``ModelConfig``), loaded
from a recipe in ``train/*.toml``; the defaults are the shipped recipe. What issue 19's study tried and dropped is in
reports/study-issue19.md, "Options removed".
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import math
import os
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from cdmpp.devices.spec import target_kind_of_id
from cdmpp.model import physics
from cdmpp.model.adaptation import discrepancy
from cdmpp.model.checkpoint import TrainedModel, current_featurizer_version
from cdmpp.model.config import TrainConfig
from cdmpp.model.distributed import Runner
from cdmpp.model.feature_store import FeatureStore, TrainingColumns, check_store_recipe
from cdmpp.model.network import (N_INNER_STATS, N_ROOFLINE_STATS, N_STATS, CDMPPModel, PackedPrograms, bucketed_batches,
                                 length_sorted_batches)
from cdmpp.model.physics import fork_join_of
from cdmpp.model.shots import median_log_error
from cdmpp.model.transforms import DeviceSpecs, FeatureNormalizer, LogLatency

if TYPE_CHECKING:
    from cdmpp.records.dataset import LabeledProgram


MIN_DA_SOURCE = 8  # a batch with fewer training programs of the target's kind adds no alignment term
# Most validation programs predicted at under a twentieth of their latency: the network stopped predicting
# (MAPE -> 1, the MAPE of predicting zero). Domain adaptation towards programs unlike the training ones does
# that (a min-max scaled CMD cannot shrink, so its cheapest alignment is a constant embedding); ``fit`` then
# trains again without adaptation.
COLLAPSED_SHARE, COLLAPSED_RATIO = 0.9, 0.05


def mape_loss(pred: torch.Tensor, target: torch.Tensor, sigma: float, weight: torch.Tensor | None = None) -> torch.Tensor:
    """MAPE on seconds, |predicted / measured - 1|, through the log label (``sigma``: its standard deviation);
    the log ratio is clamped at e^3 so one wild start cannot blow up a batch. ``weight``: per program (mean 1)."""
    ape = torch.expm1(((pred - target) * sigma).clamp(max=3.0)).abs()
    return ape.mean() if weight is None else (ape * weight).sum() / weight.sum()


def rank_loss(pred: torch.Tensor, target: torch.Tensor, groups: torch.Tensor, sigma: float) -> torch.Tensor:
    """RankNet over the pairs of a batch in one group (task and device) whose labels differ by more than 3 %:
    softplus of the predicted log-latency gap taken against the measured order (0 without such a pair)."""
    gap = target[:, None] - target[None, :]
    pairs = (groups[:, None] == groups[None, :]) & (gap.abs() * sigma > math.log(1.03))
    if not bool(pairs.any()):
        return pred.new_zeros(())
    return torch.nn.functional.softplus(-(pred[:, None] - pred[None, :]) * torch.sign(gap))[pairs].mean()


def device_weights(train_devices: Sequence[str], devices: Sequence[str], balance: float) -> np.ndarray | None:
    """Per program of ``devices``: n_device ** -balance, n counted in ``train_devices``, scaled to mean 1 over the
    training programs (None for balance 0). A device with few programs (a GPU beside 150,000 CPU programs)
    otherwise barely moves the loss. Tried for the GPUs and left at 0: the transformer still did not rank them
    (reports/gpu-transformer.md)."""
    if not balance:
        return None
    names, counts = np.unique(np.asarray(train_devices), return_counts=True)
    per_device = dict(zip(names.tolist(), counts.astype(np.float64) ** -balance))
    scale = len(train_devices) / float(np.dot(counts, counts.astype(np.float64) ** -balance))
    fallback = float(np.mean(list(per_device.values())))  # a device without training programs
    return np.array([per_device.get(d, fallback) * scale for d in devices], dtype=np.float32)


@dataclass
class _Split:
    """Training-ready data: packed normalized programs, device row per program, labels, and the program-level
    inputs (``TrainedModel.extra_inputs``)."""

    pack: PackedPrograms
    dev_rows: np.ndarray
    z: np.ndarray | None = None
    seconds: np.ndarray | None = None
    extra: torch.Tensor | None = None
    da_source: np.ndarray | None = None  # per program: whether domain adaptation aligns it with the target
    weight: np.ndarray | None = None  # per program: its weight in the loss / validation MAPE (device_balance)
    copies: np.ndarray | None = None  # programs trained on a second time, unbuilt (``assembly_unbuilt_copies``)
    unbuilt: torch.Tensor | None = None  # the assembly columns of ``extra`` as a program without counts has them
    groups: np.ndarray | None = None  # per program: its (task, device) group, for ``rank_weight``

    def inputs(self, idx) -> torch.Tensor | None:
        """The program-level input rows of the batch ``idx`` (None for a model without them)."""
        return None if self.extra is None else self.extra[idx]


def _prepare(samples: Sequence[LabeledProgram], trained: TrainedModel, dev_index: dict[str, int], labeled: bool = True) -> _Split:
    pack = trained.pack([s.features for s in samples])
    rows = np.array([dev_index[s.device] for s in samples], dtype=np.int64)
    extra = trained.extra_inputs(pack)
    if not labeled:
        return _Split(pack, rows, extra=extra)
    seconds = np.array([s.seconds for s in samples], dtype=np.float64)
    return _Split(pack, rows, trained.label_transform.transform(seconds).astype(np.float32), seconds, extra)


def program_input_scaling(stats: np.ndarray, clip: float) -> dict:
    """``TrainedModel.program_inputs`` of the training programs' ``stats``: each column's mean and std, and the
    range (``lo``, ``hi``) the standardized inputs are held in, in training and prediction alike: +-``clip`` sd (the
    leaf features' bound), and for the assembly's columns also the training programs' own range. Why: a nearly
    constant column (the "built" flag, a rare instruction class's share) standardizes a rare value to hundreds of
    sd, which the first linear layer extrapolates without bound (reports/cross-model-tail.md). The roofline
    columns (log FLOPs, bytes) may leave the training range: a larger program is meant to be predicted slower."""
    mean, std = stats.mean(axis=0), np.maximum(stats.std(axis=0), 1e-6)
    z = (stats - mean) / std
    lo, hi = np.clip(z.min(axis=0), -clip, 0.0), np.clip(z.max(axis=0), 0.0, clip)
    lo[:N_ROOFLINE_STATS], hi[:N_ROOFLINE_STATS] = -clip, clip
    return dict(mean=mean.tolist(), std=std.tolist(), lo=lo.tolist(), hi=hi.tolist())


def withhold_counts(programs: Sequence[LabeledProgram], share: float, seed: int) -> list[LabeledProgram]:
    """``programs`` with the assembly counts of ``share`` of them removed (drawn once with ``seed``), as a failed
    build leaves them: ``TrainConfig.assembly_withheld``."""
    drop = withheld_share(len(programs), share, seed)
    return [p.without_counts() if d else p for p, d in zip(programs, drop)]


def unbuilt_stats(stats: np.ndarray) -> np.ndarray:
    """Program stats (``PackedPrograms.stats``) as programs without counts have them: the assembly columns zero."""
    stats = np.array(stats)
    stats[:, N_ROOFLINE_STATS:] = 0.0
    return stats


def withheld_share(n: int, share: float, seed: int) -> np.ndarray:
    """Which of ``n`` training programs have their counts withheld: one seeded draw, the same in memory and from a
    feature store."""
    return np.random.default_rng(seed).random(n) < share


def fit(config: TrainConfig, train_set: Sequence[LabeledProgram] | FeatureStore,
        val_set: Sequence[LabeledProgram] | None = None, target_pool: Sequence[LabeledProgram] | None = None, *,
        device_table: dict[str, dict[str, float]] | None = None, featurizer_version: str | None = None,
        device: str = "cpu", resume: str | os.PathLike | None = None) -> TrainedModel:
    """Train an ensemble of ``config.ensemble`` members; return the ``TrainedModel``.

    Samples are ``LabeledProgram`` or anything with ``features``, ``device`` and ``seconds`` attributes.
    Everything fitted (normalizers, label transform, device-spec scaling) sees ``train_set`` only; model
    selection, early stopping and the interval calibration see ``val_set`` only. Without a
    ``val_set`` a random ``val_fraction`` of the training programs is held out. ``device_table`` maps
    every device that appears to its spec dict (or is a ``cdmpp.devices.table.DeviceTable``); without one,
    all devices share a zero spec vector.
    ``target_pool`` (unlabeled) switches on domain adaptation unless ``config.da == "none"`` or every pool
    device has training labels and ``config.da_known_devices`` is off (towards new networks on known devices it
    cost MAPE: reports/study-issue19.md, round 12; reports/cross-model-tail.md). It aligns the pool with the
    training programs of its own kind (CPU or GPU code): a GPU held out and aligned with mostly CPU programs sent
    the training's validation MAPE to 100 %.

    ``train_set`` may be a ``FeatureStore`` (read memory-mapped, batch by batch; the GBT blend's inputs and the
    Amdahl anchors' parallel leaves in chunks of programs; needs a ``val_set``, held in memory).
    ``device``: ``cpu``, ``cuda`` or ``auto`` (``cdmpp.model.distributed``); in a torch process group (torchrun)
    the ranks share each batch, and only rank 0 goes on past the transformer's training: other ranks return its
    members uncalibrated (``summary["rank"]``), rank 0's model is the result.
    ``resume``: a file the transformer's run is saved to after every epoch (``RunState``); a run started again
    with the same file, config and data goes on from its last epoch, and ends as the uninterrupted run would.
    """
    start = time.monotonic()
    deadline = start + 60.0 * config.max_minutes
    runner = Runner(device)
    if isinstance(train_set, FeatureStore):
        check_store_recipe(val_set)
    else:
        train_set = list(train_set)
    if not val_set:
        perm = np.random.default_rng(config.seed).permutation(len(train_set))
        n_val = max(1, int(round(config.val_fraction * len(train_set))))
        val_set = [train_set[i] for i in perm[:n_val]]
        train_set = [train_set[i] for i in perm[n_val:]]
    copies = None  # which training programs are trained on a second time, unbuilt
    if config.assembly_counts and config.assembly_withheld > 0:
        withheld = withheld_share(len(train_set), config.assembly_withheld, config.seed)
        if config.assembly_unbuilt_copies:
            copies = withheld
        elif isinstance(train_set, FeatureStore):
            train_set = train_set.without_counts(withheld)
        else:
            train_set = [p.without_counts() if w else p for p, w in zip(train_set, withheld)]
    if device_table is not None:  # tensor-core programs learned as FP32-equivalent time; ``predict`` speeds them up
        table = DeviceSpecs(device_table).table
        val_set = physics.fp32_equivalent(val_set, table)
        if isinstance(train_set, FeatureStore):  # the same from the store's columns (the store is left as it is)
            train_set = train_set.with_seconds(train_set.seconds / physics.tensor_time_shares_of(
                train_set.flops, train_set.tensor_flops, train_set.device_names(), table))
        else:
            train_set = physics.fp32_equivalent(train_set, table)
    target_pool = list(target_pool or []) if config.da != "none" else []
    cols = TrainingColumns.of(train_set)
    if {s.device for s in target_pool} <= set(cols.devices) and not config.da_known_devices:
        target_pool = []
    trained_kinds = {target_kind_of_id(d) for d in set(cols.devices)}
    target_pool = [s for s in target_pool if target_kind_of_id(s.device) in trained_kinds]  # nothing to align with

    all_devices = sorted(set(cols.devices) | {s.device for s in [*val_set, *target_pool]})
    specs = DeviceSpecs(device_table if device_table is not None else {d: {} for d in all_devices})
    specs.fit(cols.devices)
    raw = cols.raw
    normalizer = cols.fit_normalizer(FeatureNormalizer())
    labels = LogLatency().fit(cols.seconds)
    program_inputs = None
    if raw.stats is not None:
        width = (N_INNER_STATS if config.assembly_inner else N_STATS) if config.assembly_counts else N_ROOFLINE_STATS
        stats = raw.stats[:, :width]
        if stats.shape[1] < N_STATS and config.assembly_counts:
            raise ValueError("assembly_counts: the training programs' stats have no assembly counts (a feature store "
                             "written before them): write the store again")
        if stats.shape[1] < width:
            raise ValueError("assembly_inner: the training programs carry no innermost loops' counts (load them with "
                             "load_dataset(..., innermost=True))")
        if copies is not None:  # the copies' absent counts inside the scaled range, as withheld ones would be
            stats = np.vstack([stats, unbuilt_stats(stats[copies])])
        program_inputs = program_input_scaling(stats, normalizer.clip)
    trained = TrainedModel([], normalizer, labels, specs, config.to_dict(),
                           featurizer_version=featurizer_version or current_featurizer_version(),
                           program_inputs=program_inputs)

    dev_matrix, dev_index = specs.matrix(all_devices)
    dev_matrix = torch.from_numpy(dev_matrix)
    train = _Split(cols.normalized(normalizer), np.array([dev_index[d] for d in cols.devices]), None, cols.seconds)
    train.z = labels.transform(train.seconds).astype(np.float32)
    train.extra = trained.extra_inputs(train.pack)
    if copies is not None and train.extra is not None:
        train.copies = np.flatnonzero(copies)
        train.unbuilt = trained.scaled_stats(unbuilt_stats(np.zeros((1, train.extra.shape[1]))))[0, N_ROOFLINE_STATS:]
    val = _prepare(val_set, trained, dev_index)
    target = _prepare(target_pool, trained, dev_index, labeled=False) if target_pool else None
    train.weight = device_weights(cols.devices, cols.devices, config.device_balance)
    if config.rank_weight > 0:
        groups = {}
        train.groups = np.array([groups.setdefault((t, d), len(groups)) for t, d in zip(cols.tasks, cols.devices)])
    val.weight = device_weights(cols.devices, [s.device for s in val_set], config.device_balance)
    if target is not None:
        kinds = {target_kind_of_id(s.device) for s in target_pool}
        same_kind = np.zeros(len(dev_matrix), bool)
        for d, row in dev_index.items():
            same_kind[row] = target_kind_of_id(d) in kinds
        train.da_source = same_kind[train.dev_rows]

    # the members: the best states of one run's best LR cycles, or the best state of each of several runs
    if resume and runner.world > 1:
        raise ValueError("resume: one training process only (not under torchrun)")
    runs = config.ensemble if config.ensemble_of == "runs" else 1
    members, histories, da_dropped, run_state = [], [], None, None
    for i in range(runs):
        run_config = dataclasses.replace(config, seed=config.seed + i)
        run_resume = None if not resume else f"{resume}.run{i}" if i else os.fspath(resume)
        snaps, history, collapsed, saved_run = _train_with_fallback(run_config, train, val, target, dev_matrix, trained,
                                                                deadline, runner, run_resume)
        da_dropped, run_state = da_dropped or collapsed, run_state or saved_run  # the blend's GBT: beside run 0
        taken = snaps[: config.ensemble] if runs == 1 else snaps[:1]
        members.extend(taken)
        histories.append({**history, "members_from_epochs": [epoch for _, _, epoch in taken]})
    trained.members.extend(_model_with(config, train, dev_matrix, trained, state) for _, state, _ in members)
    if not runner.is_main:
        trained.summary = dict(rank=runner.rank, world_size=runner.world, members=histories)
        return trained

    z_val = trained.predict_z(val.pack, [s.device for s in val_set])
    trained.calibrate(z_val, val.z, config.interval)
    mu, lo, hi = trained.interval_z(z_val)
    pred = labels.inverse_transform(mu)
    lo_s, hi_s = labels.inverse_transform(lo), labels.inverse_transform(hi)
    if config.gbt_blend:
        # the GBT's boosting ends gbt_minutes after the transformer's deadline (it also gets what a transformer
        # stopped early left; never under 10 s); the blend weight chosen after it is not counted
        gbt_budget = max(deadline + 60.0 * config.gbt_minutes - time.monotonic(), 10.0)
        factor = _add_gbt_blend(trained, train_set, val_set, pred, config.seed, gbt_budget, config.blend_rank_slack,
                                config.gbt_max_trees, run_state, copies)
        pred, lo_s, hi_s = pred * factor, lo_s * factor, hi_s * factor
    rel = np.abs(pred - val.seconds) / val.seconds
    # where a prediction trained for MAPE sits against the median on programs new to it: the level a device's
    # shots are fitted back to (ShotChoice's base_bias)
    trained.calibration["val_log_bias"] = median_log_error(pred, val.seconds)
    trained.summary = dict(
        n_train=len(cols), n_val=len(val_set), n_target=0 if da_dropped else len(target_pool), devices=all_devices,
        train_devices=sorted(set(cols.devices)), n_features=int(raw.leaves.shape[1]),
        train_seconds=round(time.monotonic() - start, 1), members=histories,
        val=dict(mape=float(rel.mean()), within_10=float((rel <= 0.10).mean()), within_25=float((rel <= 0.25).mean()),
                 interval_coverage=float(((val.seconds >= lo_s) & (val.seconds <= hi_s)).mean())))
    if da_dropped:
        trained.summary["da_collapsed"] = da_dropped
    if config.amdahl_transfer:
        trained.anchors = fork_join_of(cols.devices, cols.seconds, cols.parallel_leaves(), specs.table)
    if runner.world > 1:
        trained.summary["world_size"] = runner.world
    return trained



def _add_gbt_blend(trained: TrainedModel, train_set, val_set, val_pred: np.ndarray, seed: int,
                   budget_s: float, rank_slack: float, max_trees: int = 0, resume: RunState | None = None,
                   copies: np.ndarray | None = None) -> np.ndarray:
    """Fit the pooled GBT on log latency (early stopping on val), choose the blend weight on val; return
    the factor the blend multiplies the members' validation predictions by. With ``resume`` the fitted trees
    are saved beside the run (a resumed run reads them instead of boosting again). ``copies``: the training
    programs it also fits unbuilt, as the transformer does."""
    from cdmpp.model.pooled_gbt import PooledGBT
    from cdmpp.model.blend import blend, blend_weight, ranked_tasks

    # as many threads as the transformer had: 2 for `cdmpp train` here, 1 per job in the protocol
    trees = {"n_estimators": max_trees} if max_trees > 0 else {}
    gbt = PooledGBT(trained.device_specs.table, nthread=torch.get_num_threads(), random_state=seed, target="latency",
                    assembly_counts=bool(trained.config.get("assembly_counts")), **trees)
    saved = resume.last if resume is not None else None  # the transformer's run, just loaded or saved
    if saved is not None and saved.get("gbt") is not None:
        import xgboost as xgb

        gbt.booster_ = xgb.Booster(params={"nthread": gbt.nthread})
        gbt.booster_.load_model(bytearray(saved["gbt"]))
    else:
        gbt.fit(train_set, val_set, time_budget_s=budget_s, unbuilt_copies=copies)
        if saved is not None:
            resume.save(**saved, gbt=bytes(gbt.booster_.save_raw("ubj")))
    gbt.specs = trained.device_specs
    seconds = np.array([s.seconds for s in val_set])
    trained.gbt = gbt
    gbt_pred = gbt.predict(val_set)
    # seconds (what a user asks): the lowest validation MAPE; the order of a task's candidates (what a search
    # asks, TrainedModel.predict(order=True)): the best-ranking weight within rank_slack of that MAPE
    tasks = _task_keys(val_set)
    trained.calibration["gbt_weight"] = blend_weight(seconds, val_pred, gbt_pred)
    trained.calibration["gbt_order_weight"] = blend_weight(seconds, val_pred, gbt_pred, tasks, rank_slack)
    trained.calibration["order_tasks"] = ranked_tasks(tasks)  # how much ranking that weight was chosen on
    return blend(val_pred, gbt_pred, trained.calibration["gbt_weight"]) / val_pred  # gbt_factor, GBT not rerun


def _model_with(config: TrainConfig, train: _Split, dev_matrix: torch.Tensor, trained: TrainedModel,
                state: dict | None = None) -> CDMPPModel:
    n_program_inputs = 0 if trained.program_inputs is None else len(trained.program_inputs["mean"])
    model = CDMPPModel(train.pack.leaves.shape[1], dev_matrix.shape[1], **dataclasses.asdict(config.model),
                       n_program_inputs=n_program_inputs)
    if state is not None:
        model.load_state_dict(state)
        model.eval()
    return model


def _train_with_fallback(config: TrainConfig, train: _Split, val: _Split, target: _Split | None,
                         dev_matrix: torch.Tensor, trained: TrainedModel, deadline: float, runner: Runner,
                         resume: str | None):
    """``_train_run``, and once more without domain adaptation if the alignment won over the labels; returns its
    snapshots, its history, the collapsed run's history (when it fell back) and its ``RunState``."""
    state = RunState(resume, config, train, val, target) if resume else None
    snaps, history = _train_run(config, train, val, target, dev_matrix, trained, deadline, runner, state)
    if history["stopped"] != "collapsed":
        return snaps, history, None, state
    collapsed = {k: history[k] for k in ("best_val_mape", "history")}
    print(f"domain adaptation collapsed training (validation MAPE {history['history'][-1][2]:.3f} at epoch "
          f"{history['history'][-1][0]}): training again without it", file=sys.stderr)
    state = RunState(f"{resume}.no-da", config, train, val, None) if resume else None
    snaps, history = _train_run(config, train, val, None, dev_matrix, trained, deadline, runner, state)
    return snaps, history, collapsed, state


class RunState:
    """A training run saved after every epoch (model, optimizer, LR schedule, random states, the snapshots
    kept so far, the history) to ``path``, so a stopped run goes on where it was. The file names the run it
    belongs to (its config and a digest of its data); a different run refuses it rather than resume from it,
    and nothing is overwritten but the file's own earlier epochs (written aside, then renamed over)."""

    # what may change between a run and its resumption (how members are drawn from runs does not change a run)
    _NOT_THE_RUN = ("progress", "max_minutes", "ensemble_of")

    def __init__(self, path, config: TrainConfig, train: _Split, val: _Split, target: _Split | None):
        self.path = os.fspath(path)
        run = {k: v for k, v in config.to_dict().items() if k not in self._NOT_THE_RUN}
        digest = hashlib.sha256(json.dumps(run, sort_keys=True, default=str).encode())
        for part in (train, val, target):
            for arr in (() if part is None else (part.pack.lengths, part.dev_rows, part.z)):
                if arr is not None:
                    digest.update(np.ascontiguousarray(arr).tobytes())
        self.run = digest.hexdigest()
        self.last: dict | None = None  # what was last loaded or saved, so the file is read once

    def load(self) -> dict | None:
        """The saved state, or None when there is none yet; a file of another run raises ``ValueError``."""
        if not os.path.exists(self.path):
            return None
        state = torch.load(self.path, map_location="cpu", weights_only=False)
        if state.pop("run", None) != self.run:
            raise ValueError(f"{self.path} holds another training run (other config or data); move it away "
                             "or pass another resume file")
        self.last = state
        return state

    def save(self, **state) -> None:
        tmp = f"{self.path}.tmp"
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        torch.save({"run": self.run, **state}, tmp)
        os.replace(tmp, self.path)
        self.last = state


def _train_run(config: TrainConfig, train: _Split, val: _Split, target: _Split | None, dev_matrix: torch.Tensor,
               trained: TrainedModel, deadline: float, runner: Runner, resume: RunState | None = None):
    """One training run: the epoch loop, validation after every epoch, early stopping, a deadline; on
    ``runner``'s device, each rank on its share of every batch; saved to ``resume`` after every epoch and
    resumed from it.

    Returns the best validation state of every LR cycle as ``(val MAPE, state, epoch)``, best first
    (``snapshots[0]`` is the run's overall best), and a history for the training summary.
    """
    seed = config.seed
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    # ranks draw the same batches (rng) but their own target programs for domain adaptation
    da_rng = rng if runner.world == 1 else np.random.default_rng([seed, runner.rank])
    model = _model_with(config, train, dev_matrix, trained).to(runner.device)
    step = runner.forward_module(model)
    # foreach: one fused update over all tensors; PyTorch's CPU default loops over them in Python
    opt = torch.optim.Adam(model.parameters(), lr=config.lr, foreach=True)
    # every program once, then the copies trained unbuilt (``assembly_unbuilt_copies``): positions past n
    n = len(train.pack)
    rows = np.arange(n) if train.copies is None else np.concatenate([np.arange(n), train.copies])
    steps_per_epoch = math.ceil(len(rows) / config.batch_size)
    sched = torch.optim.lr_scheduler.CyclicLR(
        opt, base_lr=config.lr, max_lr=config.max_lr, mode="triangular", cycle_momentum=False,
        step_size_up=max(1, round(steps_per_epoch * config.lr_cycle_epochs / 2)))
    disc = discrepancy(config.da, config.cmd_k)
    matcher = _LengthMatcher(target.pack.lengths) if target is not None else None
    z_all = torch.from_numpy(train.z)
    sigma = trained.label_transform.std_
    cycle_epochs = max(1, round(config.lr_cycle_epochs))
    snapshots: dict[int, tuple] = {}  # LR cycle -> (val MAPE, state, epoch) of its best epoch
    best = (math.inf, -1)  # (val MAPE, epoch) over the run, for early stopping
    history = []
    bar = tqdm(total=config.epochs * steps_per_epoch, desc="snapshots", unit="step",
               disable=not (config.progress and runner.is_main))
    stopped, steps, on, first = "epochs", 0, runner.to, 0
    saved = resume.load() if resume is not None else None
    if saved is not None:
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["optimizer"])
        sched.load_state_dict(saved["schedule"])
        rng.bit_generator.state = saved["rng"]
        torch.set_rng_state(saved["torch_rng"])
        snapshots, best, history, steps = saved["snapshots"], tuple(saved["best"]), saved["history"], saved["steps"]
        first = len(history)
        bar.update(steps)
        print(f"resuming {resume.path}: {first} epochs done" + (", run ended" if saved["stopped"] else ""),
              file=sys.stderr)
        if saved["stopped"] is not None:  # the run had ended: nothing left to train
            first, stopped = config.epochs, saved["stopped"]
    for epoch in range(first, config.epochs):
        model.train()
        total, count = 0.0, 0
        for at in runner.shares(bucketed_batches(train.pack.lengths[rows], config.batch_size, rng)):
            idx, inputs = rows[at], train.inputs(rows[at])
            if train.copies is not None:
                inputs[torch.from_numpy(at >= n), N_ROOFLINE_STATS:] = train.unbuilt
            dev, z = on(dev_matrix[train.dev_rows[idx]]), on(z_all[idx])
            t_inputs = None
            if target is not None:
                t_idx = matcher.sample(train.pack.lengths[idx], da_rng)
                t_inputs = on((*target.pack.batch(t_idx), target.inputs(t_idx)))
            emb, pred, t_emb = step(*on(train.pack.batch(idx)), dev, on(inputs), t_inputs)
            loss = mape_loss(pred, z, sigma, None if train.weight is None else on(torch.from_numpy(train.weight[idx])))
            if train.groups is not None:
                loss = loss + config.rank_weight * rank_loss(pred, z, on(torch.from_numpy(train.groups[idx])), sigma)
            if target is not None:
                source = on(torch.from_numpy(train.da_source[idx]))
                if int(source.sum()) >= MIN_DA_SOURCE:
                    loss = loss + config.da_weight * disc(emb[source], t_emb)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
            opt.step()
            sched.step()
            total, count, steps = total + loss.item() * len(idx), count + len(idx), steps + 1
            bar.update(1)
            if runner.any(time.monotonic() > deadline):
                stopped = "time"
                break
            if steps == config.max_steps:
                stopped = "steps"
                break
        val_mape, nothing = map(runner.agree, _val_scores(model, val, dev_matrix, trained, runner))
        total, count = runner.sum(total, count)
        history.append([epoch, round(total / max(count, 1), 4), round(val_mape, 5)])
        bar.set_postfix(loss=f"{total / max(count, 1):.3g}", val_mape=f"{val_mape:.3f}")
        cycle = epoch // cycle_epochs
        if val_mape < snapshots.get(cycle, (math.inf,))[0]:
            snapshots[cycle] = (val_mape, {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()},
                                epoch)
        if val_mape < best[0]:
            best = (val_mape, epoch)
        if stopped not in ("time", "steps") and epoch - best[1] >= config.patience:
            stopped = "patience"
        if target is not None and nothing >= COLLAPSED_SHARE:
            stopped = "collapsed"
        ended = stopped != "epochs" or epoch == config.epochs - 1
        if resume is not None:
            resume.save(model=model.state_dict(), optimizer=opt.state_dict(), schedule=sched.state_dict(),
                        rng=rng.bit_generator.state, torch_rng=torch.get_rng_state(), snapshots=snapshots,
                        best=best, history=history, steps=steps, stopped=stopped if ended else None)
        if stopped != "epochs":
            break
    bar.close()
    ranked = sorted(snapshots.values(), key=lambda s: s[0])
    return ranked, dict(seed=seed, best_epoch=best[1], best_val_mape=best[0], stopped=stopped, history=history)


class _LengthMatcher:
    """Draws target programs with the leaf counts of a source batch.

    Training batches are length-bucketed (little padding). A uniformly drawn target batch would have a
    different leaf-count mix, so the discrepancy would mostly measure "short vs long programs" (and
    pad every target batch to ~30 leaves, 4x the compute). Matching each source program with a random
    target program of the same leaf count (nearest count if none) leaves only the domain shift.
    """

    def __init__(self, lengths: np.ndarray):
        self.order = np.argsort(lengths, kind="stable")
        self.sorted = lengths[self.order]

    def sample(self, lengths: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        lo = np.searchsorted(self.sorted, lengths, "left")
        hi = np.searchsorted(self.sorted, lengths, "right")
        n = len(self.sorted)
        below, above = np.clip(lo - 1, 0, n - 1), np.clip(lo, 0, n - 1)
        nearest = np.where(np.abs(self.sorted[below] - lengths) <= np.abs(self.sorted[above] - lengths), below, above)
        pick = np.where(hi > lo, lo + (rng.random(len(lengths)) * (hi - lo)).astype(np.int64), nearest)
        return self.order[np.minimum(pick, n - 1)]


@torch.inference_mode()
def _val_scores(model: CDMPPModel, val: _Split, dev_matrix: torch.Tensor, trained: TrainedModel,
                runner: Runner | None = None) -> tuple[float, float]:
    """MAPE on absolute latency of one member over the validation split (the model-selection metric), and the
    share of validation programs it predicts at under ``COLLAPSED_RATIO`` of their latency."""
    model.eval()
    on = (runner or Runner()).to
    z = np.empty(len(val.pack), np.float32)
    for idx in length_sorted_batches(val.pack.lengths, 256):
        z[idx] = model(*on(val.pack.batch(idx)), on(dev_matrix[val.dev_rows[idx]]), on(val.inputs(idx))).cpu().numpy()
    pred = trained.label_transform.inverse_transform(z)
    return (float(np.average(np.abs(pred - val.seconds) / val.seconds, weights=val.weight)),
            float(np.average(pred < COLLAPSED_RATIO * val.seconds, weights=val.weight)))


def finetune(trained: TrainedModel, labeled_set: Sequence[LabeledProgram], config: TrainConfig | None = None,
             steps: int = 100, *, device_table: dict[str, dict[str, float]] | None = None) -> TrainedModel:
    """Adapt a trained model with a handful of measured programs (k-shot); returns a new model.

    Each member takes ``steps`` Adam steps at ``config.finetune_lr`` on (mini)batches of the labeled
    set, in the same loss as training. Normalizers, label transform and calibration stay as trained: with k
    samples there is nothing to refit them on. ``device_table`` adds specs of new devices. Shots of a device
    predicted through an anchor are learned on the anchor (``TrainedModel.on_anchors``).
    """
    config = config or TrainConfig.from_dict(trained.config)
    new = _with_devices(trained, device_table)
    devices = sorted({s.device for s in labeled_set})
    labeled_set = new.on_anchors(labeled_set)
    dev_matrix, dev_index = new.device_specs.matrix([s.device for s in labeled_set])
    data = _prepare(labeled_set, new, dev_index)
    dev_matrix, z_all = torch.from_numpy(dev_matrix), torch.from_numpy(data.z)
    batch = min(config.batch_size, len(labeled_set))
    for i, model in enumerate(new.members):
        torch.manual_seed(config.seed + 1000 + i)
        rng = np.random.default_rng(config.seed + 1000 + i)
        if config.finetune_scope == "head":
            params = [*model.decoder.parameters(), *model.device_encoder.parameters()]
        else:
            params = list(model.parameters())
        opt = torch.optim.Adam(params, lr=config.finetune_lr, foreach=True)
        model.train()
        for _ in range(steps):
            idx = rng.choice(len(labeled_set), size=batch, replace=False)
            pred = model(*data.pack.batch(idx), dev_matrix[data.dev_rows[idx]], data.inputs(idx))
            loss = mape_loss(pred, z_all[idx], new.label_transform.std_)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, config.grad_clip)
            opt.step()
        model.eval()
    if new.gbt is not None:  # the blended GBT learns the shots too (shallow trees on top), or it drags k-shot back
        new.gbt = new.gbt.adapt(labeled_set)
    new.summary = {**new.summary, "finetune": dict(n=len(labeled_set), steps=steps, lr=config.finetune_lr,
                                                   scope=config.finetune_scope, devices=devices)}
    return new


def _with_devices(trained: TrainedModel, device_table) -> TrainedModel:
    """A copy of ``trained`` that also knows the devices of ``device_table`` (a dict or a DeviceTable)."""
    new = copy.deepcopy(trained)
    for name, spec in DeviceSpecs(device_table).table.items():
        new.add_device(name, spec)
    if new.gbt is not None:
        new.gbt.specs = new.device_specs  # the blended GBT reads the same specs
    return new


def finetune_steps(k: int, batch_size: int, passes: int = 20, most: int = 100) -> int:
    """Adam steps for a fine-tune on ``k`` shots: about ``passes`` passes over them, at most ``most``.
    A hundred steps on 16 or 64 shots are a hundred passes, which fits them and leaves the device worse
    than twenty do; a few thousand shots want the hundred (reports/study-issue19.md, round 23)."""
    return int(min(most, max(1, math.ceil(passes * k / max(1, min(batch_size, k))))))


def checked_finetune(trained: TrainedModel, labeled_set: Sequence[LabeledProgram], config: TrainConfig | None = None,
                     steps: int | None = None, *, device_table: dict[str, dict[str, float]] | None = None,
                     folds: int = 4) -> TrainedModel:
    """``finetune``, kept only where cross-validation on the shots says it helps.

    A fine-tune on a dozen or two shots can fit them and throw the rest of the device far off. Each of
    ``folds`` folds fine-tunes on the other shots and predicts its own; when those held-out shots come out
    worse than from the model as it was, the model as it was is returned. Worse in mean absolute log
    error, the scale the model learns on: the MAPE of a dozen shots is decided by the one or two that are
    over-predicted most, and declined fine-tunes that helped the whole device (reports/study-issue19.md,
    round 24). Sets of fewer than
    ``2 * folds`` shots are fine-tuned unchecked: there is nothing to hold out. ``summary["finetune"]``
    says what the check found. ``steps``: by default ``finetune_steps`` of the number of shots.
    """
    labeled_set = list(labeled_set)
    config = config or TrainConfig.from_dict(trained.config)
    steps = finetune_steps(len(labeled_set), config.batch_size) if steps is None else steps
    if len(labeled_set) < 2 * folds:
        return finetune(trained, labeled_set, config, steps, device_table=device_table)
    base = _with_devices(trained, device_table)
    seconds = np.array([s.seconds for s in labeled_set])
    fold_of = np.random.default_rng(len(labeled_set)).permutation(len(labeled_set)) % folds
    adapted = np.empty(len(labeled_set))
    order_on_shots = _shots_choose_order(trained, labeled_set)
    held_out_parts = np.empty((2, len(labeled_set)))  # the adapted members' and GBT's, for the order weight
    for f in range(folds):
        held = np.flatnonzero(fold_of == f)
        fitted = finetune(trained, [s for i, s in enumerate(labeled_set) if fold_of[i] != f], config, steps,
                          device_table=device_table)
        feats, devs = [labeled_set[i].features for i in held], [labeled_set[i].device for i in held]
        adapted[held] = fitted.predict(feats, devs)[0]
        if order_on_shots:
            held_out_parts[:, held] = fitted.predict_parts(feats, devs)
    unadapted = base.predict([s.features for s in labeled_set], [s.device for s in labeled_set])[0]
    gain = np.abs(np.log(unadapted / seconds)) - np.abs(np.log(adapted / seconds))
    check = {"folds": folds, "held_out_log_error": float(np.mean(np.abs(np.log(adapted / seconds)))),
             "unadapted_log_error": float(np.mean(np.abs(np.log(unadapted / seconds)))),
             "gain_se": float(gain.std() / np.sqrt(len(gain))),
             "held_out_mape": float(np.mean(np.abs(adapted / seconds - 1))),
             "unadapted_mape": float(np.mean(np.abs(unadapted / seconds - 1)))}
    check["kept"] = bool(gain.mean() > check["gain_se"])
    new = finetune(trained, labeled_set, config, steps, device_table=device_table) if check["kept"] else base
    new.summary = {**new.summary, "finetune": {**new.summary.get("finetune", {}), "n": len(labeled_set), "check": check}}
    if order_on_shots:  # predictions the shots did not train: held out by the folds, or the model as it was
        parts = held_out_parts if check["kept"] else base.predict_parts([s.features for s in labeled_set],
                                                                        [s.device for s in labeled_set])
        _order_weight_on_shots(new, labeled_set, *parts, config.blend_rank_slack)
    return new


def _task_keys(samples: Sequence[LabeledProgram]) -> list[str]:
    """The (device, task) group of each labelled program, what an order weight ranks within."""
    return [f"{s.device}|{s.task}" for s in samples]


def _shots_choose_order(model: TrainedModel, shots: Sequence[LabeledProgram]) -> bool:
    """Whether the blend's order weight is chosen again on the shots: where they rank at least as many tasks
    as the validation that chose it did. They are the device the model is asked about, and the weight that
    ranked a source device's validation programs best need not rank a device it reaches by transfer best
    (reports/study-issue19.md, round 27)."""
    from cdmpp.model.blend import ranked_tasks

    return model.gbt is not None and ranked_tasks(_task_keys(shots)) >= model.calibration["order_tasks"]


def _order_weight_on_shots(model: TrainedModel, shots: Sequence[LabeledProgram], members: np.ndarray,
                           gbt: np.ndarray, rank_slack: float) -> None:
    """Choose the blend's order weight on the shots by the rule validation chose it by (``_add_gbt_blend``),
    from the blend's two parts ``members`` and ``gbt`` predicted for them."""
    from cdmpp.model.blend import blend_weight, ranked_tasks

    tasks = _task_keys(shots)
    before = model.calibration["gbt_order_weight"]
    model.calibration["gbt_order_weight"] = blend_weight([s.seconds for s in shots], members, gbt, tasks, rank_slack)
    model.summary["finetune"]["order_weight"] = {"validation": before, "shots": model.calibration["gbt_order_weight"],
                                                 "ranked_tasks": ranked_tasks(tasks)}
