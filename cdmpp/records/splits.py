"""Grouped, seeded splits of a dataset into train / validation / test (``Split``), and the random split by
program hash or by task that both ``cdmpp train`` (its validation share) and the evaluation's settings
(``cdmpp.evaluation.splits``) draw from.

A split is a pure function of the data and a seed: programs are ordered by record id first, so load order
does not matter, and programs are cut by a group key (program hash across devices, or task), so twins (the
same program measured on two devices) and the programs of one task stay on one side.
"""

from __future__ import annotations

import math
import zlib
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np


@dataclass
class Unlabeled:
    """A program whose latency the trainer must not see (domain-adaptation target pool)."""

    features: object
    device: str
    task: str = ""
    seconds: float = math.nan


@dataclass
class Split:
    kind: str
    train: list
    val: list
    test: list
    target_pool: list = field(default_factory=list)  # Unlabeled: features of the target domain, no labels
    shots: list = field(default_factory=list)  # labeled target programs chosen for k-shot fine-tuning
    info: dict = field(default_factory=dict)
    twins: dict = field(default_factory=dict)  # program hash -> source-device latency (seen-programs setting)

    def overlaps(self) -> dict[str, int]:
        """Record ids (and program hashes per device) found in two labeled parts; all zero when sound."""
        parts = dict(train=self.train, val=self.val, test=self.test, shots=self.shots)
        out = {}
        names = list(parts)
        for i, a in enumerate(names):
            for b in names[i + 1:]:
                ids_a = {(p.device, p.features.program_hash) for p in parts[a]}
                ids_b = {(p.device, p.features.program_hash) for p in parts[b]}
                out[f"{a}&{b}"] = len(ids_a & ids_b)
        return out


def _programs(ds) -> list:
    progs = list(getattr(ds, "programs", ds))
    return sorted(progs, key=lambda p: p.record_id)


def _rng(seed: int, *names: str) -> np.random.Generator:
    return np.random.default_rng([seed, *(zlib.crc32(n.encode()) for n in names)])


def _split_by_key(programs: list, key: Callable, fractions: Sequence[float], rng: np.random.Generator) -> list[list]:
    """Shuffle the distinct keys and cut them into len(fractions)+1 parts (the last gets the rest)."""
    groups: dict = defaultdict(list)
    for p in programs:
        groups[key(p)].append(p)
    keys = sorted(groups)
    keys = [keys[i] for i in rng.permutation(len(keys))]
    parts, start = [], 0
    for f in fractions:
        n = int(round(f * len(keys)))
        if f > 0 and len(keys) >= len(fractions) + 1:
            n = max(1, n)
        parts.append(keys[start:start + n])
        start += n
    parts.append(keys[start:])
    return [[p for k in part for p in groups[k]] for part in parts]


_RANDOM_GROUPS = {  # random_split's ``by``: (group key, random stream name, description)
    "program": (lambda p: p.features.program_hash, "random", "program hash across devices (twins on one side)"),
    "task": (lambda p: p.task, "random-task", "task (new tasks only)"),
}


def random_split(ds, seed: int = 0, val: float = 0.1, test: float = 0.2, device: str | None = None,
                 by: str = "program") -> Split:
    """Random split by program hash across devices (twins on one side), or only ``device``'s programs.
    ``by="task"`` draws whole tasks instead, so validation and test hold only tasks training never saw
    (what a model meets on a network it was not trained on)."""
    if by not in _RANDOM_GROUPS:
        raise ValueError(f"by = {by!r}: expected 'program' or 'task'")
    programs = [p for p in _programs(ds) if device is None or p.device == device]
    if not programs:
        raise ValueError(f"no programs{' on ' + device if device else ''} to split")
    key, stream, group = _RANDOM_GROUPS[by]
    test_, val_, train = _split_by_key(programs, key, [test, val], _rng(seed, stream))
    info = dict(kind="random", seed=seed, by=by, devices=sorted({p.device for p in programs}),
                description=f"random-new: by {group}: {1 - val - test:.0%} "
                            f"train, {val:.0%} val, {test:.0%} test (seed {seed})")
    return _finish(Split("random", train, val_, test_, info=info))


def _finish(split: Split) -> Split:
    split.info.update(n_train=len(split.train), n_val=len(split.val), n_test=len(split.test),
                      n_shots=len(split.shots), n_target_pool=len(split.target_pool))
    return split
