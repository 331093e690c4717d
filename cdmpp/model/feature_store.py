"""Featurized programs on disk as ``.npy`` columns, read memory-mapped: what training past memory reads.

A process that holds every program as Python objects (``LabeledProgram``, ``ProgramFeatures``) grows with the
dataset: ~5 KB of leaf rows a program, ~5 GB at a million (Tenset has 51.6M records). ``write_store`` writes the
packed columns once, chunk by chunk (each chunk what ``PackedPrograms.from_programs`` makes of it, so a store and
an in-memory pack hold the same numbers; features left in the feature cache are read one cache chunk at a time,
each once, and their rows written at their place); ``FeatureStore`` opens them with ``np.load(mmap_mode="r")`` and
training gathers each batch's rows from the mapped file. Pages read are handed back to the kernel (``release``:
every few batches and after every chunk of a pass over the file), or a whole epoch would leave the file resident
and counted in the process's memory. What stays in memory is per program: offsets, labels, device and task codes,
program stats, FLOPs and hashes (~80 bytes). The pooled GBT of the blend and the Amdahl anchors read the leaf rows
in chunks of programs (``program_chunks``), as the normalizer does.

Files (format 3): ``leaves.npy`` float32 ``[n_leaves, F]`` (raw, as featurized), ``positions.npy`` int64
``[n_leaves]``, ``offsets.npy`` int64 ``[n + 1]``, ``seconds.npy`` float64, ``device.npy`` / ``task.npy`` int32
codes into ``meta.json``'s lists, ``flops.npy`` and ``tensor_flops.npy`` float64 (``ProgramFeatures.flops`` and
``tensor_flops``), ``hashes.npy`` bytes (program hashes), ``stats.npy`` float64 ``[n, N_STATS]`` (TVM features only; an older store's ``[n, 3]``: no assembly counts). An
older format (1: before flops and hashes; 2: before tensor-core FLOPs) is refused.
"""

from __future__ import annotations

import copy
import json
import mmap
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from cdmpp.model.network import N_ROOFLINE_STATS, N_STATS, PackedPrograms

FORMAT = 3  # 2: flops.npy and hashes.npy (the pooled GBT's log FLOPs input; programs rebuilt from a store); 3: tensor_flops.npy
# (labels learned as FP32-equivalent time, physics.fp32_equivalent)
CHUNK_PROGRAMS = 8192
CHUNK_ROWS = 1 << 14  # leaf rows per read of a pass over the file (11 MB of float32 TVM rows, 21 MB as float64)


class _NpyWriter:
    """One ``.npy`` file of a known shape written in pieces (plain writes, no mapping): appended, or each put at
    its row (``at``; every row written once, in any order)."""

    def __init__(self, path: Path, dtype, shape: tuple):
        self.f, self.dtype, self.shape, self.rows = open(path, "wb"), np.dtype(dtype), shape, 0
        np.lib.format.write_array_header_1_0(self.f, dict(descr=np.lib.format.dtype_to_descr(self.dtype),
                                                          fortran_order=False, shape=shape))
        self.start, self.row_bytes = self.f.tell(), self.dtype.itemsize * int(np.prod(shape[1:], dtype=np.int64))

    def append(self, a: np.ndarray, at: int | None = None) -> None:
        a = np.ascontiguousarray(a, dtype=self.dtype)
        if at is not None:
            self.f.seek(self.start + int(at) * self.row_bytes)
        self.rows += len(a)
        self.f.write(a.tobytes())

    def close(self) -> None:
        self.f.close()
        if self.rows != self.shape[0]:
            raise RuntimeError(f"{self.f.name}: wrote {self.rows} rows, header says {self.shape[0]}")


