"""The evaluation's methods by name (``cdmpp.evaluation.methods.registry``): what ``build`` makes, without
training anything."""

from __future__ import annotations

import pytest


def _context():
    from cdmpp.evaluation.methods.registry import Context

    return Context(seed=0, device_table={}, peer_budget_s=6.0)


def test_build_makes_each_method_once_in_a_fixed_order_with_the_peers_budget():
    from cdmpp.evaluation.methods.derived import Blend, TransferredBlend, ValScaled, ViaAmdahl
    from cdmpp.evaluation.methods.registry import GBT_BLEND, build

    made = build(["gbt-blend", "mlp", "pooled-gbt-latency", "pooled-gbt", "twins"], _context())
    labels = [m.label for m, _ in made]
    assert labels == ["pooled GBT", "pooled GBT, val-scaled", "Tenset MLP", "pooled GBT, latency target",
                      "pooled GBT, latency target, Amdahl transfer", "pooled GBT, MAPE loss",
                      "pooled GBT, MAPE loss, Amdahl transfer", GBT_BLEND, GBT_BLEND + ", Amdahl transfer"]
    by = {m.label: (m, budget) for m, budget in made}
    blend = by[GBT_BLEND][0]
    assert isinstance(blend, Blend) and blend.a is by["pooled GBT, latency target"][0]  # one latency GBT, shared
    assert isinstance(by["pooled GBT, val-scaled"][0], ValScaled)
    assert isinstance(by["pooled GBT, MAPE loss, Amdahl transfer"][0], ViaAmdahl)
    assert by["Tenset MLP"][1] == 6.0 and by["pooled GBT"][1] is None
    assert blend.scope == ("within-device",) and ViaAmdahl.scope == ("cross-device",)
    moved = by[GBT_BLEND + ", Amdahl transfer"][0]  # cross-device: the blend of the two GBTs through the transfer
    assert isinstance(moved, TransferredBlend) and moved.parts == (by["pooled GBT, latency target, Amdahl transfer"][0],
                                                                   by["pooled GBT, MAPE loss, Amdahl transfer"][0])
    assert moved.scope == ("cross-device",) and moved.shot_choice


def test_an_unknown_method_is_refused():
    from cdmpp.evaluation.methods.registry import build

    with pytest.raises(ValueError, match="unknown method"):
        build(["cdmpp", "pooled-gbt-typo"], _context())


def test_the_peers_by_name():
    from cdmpp.evaluation.methods.mlp import TensetMLP
    from cdmpp.evaluation.methods.registry import build
    from cdmpp.evaluation.methods.xgb import MetaScheduleXGB, XGBRegressorPeer

    made = build(["xgb-regressor", "mlp", "xgb"], _context())
    assert [type(m) for m, _ in made] == [MetaScheduleXGB, TensetMLP, XGBRegressorPeer]
    assert [m.label for m, _ in made] == ["TVM XGBModel (ranking only)", "Tenset MLP",
                                          "XGBoost regressor (TVM features + device specs)"]
    assert {budget for _, budget in made} == {6.0}
