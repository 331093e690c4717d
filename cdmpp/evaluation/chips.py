"""Leave-one-chip-out, the headline of cross-device (DESIGN.md §5, issue 52): every device of one chip held
out, cdmpp and its peers trained on every other device (CPU and GPU), then scored on the chip's test
programs with k = 0, 1 %, 5 %, 16 and 64 of its programs measured (KMeans and random shots).

Rows (``protocol-runs.jsonl`` form, setting ``leave-one-chip-out``, ``chip`` naming the held-out one):

* ``cdmpp``: the pretrained model's prediction (a new CPU chip through its anchor, moved by Amdahl's law
  and the two chips' reference-kernel levels, else per-thread peaks: ``cdmpp.model.physics.chip_ratio``; the
  reference kernels are not test programs; a new GPU through the trained GPU closest in peak FLOP/s, moved by
  the ratio of the two GPUs' measured levels, else peaks; the level programs are not test programs); with
  shots, ``ShotChoice`` on it (the shipped k-shot path: the prediction as is, × the shots' median ratio, × a
  GBT of the log ratio, a GBT of the shots alone, or a blend, whichever cross-validation on the shots
  prefers; applied to its seconds and to its order prediction, as a checkpoint with shots applies it), one
  per device of the chip, fitted on that device's shots (``by_device``), which were chosen among its own
  programs (``splits.shots_by_device``); ``cdmpp, direct`` (k = 0):
  the network asked for the new chip from its specs, without the transfer; ``cdmpp, seen programs`` (k = 0):
  the same prediction on the chip's programs outside the test, whose twins were in training on other chips
  (the chip new, the programs not: what the shots' cross-validation sees);
* ``cdmpp, fine-tune`` (method ``cdmpp-finetune``, KMeans shots only): the network fine-tuned on the shots
  (``checked_finetune``), for comparison;
* ``pooled GBT``: the pooled GBT of the other devices (+ the shots: its ``adapt``), and
  ``pooled GBT, spec transfer``: the same GBT through cdmpp's transfer, with ``ShotChoice`` on it, so
  the peer gets the same physics and the same k-shot path;
* ``shots-only GBT``: XGBoost on the k shots alone (log seconds from pooled features and log FLOPs), its
  size chosen by cross-validation on them;
* ``chip's own GBT (reference)``: a pooled GBT on log latency trained on every labelled program of the
  chip outside the test (the pool), the ceiling a full collection on the chip would reach.

``methods``: "cdmpp", "pooled-gbt" (the GBT peers and the reference), "chip-peers" (only the
shots-only GBT and the reference: no model of the other devices is trained, so KMeans shots come from
model-free features).

Twins are grouped: no program of the chip's test set is in training on any device (``programs="new"``).
Each row names the chip's ``kind`` ("cpu" or "gpu"): the summary averages GPU chips apart.
"""

from __future__ import annotations

import copy
import time
from typing import Sequence

import numpy as np

from cdmpp.evaluation import metrics as ev
from cdmpp.evaluation import splits
def _chip_pool(ds, split) -> list:
    """The chip's labelled programs outside the test set (what a full collection on it would give)."""
    targets = set(split.info["target_device"].split("+"))
    test = {p.features.program_hash for p in split.test}
    return [p for p in getattr(ds, "programs", ds) if p.device in targets and p.features.program_hash not in test]


def of_chips_kind(ds, chip: str, device_table: dict) -> list:
    """The programs of ``ds`` whose code is of the held-out chip's kind (CPU or GPU): leave-one-chip-out
    trained on that kind alone (``--chip-train same-kind``). Its test programs are the same: no program is
    a twin across kinds."""
    from cdmpp.devices.spec import target_kind_of_id

    programs = getattr(ds, "programs", ds)
    kinds = {target_kind_of_id(d) for d in {p.device for p in programs} if splits.chip_of(d, device_table) == chip}
    return [p for p in programs if target_kind_of_id(p.device) in kinds]