def _writers(path: Path, n: int, n_leaves: int, n_features: int, stats: int, hash_dtype) -> dict:
    """``stats``: the stats column's width (0: none)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "meta.json").unlink(missing_ok=True)  # written last: a write cut short leaves no store, not a wrong one
    cols = dict(leaves=(np.float32, (n_leaves, n_features)), positions=(np.int64, (n_leaves,)),
                offsets=(np.int64, (n + 1,)), seconds=(np.float64, (n,)), device=(np.int32, (n,)), task=(np.int32, (n,)),
                flops=(np.float64, (n,)), tensor_flops=(np.float64, (n,)), hashes=(hash_dtype, (n,)))
    if stats:
        cols["stats"] = (np.float64, (n, stats))
    else:  # a store rewritten in place loses the column it no longer has
        (path / "stats.npy").unlink(missing_ok=True)
    return {name: _NpyWriter(path / f"{name}.npy", dt, shape) for name, (dt, shape) in cols.items()}


def _close(path: Path, writers: dict, meta: dict) -> None:
    for w in writers.values():
        w.close()
    (path / "meta.json").write_text(json.dumps({**meta, "format": FORMAT}, indent=1))


def write_store(path: str | Path, samples: Sequence, featurizer_version: str = "unknown",
                chunk: int = CHUNK_PROGRAMS) -> "FeatureStore":
    """Write labelled programs (``LabeledProgram``s) as a store at ``path``; return it opened.

    Their features may be left on disk (``CachedFeatures``, ``load_dataset(features_on_disk=True)``): then the
    programs are written grouped by the cache chunk that holds them, each cache chunk read once (a split's
    programs are in random order against the cache: read in store order, every ``chunk`` programs would read most
    cache chunks again). Each program's leaf count, hence where its rows go, is known beforehand (``n_leaves``;
    an empty program gets one zero leaf, as in ``from_programs``), so a group's rows are written at their place,
    ``chunk`` programs packed at a time; the per-program columns (~80 bytes a program) are filled in memory and
    written last. In memory at once: one cache chunk and one pack. Features in memory are one group, written in
    order. Every pack is ``PackedPrograms.from_programs`` (its stats per program), so the store is the same
    whichever way it is written."""
    from cdmpp.records.dataset import CachedFeatures, read_cached

    path = Path(path)
    if not samples:
        raise ValueError("no programs to store")
    n = len(samples)
    lengths = np.fromiter((max(1, s.features.n_leaves) for s in samples), np.int64, n)
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    devices = sorted({s.device for s in samples})
    tasks = sorted({getattr(s, "task", "") for s in samples})
    dcode, tcode = {d: i for i, d in enumerate(devices)}, {t: i for i, t in enumerate(tasks)}
    code: dict = {}  # cache chunk path ("": features in memory) -> group number
    group = np.fromiter((code.setdefault(s.features.path if isinstance(s.features, CachedFeatures) else "", len(code))
                         for s in samples), np.int64, n)
    order = np.argsort(group, kind="stable")  # by group, each in store order
    cuts = np.searchsorted(group[order], np.arange(len(code) + 1))
    hashes = np.zeros(n, f"S{max(1, max(len(s.features.program_hash) for s in samples))}")
    flops, tensor, stats, w = np.zeros(n), np.zeros(n), None, None
    for g, key in enumerate(code):
        idx = order[cuts[g]:cuts[g + 1]]
        feats = [samples[i].features for i in idx]
        if key:
            feats = read_cached(feats)  # this cache chunk's one read
        for a in range(0, len(idx), chunk):
            part, p = idx[a:a + chunk], PackedPrograms.from_programs(feats[a:a + chunk])
            if w is None:  # the header needs the feature count
                width = 0 if p.stats is None else p.stats.shape[1]
                w = _writers(path, n, int(offsets[-1]), p.leaves.shape[1], width, hashes.dtype)
                stats = np.zeros((n, width)) if width else None
            if not np.array_equal(np.diff(p.offsets), lengths[part]):
                raise RuntimeError(f"{path}: programs' rows disagree with their leaf counts (n_leaves); write it again")
            runs = [0, *(np.flatnonzero(np.diff(part) != 1) + 1), len(part)]
            for lo, hi in zip(runs[:-1], runs[1:]):  # consecutive programs of the store: one write
                rows = slice(p.offsets[lo], p.offsets[hi])
                w["leaves"].append(p.leaves[rows], at=offsets[part[lo]])
                w["positions"].append(p.positions[rows], at=offsets[part[lo]])
            flops[part] = np.array([f.flops for f in feats[a:a + chunk]], dtype=np.float64)
            tensor[part] = np.array([f.tensor_flops or 0.0 for f in feats[a:a + chunk]], dtype=np.float64)
            hashes[part] = [f.program_hash.encode() for f in feats[a:a + chunk]]
            if stats is not None:
                stats[part] = p.stats
        del feats, p  # before the next chunk is read
    w["offsets"].append(offsets)
    w["seconds"].append(np.fromiter((s.seconds for s in samples), np.float64, n))
    w["device"].append(np.fromiter((dcode[s.device] for s in samples), np.int32, n))
    w["task"].append(np.fromiter((tcode[getattr(s, "task", "")] for s in samples), np.int32, n))
    w["flops"].append(flops)
    w["tensor_flops"].append(tensor)
    w["hashes"].append(hashes)
    if stats is not None:
        w["stats"].append(stats)
    _close(path, w, dict(n=n, devices=devices, tasks=tasks, featurizer_version=featurizer_version,
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
    w = _writers(path, n, n_leaves, src.leaves.shape[1], 0 if src.stats is None else src.stats.shape[1], src.hashes.dtype)
    w["offsets"].append([0])
    for copy, k in enumerate(counts):
        rows = int(src.offsets[k])
        for a in range(0, rows, CHUNK_ROWS):
            w["leaves"].append(src.leaves[a:min(rows, a + CHUNK_ROWS)])
            w["positions"].append(src.positions[a:min(rows, a + CHUNK_ROWS)])
            src.release()
        w["offsets"].append(src.offsets[1:k + 1] + copy * total)
        for name in ("seconds", "device", "task", "flops", "tensor_flops", "hashes") + (("stats",) if src.stats is not None else ()):
            w[name].append(getattr(src, name)[:k])
    _close(path, w, {**src.meta, "n": n, "replicated_from": str(src.path)})
    return FeatureStore(path)


class FeatureStore:
    """A written store, opened: leaf rows and positions memory-mapped, the per-program columns in memory.
    A missing, old (format 1) or inconsistent store is refused with what to do."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if not (self.path / "meta.json").exists():
            raise FileNotFoundError(f"{self.path}: no feature store here (no meta.json; a write cut short leaves "
                                    "none): write one with `cdmpp train --write-store`")
        try:
            self.meta = json.loads((self.path / "meta.json").read_text())
        except ValueError as e:
            raise ValueError(f"{self.path}/meta.json is not JSON ({e}): write the store again") from None
        fmt = self.meta.get("format", 1)
        if fmt != FORMAT:
            raise ValueError(f"{self.path}: a feature store of format {fmt}; this cdmpp reads format {FORMAT} (program "
                             "FLOPs, hashes and tensor-core FLOPs added): write it again with `cdmpp train --write-store`")
        self.devices, self.tasks = list(self.meta["devices"]), list(self.meta["tasks"])

        def col(name, mapped=False, required=True):
            f = self.path / f"{name}.npy"
            if not f.exists():
                if required:
                    raise ValueError(f"{self.path}: {name}.npy is missing: the store is incomplete, write it again")
                return None
            try:
                return np.load(f, mmap_mode="r" if mapped else None)
            except (ValueError, OSError, EOFError) as e:
                raise ValueError(f"{f}: unreadable ({e}): the store is corrupt, write it again") from None

        self.leaves, self.positions = col("leaves", True), col("positions", True)
        self.offsets, self.stats = col("offsets"), col("stats", required=False)
        self.seconds, self.device, self.task = col("seconds"), col("device"), col("task")
        self.flops, self.tensor_flops, self.hashes = col("flops"), col("tensor_flops"), col("hashes")
        self._check()

    def _check(self) -> None:
        n = self.meta["n"]
        per_program = dict(seconds=self.seconds, device=self.device, task=self.task, flops=self.flops,
                           tensor_flops=self.tensor_flops, hashes=self.hashes)
        if self.stats is not None:
            per_program["stats"] = self.stats
        bad = [name for name, a in per_program.items() if len(a) != n]
        o = self.offsets
        if len(o) != n + 1 or o[0] != 0 or o[-1] != len(self.leaves) or len(self.positions) != len(self.leaves):
            bad.append("offsets")
        elif n and np.diff(o).min() < 1:
            bad.append("offsets (a program without rows)")
        if n and (self.device.max() >= len(self.devices) or self.task.max() >= len(self.tasks)):
            bad.append("device/task codes")
        if bad:
            raise ValueError(f"{self.path}: {', '.join(bad)} disagree with meta.json's {n} programs: the store is "
                             "corrupt, write it again")

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

    def program_chunks(self):
        """``(a, b, rows, offsets)`` for programs ``a:b`` in chunks of about ``CHUNK_ROWS`` leaf rows (at least one
        program): their raw rows in memory and offsets into them (pages released after each)."""
        a, n = 0, len(self)
        while a < n:
            b = max(a + 1, min(n, int(np.searchsorted(self.offsets, self.offsets[a] + CHUNK_ROWS, "right")) - 1))
            lo, hi = int(self.offsets[a]), int(self.offsets[b])
            yield a, b, np.array(self.leaves[lo:hi]), self.offsets[a:b + 1] - lo
            self.release()
            a = b

    def programs(self) -> list:
        """The store's programs as ``LabeledProgram``s in memory (what a validation split is; a program stored
        without leaves comes back with the one zero leaf every pack gives it)."""
        from cdmpp.program.features import ProgramFeatures
        from cdmpp.records.dataset import LabeledProgram

        out = []
        for a, b, rows, offsets in self.program_chunks():
            pos = np.array(self.positions[self.offsets[a]:self.offsets[b]])
            for i in range(a, b):
                r = slice(offsets[i - a], offsets[i - a + 1])
                f = ProgramFeatures(rows[r], pos[r], float(self.flops[i]), self.hashes[i].decode(),
                                    tensor_flops=float(self.tensor_flops[i]))
                out.append(LabeledProgram(f, self.devices[self.device[i]], float(self.seconds[i]),
                                          task=self.tasks[self.task[i]]))
        return out

    def pack(self) -> PackedPrograms:
        """The store's programs as a ``PackedPrograms`` over the mapped rows (raw; ``with_transform`` normalizes)."""
        return PackedPrograms(self.leaves, self.positions, self.offsets, self.stats, release=self.release)

    def with_seconds(self, seconds: np.ndarray) -> "FeatureStore":
        """The same store read with other labels (``fit``'s FP32-equivalent ones); this one keeps its own."""
        if len(seconds) != len(self):
            raise ValueError(f"{len(seconds)} labels for a store of {len(self)} programs")
        view = copy.copy(self)
        view.seconds = np.asarray(seconds, dtype=np.float64)
        return view

    def without_counts(self, withheld: np.ndarray) -> "FeatureStore":
        """The same store read with the assembly counts of the ``withheld`` programs (a boolean mask) removed, as a
        failed build leaves them (``TrainConfig.assembly_withheld``); this one keeps its own. A store written without
        counts has none to remove."""
        if len(withheld) != len(self):
            raise ValueError(f"{len(withheld)} programs to withhold counts of in a store of {len(self)}")
        if self.stats is None or self.stats.shape[1] < N_STATS:
            return self
        view = copy.copy(self)
        view.stats = np.array(self.stats)
        view.stats[np.asarray(withheld, bool), N_ROOFLINE_STATS:] = 0.0  # assembly_stats of no counts
        return view

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

    def parallel_leaves(self) -> np.ndarray:
        """Per program, its leaves under a parallel loop (what the Amdahl anchors' fork/join cost divides by):
        at once in memory, in chunks of programs from a store."""
        from cdmpp.model.physics import parallel_leaves

        if self.store is None:
            return parallel_leaves(self.raw.leaves, self.raw.offsets)
        return np.concatenate([parallel_leaves(rows, offsets) for _, _, rows, offsets in self.store.program_chunks()])


def check_store_recipe(val_set) -> None:
    """What ``fit`` needs beside a store: a validation set in memory (a random share of a store is not drawn)."""
    if not val_set:
        raise ValueError("training from a feature store needs a validation set (val_set)")
