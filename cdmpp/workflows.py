"""Train, sample, fine-tune: the workflow of an engineer adapting cdmpp to a device (``cdmpp train``,
``cdmpp sample``, ``cdmpp finetune``). Each reads the dataset, fits or picks, and writes a checkpoint or ids."""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import math
import os
import sys
from typing import Sequence

from cdmpp import defaults
from cdmpp.devices.spec import target_kind_of_id
from cdmpp.devices.table import DeviceTable
from cdmpp.model import distributed
from cdmpp.model.kinds import KindModels, load_model
from cdmpp.model.sampling import choose_shots, model_free_embedding
from cdmpp.model.training import TrainConfig, checked_finetune, fit
from cdmpp.predict.devices import target_kind
from cdmpp.provenance import git_commit
from cdmpp.records.dataset import load_dataset, per_device_counts
from cdmpp.records.splits import random_split
from cdmpp.zoo.tasks import TaskTable


def model_hash(model) -> str:
    """Short SHA-256 of what a model's answers depend on: every member's weights, the calibration (interval,
    blend weights), the blended GBT's trees, the devices it knows with their anchors, and each device's shots
    correction (``cdmpp finetune``), so the model version changes whenever an answer can."""
    import hashlib

    if isinstance(model, KindModels):
        return hashlib.sha256("".join(f"{k}:{model_hash(p)}" for k, p in sorted(model.parts.items())).encode()).hexdigest()[:10]
    h = hashlib.sha256()
    for m in model.members:
        for key, value in sorted(m.state_dict().items()):
            h.update(key.encode())
            h.update(value.detach().cpu().contiguous().numpy().tobytes())
    h.update(json.dumps(model.calibration, sort_keys=True, default=str).encode())
    if model.gbt is not None:
        h.update(bytes(model.gbt.booster_.save_raw("ubj")))
    h.update(json.dumps([model.device_specs.table, model.anchors], sort_keys=True, default=str).encode())
    for device, choice in sorted(model.shot_choices.items()):
        for part, shift, trees in choice.parts_:
            h.update(json.dumps([device, part._asdict(), shift]).encode())
            if trees is not None:
                h.update(bytes(trees.get_booster().save_raw("ubj")))
    return h.hexdigest()[:10]


def _version(model) -> str:
    return f"cdmpp-{_dt.date.today().strftime('%Y%m%d')}-{model_hash(model)}"