def run_chip(opts, seed: int, ds, device_table: dict, chip: str, out, context, k_value, resume=None) -> None:
    """Every k and sampler of one held-out ``chip`` for one seed: rows to ``out`` (a protocol ``_Writer``).
    ``context(pool)``: the registry's ``Context`` of this seed, whose ``cdmpp`` and ``pooled-gbt`` are trained
    on the other devices. ``resume``: the protocol's ``Resumable`` of this chip and seed (cdmpp's training is
    saved every epoch until the chip's rows are written)."""
    from cdmpp.devices.reference import kernel_hashes
    from cdmpp.devices.spec import target_kind_of_id
    from cdmpp.evaluation.methods.derived import Memo, shot_chosen
    from cdmpp.model.pooled_gbt import PooledGBT
    from cdmpp.model.shots import MIN_SHOTS_FOR_MODELS, ShotChoice, median_log_error

    base = splits.leave_one_chip_out_split(ds, chip, device_table, 0, seed=seed)
    kinds = {target_kind_of_id(d) for d in base.info["target_device"].split("+")}
    common = dict(chip=chip, kind="gpu" if kinds == {"cuda"} else "cpu", programs=len(base.test), n_train=len(base.train))
    common["chip_train"] = opts.chip_train
    made = context(base.target_pool)
    if made.config is not None and kinds == {"cuda"}:
        made.config = made.config.for_kind("cuda")  # its methods are made on first use, after this
    pool = _chip_pool(ds, base)  # the chip's programs outside the test: the reference's data, the seen-programs row
    counted = bool(made.config is not None and made.config.assembly_counts)  # every GBT reads what cdmpp reads

    def fitted(name: str):
        method = made.one(name)
        if resume is not None:
            resume(method)
        t = time.monotonic()
        method.fit(base.train, base.val)
        return method, round(time.monotonic() - t, 1)

    model = cdmpp_secs = None
    if "cdmpp" in opts.methods:
        model, cdmpp_secs = fitted("cdmpp")
        cdmpp_base = Memo(model)
        cdmpp_bias = median_log_error(cdmpp_base.predict(base.val), [p.seconds for p in base.val])
    if {"pooled-gbt", "chip-peers"} & set(opts.methods):  # the ceiling: a GBT of the chip's own programs
        val_, train_ = splits._split_by_key(pool, lambda p: p.features.program_hash, [0.1],
                                            splits._rng(seed, "chip-reference", chip))
        t = time.monotonic()
        own = PooledGBT(device_table, nthread=opts.threads, random_state=seed, target="latency",
                        assembly_counts=counted).fit(train_, val_)
        out.row("leave-one-chip-out", "chip's own GBT (reference)", ev.score(base.test, own.predict(base.test)),
                k=None, train_seconds=round(time.monotonic() - t, 1), n_reference=len(train_), **common)
    gbt = None
    if "pooled-gbt" in opts.methods:
        from cdmpp.evaluation.methods.twin_ratio import AmdahlTransfer
        from cdmpp.model.physics import fork_join_by_device

        gbt, gbt_secs = fitted("pooled-gbt")
        transfer = Memo(AmdahlTransfer(gbt, fork_join_by_device(base.train, device_table), device_table))
        transfer_bias = median_log_error(transfer.predict(base.val), [p.seconds for p in base.val])
    embed = model.embed if model is not None else None
    for k_name in opts.chip_ks:
        k = k_value(k_name, base.info["n_target"]) if k_name != "0" else 0
        for sampler in (opts.samplers if k else ["kmeans"]):
            sp = splits.leave_one_chip_out_split(ds, chip, device_table, k, sampler, seed, embed=embed)
            test, shots = sp.test, sp.shots
            n = dict(common, k=k, k_name=k_name, sampler=sampler if k else None)
            suffix = "" if not k else f" k={k_name} ({sampler})"
            if model is not None:
                if k:
                    chosen, described = by_device(lambda s: ShotChoice(
                        cdmpp_base.predict, seed=seed, nthread=opts.threads, base_bias=cdmpp_bias,
                        assembly_counts=counted).fit(s), shots, test, lambda c, ps: shot_chosen(c, cdmpp_base, ps))
                    out.row("leave-one-chip-out", opts.label + suffix, ev.score(test, *chosen), train_seconds=cdmpp_secs,
                            choice=described, **n)
                    if "cdmpp-finetune" in opts.methods and sampler == "kmeans":  # the comparison, at its cost
                        tuned = model.adapt(shots)
                        mean, lo, hi, order = tuned.predict_interval_and_order(test)
                        out.row("leave-one-chip-out", opts.label + ", fine-tune" + suffix,
                                ev.score(test, mean, lo, hi, order), train_seconds=cdmpp_secs, **n)
                else:
                    mean, lo, hi, order = cdmpp_base.predict_interval_and_order(test)
                    out.row("leave-one-chip-out", opts.label, ev.score(test, mean, lo, hi, order),
                            train_seconds=cdmpp_secs, val_mape=model.model_.summary["val"]["mape"],
                            epochs=sum(len(r.get("history", [])) for r in model.model_.summary["members"]), **n)
                    kernels = kernel_hashes()
                    seen = [p for p in pool if p.features.program_hash not in kernels]
                    mean, lo, hi, order = cdmpp_base.predict_interval_and_order(seen)  # their twins were in training
                    out.row("leave-one-chip-out", opts.label + ", seen programs", ev.score(seen, mean, lo, hi, order),
                            train_seconds=cdmpp_secs, **dict(n, programs=len(seen)))
                    direct = copy.copy(model.model_)
                    direct.anchors = None  # every device predicted by the network from its specs
                    mean, lo, hi = direct.predict([p.features for p in test], [p.device for p in test])
                    out.row("leave-one-chip-out", opts.label + ", direct", ev.score(test, mean, lo, hi),
                            train_seconds=cdmpp_secs, **n)
            if gbt is not None:
                g = gbt.adapt(shots) if k else gbt
                out.row("leave-one-chip-out", "pooled GBT" + suffix, ev.score(test, g.predict(test)),
                        train_seconds=gbt_secs, **n)
                moved, described = by_device(lambda s: ShotChoice(
                    transfer.predict, seed=seed, nthread=opts.threads, base_bias=transfer_bias,
                    assembly_counts=counted).fit(s), shots, test, lambda c, ps: shot_chosen(c, transfer, ps))
                out.row("leave-one-chip-out", "pooled GBT, spec transfer" + suffix, ev.score(test, *moved),
                        train_seconds=gbt_secs, choice=described, **n)
            if k and min(sum(p.device == d for p in shots) for d in {p.device for p in test}) >= MIN_SHOTS_FOR_MODELS:
                alone, described = by_device(lambda s: ShotChoice(
                    None, seed=seed, nthread=opts.threads, only=("shots",), assembly_counts=counted).fit(s),
                    shots, test, lambda c, ps: (c.predict(ps),))
                out.row("leave-one-chip-out", "shots-only GBT" + suffix, ev.score(test, *alone),
                        train_seconds=0.0, choice=described, **n)
    if resume is not None:
        resume.finish()


