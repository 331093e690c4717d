"""Where training runs: one process on the CPU or a GPU, or one of several under ``torchrun`` (DDP).

``Runner`` is what the training loop asks: the device tensors go to, this process's share of a batch, the
module to run the forward through, and the values every process must agree on. In one process every answer
is the identity, so the single-process CPU loop computes what it computed before there were several.

Under ``torchrun --nproc_per_node N cdmpp train ...`` (or ``--nnodes`` machines): each global batch of
``batch_size`` programs (the same on every rank: the batch order comes from the same seed) is split into N
disjoint near-equal shares, one per rank, so every rank takes the same number of steps; DDP averages the
gradients, so N ranks on B/N programs each take the step one process takes on B (without dropout, and when
N divides B; a ranking loss sees only the pairs within a share). What is decided from measured values, the
validation MAPE behind snapshots and early stopping and the time budget, is rank 0's, broadcast. Only rank 0
logs and saves.
"""

from __future__ import annotations

import os

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

DEVICES = ("auto", "cpu", "cuda")


def resolve_device(name: str | torch.device | None = "cpu") -> torch.device:
    """``auto``: the GPU when torch sees one, else the CPU; ``cuda`` without one is an error that says so.
    Under torchrun each process takes the GPU of its ``LOCAL_RANK``."""
    if isinstance(name, torch.device):
        return name
    name = name or "cpu"
    if name not in DEVICES and not name.startswith("cuda:"):
        raise ValueError(f"--device {name}: expected one of {', '.join(DEVICES)}")
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            build = "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
            raise ValueError(f"--device {name}: torch sees no GPU (torch.cuda.is_available() is False; this torch "
                             f"is {build}); use --device cpu or auto")
        if name == "cuda":
            name = f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}"
    return torch.device(name)


def setup(device: str | torch.device | None = "cpu") -> torch.device:
    """Resolve ``device`` and, when torchrun started several processes (``WORLD_SIZE`` > 1), join their
    process group: NCCL between GPUs, gloo between CPUs. Returns the device this process trains on."""
    device = resolve_device(device)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return device


def world() -> tuple[int, int]:
    """``(rank, world size)`` of this process: ``(0, 1)`` outside a process group."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def is_main() -> bool:
    """Whether this process logs and saves (rank 0, or the only one)."""
    return world()[0] == 0


class _Forward(nn.Module):
    """One training step's forward as a module, so DDP sees it (DDP synchronizes gradients only of what runs
    through ``forward``): the source embedding, its prediction, and the embedding of a target batch for domain
    adaptation, in the order the loop ran them."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x, pos, mask, dev, extra, target=None):
        emb = self.model.embed(x, pos, mask, extra)
        pred = self.model.head(emb, dev)
        t_emb = None if target is None else self.model.embed(*target)
        return emb, pred, t_emb


class Runner:
    """The device and the process group a training run runs in (see the module docstring)."""

    def __init__(self, device: str | torch.device | None = "cpu"):
        self.device = resolve_device(device)
        self.rank, self.world = world()
        self.is_main = self.rank == 0

    def to(self, value):
        """A tensor, or a tuple of them (None kept), on this run's device."""
        if isinstance(value, tuple):
            return tuple(self.to(v) for v in value)
        return value if value is None else value.to(self.device)

    def shares(self, batches: list[np.ndarray]) -> list[np.ndarray]:
        """This rank's share of every batch: programs ``rank, rank + N, ...`` of a length-sorted batch (so the
        shares pad alike). A batch of fewer programs than ranks is skipped on every rank."""
        if self.world == 1:
            return batches
        return [b[self.rank::self.world] for b in batches if len(b) >= self.world]

    def forward_module(self, model: nn.Module) -> nn.Module:
        """What the loop runs its forward through: ``model`` itself wrapped, in DDP when there are ranks."""
        step = _Forward(model)
        if self.world == 1:
            return step
        ids = [self.device.index] if self.device.type == "cuda" else None
        return nn.parallel.DistributedDataParallel(step, device_ids=ids)

    def agree(self, value: float) -> float:
        """Rank 0's ``value`` on every rank."""
        if self.world == 1:
            return value
        t = torch.tensor([value], dtype=torch.float64, device=self._comm_device())
        dist.broadcast(t, 0)
        return float(t.item())

    def any(self, flag: bool) -> bool:
        """Whether ``flag`` holds on some rank (a stop every rank takes at the same step)."""
        if self.world == 1:
            return flag
        t = torch.tensor([float(flag)], device=self._comm_device())
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return bool(t.item())

    def sum(self, *values: float) -> tuple[float, ...]:
        """``values`` summed over the ranks."""
        if self.world == 1:
            return values
        t = torch.tensor(values, dtype=torch.float64, device=self._comm_device())
        dist.all_reduce(t)
        return tuple(t.tolist())

    def _comm_device(self) -> torch.device:
        return self.device if dist.get_backend() == "nccl" else torch.device("cpu")
