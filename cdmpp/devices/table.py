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
            raise KeyError(f"unknown device {device_id!r} in {self.path}; known devices: "
                           f"{', '.join(self._specs) or '(none)'}") from None

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