def train_checkpoint(recipe: str, dataset: str, out: str, task_table: str = defaults.TASK_TABLE,
                     devices: str = defaults.DEVICES, max_minutes: float | None = None, val: float = 0.1,
                     seed: int = 0, limit: int | None = None, progress: bool = True, device_ids=None,
                     exclude_networks=None, val_by: str = "task", device: str = "cpu", store: str | None = None,
                     other_parts_from: str | None = None):
    """Train on every program of ``dataset`` (all devices, or ``device_ids``) and save a checkpoint the
    ``Predictor`` can serve. ``val`` of the tasks (``val_by="task"``; or of the program hashes, "program")
    is held out for model selection and calibration: early stopping, the blend weight and the intervals
    are then chosen on tasks the model never trained on, as a network it was not trained on presents
    them; picked on programs of seen tasks, the blend leaned on the GBT, which extrapolates worst.
    ``exclude_networks``: leave out every program of a task that occurs in one of them (as cross-model
    does), so benchmarks on those networks test a model that never saw them. ``device``: cpu, cuda or auto;
    under torchrun every process loads the data and trains its share of each batch (DistributedDataParallel),
    and rank 0 alone saves (``cdmpp.model.distributed``).
    ``store``: train from a folder ``write_split_store`` wrote instead (the training programs read memory-mapped,
    the validation programs in memory; the dataset options were applied when it was written).
    CPU and GPU programs together (``TrainConfig.per_kind``): one model per kind of code, each fitted on its
    kind's programs alone, saved as one ``cdmpp.model.kinds.KindModels`` checkpoint.
    ``other_parts_from``: a ``KindModels`` checkpoint whose parts of the kinds not trained here are saved
    unchanged beside the new ones (GPU data added: retrain the GPU part in minutes, not the CPU part's hour)."""
    kept = _other_parts(other_parts_from) if other_parts_from else {}
    device = distributed.setup(device)
    progress = progress and distributed.is_main()
    if store:
        train, val_set, data = open_split_store(store)
    else:
        ds = load_dataset(dataset, TaskTable.load(task_table), devices=device_ids, limit=limit, progress=progress)
        split = training_split(ds, seed, val, val_by, exclude_networks)
        train, val_set, data = split.train, split.val, dict(programs=len(ds), per_device=per_device_counts(ds))
    table = DeviceTable(devices)
    missing = sorted(set(data["per_device"]) - set(table.ids()))
    if missing:
        raise ValueError(f"devices {missing} have no spec in {devices}")
    over = {"max_minutes": max_minutes} if max_minutes else {}
    config = dataclasses.replace(TrainConfig.recipe(recipe), seed=seed, progress=progress, **over)
    specs = table.spec_table()
    kind_of = {d: target_kind(table.get(d).target) for d in specs}
    kinds = sorted({kind_of[d] for d in data["per_device"]})
    if kept and not config.per_kind:
        raise ValueError(f"recipe {recipe!r} trains one model for every kind of code: it cannot keep other parts")
    if config.per_kind and (len(kinds) > 1 or kept):  # each part knows the devices of its kind alone
        if store and len(kinds) > 1:
            raise ValueError(f"{store} holds {' and '.join(kinds)} programs and the recipe trains one model per kind: "
                             "write one store per kind (--device-ids) and train from each")
        jobs = {k: ([p for p in train if kind_of[p.device] == k], [p for p in val_set if kind_of[p.device] == k],
                    {d: s for d, s in specs.items() if kind_of[d] == k}) for k in kinds}
    else:
        jobs = {"": (train, val_set, specs)}
    # a stopped `cdmpp train` started again goes on from its last epoch (one process only; torchrun restarts)
    states = {k: None if distributed.world()[1] > 1 else os.path.join(out, f"train-state-{k}.pt" if k else "train-state.pt")
              for k in jobs}
    parts = {k: fit(config.for_kind(k), t, v, device_table=d, device=device, resume=states[k])
             for k, (t, v, d) in jobs.items()}
    if kept:
        parts = {k: parts.get(k, kept.get(k)) for k in sorted({*kept, *parts})}
    model = parts[""] if "" in parts else KindModels(parts)
    if not distributed.is_main():
        return model
    shared = dict(recipe=recipe, dataset=data.pop("dataset", dataset), git_commit=git_commit(), data=data,
                  trained_at=_dt.datetime.now().isoformat(timespec="seconds"), devices={s.id: s.to_dict() for s in table})
    for kind, part in parts.items():
        if kept.get(kind) is not part:
            part.summary.update(model_version=_version(part), **shared)
    if isinstance(model, KindModels):
        model.summary = model.merged_summary()
        if kept:  # the whole model's data and date: each part's own stay in summary["kinds"]
            per_device = {d: n for k, p in parts.items() for d, n in p.summary.get("data", {}).get("per_device", {}).items()
                          if kind_of.get(d) == k}  # each part's programs of its own kind
            model.summary.update(trained_at=shared["trained_at"], git_commit=shared["git_commit"],
                                 data=dict(programs=sum(v["programs"] for v in per_device.values()), per_device=per_device),
                                 kept_parts={k: p.summary.get("model_version") for k, p in parts.items()
                                             if kept.get(k) is p})
        model.summary["model_version"] = _version(model)
    model.save(out)
    for state in states.values():
        if state:
            os.remove(state)
    return model


