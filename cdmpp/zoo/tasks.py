"""Extract MetaSchedule tuning tasks from the network zoo and keep them in a deduplicated table.

Why: the dataset is sampled per *task* (one fused TIR kernel), but evaluation and weighting are per
*network*: a network's latency is the weight-summed latency of its tasks. The same kernel (e.g. a
3x3 conv at 56x56x64) appears in many networks and batch sizes, so tasks are keyed by the structural
hash of their IRModule and the table keeps, for every task, how often each ``network@batch`` calls it.

Pipeline (see shared TVM-NOTES): ``torch.export`` → Relax importer → ``DecomposeOpsForInference``,
``CanonicalizeBindings`` → ``relax.get_pipeline("zero")`` (legalize, fold constants, fuse) →
``meta_schedule.relax_integration.extract_tasks``. Parameters are bound as constants (as in deployment),
so constant folding sees them, as a real build would.

CLI: ``python -m cdmpp.zoo.tasks --networks resnet18,bert_tiny --batch-sizes 1,8 --out datasets/tasks.json.gz``
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass, field
from typing import Iterable, Sequence

FORMAT_VERSION = 1


def occurrence_key(network: str, batch_size: int) -> str:
    """The string that names one network instance in ``Task.occurrences`` ("resnet18@8")."""
    return f"{network}@{batch_size}"


def split_occurrence(occ: str) -> tuple[str, int]:
    net, _, bs = occ.rpartition("@")
    return net, int(bs)


@dataclass
class Task:
    """One tuning task: a fused TIR kernel, shared by every network instance that calls it.

    ``key``: 16-hex-digit structural hash of the task IRModule (stable across processes: the hash
    depends on structure only, never on object addresses). ``mod_json``: ``tvm.ir.save_json(mod)``.
    ``occurrences``: ``"network@batch"`` → number of calls to this kernel in that network.
    """

    key: str
    name: str
    mod_json: str
    flops: float | None = None
    occurrences: dict[str, int] = field(default_factory=dict)

    @property
    def networks(self) -> set[str]:
        return {split_occurrence(o)[0] for o in self.occurrences}

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Task":
        return cls(key=d["key"], name=d["name"], mod_json=d["mod_json"], flops=d.get("flops"),
                   occurrences={k: int(v) for k, v in d.get("occurrences", {}).items()})


def task_key(mod) -> str:
    """Structural hash of an IRModule as a fixed-width hex string (the task's identity)."""
    import tvm_ffi

    return format(tvm_ffi.structural_hash(mod) & 0xFFFFFFFFFFFFFFFF, "016x")


def load_task_mod(task: Task):
    """The task's IRModule, rebuilt from its JSON."""
    from cdmpp.program import tvm_env

    tvm = tvm_env.setup()
    return tvm.ir.load_json(task.mod_json)


def target_to_str(target) -> str:
    """A JSON-able description of the target the tasks were extracted for."""
    try:
        return json.dumps({str(k): str(v) for k, v in target.export().items()}, sort_keys=True)
    except Exception:  # pragma: no cover - fall back to the target's repr
        return str(target)


# --------------------------------------------------------------------------------------------------
# Network → Relax → tasks


def network_to_relax(network: str, batch_size: int):
    """Export a zoo network with torch.export and import it into Relax, ready for task extraction."""
    import torch

    from cdmpp.program import tvm_env
    from cdmpp.zoo.networks import get_network

    tvm = tvm_env.setup()
    from tvm import relax
    from tvm.relax.frontend.torch import from_exported_program

    spec = get_network(network)
    torch.manual_seed(0)
    model = spec.build().eval()
    args = spec.example_inputs(batch_size)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.export pytree deprecation noise
        ep = torch.export.export(model, args)
        mod = from_exported_program(ep)
    mod = relax.transform.DecomposeOpsForInference()(mod)
    mod = relax.transform.CanonicalizeBindings()(mod)
    return relax.get_pipeline("zero")(mod)


def count_tir_calls(mod) -> int:
    """Number of ``call_tir`` calls in the Relax ``main`` of a lowered module (= kernel launches);
    used to check that task weights account for every kernel call."""
    import tvm
    from tvm import relax

    call_tir = tvm.ir.Op.get("relax.call_tir")
    n = 0

    @relax.expr_functor.visitor
    class _Count(relax.PyExprVisitor):
        def visit_call_(self, call):  # noqa: N802 - TVM visitor naming
            nonlocal n
            n += call.op.same_as(call_tir)
            super().visit_call_(call)

    _Count().visit_expr(mod["main"])
    return n


def extract_tasks(network: str, batch_size: int, target, with_flops: bool = True, mod=None) -> list[Task]:
    """Tasks of one network instance; each ``Task.occurrences`` holds only this instance's weight.

    Tasks of the same instance with equal keys are merged (weights added), so the weights of the
    returned list sum to the number of kernel calls of the network. ``mod``: the instance's lowered
    Relax module if already made by ``network_to_relax`` (saves converting twice).
    """
    from cdmpp.program import tvm_env

    tvm = tvm_env.setup()
    from tvm.s_tir.meta_schedule import relax_integration

    if mod is None:
        mod = network_to_relax(network, batch_size)
    occ = occurrence_key(network, batch_size)
    by_key: dict[str, Task] = {}
    for ext in relax_integration.extract_tasks(mod, target):
        key = task_key(ext.mod)
        if key in by_key:
            by_key[key].occurrences[occ] += int(ext.weight)
            continue
        flops = None
        if with_flops:
            try:
                from tvm.s_tir.analysis import estimate_tir_flops

                flops = float(estimate_tir_flops(ext.mod))
            except Exception:
                flops = None
        by_key[key] = Task(key=key, name=str(ext.task_name), mod_json=tvm.ir.save_json(ext.mod), flops=flops,
                           occurrences={occ: int(ext.weight)})
    return list(by_key.values())


# --------------------------------------------------------------------------------------------------
# The deduplicated table


@dataclass
class TaskTable:
    """Tasks of many network instances, deduplicated by key.

    ``tasks``: key → Task (``occurrences`` lists every ``network@batch`` that calls it).
    ``meta``: target, networks, batch sizes, versions, extraction times.
    """

    tasks: dict[str, Task] = field(default_factory=dict)
    meta: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.tasks)

    def __iter__(self):
        return iter(self.tasks.values())

    def __getitem__(self, key: str) -> Task:
        return self.tasks[key]

    def add(self, tasks: Iterable[Task]) -> None:
        """Merge tasks (e.g. from ``extract_tasks``): new keys are inserted, known keys gain occurrences."""
        for t in tasks:
            have = self.tasks.get(t.key)
            if have is None:
                self.tasks[t.key] = Task.from_dict(t.to_dict())
            else:
                for occ, w in t.occurrences.items():
                    have.occurrences[occ] = have.occurrences.get(occ, 0) + w

    def occurrences(self) -> list[str]:
        """All ``network@batch`` names in the table, sorted."""
        return sorted({o for t in self for o in t.occurrences})

    def networks(self) -> list[str]:
        return sorted({split_occurrence(o)[0] for o in self.occurrences()})

    def tasks_of(self, network: str, batch_size: int | None = None) -> list[tuple[Task, int]]:
        """(task, weight) pairs of a network; ``network`` may be ``"name@batch"``. Without a batch size
        the weights of all batch sizes are added up."""
        if "@" in network:
            network, bs = split_occurrence(network)
            batch_size = bs
        out = []
        for t in self:
            w = sum(c for o, c in t.occurrences.items()
                    if split_occurrence(o)[0] == network and (batch_size is None or split_occurrence(o)[1] == batch_size))
            if w:
                out.append((t, w))
        return out

    def filter(self, networks: Sequence[str] | None = None, task_names: Sequence[str] | None = None,
               batch_sizes: Sequence[int] | None = None, task_like: Sequence[str] | None = None,
               task_keys: Sequence[str] | None = None) -> "TaskTable":
        """A sub-table: only occurrences of the given networks / batch sizes, only tasks whose name is
        one of ``task_names`` (exact: "conv2d" must not pull in every fused conv2d), or contains one of
        ``task_like``, or whose key is in ``task_keys``. Tasks left with no occurrence are dropped."""
        nets = set(networks) if networks else None
        bss = set(int(b) for b in batch_sizes) if batch_sizes else None
        names, keys = set(task_names or ()), set(task_keys or ())
        out = TaskTable(meta=dict(self.meta))
        for t in self:
            if (names or task_like or keys) and not (t.name in names or t.key in keys
                                                     or any(s in t.name for s in task_like or ())):
                continue
            occ = {o: w for o, w in t.occurrences.items()
                   if (nets is None or split_occurrence(o)[0] in nets) and (bss is None or split_occurrence(o)[1] in bss)}
            if occ:
                out.tasks[t.key] = Task(t.key, t.name, t.mod_json, t.flops, occ)
        return out

    def summary(self) -> dict[str, dict]:
        """Per network instance: number of distinct tasks and of kernel calls."""
        out: dict[str, dict] = {}
        for t in self:
            for o, w in t.occurrences.items():
                s = out.setdefault(o, {"tasks": 0, "calls": 0})
                s["tasks"] += 1
                s["calls"] += w
        return dict(sorted(out.items()))

    # ---- persistence ------------------------------------------------------------------------------

    def to_json(self) -> dict:
        return {"format": "cdmpp-task-table", "version": FORMAT_VERSION, "meta": self.meta,
                "tasks": [t.to_dict() for t in self.tasks.values()]}

    @classmethod
    def from_json(cls, d: dict) -> "TaskTable":
        if d.get("format") != "cdmpp-task-table":
            raise ValueError("not a cdmpp task table")
        return cls(tasks={t["key"]: Task.from_dict(t) for t in d["tasks"]}, meta=d.get("meta", {}))

    def save(self, path: str) -> None:
        """Write JSON (gzip if the path ends with .gz) atomically: a temp file renamed over ``path``."""
        path = os.fspath(path)
        folder = os.path.dirname(os.path.abspath(path))
        os.makedirs(folder, exist_ok=True)
        data = json.dumps(self.to_json(), separators=(",", ":")).encode()
        if path.endswith(".gz"):
            data = gzip.compress(data, compresslevel=6, mtime=0)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-" + os.path.basename(path), dir=folder)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give the file normal permissions
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise

    @classmethod
    def load(cls, path: str) -> "TaskTable":
        path = os.fspath(path)
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rt", encoding="utf-8") as f:
            return cls.from_json(json.load(f))


