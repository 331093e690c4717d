"""What a training run is told: ``TrainConfig``, read from a recipe in ``train/*.toml``.

A recipe is flat ``key = value`` pairs, the network's keys (``cdmpp.model.network.ModelConfig``) among them;
``base = "default"`` starts from another recipe, so an ablation states only what it changes. The defaults are
the shipped recipe's (``train/default.toml`` writes them out). What issue 19's study tried and dropped is in
reports/study-issue19.md, "Options removed".
"""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from cdmpp import defaults
from cdmpp.model.network import ModelConfig


@dataclass
class TrainConfig:
    """Every knob of a training run; a recipe file sets any subset of them. The defaults are the shipped
    recipe's (``train/default.toml``)."""

    model: ModelConfig = field(default_factory=ModelConfig)  # the network; a recipe sets its keys flat
    # blend in a pooled GBT on log latency, weights for seconds and for order chosen on val (cdmpp.model.blend)
    gbt_blend: bool = True
    gbt_minutes: float = 5.0  # the blend's GBT ends this long after max_minutes (early stopping ends it first)
    gbt_max_trees: int = 0  # > 0: the blend's GBT boosts at most this many trees (benchmarks, smoke runs)
    blend_rank_slack: float = 0.02  # the order's blend weight ranks best within this relative slack of the best MAPE
    # a CPU device running a thread count without training labels is predicted on the nearest trained CPU
    # device and moved there by Amdahl's law (cdmpp.model.physics; TrainedModel.anchors), not by its spec vector
    amdahl_transfer: bool = True
    # `cdmpp train` on CPU and GPU programs fits one model per kind of code, each on its kind's programs alone
    # (cdmpp.model.kinds: beside the CPUs' programs the transformer did not rank a GPU's)
    per_kind: bool = True
    # the built programs' instruction counts (cdmpp.program.assembly, ProgramFeatures.asm) as program-level inputs
    # of the transformer and the blend's GBT: a program not built for its device's target has them marked absent;
    # random-new 34.2 -> 23.9 %, cross-model 55.3 -> 35.7 % on the locked test (reports/assembly-counts.md)
    assembly_counts: bool = True
    # with assembly_counts: this share of the training programs (drawn with the seed) also stands unbuilt, as if its
    # builds had failed, so that one model also ranks a program asked unbuilt (a tuner's candidate) as the recipe
    # without counts does (reports/assembly-counts.md, "Built and unbuilt programs: one model for both")
    assembly_withheld: float = 0.25
    # true: those programs are trained on twice, with their counts and as a copy without them; false: their counts
    # are removed (the recipe shipped 6 Dec, which lost what it withheld: reports/assembly-counts.md, "Copies")
    assembly_unbuilt_copies: bool = True
    # with assembly_counts: also the counts of the build's innermost loops (``ProgramFeatures.asm_inner``, from
    # ``load_dataset(..., innermost=True)``); a study's option (experiments/cross_model_arms.py --arm inner)
    assembly_inner: bool = False
    # optimization: Adam, a triangular cyclic LR between lr and max_lr, grad-norm clipping
    lr: float = 1e-4
    max_lr: float = 1e-3
    lr_cycle_epochs: float = 20.0  # one up-and-down cycle
    epochs: int = 60
    batch_size: int = 256
    grad_clip: float = 1.0
    patience: int = 60  # epochs without validation improvement before stopping
    # a program's weight in the loss and in the validation MAPE that picks the snapshots, by how many training
    # programs its device has: n_device ** -device_balance (0: every program alike; 1: every device alike; the study
    # that tried it for the GPUs: reports/gpu-transformer.md)
    device_balance: float = 0.0
    # domain adaptation: only when fit gets a target pool holding a device without training labels, or with
    # da_known_devices also a pool on trained devices (a new network's unlabeled programs, as the paper adapts)
    da: str = "cmd"  # "cmd" | "mmd" | "none"
    da_known_devices: bool = False
    # > 0: a RankNet term of this weight over the pairs of a batch of one task and device whose labels differ by > 3 %
    # (a study knob: round 3 of reports/study-issue19.md, again in reports/cross-model-tail.md)
    rank_weight: float = 0.0
    da_weight: float = 0.5
    cmd_k: int = 5
    val_fraction: float = 0.1  # carved from the training set only when fit gets no validation set
    # the members: the best states of this many LR cycles of one run ("snapshots", Huang et al. 2017), or the best
    # state of this many independent runs, each ``epochs`` long and seeded seed, seed + 1, ... ("runs"); the spread
    # of the members gives the interval at this level
    ensemble: int = 3
    ensemble_of: str = "snapshots"  # "snapshots" | "runs"
    interval: float = 0.9
    # few-shot fine-tuning
    finetune_lr: float = 1e-4
    finetune_scope: str = "head"  # "head" (decoder + device encoder) | "all"
    # run
    seed: int = 0
    max_minutes: float = 120.0  # a safety cap: epochs end a run
    max_steps: int = 0  # > 0: each run stops after this many steps (benchmarks, smoke runs)
    progress: bool = True

    def __post_init__(self):
        if isinstance(self.model, dict):
            self.model = ModelConfig(**self.model)
        choices = dict(da=("cmd", "mmd", "none"), finetune_scope=("all", "head"), ensemble_of=("snapshots", "runs"))
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} = {getattr(self, name)!r}: expected one of {allowed}")
        if not 0.0 <= self.assembly_withheld < 1.0:
            raise ValueError(f"assembly_withheld = {self.assembly_withheld!r}: expected a share in [0, 1)")

    @classmethod
    def from_dict(cls, values: dict) -> "TrainConfig":
        """From flat ``key = value`` pairs (a recipe, ``to_dict``, a checkpoint's ``config``): the network's keys
        go to ``model``."""
        model_keys = {f.name for f in dataclasses.fields(ModelConfig)}
        known = {f.name for f in dataclasses.fields(cls)} - {"model"}
        unknown = sorted(set(values) - known - model_keys)
        if unknown:
            raise ValueError(f"unknown training settings {unknown}; known: {sorted(known | model_keys)}")
        model = ModelConfig(**{k: v for k, v in values.items() if k in model_keys})
        return cls(model=model, **{k: v for k, v in values.items() if k in known})

    @classmethod
    def from_file(cls, path: str | Path) -> "TrainConfig":
        """Load a TOML recipe: flat ``key = value`` pairs; ``base = "default"`` starts from another recipe
        (a name beside this file), so an ablation states only what it changes."""
        return cls.from_dict(_read_recipe(Path(path)))

    @classmethod
    def recipe(cls, name: str) -> "TrainConfig":
        """A shipped recipe by name (``"default"`` -> ``train/default.toml``) or a path to one."""
        path = Path(name)
        if not path.suffix:
            path = defaults.RECIPES / f"{name}.toml"
        return cls.from_file(path)

    def to_dict(self) -> dict:
        """Flat ``key = value`` pairs, the network's keys first (what a checkpoint's ``config`` holds)."""
        values = dataclasses.asdict(self)
        return {**values.pop("model"), **values}

    def replace(self, **changes) -> "TrainConfig":
        """A copy with ``changes`` (flat keys, the network's included)."""
        return TrainConfig.from_dict({**self.to_dict(), **changes})

    def for_kind(self, kind: str) -> "TrainConfig":
        """This recipe for a model of ``kind`` code ("llvm", "cuda"; "" for every kind): the assembly's counts are of
        x86 builds, so a GPU model reads none (its every program would stand "not built") and withholds none."""
        return dataclasses.replace(self, assembly_counts=False, assembly_withheld=0.0) if kind == "cuda" else self


def _read_recipe(path: Path, seen: tuple[Path, ...] = ()) -> dict:
    with open(path, "rb") as f:
        values = tomllib.load(f)
    base = values.pop("base", None)
    if base is None:
        return values
    base_path = (path.parent / base).with_suffix(".toml")
    if base_path.resolve() in seen:
        raise ValueError(f"recipe {path} inherits from itself through {base_path}")
    return {**_read_recipe(base_path, (*seen, path.resolve())), **values}