def _other_parts(checkpoint: str) -> dict:
    """The parts of a ``KindModels`` checkpoint, by kind, for ``train_checkpoint(other_parts_from=...)``."""
    try:
        model = load_model(checkpoint)
    except FileNotFoundError as e:
        raise ValueError(str(e)) from None
    if not isinstance(model, KindModels):
        raise ValueError(f"{checkpoint} holds one model for every kind of code: it has no other parts to keep")
    return dict(model.parts)


def write_split_store(out: str, dataset: str, task_table: str = defaults.TASK_TABLE, val: float = 0.1, seed: int = 0,
                      limit: int | None = None, device_ids=None, exclude_networks=None, val_by: str = "task",
                      progress: bool = True) -> dict:
    """``train_checkpoint``'s split of ``dataset`` (the same options, the same programs on each side) written as
    two feature stores, ``out/train`` and ``out/val``, and ``out/split.json`` (what was split, how): what
    ``train_checkpoint(store=out)`` trains from without the dataset in memory. Returns the split's description.
    Only the labels and ids are held here (the split needs no more); the features stay in the feature cache
    (``load_dataset(features_on_disk=True)``) and are read one cache chunk at a time, each once per store."""
    from pathlib import Path

    from cdmpp.model.feature_store import write_store
    from cdmpp.program.features import FEATURIZER_VERSION

    ds = load_dataset(dataset, TaskTable.load(task_table), devices=device_ids, limit=limit, progress=progress,
                      features_on_disk=True)
    split = training_split(ds, seed, val, val_by, exclude_networks)
    if not split.train or not split.val:
        raise ValueError(f"{dataset}: {len(split.train)} training and {len(split.val)} validation programs; a store "
                         "needs both (more programs, or another --val)")
    for part, programs in (("train", split.train), ("val", split.val)):
        write_store(Path(out) / part, programs, featurizer_version=str(FEATURIZER_VERSION))
    info = dict(dataset=dataset, seed=seed, val=val, val_by=val_by, limit=limit, device_ids=device_ids,
                exclude_networks=exclude_networks, n_train=len(split.train), n_val=len(split.val),
                programs=len(ds), per_device=per_device_counts(ds), featurizer_version=str(FEATURIZER_VERSION),
                written_at=_dt.datetime.now().isoformat(timespec="seconds"), git_commit=git_commit())
    (Path(out) / "split.json").write_text(json.dumps(info, indent=1))
    return info


def open_split_store(path: str):
    """``(training store, validation programs, data summary)`` of a folder ``write_split_store`` wrote; refused
    when it is not one, or when its features come from another featurizer than this cdmpp's."""
    from pathlib import Path

    from cdmpp.model.feature_store import FeatureStore
    from cdmpp.program.features import FEATURIZER_VERSION

    split_file = Path(path) / "split.json"
    if not split_file.exists():
        raise FileNotFoundError(f"{path}: no training store here (no split.json): write one with "
                                "`cdmpp train --write-store DIR`")
    info = json.loads(split_file.read_text())
    train, val = FeatureStore(Path(path) / "train"), FeatureStore(Path(path) / "val")
    for part in (train, val):
        if part.meta.get("featurizer_version") != str(FEATURIZER_VERSION):
            raise ValueError(f"{part.path}: featurized by featurizer {part.meta.get('featurizer_version')}, this cdmpp's "
                             f"is {FEATURIZER_VERSION}: write the store again")
    if (len(train), len(val)) != (info["n_train"], info["n_val"]):
        raise ValueError(f"{path}: split.json says {info['n_train']} + {info['n_val']} programs, the stores hold "
                         f"{len(train)} + {len(val)}: write the store again")
    return train, val.programs(), dict(programs=info["programs"], per_device=info["per_device"],
                                       dataset=info["dataset"], store=str(path))


