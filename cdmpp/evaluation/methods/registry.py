"""The evaluation's methods by short name, as MetaSchedule names its cost models (``cost_model="xgb"``):
``METHODS`` maps a name to a factory that makes the ``Method`` objects of that name for one split, and
``build`` makes every method a list of names asks for, each once. The runner (``cdmpp.evaluation.protocol``)
fits and scores what ``build`` returns and knows no method by name.

Names: ``cdmpp``; ``transformer-alone`` (cdmpp's transformer without its GBT, from the same fit); ``pooled-gbt`` (the pooled GBT and its validation-scaled row); ``pooled-gbt-roofline``,
``pooled-gbt-latency``, ``pooled-gbt-mape`` (the GBT on log(latency / roofline bound), on log latency, on
log latency with a MAPE loss; cross-device also through Amdahl's law); ``gbt-blend`` (the latency and
MAPE-loss GBTs blended, the weight on validation; cross-device their blend through Amdahl's law); ``xgb`` (TVM's XGBModel, ranking only), ``mlp`` (the
Tenset MLP), ``xgb-regressor`` (XGBoost on TVM's features and device specs), under the peers' time budget. ``FLAGS`` are names of the ``--methods`` list that choose
rows rather than methods (the twin predictors, leave-one-chip-out's peers and its fine-tune row).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

FLAGS = ("twins", "chip-peers", "cdmpp-finetune")


@dataclass
class Context:
    """What a factory may use for one split: seed and threads, the device table, cdmpp's training config
    (``TrainConfig``) and its unlabeled target pool, row names, the peers' time budget."""

    seed: int
    device_table: dict
    threads: int = 1
    config: object = None
    target_pool: Sequence | None = None
    label: str = "cdmpp"
    gbt_label: str = "pooled GBT"
    peer_budget_s: float | None = None
    made: dict = field(default_factory=dict)  # name -> methods already made for this split (shared parts)

    def one(self, name: str):
        """The (first) method of ``name`` for this split, made once however many others use it."""
        return self.get(name)[0]

    def get(self, name: str) -> list:
        if name not in self.made:
            self.made[name] = METHODS[name](self)
        return self.made[name]


def _gbt(c: Context, target: str = "flops", loss: str = "l2", label: str | None = None):
    from cdmpp.model.pooled_gbt import PooledGBT

    gbt = PooledGBT(c.device_table, nthread=c.threads, random_state=c.seed, target=target, loss=loss,
                    assembly_counts=bool(getattr(c.config, "assembly_counts", False)))  # what cdmpp is given
    if label:
        gbt.label = label
    return gbt


def _variant(target: str, loss: str, label: str) -> Callable[[Context], list]:
    def make(c: Context) -> list:
        from cdmpp.evaluation.methods.derived import ViaAmdahl

        gbt = _gbt(c, target, loss, label)
        return [gbt, ViaAmdahl(gbt, c.device_table)]
    return make


def _cdmpp(c: Context) -> list:
    from cdmpp.evaluation.methods.cdmpp_model import CDMPP

    return [CDMPP(c.config, c.device_table, c.target_pool, c.label)]


def _transformer_alone(c: Context) -> list:
    from cdmpp.evaluation.methods.derived import TransformerAlone

    return [TransformerAlone(c.one("cdmpp"))]


def _pooled_gbt(c: Context) -> list:
    from cdmpp.evaluation.methods.derived import ValScaled

    gbt = _gbt(c, label=c.gbt_label)
    return [gbt, ValScaled(gbt)]


def _gbt_blend(c: Context) -> list:
    from cdmpp.evaluation.methods.derived import Blend, TransferredBlend

    latency, mape = c.get("pooled-gbt-latency"), c.get("pooled-gbt-mape")  # each [GBT, GBT through Amdahl]
    return [*latency, *mape, Blend(latency[0], mape[0], GBT_BLEND),
            TransferredBlend(latency[1], mape[1], GBT_BLEND + ", Amdahl transfer")]


def _xgb(c: Context) -> list:
    from cdmpp.evaluation.methods.xgb import MetaScheduleXGB

    peer = MetaScheduleXGB(c.threads, c.seed)
    peer.label = "TVM XGBModel (ranking only)"
    return [peer]


def _mlp(c: Context) -> list:
    from cdmpp.evaluation.methods.mlp import TensetMLP

    peer = TensetMLP(random_state=c.seed)
    peer.label = "Tenset MLP"
    return [peer]


def _xgb_regressor(c: Context) -> list:
    from cdmpp.evaluation.methods.xgb import XGBRegressorPeer

    peer = XGBRegressorPeer(nthread=c.threads, device_table=c.device_table)
    peer.label = "XGBoost regressor (TVM features + device specs)"
    return [peer]


GBT_BLEND = "GBT peers' blend (latency target, MAPE loss; weight on validation)"

METHODS: dict[str, Callable[[Context], list]] = {  # in the order they are fitted (see ``build``)
    "cdmpp": _cdmpp,
    "transformer-alone": _transformer_alone,
    "pooled-gbt": _pooled_gbt,
    "xgb": _xgb,
    "mlp": _mlp,
    "xgb-regressor": _xgb_regressor,
    "pooled-gbt-roofline": _variant("roofline", "l2", "pooled GBT, roofline target"),
    "pooled-gbt-latency": _variant("latency", "l2", "pooled GBT, latency target"),
    "pooled-gbt-mape": _variant("latency", "mape", "pooled GBT, MAPE loss"),
    "gbt-blend": _gbt_blend,
}
BUDGETED = ("xgb", "mlp", "xgb-regressor")  # fitted under ``Context.peer_budget_s``; the others' budgets are epochs and rounds


def check(names: Sequence[str]) -> None:
    """Refuse a name that is neither a method nor a flag (a typo would otherwise run nothing)."""
    unknown = [n for n in names if n not in METHODS and n not in FLAGS]
    if unknown:
        raise ValueError(f"unknown method(s) {unknown}: expected some of {sorted(METHODS) + list(FLAGS)}")


def build(names: Sequence[str], context: Context) -> list[tuple]:
    """[(method, time budget in seconds or None)] of what ``names`` ask for, in the order of ``METHODS`` (a
    fixed order keeps xgboost's process-wide random state, which ``PooledGBT.adapt`` draws on, the same from
    run to run), each object once (a part shared by two names, such as the latency GBT of ``gbt-blend`` and
    ``pooled-gbt-latency``, is one object), parts before the methods made of them."""
    check(names)
    out: list = []
    for name in [n for n in METHODS if n in names]:  # METHODS' order, whatever the order of ``names``
        budget = context.peer_budget_s if name in BUDGETED else None
        for method in context.get(name):
            if all(method is not m for m, _ in out):
                out.append((method, budget))
    return out
