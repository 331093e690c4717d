"""Devices as a predictor sees them: an id resolved once into its target, target kind and spec vector.

``Devices.get(id)`` answers from the model's checkpoint and the device table (``cdmpp.devices.table``):
a device of the table the model never saw joins the model from its specs, once. The target kind
("llvm" or "cuda") is the kind of the device's TVM target as the table records it (the checkpoint's
copy for a device no longer in the table), never read from the id. Every later use of the device
(featurizing for its kind, refusing a program of another kind, the model call) takes the resolved
``Device``, so one request resolves its device once.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from typing import Sequence


class UnknownDeviceError(KeyError):
    def __init__(self, device: str, known: Sequence[str]):
        super().__init__(device)
        self.device, self.known = device, list(known)

    def __str__(self) -> str:
        return (f"unknown device {self.device!r}; known devices: {', '.join(self.known)} "
                "(describe a new one with `cdmpp devices add SPEC.json`)")


@dataclass(frozen=True)
class Device:
    """A device the model can predict: its id, TVM target (a dict), target kind, spec vector, whether the
    model trained on it, and ``info`` (what ``/v1/devices`` shows: the checkpoint's record of it, its
    target and specs)."""

    id: str
    kind: str  # target kind: "llvm" or "cuda"
    target: dict = field(default_factory=dict)
    specs: dict = field(default_factory=dict)
    trained: bool = True
    info: dict = field(default_factory=dict)


def target_kind(target) -> str:
    """The kind of a TVM target dict: "cuda" for a CUDA target, else "llvm" (a device with no recorded
    target is a CPU, the kind every cdmpp device table entry had before GPUs)."""
    kind = target.get("kind") if isinstance(target, dict) else None
    return "cuda" if kind == "cuda" else "llvm"


class Devices:
    """The devices a model answers for: its checkpoint's and those of the device table at ``table``."""

    def __init__(self, model, table: str | os.PathLike | None):
        self.model = model
        self._table_path = table
        self._table = None
        self._resolved: dict[str, Device] = {}
        self._lock = threading.Lock()

    def table(self):
        """The device table (``cdmpp.devices.table.DeviceTable``) read once; empty when there is none."""
        if self._table is None:
            from cdmpp.devices.table import DeviceTable

            self._table = DeviceTable(self._table_path) if self._table_path else {}
        return self._table

    def ids(self) -> list[str]:
        table = self.table()
        return sorted(set(self.model.device_ids()) | set(table.ids() if table else ()))

    def get(self, device: "str | Device") -> Device:
        """``device`` resolved (a ``Device`` passes through); raises ``UnknownDeviceError``."""
        if isinstance(device, Device):
            return device
        found = self._resolved.get(device)
        return found if found is not None else self._resolve(device)

    def _resolve(self, device: str) -> Device:
        table = self.table()
        in_table = bool(table) and isinstance(device, str) and device in table
        with self._lock:
            if device in self._resolved:
                return self._resolved[device]
            summary = self.model.summary
            known = summary.get("devices")
            info = dict(known.get(device, {})) if isinstance(known, dict) else {}  # fit() stores a plain list
            spec_target = table.get(device).target if in_table else None
            if spec_target is not None:
                info.setdefault("target", spec_target)
            target = spec_target if spec_target is not None else info.get("target") or {}
            if device not in self.model.device_ids():
                if not in_table:
                    raise UnknownDeviceError(device, self.ids())
                # predicted from its specs alone, by the model of its kind of code
                self.model.part(target_kind(target)).add_device(device, table.get(device).specs())
                self.model.add_reference_levels(table.spec_table())
            info.setdefault("specs", self.model.part_for(device).device_specs.table[device])
            train = summary.get("train_devices")
            resolved = Device(device, target_kind(target), dict(target) if isinstance(target, dict) else {},
                              dict(info["specs"]), True if train is None else device in train, info)
            self._resolved[device] = resolved
            return resolved
