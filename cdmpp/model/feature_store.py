"""Featurized programs on disk as ``.npy`` columns, read memory-mapped: what training past memory reads.

A process that holds every program as Python objects (``LabeledProgram``, ``ProgramFeatures``) grows with the
dataset: ~5 KB of leaf rows a program, ~5 GB at a million (Tenset has 51.6M records). ``write_store`` writes
the packed columns once, chunk by chunk (each chunk what ``PackedPrograms.from_programs`` makes of it, so a
store and an in-memory pack hold the same numbers); ``FeatureStore`` opens them with ``np.load(mmap_mode="r")``
and training gathers each batch's rows from the mapped file. Pages read are handed back to the kernel
(``release``: every few batches and after every chunk of a pass over the file), or a whole epoch would leave the file
resident and counted in the process's memory. What stays in memory is per program: offsets, labels, device
and task codes, program stats (~60 bytes).

Files: ``leaves.npy`` float32 ``[n_leaves, F]`` (raw, as featurized), ``positions.npy`` int64 ``[n_leaves]``,
``offsets.npy`` int64 ``[n + 1]``, ``seconds.npy`` float64, ``device.npy`` / ``task.npy`` int32 codes into
``meta.json``'s lists, ``stats.npy`` float64 ``[n, 3]`` (TVM features only).
"""

from __future__ import annotations

import json
import mmap
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from cdmpp.model.network import PackedPrograms

CHUNK_PROGRAMS = 8192
CHUNK_ROWS = 1 << 14  # leaf rows per read of a pass over the file (11 MB of float32 TVM rows, 21 MB as float64)


class _NpyWriter:
    """One ``.npy`` file of a known shape written in appended pieces (plain writes, no mapping)."""

    def __init__(self, path: Path, dtype, shape: tuple):
        self.f, self.dtype, self.shape, self.rows = open(path, "wb"), np.dtype(dtype), shape, 0
        np.lib.format.write_array_header_1_0(self.f, dict(descr=np.lib.format.dtype_to_descr(self.dtype),
                                                          fortran_order=False, shape=shape))

    def append(self, a: np.ndarray) -> None:
        a = np.ascontiguousarray(a, dtype=self.dtype)
        self.rows += len(a)
        self.f.write(a.tobytes())

    def close(self) -> None:
        self.f.close()
        if self.rows != self.shape[0]:
            raise RuntimeError(f"{self.f.name}: wrote {self.rows} rows, header says {self.shape[0]}")


def _writers(path: Path, n: int, n_leaves: int, n_features: int, stats: bool) -> dict:
    path.mkdir(parents=True, exist_ok=True)
    cols = dict(leaves=(np.float32, (n_leaves, n_features)), positions=(np.int64, (n_leaves,)),
                offsets=(np.int64, (n + 1,)), seconds=(np.float64, (n,)), device=(np.int32, (n,)), task=(np.int32, (n,)))
    if stats:
        cols["stats"] = (np.float64, (n, 3))
    else:  # a store rewritten in place loses the column it no longer has
        (path / "stats.npy").unlink(missing_ok=True)
    return {name: _NpyWriter(path / f"{name}.npy", dt, shape) for name, (dt, shape) in cols.items()}


def _close(path: Path, writers: dict, meta: dict) -> None:
    for w in writers.values():
        w.close()
    (path / "meta.json").write_text(json.dumps(meta, indent=1))


def write_store(path: str | Path, samples: Sequence, featurizer_version: str = "unknown",
                chunk: int = CHUNK_PROGRAMS) -> "FeatureStore":
    """Write labelled programs (``LabeledProgram``s) as a store at ``path``; return it opened."""
    path = Path(path)
    if not samples:
        raise ValueError("no programs to store")
    feats = [s.features for s in samples]
    n_leaves = sum(max(1, len(f.leaf_features)) for f in feats)  # an empty program gets one zero leaf (from_programs)
    devices = sorted({s.device for s in samples})
    tasks = sorted({getattr(s, "task", "") for s in samples})
    dcode, tcode = {d: i for i, d in enumerate(devices)}, {t: i for i, t in enumerate(tasks)}
    first = PackedPrograms.from_programs(feats[:1])
    w = _writers(path, len(samples), n_leaves, first.leaves.shape[1], first.stats is not None)
    w["offsets"].append([0])
    base = 0
    for a in range(0, len(samples), chunk):
        part = samples[a:a + chunk]
        p = PackedPrograms.from_programs([s.features for s in part])
        w["leaves"].append(p.leaves)
        w["positions"].append(p.positions)
        w["offsets"].append(p.offsets[1:] + base)
        base += int(p.offsets[-1])
        w["seconds"].append([s.seconds for s in part])
        w["device"].append([dcode[s.device] for s in part])
        w["task"].append([tcode[getattr(s, "task", "")] for s in part])
        if "stats" in w:
            w["stats"].append(p.stats)
    _close(path, w, dict(n=len(samples), devices=devices, tasks=tasks, featurizer_version=featurizer_version,
                         replicated_from=None))
    return FeatureStore(path)