def training_split(ds, seed: int = 0, val: float = 0.1, val_by: str = "task", exclude_networks=None):
    """The train/validation split ``train_checkpoint`` fits and selects on (``ds`` loses the programs of
    ``exclude_networks``), so a study of a checkpoint can score the validation tasks it was chosen on."""
    if exclude_networks:
        excluded = set(exclude_networks)
        ds.programs = [p for p in ds.programs if not any(o.split("@")[0] in excluded for o in p.networks)]
    return random_split(ds, seed, val=val, test=0.0, by=val_by)


def sample_ids(k: int, pool: str, device: str, model_path: str | None = None, sampler: str = "kmeans",
               task_table: str = defaults.TASK_TABLE, seed: int = 0, limit: int | None = None) -> list[str]:
    """Record ids of the ``k`` programs of ``pool`` worth measuring on ``device`` (not measured there yet).

    Candidates are the distinct programs (task, program hash) of the pool's records; KMeans on the
    model's embeddings (or, without a model, on mean-pooled normalized features) picks the program
    nearest each centroid.
    """
    ds = load_dataset(pool, TaskTable.load(task_table), limit=limit, progress=False)
    done = {(p.task, p.features.program_hash) for p in ds.programs if p.device == device}
    cands, seen = [], set()
    for p in sorted(ds.programs, key=lambda p: p.record_id):
        key = (p.task, p.features.program_hash)
        if key not in done and key not in seen:
            seen.add(key)
            cands.append(p)
    if not cands:
        return []
    if model_path:
        emb = _part(load_model(model_path), device).embed([p.features for p in cands])
    else:
        emb = model_free_embedding(cands, cands)
    return [cands[i].record_id for i in choose_shots(cands, k, sampler, seed, emb)]


def sample_features(k: int, features: Sequence, model_path: str | None = None, sampler: str = "kmeans",
                    seed: int = 0, kind: str = "llvm") -> list[int]:
    """Indices of the ``k`` of ``features`` (``ProgramFeatures`` of any programs: TVMScript files, a
    MetaSchedule database, ...) worth measuring: KMeans on the embeddings of the model of their ``kind`` of
    code ("llvm" or "cuda"), else on mean-pooled normalized features, the program nearest each centroid."""
    from types import SimpleNamespace

    if not features:
        return []
    if model_path:
        emb = load_model(model_path).part(kind).embed(list(features))
    else:
        wrapped = [SimpleNamespace(features=f) for f in features]
        emb = model_free_embedding(wrapped, wrapped)
    return [int(i) for i in choose_shots(features, min(k, len(features)), sampler, seed, emb)]


