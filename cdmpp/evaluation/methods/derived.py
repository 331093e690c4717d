"""Methods made of other methods: a peer's prediction scaled on validation, two peers blended, a peer moved
to a new thread count by Amdahl's law. Each holds the methods it is made of (``parts``); the runner fits
the parts first and the derived method's ``fit`` learns only its own part (a factor, a weight, the
fork-join times), so a part shared by several derived methods is trained once; one whose prediction is a
function of its parts' (``on_parts``) is also adapted through its parts, adapted once per set of shots. ``scope``: the kind of
setting it is scored in ("within-device", "cross-device"); a method without it is scored in both.
"""

from __future__ import annotations

import copy
from typing import Sequence

import numpy as np

from cdmpp.evaluation.methods.method import Peer


def _seconds(programs: Sequence) -> np.ndarray:
    return np.array([p.seconds for p in programs])


class ValScaled(Peer):
    """``part``'s prediction times the factor with the lowest validation MAPE (``metrics.mape_scale``): the
    trick cdmpp's study tried and dropped, on the peer, so that it is never what separates the two. Adapting
    adapts the part and keeps the factor."""

    def __init__(self, part):
        self.part = part
        self.parts = (part,)
        self.label = part.label + ", val-scaled"

    def fit(self, train: Sequence, val: Sequence | None = None, time_budget_s: float | None = None) -> "ValScaled":
        from cdmpp.evaluation.metrics import mape_scale

        self.scale_ = mape_scale(self.part.predict(val), _seconds(val))
        return self

    def predict(self, programs: Sequence) -> np.ndarray:
        return self.scale_ * self.part.predict(programs)

    def adapt(self, shots: Sequence) -> "ValScaled":
        return self.on_parts([self.part.adapt(shots)])

    def on_parts(self, parts: Sequence) -> "ValScaled":
        """The same factor on other (adapted) parts: the runner adapts a shared part once per set of shots."""
        new = copy.copy(self)
        new.part, new.parts = parts[0], tuple(parts)
        return new

    def row_info(self) -> dict:
        return {"scale": self.scale_}

    def describe(self) -> str:
        return f"{self.part.describe()}; x {self.scale_:.3f} (lowest validation MAPE)"


class Blend(Peer):
    """A weighted geometric blend of two peers' seconds (``cdmpp.model.blend``), the weight chosen on
    validation: a blend of peers is a peer (DESIGN.md §5). Within-device settings only."""

    scope = ("within-device",)

    def __init__(self, a, b, label: str):
        self.a, self.b, self.label = a, b, label
        self.parts = (a, b)

    def fit(self, train: Sequence, val: Sequence | None = None, time_budget_s: float | None = None) -> "Blend":
        from cdmpp.model.blend import blend_weight

        self.weight_ = blend_weight(_seconds(val), self.a.predict(val), self.b.predict(val))
        return self

    def predict(self, programs: Sequence) -> np.ndarray:
        from cdmpp.model.blend import blend

        return blend(self.a.predict(programs), self.b.predict(programs), self.weight_)

    def row_info(self) -> dict:
        return {"weight": self.weight_}

    def describe(self) -> str:
        return f"{self.a.label} and {self.b.label} blended, weight {self.weight_:.2f} on validation"


class TransferredBlend(Blend):
    """``Blend`` of two peers that reach a new thread count through Amdahl's law (``ViaAmdahl``), the weight
    chosen on the source devices' validation programs: the blend peer of the cross-device settings, with
    shots through ``ShotChoice`` as the peers it blends."""

    scope = ("cross-device",)
    shot_choice = True


class ViaAmdahl(Peer):
    """``part`` trained on the source devices, predicting a new CPU thread count through cdmpp's Amdahl
    transfer (``twin_ratio.AmdahlTransfer``, its fork-join times from the training programs). Cross-device
    settings only."""

    scope = ("cross-device",)
    shot_choice = True

    def __init__(self, part, device_table: dict):
        self.part, self.device_table = part, device_table
        self.parts = (part,)
        self.label = part.label + ", Amdahl transfer"

    def fit(self, train: Sequence, val: Sequence | None = None, time_budget_s: float | None = None) -> "ViaAmdahl":
        from cdmpp.evaluation.methods.twin_ratio import AmdahlTransfer
        from cdmpp.model.physics import fork_join_by_device

        self.transfer_ = AmdahlTransfer(self.part, fork_join_by_device(train, self.device_table), self.device_table)
        return self

    def predict(self, programs: Sequence) -> np.ndarray:
        return self.transfer_.predict(programs)

    def adapt(self, shots: Sequence) -> "ViaAmdahl":
        new = copy.copy(self)
        new.transfer_ = self.transfer_.adapt(shots)
        return new

    def describe(self) -> str:
        return self.transfer_.describe()


