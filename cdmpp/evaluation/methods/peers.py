"""The peers by short name, as MetaSchedule names its cost models (``"xgb"``, ``"mlp"``)."""

from __future__ import annotations

from typing import Sequence

from cdmpp.evaluation.methods.mlp import TensetMLP
from cdmpp.evaluation.methods.xgb import MetaScheduleXGB, XGBRegressorPeer


def make_peers(names: Sequence[str], nthread: int = 1, seed: int = 0, device_table: dict | None = None) -> list:
    """Peers by short name: ``"xgb"`` gives both XGBoost peers (ranking + regressor), ``"mlp"`` Tenset's MLP.
    ``device_table`` ({device: spec dict}) goes to the peer that can use device specs (the regressor)."""
    peers = {"xgb": lambda: [MetaScheduleXGB(nthread=nthread),
                             XGBRegressorPeer(nthread=nthread, device_table=device_table)],
             "mlp": lambda: [TensetMLP(random_state=seed)]}
    out = []
    for name in names:
        if name not in peers:
            raise ValueError(f"unknown peer {name!r}: expected one of {sorted(peers)}")
        out += peers[name]()
    return out