def finetune_checkpoint(model_path: str, dataset: str, device: str, ids: Sequence[str], out: str,
                        steps: int | None = None, task_table: str = defaults.TASK_TABLE,
                        devices: str = defaults.DEVICES, scope: str | None = None, how: str = "choice"):
    """Adapt a checkpoint to ``device`` with the programs ``ids`` (from ``sample_ids``) as measured there.

    ``how="choice"`` (default): ``ShotChoice`` on the checkpoint's prediction, stored with the model and
    applied to every later prediction for ``device`` (cross-validation on the shots picks the prediction as
    is, corrected by the shots' ratio or a GBT of it, a GBT of the shots alone, or a blend; on an unseen
    CPU the network fine-tune ended 2x worse than a GBT of the shots alone, which is now one of the
    candidates: reports/leave-one-chip-out.md). ``how="network"``: fine-tune the network
    (``checked_finetune``; ``steps``, ``scope`` "head" or "all" as there).

    An id names a program by its task and program hash (``device|task|hash``), so ids sampled from
    another device's records match this device's measurements of the same programs.
    """
    if how not in ("choice", "network"):
        raise ValueError(f"how = {how!r}: expected choice or network")
    keys = {tuple(i.strip().split("|")[-2:]) for i in ids if i.strip()}
    ds = load_dataset(dataset, TaskTable.load(task_table), devices=[device], progress=False)  # its measurements only
    shots = [p for p in ds.programs if p.device == device and (p.task, p.features.program_hash) in keys]
    found = {(p.task, p.features.program_hash) for p in shots}
    if len(found) < len(keys):
        print(f"finetune: {len(keys) - len(found)} of {len(keys)} ids have no measurement on {device} yet",
              file=sys.stderr)
    if not shots:
        raise ValueError(f"none of the {len(keys)} ids is measured on {device} in {dataset}")
    table = DeviceTable(devices)
    whole = load_model(model_path)
    trained = _part(whole, device, table)
    extra = {} if device in trained.device_specs.table else {device: table.get(device).specs()}
    unbuilt = sum(p.features.asm is None for p in shots) if trained.config.get("assembly_counts") else 0
    if unbuilt:  # a query is built before it is predicted: shots predicted unbuilt would teach the wrong correction
        print(f"finetune: {unbuilt} of {len(shots)} shots are not built for {device}'s target, and this model reads "
              f"the builds' counts: run `cdmpp assembly --device {device}` first", file=sys.stderr)
    if how == "choice":
        new = adapt_by_choice(trained, shots, device, extra)
    else:
        config = TrainConfig.from_dict({**trained.config, **({"finetune_scope": scope} if scope else {})})
        new = checked_finetune(trained, shots, config, steps=steps, device_table=extra)
    check = new.summary.get("finetune", {}).get("check")
    if check and not check["kept"]:
        print(f"finetune: not kept: held-out shots off by a factor {math.exp(check['held_out_log_error']):.2f} "
              f"(geometric mean) after fine-tuning, {math.exp(check['unadapted_log_error']):.2f} before (kept only when "
              f"better by more than the standard error, {check['gain_se']:.3f} in log); {out} is "
              f"the model as it was, with {device}",
              file=sys.stderr)
    known = dict(new.summary.get("devices", {}))
    if device in table:
        known[device] = table.get(device).to_dict()
    if isinstance(whole, KindModels):  # the other kind's part as it was
        kind = next(k for k, p in whole.parts.items() if p is trained)
        new = KindModels({**whole.parts, kind: new}, {**whole.summary, "finetune": new.summary["finetune"]})
    new.summary.update(model_version=_version(new), base_model_version=whole.summary.get("model_version"),
                       devices={**whole.summary.get("devices", {}), **known})
    new.save(out)
    return new


def _part(model, device: str, table: DeviceTable | None = None):
    """The part of ``model`` (a ``TrainedModel`` or ``KindModels``) that predicts ``device``: the one that knows
    it, else the one of its kind of code (its target in the device table, else its id)."""
    if device in model.device_ids():
        return model.part_for(device)
    table = table if table is not None else DeviceTable()
    return model.part(target_kind(table.get(device).target) if device in table else target_kind_of_id(device))


def adapt_by_choice(trained, shots: Sequence, device: str, new_devices: dict | None = None):
    """A copy of ``trained`` whose predictions for ``device`` go through a ``ShotChoice`` fitted on ``shots``
    (labelled programs measured there), its base the model's own prediction without any earlier choice."""
    import copy

    from cdmpp.model.shots import ShotChoice

    new = copy.copy(trained)
    new.device_specs = copy.deepcopy(trained.device_specs)
    if trained.gbt is not None:  # the blended GBT reads the same device table
        new.gbt = copy.copy(trained.gbt)
        new.gbt.specs = new.device_specs
    for name, spec in (new_devices or {}).items():
        new.add_device(name, spec)
    new.shot_choices = {d: c for d, c in trained.shot_choices.items() if d != device}
    base = lambda ps: new.predict([p.features for p in ps], device)[0]  # noqa: E731
    choice = ShotChoice(base, seed=0, base_bias=trained.calibration.get("val_log_bias", 0.0),
                        assembly_counts=bool(trained.config.get("assembly_counts"))).fit(list(shots))
    new.shot_choices = {**new.shot_choices, device: choice}
    new.summary = {**trained.summary, "finetune": dict(n=len(shots), device=device, how="choice",
                                                        choice=choice.describe())}
    return new