class TransformerAlone(Peer):
    """cdmpp's transformer ensemble without the GBT blended in (``TrainedModel.predict_parts``), from the
    same fit: does the transformer earn its place beside the GBT peers (issue 55)? Within-device only."""

    scope = ("within-device",)

    def __init__(self, cdmpp):
        self.part = cdmpp
        self.parts = (cdmpp,)
        self.label = cdmpp.label + ", transformer alone"

    def fit(self, train: Sequence, val: Sequence | None = None, time_budget_s: float | None = None) -> "TransformerAlone":
        return self

    def predict(self, programs: Sequence) -> np.ndarray:
        model = self.part.model_
        return model.predict_parts([p.features for p in programs], [p.device for p in programs])[0]

    def describe(self) -> str:
        return f"the transformer members of: {self.part.describe()}"


class Memo:
    """A method's (mean, lo90, hi90, order) per (device, program hash), so the test set is predicted once per
    model; a method with only ``predict`` gives its seconds and None for the rest."""

    def __init__(self, method):
        self.method, self.seen = method, {}
        self.label = getattr(method, "label", "")

    def predict_interval_and_order(self, programs: Sequence) -> tuple:
        keys = [(p.device, p.features.program_hash) for p in programs]
        new = [i for i, key in enumerate(keys) if key not in self.seen]
        if new:
            both = getattr(self.method, "predict_interval_and_order", None)
            part = [programs[i] for i in new]
            got = both(part) if both is not None else (self.method.predict(part), None, None, None)
            for j, i in enumerate(new):
                self.seen[keys[i]] = tuple(None if a is None else float(a[j]) for a in got)
        rows = [self.seen[key] for key in keys]
        return tuple(None if rows and rows[0][c] is None else np.array([r[c] for r in rows]) for c in range(4))

    def predict(self, programs: Sequence) -> np.ndarray:
        return self.predict_interval_and_order(programs)[0]


class ShotChosen(Peer):
    """``part``'s prediction with ``ShotChoice`` fitted on the shots of the target: the shipped k-shot path
    (``cdmpp finetune --how choice``), so a cross-device row with shots scores what a user gets, as
    leave-one-chip-out does. As in a checkpoint with shots (``TrainedModel.predict_orders``), the choice is
    applied to the part's seconds, its interval moved with them, and to its order prediction (cdmpp's
    order weight), which ranks a task's programs. Made by ``for_shots``; ``part`` is a fitted method."""

    def __init__(self, part, choice):
        self.part, self.choice_ = part, choice
        self.label = part.label

    @classmethod
    def for_shots(cls, part, shots: Sequence, seed: int, nthread: int = 1, base_bias: float = 0.0,
                  assembly_counts: bool = False) -> "ShotChosen":
        from cdmpp.model.shots import ShotChoice

        return cls(part, ShotChoice(part.predict, seed=seed, nthread=nthread, base_bias=base_bias,
                                    assembly_counts=assembly_counts).fit(shots))

    def predict(self, programs: Sequence) -> np.ndarray:
        return self.choice_.predict(programs)

    def predict_interval_and_order(self, programs: Sequence):
        """(mean, lo, hi, order) of the part, each through the choice: one pass of the part for all four."""
        return shot_chosen(self.choice_, self.part, programs)

    def row_info(self) -> dict:
        return {"choice": self.choice_.describe()}

    def describe(self) -> str:
        return self.choice_.describe()


def shot_chosen(choice, part, programs: Sequence):
    """``choice`` (a fitted ``ShotChoice``) on ``part``'s prediction of ``programs``: (mean, lo, hi, order),
    the bounds moved by the mean's factor and ``order`` (None where ``part`` has no order prediction) through
    the same choice, as ``TrainedModel.predict_orders`` applies a device's shots."""
    both = getattr(part, "predict_interval_and_order", None)
    if both is not None:
        seconds, lo, hi, order = both(programs)
    else:
        (seconds, lo, hi), order = part.predict_interval(programs), None
    mean = choice.predict(programs, base_seconds=seconds)
    factor = mean / np.asarray(seconds, dtype=np.float64)
    lo, hi = (None if b is None else b * factor for b in (lo, hi))
    return mean, lo, hi, None if order is None else choice.predict(programs, base_seconds=order)