def replicate_store(src: "FeatureStore", path: str | Path, n: int) -> "FeatureStore":
    """A store of ``n`` programs made of ``src``'s repeated (labels and all): a store as large as a benchmark
    of memory needs, from real featurized programs. Not training data: its programs are copies."""
    path = Path(path)
    reps, rest = divmod(n, len(src))
    counts = [len(src)] * reps + ([rest] if rest else [])
    total = int(src.offsets[-1])
    n_leaves = reps * total + int(src.offsets[rest])
    w = _writers(path, n, n_leaves, src.leaves.shape[1], src.stats is not None)
    w["offsets"].append([0])
    for copy, k in enumerate(counts):
        rows = int(src.offsets[k])
        for a in range(0, rows, CHUNK_ROWS):
            w["leaves"].append(src.leaves[a:min(rows, a + CHUNK_ROWS)])
            w["positions"].append(src.positions[a:min(rows, a + CHUNK_ROWS)])
            src.release()
        w["offsets"].append(src.offsets[1:k + 1] + copy * total)
        for name in ("seconds", "device", "task") + (("stats",) if src.stats is not None else ()):
            w[name].append(getattr(src, name)[:k])
    _close(path, w, {**src.meta, "n": n, "replicated_from": str(src.path)})
    return FeatureStore(path)


class FeatureStore:
    """A written store, opened: leaf rows and positions memory-mapped, the per-program columns in memory."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if not (self.path / "meta.json").exists():
            raise FileNotFoundError(f"{self.path}: no feature store here (looked for meta.json)")
        self.meta = json.loads((self.path / "meta.json").read_text())
        self.devices, self.tasks = list(self.meta["devices"]), list(self.meta["tasks"])

        def col(name, mapped=False):
            f = self.path / f"{name}.npy"
            return np.load(f, mmap_mode="r" if mapped else None) if f.exists() else None

        self.leaves, self.positions = col("leaves", True), col("positions", True)
        self.offsets, self.stats = col("offsets"), col("stats")
        self.seconds, self.device, self.task = col("seconds"), col("device"), col("task")

    def __len__(self) -> int:
        return len(self.seconds)

    def release(self) -> None:
        """Drop the mapped pages from this process (MADV_DONTNEED; the page cache keeps them): resident memory
        stays what the last few batches read, not the whole file."""
        for a in (self.leaves, self.positions):
            mm = getattr(a, "_mmap", None)
            if mm is not None and hasattr(mmap, "MADV_DONTNEED"):
                mm.madvise(mmap.MADV_DONTNEED)

    def leaf_chunks(self):
        """The raw leaf rows in chunks of ``CHUNK_ROWS`` (pages released after each)."""
        for a in range(0, len(self.leaves), CHUNK_ROWS):
            yield np.array(self.leaves[a:a + CHUNK_ROWS])
            self.release()

    def pack(self) -> PackedPrograms:
        """The store's programs as a ``PackedPrograms`` over the mapped rows (raw; ``with_transform`` normalizes)."""
        return PackedPrograms(self.leaves, self.positions, self.offsets, self.stats, release=self.release)

    def device_names(self) -> list[str]:
        """The device of each program (one list entry per program, the names shared)."""
        return [self.devices[c] for c in self.device.tolist()]


@dataclass
class TrainingColumns:
    """What ``fit`` reads of its training programs, whether they are in memory or in a store."""

    raw: PackedPrograms  # raw leaf rows
    devices: list[str]  # per program
    seconds: np.ndarray
    tasks: list  # per program
    store: FeatureStore | None = None

    @classmethod
    def of(cls, samples) -> "TrainingColumns":
        if isinstance(samples, FeatureStore):
            return cls(samples.pack(), samples.device_names(), np.array(samples.seconds, dtype=np.float64),
                       [samples.tasks[c] for c in samples.task.tolist()], samples)
        return cls(PackedPrograms.from_programs([s.features for s in samples]),
                   [s.device for s in samples], np.array([s.seconds for s in samples]),
                   [getattr(s, "task", None) for s in samples])

    def __len__(self) -> int:
        return len(self.seconds)

    def fit_normalizer(self, normalizer):
        """Fit ``normalizer`` on the leaves: at once in memory, in chunks from a store."""
        if self.store is None:
            return normalizer.fit(self.raw.leaves)
        return normalizer.fit_chunks(self.store.leaf_chunks)

    def normalized(self, normalizer) -> PackedPrograms:
        """The pack training batches come from: normalized once in memory; from a store, normalized per batch."""
        if self.store is None:
            return self.raw.with_leaves(normalizer.transform(self.raw.leaves))
        return self.raw.with_transform(normalizer.transform)


def check_store_recipe(config, val_set) -> None:
    """Whether ``fit`` can train ``config`` (a ``TrainConfig``) from a store: these options read every
    training program at once."""
    needs_all = [name for name in ("gbt_blend", "amdahl_transfer") if getattr(config, name)]
    if needs_all:
        raise ValueError(f"training from a feature store: {', '.join(needs_all)} read every training program in "
                         "memory; set them to false")
    if not val_set:
        raise ValueError("training from a feature store needs a validation set (val_set)")