def build_task_table(networks: Sequence[str], batch_sizes: Sequence[int] | None, target,
                     progress: bool = True, with_flops: bool = True) -> TaskTable:
    """Extract every (network, batch size) and merge into one deduplicated table.

    ``batch_sizes=None`` uses each network's own ``NetworkSpec.batch_sizes``. Progress goes to stderr.
    """
    from tqdm import tqdm

    from cdmpp.zoo.networks import get_network

    jobs = [(n, b) for n in networks for b in (batch_sizes or get_network(n).batch_sizes)]
    table = TaskTable(meta={"target": target_to_str(target), "networks": list(networks),
                            "batch_sizes": list(batch_sizes) if batch_sizes else None, "extract_seconds": {}})
    bar = tqdm(jobs, desc="extract", unit="net", file=sys.stderr, disable=not progress)
    t_all = time.perf_counter()
    for net, bs in bar:
        bar.set_postfix_str(occurrence_key(net, bs))
        t0 = time.perf_counter()
        tasks = extract_tasks(net, bs, target, with_flops=with_flops)
        before = len(table)
        table.add(tasks)
        dt = time.perf_counter() - t0
        table.meta["extract_seconds"][occurrence_key(net, bs)] = round(dt, 2)
        bar.write(f"{occurrence_key(net, bs)}: {len(tasks)} tasks, {sum(t.occurrences[occurrence_key(net, bs)] for t in tasks)} "
                  f"calls, {len(table) - before} new, {dt:.1f} s (table: {len(table)})", file=sys.stderr)
    table.meta["total_seconds"] = round(time.perf_counter() - t_all, 2)
    try:
        import torch
        import tvm

        table.meta["versions"] = {"tvm": tvm.__version__, "torch": torch.__version__}
    except Exception:  # pragma: no cover
        pass
    return table