def by_device(fit, shots: Sequence, test: Sequence, predict) -> tuple[tuple, str]:
    """One ``ShotChoice`` per device of the held-out chip, fitted on that device's shots (``fit(shots)``) and
    applied to its test programs (``predict(choice, programs)``: a tuple of arrays or None), as a user
    adapting each device with its own shots gets (``cdmpp finetune --device``): the choice reads device-free
    features, so one fitted over two thread counts moved each by the other's shots. Returns the predictions of
    ``test`` in order and the choices described."""
    devices = sorted({p.device for p in test})
    merged, described = None, []
    for device in devices:
        at = np.array([p.device == device for p in test])
        choice = fit([p for p in shots if p.device == device])
        got = predict(choice, [p for p, mine in zip(test, at) if mine])
        if merged is None:
            merged = [None if g is None else np.empty(len(test)) for g in got]
        for whole, part in zip(merged, got):
            if whole is not None:
                whole[at] = part
        described.append(choice.describe() if len(devices) == 1 else f"{device}: {choice.describe()}")
    return tuple(merged), "; ".join(described)


def held_out_chips(opts, ds, device_table: dict) -> list[str]:
    """``opts.chips``, or every chip with enough data (``splits.chips``); an unknown name is an error."""
    known = {splits.chip_of(d, device_table) for d in {p.device for p in getattr(ds, "programs", ds)}}
    eligible = splits.chips(ds, device_table)
    if opts.chips:  # a device id names its chip
        devices = {p.device for p in getattr(ds, "programs", ds)}
        chips = [splits.chip_of(c, device_table) if c in devices else c for c in opts.chips]
        unknown = [c for c in chips if c not in known]
        if unknown:
            raise ValueError(f"unknown chip(s) {unknown}; chips in the data: {sorted(known)}")
        return chips
    if not eligible:
        raise ValueError(f"no chip has enough programs to hold out; chips in the data: {sorted(known)}")
    return sorted(eligible)
