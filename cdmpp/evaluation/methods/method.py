"""``Method``: what every latency predictor in an evaluation is to the harness: cdmpp, its ablations and
every peer. A method is an estimator (scikit-learn style): settings in the constructor, ``fit`` learns
and returns ``self``, learned state ends in ``_``, ``predict`` has no side effects, ``adapt`` returns a
new method for the target device and leaves the source one as it was.

Samples are anything with ``features``, ``device``, ``seconds`` and ``task`` (``LabeledProgram``).
Methods by short name: ``cdmpp.evaluation.methods.registry`` (``build(["cdmpp", "pooled-gbt", "xgb"], context)``).

XGBoost runs one thread by default: on a 2-core machine shared with a measurement job, OpenMP's
spin-waiting made 2 threads ~18x slower than 1; pass ``nthread`` to change it.
"""

from __future__ import annotations

from typing import Protocol, Sequence

import numpy as np


class Method(Protocol):
    label: str  # the row name in reports
    predicts: str  # "seconds", or "score" (higher = predicted faster; comparable within a task: ranking only)
    budget_weight: float  # its share of a shared training budget, relative to cdmpp's 1.0

    def fit(self, train: Sequence, val: Sequence | None = None, time_budget_s: float | None = None) -> "Method":
        """Learn from ``train``; select and stop early on ``val`` only; stop by ``time_budget_s``."""

    def predict(self, programs: Sequence) -> np.ndarray:
        """Seconds (or scores) per program."""

    def predict_interval(self, programs: Sequence) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
        """``(prediction, lo90, hi90)``; the bounds are None for a method without intervals."""

    # optional: ``predict_order(programs)``, seconds that order the programs of a task, where a method
    # answers that apart from the seconds themselves (cdmpp); the ranking metrics use it, else ``predict``'s
    # optional: ``shot_choice = True``, a method that reaches the target by transfer (cdmpp, a peer through
    # Amdahl's law): its cross-device rows with shots go through ``ShotChoice`` (``derived.ShotChosen``), the
    # shipped k-shot path, instead of its ``adapt``

    def adapt(self, shots: Sequence) -> "Method":
        """A new method adapted with the measured target programs ``shots`` (k-shot transfer)."""

    def describe(self) -> str:
        """How it was fitted (rounds, epochs, stopping): the note beside its row in a report."""


class Peer:
    """What the peers share: no prediction intervals."""

    label = "peer"
    predicts = "seconds"
    budget_weight = 0.3

    def predict_interval(self, programs: Sequence):
        return self.predict(programs), None, None