# --------------------------------------------------------------------------------------------------
# CLI


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m cdmpp.zoo.tasks``: extract a task table for some networks and save it."""
    from cdmpp.zoo.networks import NETWORKS

    p = argparse.ArgumentParser(prog="python -m cdmpp.zoo.tasks", description=__doc__.split("\n\n")[0])
    p.add_argument("--networks", default="all", help="comma-separated zoo names, or 'all' (default)")
    p.add_argument("--batch-sizes", default=None, help="comma-separated, e.g. 1,8 (default: each network's own)")
    p.add_argument("--target", default="llvm", choices=["llvm", "cuda"])
    p.add_argument("--num-cores", type=int, default=None, help="target num-cores (default: this machine's)")
    p.add_argument("--mcpu", default=None, help="llvm mcpu (default: this machine's)")
    p.add_argument("--no-flops", action="store_true", help="skip FLOP estimation")
    p.add_argument("--out", help="output .json or .json.gz (required unless --list)")
    p.add_argument("--list", action="store_true", help="list the zoo and exit")
    a = p.parse_args(argv)
    if a.list:
        for n, s in NETWORKS.items():
            print(f"{n:18s} {s.description}")
        return 0
    if not a.out:
        p.error("--out is required")
    from cdmpp.program import tvm_env

    tvm_env.setup()
    nets = list(NETWORKS) if a.networks == "all" else [n.strip() for n in a.networks.split(",") if n.strip()]
    bss = [int(b) for b in a.batch_sizes.split(",")] if a.batch_sizes else None
    target = tvm_env.make_target(a.target, num_cores=a.num_cores, mcpu=a.mcpu)
    t0 = time.perf_counter()
    table = build_task_table(nets, bss, target, with_flops=not a.no_flops)
    table.save(a.out)
    print(f"{len(table)} unique tasks from {len(table.occurrences())} network instances → {a.out} "
          f"({os.path.getsize(a.out) / 1e6:.2f} MB) in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
