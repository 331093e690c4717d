"""A trained predictor: ensemble members plus every fitted transform they need; predict, embed, save, load.

A checkpoint is a folder with ``weights.safetensors`` (tensors only, one prefix per ensemble member)
and ``predictor.json`` (model shape, training config, feature normalizer, label transform, device
table, uncertainty calibration, featurizer version, training summary); a model blended with the
pooled GBT (``TrainConfig.gbt_blend``) adds ``gbt.ubj.gz``, XGBoost's own model format. No pickle
anywhere, so a checkpoint can be loaded safely and read by other tools.
"""

from __future__ import annotations

import gzip
import json
import sys
import warnings
from pathlib import Path
from typing import NamedTuple, Sequence

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from cdmpp.devices.spec import target_kind_of_id
from cdmpp.model.network import CDMPPModel, PackedPrograms, length_sorted_batches
from cdmpp.model import physics
from cdmpp.model.transforms import DeviceSpecs, FeatureNormalizer, LogLatency

# 2: the network and training loop carry only the shipped recipe's options (issue 57; the options issue 19's
# study tried and dropped are listed in reports/study-issue19.md, "Options removed"); a checkpoint of format 1
# may name one of them, so it is retrained, not read.
FORMAT_VERSION = 2


def current_featurizer_version() -> str:
    """Version string of the featurizer loaded in this process, if any (never imports TVM for it)."""
    features = sys.modules.get("cdmpp.program.features")
    return str(getattr(features, "FEATURIZER_VERSION", "unknown")) if features else "unknown"


