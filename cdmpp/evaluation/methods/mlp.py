"""``TensetMLP``: Tenset's segment-sum MLP (as ported to ``meta_schedule.cost_model.mlp_model``: row MLP
→ sum over rows → two residual layers → linear), predicting standardized log latency. Device-blind, as
in Tenset (one model per device)."""

from __future__ import annotations

import copy
import time
from typing import NamedTuple, Sequence

import numpy as np

from cdmpp.model.pooled_gbt import program_rows
from cdmpp.evaluation.methods.method import Peer


class _Rows(NamedTuple):
    """The two fields ``PackedPrograms`` reads (the MLP ignores positions)."""

    leaf_features: np.ndarray
    positions: np.ndarray


class TensetMLP(Peer):
    """Tenset's segment-sum MLP in plain torch; the settings of TVM's port (hidden 256, Adam 7e-4,
    weight decay 1e-6, batch 128, gradient clip 0.5, 50 epochs, features divided by their column max).

    Differences from the port, on purpose: the column max is fitted on the training split only (the
    port recomputes it on every data loader, test included), the label is standardized log latency
    with MSE (the port learns relative throughput), and the epoch kept is the best on validation MAPE.
    """

    label = "mlp (Tenset segment-sum)"
    budget_weight = 0.5

    def __init__(self, hidden_dim: int = 256, lr: float = 7e-4, weight_decay: float = 1e-6, batch_size: int = 128,
                 epochs: int = 50, grad_clip: float = 0.5, random_state: int = 0):
        self.hidden_dim = hidden_dim
        self.lr = lr
        self.weight_decay = weight_decay
        self.batch_size = batch_size
        self.epochs = epochs
        self.grad_clip = grad_clip
        self.random_state = random_state

    def _pack(self, programs: Sequence):
        from cdmpp.model.network import PackedPrograms

        rows = [_Rows(r, np.zeros(len(r), np.int64)) for r in (program_rows(p.features) for p in programs)]
        return PackedPrograms.from_programs(rows, lambda x: x * self.inv_max_)

    def _forward(self, pack, idx: np.ndarray):
        import torch

        sub = pack.subset(idx)
        return self.net_(torch.from_numpy(sub.lengths), torch.from_numpy(sub.leaves))

    def fit(self, train: Sequence, val: Sequence | None = None, time_budget_s: float | None = None) -> "TensetMLP":
        import torch

        torch.manual_seed(self.random_state)
        rng = np.random.default_rng(self.random_state)
        deadline = time.monotonic() + (time_budget_s if time_budget_s else 1e9)
        rows = np.concatenate([program_rows(s.features) for s in train])
        col_max = np.abs(rows).max(axis=0)
        self.inv_max_ = np.where(col_max > 0, 1.0 / np.maximum(col_max, 1e-30), 0.0).astype(np.float32)
        y = np.log([s.seconds for s in train])
        self.y_mean_, self.y_std_ = float(y.mean()), float(max(y.std(), 1e-6))
        z = torch.tensor((y - self.y_mean_) / self.y_std_, dtype=torch.float32)
        self.net_ = _segment_sum_mlp(rows.shape[1], self.hidden_dim)
        pack = self._pack(train)
        val_pack = self._pack(val) if val else None
        val_y = np.array([s.seconds for s in val]) if val else None
        opt = torch.optim.Adam(self.net_.parameters(), lr=self.lr, weight_decay=self.weight_decay)
        best, self.history_ = (np.inf, None), []
        for epoch in range(self.epochs):
            self.net_.train()
            order = rng.permutation(len(train))
            for start in range(0, len(train), self.batch_size):
                idx = order[start:start + self.batch_size]
                loss = torch.nn.functional.mse_loss(self._forward(pack, idx).reshape(-1), z[idx])
                opt.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(self.net_.parameters(), self.grad_clip)
                opt.step()
            if val_pack is not None:
                mape = float(np.mean(np.abs(self._predict_pack(val_pack) - val_y) / val_y))
                self.history_.append(round(mape, 5))
                if mape < best[0]:
                    best = (mape, copy.deepcopy(self.net_.state_dict()))
            if time.monotonic() > deadline:
                break
        if best[1] is not None:
            self.net_.load_state_dict(best[1])
        self.epochs_run_ = epoch + 1
        return self

    def _predict_pack(self, pack) -> np.ndarray:
        import torch

        self.net_.eval()
        out = np.empty(len(pack), np.float64)
        with torch.inference_mode():
            for start in range(0, len(pack), 1024):
                idx = np.arange(start, min(start + 1024, len(pack)))
                out[idx] = self._forward(pack, idx).reshape(-1).numpy()
        return np.exp(out * self.y_std_ + self.y_mean_)

    def predict(self, programs: Sequence) -> np.ndarray:
        return self._predict_pack(self._pack(programs))

    def describe(self) -> str:
        return f"{self.epochs_run_} epochs, best on val MAPE"

    def adapt(self, shots: Sequence, steps: int = 100, lr: float = 1e-4, time_budget_s: float | None = None) -> "TensetMLP":
        """k-shot: ``steps`` Adam steps on the measured target programs (same recipe as cdmpp's fine-tuning)."""
        import torch

        new = copy.copy(self)
        new.net_ = copy.deepcopy(self.net_)
        pack = new._pack(shots)
        z = torch.tensor((np.log([s.seconds for s in shots]) - self.y_mean_) / self.y_std_, dtype=torch.float32)
        opt = torch.optim.Adam(new.net_.parameters(), lr=lr)
        rng = np.random.default_rng(self.random_state + 1)
        new.net_.train()
        for _ in range(steps):
            idx = rng.choice(len(shots), size=min(self.batch_size, len(shots)), replace=False)
            loss = torch.nn.functional.mse_loss(new._forward(pack, idx).reshape(-1), z[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(new.net_.parameters(), self.grad_clip)
            opt.step()
        return new


def _segment_sum_mlp(input_dim: int, hidden_dim: int):
    """Row MLP → sum over each program's rows → two residual ReLU layers → linear (Tenset's SegmentSumMLP)."""
    import torch
    from torch import nn

    class SegmentSumMLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.encoder = nn.Sequential(nn.Linear(input_dim, hidden_dim), nn.ReLU(),
                                         nn.Linear(hidden_dim, hidden_dim), nn.ReLU())
            self.layer0 = nn.Sequential(nn.Linear(hidden_dim, hidden_dim), nn.ReLU())
            self.layer1 = nn.Sequential(nn.Linear(hidden_dim, hidden_dim), nn.ReLU())
            self.decoder = nn.Linear(hidden_dim, 1)

        def forward(self, segment_sizes, rows):
            seg = torch.repeat_interleave(torch.arange(len(segment_sizes)), segment_sizes)
            enc = self.encoder(rows)
            pooled = torch.zeros(len(segment_sizes), enc.shape[1], dtype=enc.dtype).index_add_(0, seg, enc)
            out = self.layer0(pooled) + pooled
            out = self.layer1(out) + out
            return self.decoder(out)

    return SegmentSumMLP()
