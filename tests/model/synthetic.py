"""SYNTHETIC programs and small models for the model tests: features are random, latencies follow a
known formula, so a test can tell learning from noise without TVM."""

from dataclasses import dataclass

import numpy as np
import torch

from cdmpp.model.network import CDMPPModel
from cdmpp.model.training import TrainConfig
from cdmpp.records.dataset import LabeledProgram

F = 12


DEVICES = {
    "cpu-a": dict(clock_ghz=2.0, cores=2, simd_width_bits=256, l1d_kb=32, l2_kb=512, l3_kb=8192, mem_bw_gbs=20, peak_gflops=64),
    "cpu-b": dict(clock_ghz=3.0, cores=8, simd_width_bits=512, l1d_kb=48, l2_kb=2048, l3_kb=32768, mem_bw_gbs=80, peak_gflops=900),
}


@dataclass
class FakeProgram:
    """Stand-in for cdmpp.program.features.ProgramFeatures (same attribute names)."""

    leaf_features: np.ndarray
    positions: np.ndarray
    flops: float = 0.0
    program_hash: str = ""
    loops: np.ndarray | None = None
    tensor_flops: float | None = 0.0
    asm: np.ndarray | None = None
    asm_inner: np.ndarray | None = None


def random_program(rng, n_leaves=None) -> FakeProgram:
    n = int(n_leaves or rng.integers(1, 7))
    return FakeProgram(rng.normal(size=(n, F)).astype(np.float32), np.sort(rng.choice(200, n, replace=False)))


def synthetic_samples(n, rng, device="cpu-a"):
    """SYNTHETIC: latency = 1e-4 s x sum over leaves of exp(0.8·x0 - 0.5·x1) x device factor, x small noise."""
    factor = {"cpu-a": 1.0, "cpu-b": 0.25}[device]
    out = []
    for _ in range(n):
        p = random_program(rng)
        per_leaf = np.exp(0.8 * p.leaf_features[:, 0] - 0.5 * p.leaf_features[:, 1])
        seconds = 1e-4 * factor * per_leaf.sum() * np.exp(0.02 * rng.normal())
        out.append(LabeledProgram(p, device, float(seconds), task=f"t{rng.integers(10)}"))
    return out


def small_model(use_pe=True, seed=0) -> CDMPPModel:
    torch.manual_seed(seed)
    return CDMPPModel(F, 8, d_model=32, n_heads=4, n_layers=2, d_ff=64, dropout=0.1, use_pe=use_pe).eval()


def quick_config(**kw) -> TrainConfig:
    """The shipped recipe, small and short, without the GBT blend and the Amdahl anchors unless asked."""
    base = dict(d_model=32, n_heads=4, n_layers=1, d_ff=64, dropout=0.0, epochs=25, batch_size=64,
                lr=3e-4, max_lr=3e-3, lr_cycle_epochs=4, ensemble=2, patience=25, max_minutes=1.0, progress=False,
                gbt_blend=False, amdahl_transfer=False, finetune_scope="all")
    return TrainConfig.from_dict({**base, **kw})