class TrainedModel:
    """Ensemble of ``CDMPPModel`` members with their transforms; the object ``fit`` returns.

    Uncertainty: members disagree more on programs unlike the training data. The 90 % interval in label
    space (standardized log seconds) is ``mean +- q * (std_members + delta)``, with ``q`` and ``delta``
    calibrated on the validation split (split-conformal, normalized by the ensemble spread); see ``calibrate``.
    """

    def __init__(self, members: list[CDMPPModel], feature_normalizer: FeatureNormalizer, label_transform: LogLatency,
                 device_specs: DeviceSpecs, config: dict, calibration: dict | None = None,
                 featurizer_version: str = "unknown", summary: dict | None = None,
                 program_inputs: dict | None = None, gbt=None, anchors: dict | None = None):
        self.members = members
        # {trained CPU device: fork/join seconds of one parallel region there}: a CPU device running a thread
        # count the model never trained on is predicted on the nearest of these and moved by Amdahl's law
        # (``anchor_of``); None without ``TrainConfig.amdahl_transfer``: every device is predicted directly
        self.anchors = anchors
        # with TrainConfig.gbt_blend: the pooled GBT on log latency whose prediction is blended into the
        # members' (``cdmpp.model.blend``; weights ``calibration["gbt_weight"]`` for seconds and
        # ``calibration["gbt_order_weight"]`` for order); it shares device_specs
        self.gbt = gbt
        if gbt is not None:
            gbt.specs = device_specs
        # {"mean": [3], "std": [3]} of the training programs' log2 FLOPs/bytes/unique bytes, the members'
        # program-level inputs (``extra_inputs``); None where the features have no TVM rows to count them on
        self.program_inputs = program_inputs
        self.feature_normalizer = feature_normalizer
        self.label_transform = label_transform
        self.device_specs = device_specs
        self.config = dict(config)
        self.calibration = calibration or {"level": 0.9, "q": 1.645, "delta": 1.0}
        self.featurizer_version = featurizer_version
        self.summary = summary or {}
        # {device: cdmpp.model.shots.ShotChoice}: what `cdmpp finetune` learned from a device's measured
        # programs, applied on top of the prediction for that device (``apply_shots``)
        self.shot_choices: dict = {}

    # ---- inputs -------------------------------------------------------------------------------------
    def pack(self, programs) -> PackedPrograms:
        """Normalize and pack programs once, e.g. to predict the same pool on several devices."""
        if isinstance(programs, PackedPrograms):
            return programs
        return PackedPrograms.from_programs(programs, self.feature_normalizer.transform)

    def _devices(self, devices: str | Sequence[str], n: int) -> tuple[torch.Tensor, np.ndarray]:
        names = [devices] * n if isinstance(devices, str) else list(devices)
        if len(names) != n:
            raise ValueError(f"{len(names)} devices for {n} programs: pass one device name or one per program")
        matrix, index = self.device_specs.matrix(names)
        rows = np.fromiter((index[d] for d in names), dtype=np.int64, count=n)
        return torch.from_numpy(matrix), rows

    def extra_inputs(self, packed: PackedPrograms) -> torch.Tensor | None:
        """The members' program-level inputs, standardized: log2 FLOPs, bytes and unique bytes (``program_stats``)
        and, for a model trained with them, the assembly counts (``assembly_stats``): the first as many columns of
        ``packed.stats`` as the model was trained on, held in the training range; None for a model without them."""
        if self.program_inputs is None or packed.stats is None:
            return None
        return self.scaled_stats(packed.stats)

    def scaled_stats(self, stats: np.ndarray) -> torch.Tensor:
        """``extra_inputs`` of programs' ``stats`` rows (a model with program inputs)."""
        inputs = self.program_inputs
        n = len(inputs["mean"])
        if stats.shape[1] < n:  # columns a pack lacks (the innermost loops' counts) stand as not built: zero
            stats = np.hstack([stats, np.zeros((len(stats), n - stats.shape[1]))])
        z = (stats[:, :n] - np.asarray(inputs["mean"])) / np.asarray(inputs["std"])
        if "lo" in inputs:  # held in the training range (``training.program_input_scaling``; not in models before 6 Dec)
            z = np.clip(z, inputs["lo"], inputs["hi"])
        return torch.from_numpy(z.astype(np.float32))

    def add_device(self, name: str, spec: dict[str, float]) -> None:
        """Make a new device predictable (zero-shot) from its spec; normalization stays as trained."""
        self.device_specs.add(name, spec)

    def part(self, kind: str) -> "TrainedModel":
        """The model that predicts devices of ``kind``: this one (``cdmpp.model.kinds.KindModels`` holds one per kind)."""
        return self

    def part_for(self, device: str) -> "TrainedModel":
        return self

    def device_ids(self) -> list[str]:
        return sorted(self.device_specs.table)

    def add_reference_levels(self, table: dict[str, dict]) -> None:
        """Copy each chip's measured level (a CPU's reference-kernel ``reference_s``, a GPU's ``level_gflops``: a
        measurement of the chip, not a model input) from a spec table into this model's entries that lack it, so a
        model saved before its devices' levels were measured moves a new chip by them (``physics.chip_ratio``). Not a
        GPU's ``tensor_gflops``: a trained device's entry has it only if the model learned its tensor-core programs
        as FP32-equivalent time (``physics.fp32_equivalent``), which a model trained before it existed did not."""
        for name, spec in self.device_specs.table.items():
            for level in ("reference_s", "level_gflops"):
                if level not in spec and table.get(name, {}).get(level):
                    spec[level] = float(table[name][level])

    # ---- prediction ---------------------------------------------------------------------------------
    @torch.inference_mode()
    def predict_z(self, programs, devices: str | Sequence[str], batch_size: int = 256) -> np.ndarray:
        """Per-member predictions in label space (standardized log seconds), ``[n_members, n_programs]``."""
        packed = self.pack(programs)
        dev_matrix, dev_rows = self._devices(devices, len(packed))
        out = np.empty((len(self.members), len(packed)), dtype=np.float32)
        for m in self.members:
            if m.training:  # eval() walks every submodule: ~1 ms a call, as much as a small batch's forward
                m.eval()
        extra = self.extra_inputs(packed)
        for idx in length_sorted_batches(packed.lengths, batch_size):
            x, pos, mask = packed.batch(idx)
            dev = dev_matrix[dev_rows[idx]]
            e = None if extra is None else extra[idx]
            for i, m in enumerate(self.members):
                out[i, idx] = m(x, pos, mask, dev, e).numpy()
        return out

    def interval_z(self, z: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Mean and calibrated interval bounds in label space from member predictions ``z``."""
        mu = z.mean(axis=0).astype(np.float64)
        spread = z.std(axis=0) if len(z) > 1 else np.zeros_like(mu)
        half = self.calibration["q"] * (spread + self.calibration["delta"])
        return mu, mu - half, mu + half

    def predict(self, programs, devices: str | Sequence[str], batch_size: int = 256, order: bool = False):
        """Latency in seconds for each program on its device: ``(mean, lo90, hi90)`` numpy arrays.

        ``devices`` is one device name for all programs or one per program; a CPU device running a thread
        count the model never trained on is predicted on its anchor and moved by Amdahl's law (``anchor_of``).
        ``mean`` is the inverse
        label transform of the ensemble mean (a median-like point estimate); the bounds are the calibrated
        interval mapped back through the same monotone inverse. ``order=True``: blended with the GBT at
        the weight chosen to order the programs of a task (``calibration["gbt_order_weight"]``), which a
        compiler's search asks, instead of at the one chosen for seconds (``gbt_weight``).
        """
        return self.predict_orders(programs, devices, batch_size, (order,))[0]

    def predict_orders(self, programs, devices: str | Sequence[str], batch_size: int = 256,
                       orders: Sequence[bool] = (False, True)) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """``predict``'s ``(mean, lo90, hi90)`` for each ``order`` of ``orders``, the members run once: the
        seconds and the order of the same programs cost one pass of the transformer, not two."""
        programs = programs if isinstance(programs, PackedPrograms) else list(programs)
        on, move = self._through_anchors(programs, devices)
        members = self._members_seconds(programs, on, batch_size)
        out = []
        for order in orders:
            mean, lo, hi = members
            if self.gbt is not None:
                factor = self.gbt_factor(programs, on, mean, order)
                mean, lo, hi = mean * factor, lo * factor, hi * factor
            if move is not None:
                factor = move(mean) / mean
                mean, lo, hi = mean * factor, lo * factor, hi * factor
            if self.shot_choices:
                factor = self.apply_shots(programs, devices, mean) / mean
                mean, lo, hi = mean * factor, lo * factor, hi * factor
            out.append((mean, lo, hi))
        return out

    def apply_shots(self, programs, devices: str | Sequence[str], seconds: np.ndarray) -> np.ndarray:
        """``seconds`` (the model's prediction) with each device's ``ShotChoice`` applied where it has one."""
        names = [devices] * len(seconds) if isinstance(devices, str) else list(devices)
        out = np.asarray(seconds, dtype=np.float64).copy()
        for device, choice in self.shot_choices.items():
            idx = [i for i, d in enumerate(names) if d == device]
            if idx:
                if isinstance(programs, PackedPrograms):
                    raise ValueError(f"{device} has measured shots: predict it from ProgramFeatures, not packed programs")
                out[idx] = choice.predict([programs[i] for i in idx], base_seconds=out[idx])
        return out

    def _through_anchors(self, programs, devices: str | Sequence[str]):
        """The devices the programs are predicted on (each one's anchor, or itself) and the function taking
        the seconds predicted there to ``devices``: the FP32-equivalent time the model learned sped up by the
        anchor's tensor cores (``physics.fp32_equivalent``), then moved by Amdahl's law and the chips' levels
        (``physics.move``). None where neither changes anything. Packed programs carry no tensor-core FLOPs."""
        names = [devices] if isinstance(devices, str) else list(devices)
        anchor = {d: self.anchor_of(d) or d for d in set(names)}
        on = anchor[devices] if isinstance(devices, str) else [anchor[d] for d in names]
        moved = any(a != d for d, a in anchor.items())
        if moved and isinstance(programs, PackedPrograms):
            raise ValueError("a device the model never trained on is predicted from ProgramFeatures, not packed programs")
        if isinstance(programs, PackedPrograms):
            return on, None
        names = [devices] * len(programs) if isinstance(devices, str) else names
        ons, table = [anchor[d] for d in names], self.device_specs.table
        share = physics.tensor_time_shares(programs, ons, table)
        if not moved and (share == 1.0).all():
            return on, None
        return on, lambda seconds: physics.move(np.asarray(seconds) * share, programs, ons, names, table, self.anchors or {})

    def anchor_of(self, device: str) -> str | None:
        """The trained device ``predict`` predicts ``device`` on before moving it there by Amdahl's law
        (``cdmpp.model.physics.anchor_device``); None: ``device`` is predicted directly."""
        if not self.anchors:
            return None
        return physics.anchor_device(device, list(self.anchors), self.device_specs.table)

    def on_anchors(self, labeled: Sequence) -> list:
        """Labelled programs, those of a device predicted through an anchor moved to it by Amdahl's law run
        backwards (``physics.on_anchors``), as FP32-equivalent time (``physics.fp32_equivalent``): what a fine-tune
        learns, so that ``predict`` moves it forward again."""
        table = self.device_specs.table
        return physics.fp32_equivalent(physics.on_anchors(labeled, self.anchor_of, table, self.anchors or {}), table)

    def predict_parts(self, programs, devices: str | Sequence[str], batch_size: int = 256):
        """The two predictions the blend combines, in seconds, each moved to its device as ``predict`` moves
        their blend: the members' and the GBT's (None without one); what a blend weight is chosen on
        (``cdmpp.model.blend.blend`` of the two at w is ``predict``'s, up to the fork/join cost of a move)."""
        programs = programs if isinstance(programs, PackedPrograms) else list(programs)
        on, move = self._through_anchors(programs, devices)
        parts = [self._members_seconds(programs, on, batch_size)[0], None if self.gbt is None else self._gbt_seconds(programs, on)]
        return tuple(p if p is None or move is None else move(p) for p in parts)

    def gbt_factor(self, features, devices: str | Sequence[str], mean: np.ndarray,
                   order: bool = False) -> np.ndarray:
        """What the blend with the GBT multiplies the members' prediction ``mean`` by: (gbt / mean)^(1 - w);
        the interval moves with it."""
        from cdmpp.model.blend import blend

        w = self.calibration["gbt_weight"]
        gbt = self._gbt_seconds(features, devices)
        return blend(mean, gbt, self.calibration["gbt_order_weight"] if order else w) / mean

    def _members_seconds(self, programs, devices: str | Sequence[str], batch_size: int):
        mu, lo, hi = self.interval_z(self.predict_z(programs, devices, batch_size))
        inv = self.label_transform.inverse_transform
        return inv(mu), inv(lo), inv(hi)

    def _gbt_seconds(self, features, devices: str | Sequence[str]) -> np.ndarray:
        if isinstance(features, PackedPrograms):
            raise ValueError("a model blended with a GBT predicts from ProgramFeatures, not packed programs")
        features = list(features)
        names = [devices] * len(features) if isinstance(devices, str) else list(devices)
        return self.gbt.predict([_OnDevice(f, d) for f, d in zip(features, names)])

    @torch.inference_mode()
    def embed(self, programs, member: int = 0, batch_size: int = 256) -> np.ndarray:
        """Program embeddings ``[n, d_model]`` from one member (members' spaces differ, so no averaging)."""
        packed = self.pack(programs)
        m = self.members[member].eval()
        out = np.empty((len(packed), m.d_model), dtype=np.float32)
        extra = self.extra_inputs(packed)
        for idx in length_sorted_batches(packed.lengths, batch_size):
            out[idx] = m.embed(*packed.batch(idx), None if extra is None else extra[idx]).numpy()
        return out

    def calibrate(self, z_members: np.ndarray, z_true: np.ndarray, level: float = 0.9) -> dict:
        """Split-conformal calibration of the interval on held-out data (the validation split).

        Scores are |z_true - mean| / (std + delta), delta = median member std (so a near-zero spread
        cannot make a score explode); q is the ceil((n+1)·level)/n empirical quantile of the scores.
        """
        mu = z_members.mean(axis=0)
        spread = z_members.std(axis=0) if len(z_members) > 1 else np.zeros_like(mu)
        delta = float(max(np.median(spread), 1e-3))
        scores = np.abs(np.asarray(z_true) - mu) / (spread + delta)
        n = len(scores)
        rank = min(1.0, np.ceil((n + 1) * level) / n)
        q = float(np.quantile(scores, rank, method="higher"))
        self.calibration = {**self.calibration, "level": level, "q": q, "delta": delta, "n": n}
        return self.calibration

    # ---- persistence --------------------------------------------------------------------------------
    def save(self, directory: str | Path) -> Path:
        """Write ``weights.safetensors``, ``predictor.json`` and, with a GBT blend, ``gbt.ubj.gz`` into ``directory``
        (created if needed)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        tensors = {f"member{i}.{k}": v.detach().contiguous().cpu()
                   for i, m in enumerate(self.members) for k, v in m.state_dict().items()}
        save_file(tensors, str(directory / "weights.safetensors"))
        meta = dict(format_version=FORMAT_VERSION, n_members=len(self.members),
                    model=self.members[0].hparams, config=self.config,
                    feature_normalizer=self.feature_normalizer.to_dict(),
                    label_transform=self.label_transform.to_dict(), device_specs=self.device_specs.to_dict(),
                    calibration=self.calibration, featurizer_version=self.featurizer_version, summary=self.summary,
                    program_inputs=self.program_inputs, anchors=self.anchors,
                    shot_choices={d: c.to_state() for d, c in self.shot_choices.items()})
        gbt_file = directory / "gbt.ubj.gz"  # XGBoost's binary JSON, gzipped: a third of the text JSON's size
        if self.gbt is not None:
            gbt_file.write_bytes(gzip.compress(bytes(self.gbt.booster_.save_raw("ubj")), compresslevel=6, mtime=0))
            meta["gbt"] = dict(file=gbt_file.name, target=self.gbt.target, loss=self.gbt.loss,
                               assembly_counts=self.gbt.assembly_counts)
        else:
            gbt_file.unlink(missing_ok=True)
        (directory / "predictor.json").write_text(json.dumps(meta, indent=1, default=_json_default))
        return directory

    @classmethod
    def load(cls, directory: str | Path) -> "TrainedModel":
        directory = Path(directory)
        meta = json.loads((directory / "predictor.json").read_text())
        if meta.get("format_version") != FORMAT_VERSION:
            raise ValueError(f"{directory}: checkpoint format {meta.get('format_version')}, this cdmpp reads {FORMAT_VERSION}: "
                             "retrain it (`cdmpp train`) with this cdmpp")
        tensors = load_file(str(directory / "weights.safetensors"))
        members = []
        for i in range(meta["n_members"]):
            m = CDMPPModel(**meta["model"])
            prefix = f"member{i}."
            m.load_state_dict({k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)})
            members.append(m.eval())
        here = current_featurizer_version()
        if here != "unknown" and meta["featurizer_version"] not in ("unknown", here):
            warnings.warn(f"checkpoint was trained on featurizer {meta['featurizer_version']}, this process runs {here}")
        gbt = None
        if meta.get("gbt"):
            import xgboost as xgb

            from cdmpp.model.pooled_gbt import PooledGBT

            gbt = PooledGBT({}, target=meta["gbt"]["target"], loss=meta["gbt"]["loss"],
                            assembly_counts=meta["gbt"].get("assembly_counts", False))
            gbt.booster_ = xgb.Booster(params={"nthread": 1})
            gbt.booster_.load_model(bytearray(gzip.decompress((directory / meta["gbt"]["file"]).read_bytes())))
        model = cls(members, FeatureNormalizer.from_dict(meta["feature_normalizer"]),
                    LogLatency.from_dict(meta["label_transform"]), DeviceSpecs.from_dict(meta["device_specs"]),
                    meta["config"], meta["calibration"], meta["featurizer_version"], meta["summary"],
                    meta["program_inputs"], gbt, meta["anchors"])
        if model.anchors is not None:  # saved before a trained GPU could anchor a new one (physics.anchor_device)
            for device in model.summary.get("train_devices", []):
                if target_kind_of_id(device) == "cuda":
                    model.anchors.setdefault(device, 0.0)
        if meta["shot_choices"]:
            from cdmpp.model.shots import ShotChoice

            model.shot_choices = {d: ShotChoice.from_state(s) for d, s in meta["shot_choices"].items()}
        return model


class _OnDevice(NamedTuple):
    """A program's features on a device: what the pooled GBT reads."""

    features: object
    device: str


def _json_default(obj):
    if isinstance(obj, (np.integer, np.floating)):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    raise TypeError(f"{type(obj).__name__} is not JSON serializable")
