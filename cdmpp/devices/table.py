"""The table of known devices (``datasets/devices.json`` by default): ``DeviceTable``, and
``python -m cdmpp.devices.table`` to probe this CPU and add it."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Iterator

from cdmpp import defaults
from cdmpp.devices.probe import probe_local_cpu
from cdmpp.devices.spec import DeviceSpec, SPEC_FIELDS, describe_relation


class DeviceTable:
    """The device spec table in a JSON file (a list of :class:`DeviceSpec` dicts).

    :meth:`add` writes through at once: several collectors may add devices to one table, so a save first
    re-reads the file and keeps every device it finds there (adding never drops one), then replaces the
    file atomically (tmp file + ``os.replace``) so a crash never leaves half a table.
    """

    def __init__(self, path: str | os.PathLike = defaults.DEVICES):
        self.path = Path(path)
        self._specs: dict[str, DeviceSpec] = self._read()

    def _read(self) -> dict[str, DeviceSpec]:
        if not self.path.exists():
            return {}
        with open(self.path) as f:
            data = json.load(f)
        return {d["id"]: DeviceSpec.from_dict(d) for d in data}

    def ids(self) -> list[str]:
        return list(self._specs)

    def get(self, device_id: str) -> DeviceSpec:
        try:
            return self._specs[device_id]
        except KeyError:
            where = self.path if self.path.exists() else f"{self.path} (no such file: pass --devices PATH)"
            raise KeyError(f"unknown device {device_id!r} in {where}; known devices: "
                           f"{', '.join(self._specs) or '(none)'} (cdmpp devices lists them)") from None

    def __contains__(self, device_id: str) -> bool:
        return device_id in self._specs

    def __len__(self) -> int:
        return len(self._specs)

    def __iter__(self) -> Iterator[DeviceSpec]:
        return iter(self._specs.values())

    def add(self, spec: DeviceSpec, save: bool = True) -> DeviceSpec:
        """Add or update (re-probe) ``spec``; fills an empty ``relation`` from the same chip's devices.

        Raises ``ValueError`` if the id is taken by a different hardware or target: an id must name one device.
        """
        old = self._specs.get(spec.id)
        if old is not None and (old.hardware != spec.hardware or old.target != spec.target):
            raise ValueError(f"device id {spec.id!r} already names {old.hardware} / {old.target}, "
                             f"not {spec.hardware} / {spec.target}")
        if not spec.relation:
            spec.relation = describe_relation(spec, self._specs.values())
        self._specs[spec.id] = spec
        if save:
            self.save()
        return spec

    def replace(self, spec: DeviceSpec) -> DeviceSpec:
        """Add ``spec``, replacing whatever the table holds under its id (``cdmpp devices add --replace``)."""
        self._specs.pop(spec.id, None)
        return self.add(spec)  # the save merges the file's other devices, this one from memory

    def save(self) -> None:
        on_disk = self._read()
        merged = {**on_disk, **self._specs}
        self._specs = merged
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=self.path.name + ".", suffix=".tmp", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w") as f:
                json.dump([s.to_dict() for s in merged.values()], f, indent=1)
                f.write("\n")
            os.replace(tmp, self.path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise

    def spec_table(self) -> dict[str, dict[str, float]]:
        """{id: {spec: value}} for the model's device-spec normalizer."""
        return {i: s.specs() for i, s in self._specs.items()}


def spec_problems(d) -> list[str]:
    """What is wrong with a device spec dict (empty: it is valid): missing fields, wrong types, values out
    of range. ``DeviceSpec.from_dict`` checks presence only; a table entry feeds the model's device
    encoder, so a missing or non-positive number there would turn into a silently wrong prediction."""
    import math

    if not isinstance(d, dict):
        return [f"expected a JSON object, got {type(d).__name__}"]
    out = []
    missing = [n for n in ("id", "kind", "hardware", "target", "threads", *SPEC_FIELDS) if n not in d]
    if missing:
        out.append(f"missing fields: {', '.join(missing)}")
    if "id" in d and not (isinstance(d["id"], str) and "/" in d["id"] and d["id"].strip() == d["id"]):
        out.append(f"id must be <hardware>[-<threads>t]/<target label> (e.g. amd-epyc-znver4-2t/llvm-avx512), "
                   f"got {d['id']!r}")
    if "kind" in d and d["kind"] not in ("cpu", "gpu"):
        out.append(f"kind must be 'cpu' or 'gpu', got {d['kind']!r}")
    if "hardware" in d and not (isinstance(d["hardware"], str) and d["hardware"].strip()):
        out.append("hardware must be a non-empty string (the chip's name)")
    if "target" in d and not (isinstance(d["target"], dict) and isinstance(d["target"].get("kind"), str)):
        out.append(f"target must be a TVM target dict with a 'kind' (e.g. {{\"kind\": \"llvm\", \"mcpu\": "
                   f"\"znver4\", \"num-cores\": 2}}), got {d['target']!r}")
    for name in ("threads", "cores"):
        if name in d and not (isinstance(d[name], int) and not isinstance(d[name], bool) and d[name] >= 1):
            out.append(f"{name} must be an integer >= 1, got {d[name]!r}")
    for name in SPEC_FIELDS:
        if name in ("cores",) or name not in d:
            continue
        v = d[name]
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        low = 0.0 if name in ("l1d_kb", "l2_kb", "l3_kb") else None  # a GPU has no L3
        if not ok or (v < low if low is not None else v <= 0):
            out.append(f"{name} must be a {'non-negative' if low is not None else 'positive'} number, got {v!r}")
    for name, unit in (("reference_s", "seconds"), ("level_gflops", "GFLOP/s"), ("tensor_gflops", "GFLOP/s")):
        v = d.get(name)
        if v is not None and not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0):
            out.append(f"{name} must be a positive number of {unit} or null, got {v!r}")
    return out


def main(argv=None) -> int:
    """``python -m cdmpp.devices.table --threads 2 [--mcpu x86-64-v3]``: probe this CPU and add it to the table.

    Re-probing an existing id replaces its numbers (e.g. after a probe on a busy machine was flagged).
    """
    import argparse

    p = argparse.ArgumentParser(prog="python -m cdmpp.devices.table", description=main.__doc__)
    p.add_argument("--threads", type=int, action="append", help="thread count (repeatable); default all cpus")
    p.add_argument("--mcpu", action="append", help="LLVM cpu (repeatable); default this host's")
    p.add_argument("--table", default=defaults.DEVICES)
    args = p.parse_args(argv)
    table = DeviceTable(args.table)
    for mcpu in args.mcpu or [None]:
        for threads in args.threads or [os.cpu_count() or 1]:
            spec = probe_local_cpu(threads, mcpu)
            spec.relation = describe_relation(spec, [s for s in table if s.id != spec.id])
            table.add(spec)
            print(spec.id, {f: getattr(spec, f) for f in SPEC_FIELDS}, spec.probe.get("warning", ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
