"""``Prediction``: what ``Predictor.predict`` in process and ``Client.predict`` over HTTP both answer, one per
program and device (the flags of ``ood`` are named in ``cdmpp.predict.predictor``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Prediction:
    seconds: float
    lo90: float
    hi90: float
    ood: tuple[str, ...] = ()  # empty: program and device lie inside what the model was trained on
    out_of_range: tuple[str, ...] = ()  # with features_out_of_range: the feature columns beyond the training range

    @property
    def in_distribution(self) -> bool:
        return not self.ood
