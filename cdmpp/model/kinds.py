"""One trained model per kind of code: CPU programs (TVM target "llvm") and GPU programs ("cuda").

Trained beside 150,000 CPU programs the transformer did not rank a GPU's programs at all (within-task
Spearman -0.03 on the held-out H200); trained on the GPUs alone it ranks them (0.667) and is 46.9 % off
instead of 81 % (reports/gpu-transformer.md). No program is a twin across kinds and no device runs both,
so nothing is lost by the split. ``KindModels`` holds the parts and answers as one model: each call goes to
the part that knows its device; a device new to the model joins the part of its target's kind
(``cdmpp.predict.devices.Devices``, which reads the kind from the device table, never from the id).

On disk: ``kinds.json`` (each kind's sub-folder and the merged summary) beside one ``TrainedModel``
checkpoint folder per kind. ``load_model`` reads either layout.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import numpy as np

KINDS_FILE = "kinds.json"
# what the merged summary takes from the first part that has it (they are the same run's)
_SHARED = ("recipe", "dataset", "trained_at", "git_commit", "data", "rank")


class KindModels:
    """``{kind: TrainedModel}`` answering as one model; ``summary`` merges the parts' (``train_devices``
    and ``devices`` are their union, ``kinds`` each part's own summary)."""

    def __init__(self, parts: dict, summary: dict | None = None):
        if not parts:
            raise ValueError("KindModels needs at least one part")
        self.parts = dict(parts)
        self.summary = summary if summary is not None else self.merged_summary()

    def merged_summary(self) -> dict:
        out: dict = {"kinds": {k: {x: v for x, v in p.summary.items() if x not in ("devices", "members")}
                               for k, p in self.parts.items()},
                     "train_devices": sorted({d for p in self.parts.values() for d in p.summary.get("train_devices", [])}),
                     "devices": {d: info for p in self.parts.values() if isinstance(p.summary.get("devices"), dict)
                                 for d, info in p.summary["devices"].items()},  # fit() alone stores a list
                     "n_train": sum(p.summary.get("n_train", 0) for p in self.parts.values())}
        for key in _SHARED:
            out.update({key: p.summary[key] for p in reversed(self.parts.values()) if key in p.summary})
        return out

    # ---- routing ------------------------------------------------------------------------------------
    def part(self, kind: str):
        """The model of ``kind`` ("llvm" or "cuda")."""
        if kind not in self.parts:
            raise ValueError(f"this model has no part for {kind!r} code; it predicts {sorted(self.parts)}")
        return self.parts[kind]

    def part_for(self, device: str):
        """The part that knows ``device`` (a device new to the model joins ``part(kind)`` first)."""
        for part in self.parts.values():
            if device in part.device_specs.table:
                return part
        raise KeyError(f"device {device!r} is in no part of the model; add it to the part of its kind first "
                       "(KindModels.part(kind).add_device(name, spec))")

    def predict(self, programs, devices: str | Sequence[str], batch_size: int = 256, order: bool = False):
        """``TrainedModel.predict``, each program by the part that knows its device."""
        return self.predict_orders(programs, devices, batch_size, (order,))[0]

    def predict_orders(self, programs, devices: str | Sequence[str], batch_size: int = 256,
                       orders: Sequence[bool] = (False, True)) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """``TrainedModel.predict_orders``, each program by the part that knows its device."""
        if isinstance(devices, str):
            return self.part_for(devices).predict_orders(programs, devices, batch_size, orders)
        programs, devices = list(programs), list(devices)
        if len(devices) != len(programs):
            raise ValueError(f"{len(devices)} devices for {len(programs)} programs: pass one device name or one per program")
        part_of = {d: self.part_for(d) for d in set(devices)}
        groups: dict[int, tuple] = {}  # id(part) -> (part, rows)
        for i, d in enumerate(devices):
            groups.setdefault(id(part_of[d]), (part_of[d], []))[1].append(i)
        out = [tuple(np.empty(len(programs)) for _ in range(3)) for _ in orders]
        for part, rows in groups.values():
            got = part.predict_orders([programs[i] for i in rows], [devices[i] for i in rows], batch_size, orders)
            for whole, answer in zip(out, got):
                for array, values in zip(whole, answer):
                    array[rows] = values
        return out

    def add_reference_levels(self, table: dict[str, dict]) -> None:
        for p in self.parts.values():
            p.add_reference_levels(table)

    def device_ids(self) -> list[str]:
        return sorted({d for p in self.parts.values() for d in p.device_specs.table})

    # ---- what /v1/models shows -----------------------------------------------------------------------
    @property
    def members(self) -> list:
        return [m for p in self.parts.values() for m in p.members]

    @property
    def calibration(self) -> dict:
        return {k: p.calibration for k, p in self.parts.items()}

    @property
    def featurizer_version(self) -> str:
        return next(iter(self.parts.values())).featurizer_version

    # ---- persistence --------------------------------------------------------------------------------
    def save(self, directory: str | Path) -> Path:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        for kind, p in self.parts.items():
            p.save(directory / kind)
        for stale in ("predictor.json", "weights.safetensors", "gbt.ubj.gz"):  # a one-model checkpoint saved here before
            (directory / stale).unlink(missing_ok=True)
        (directory / KINDS_FILE).write_text(json.dumps({"kinds": {k: k for k in self.parts}, "summary": self.summary},
                                                       indent=1))
        return directory

    @classmethod
    def load(cls, directory: str | Path) -> "KindModels":
        from cdmpp.model.checkpoint import TrainedModel

        directory = Path(directory)
        meta = json.loads((directory / KINDS_FILE).read_text())
        return cls({k: TrainedModel.load(directory / sub) for k, sub in meta["kinds"].items()}, meta.get("summary"))


def is_checkpoint(directory: str | Path) -> bool:
    """Whether ``directory`` holds a checkpoint of either layout."""
    return (Path(directory) / "predictor.json").exists() or (Path(directory) / KINDS_FILE).exists()


def load_model(directory: str | Path):
    """A checkpoint folder as a ``KindModels`` (``kinds.json``) or a ``TrainedModel`` (``predictor.json``)."""
    from cdmpp.model.checkpoint import TrainedModel

    if not is_checkpoint(directory):
        raise FileNotFoundError(f"no cdmpp checkpoint at {directory} (expected predictor.json or {KINDS_FILE})")
    return KindModels.load(directory) if (Path(directory) / KINDS_FILE).exists() else TrainedModel.load(directory)


def read_summary(directory: str | Path) -> dict:
    """A checkpoint's summary from its JSON alone (no torch): what ``cdmpp devices`` lists."""
    directory = Path(directory)
    name = KINDS_FILE if (directory / KINDS_FILE).exists() else "predictor.json"
    if not (directory / name).exists():
        raise FileNotFoundError(f"no cdmpp checkpoint at {directory} (expected predictor.json or {KINDS_FILE})")
    return json.loads((directory / name).read_text()).get("summary") or {}
