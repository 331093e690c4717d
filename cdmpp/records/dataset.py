"""Load a measured dataset as training samples: features, device, latency label, task and networks.

Records come from ``cdmpp.records.store.RecordStore``; programs are rebuilt from the task's workload and the
record's trace, then featurized. Features are cached on disk keyed by program hash and
``FEATURIZER_VERSION`` (a changed featurizer never reuses stale features), in append-only ``.npz``
chunks, so a second load of the same data does not touch TVM at all. Rows cached by an older version
whose rows are unchanged (``ROWS_COMPATIBLE_VERSIONS``) are reused; only what changed (FLOPs) is
recounted, on the rebuilt program, without TVM's feature extraction. So are a GPU program's rows cached before
tensor-core FLOPs were counted (``ProgramFeatures.tensor_flops`` None): its FLOPs are counted again, once.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace

import numpy as np

from cdmpp import defaults
from cdmpp.devices.spec import target_kind_of_id
from cdmpp.program.features import FEATURIZER_VERSION, ROWS_COMPATIBLE_VERSIONS, ProgramFeatures
from cdmpp.records.labels import label
from cdmpp.records.record import Record
from cdmpp.records.store import LoadReport, RecordStore, publish_numbered, slug


@dataclass
class LabeledProgram:
    """One measured program: features, the device it ran on, its latency label (the fastest repeat over
    all passes, ``cdmpp.records.labels.label``; ``math.nan`` in an unlabeled target pool), its tuning task,
    and where it came from. What training, evaluation and adaptation all take."""

    features: ProgramFeatures
    device: str
    seconds: float
    task: str = ""
    task_name: str = ""
    networks: list[str] = field(default_factory=list)  # "network@batch" occurrences of its task
    record_id: str = ""

    def without_counts(self) -> "LabeledProgram":
        """This program without its assembly counts, as a failed or skipped build leaves it (what a model with
        counts is also trained on: ``TrainConfig.assembly_unbuilt_copies``)."""
        inner = {"asm_inner": None} if hasattr(self.features, "asm_inner") else {}  # CachedFeatures have none
        return replace(self, features=replace(self.features, asm=None, **inner))


@dataclass
class Dataset:
    programs: list[LabeledProgram] = field(default_factory=list)
    failed: int = 0  # records with a build/run error or measured while others were busy (never labels)
    report: LoadReport = field(default_factory=LoadReport)

    def __len__(self) -> int:
        return len(self.programs)

    def filter(self, devices=None, networks=None, tasks=None) -> "Dataset":
        nets = set(networks) if networks else None
        out = [p for p in self.programs
               if (not devices or p.device in devices)
               and (not tasks or p.task in tasks or p.task_name in tasks)
               and (nets is None or any(o.split("@")[0] in nets or o in nets for o in p.networks))]
        return Dataset(out, self.failed, self.report)

    def devices(self) -> list[str]:
        return sorted({p.device for p in self.programs})

    def networks(self) -> list[str]:
        return sorted({o.split("@")[0] for p in self.programs for o in p.networks})


@dataclass(frozen=True)
class CachedFeatures:
    """A program's features left on disk: where the feature cache holds them (chunk ``path``, entry ``index``)
    and what a split and a store's header need (hash, leaf count). ``write_store`` reads them
    (``read_cached``) one cache chunk at a time, each once, so a store is written without every program's features
    in memory."""

    program_hash: str
    n_leaves: int
    path: str
    index: int
    tensor_flops: float | None = None  # None: cached before tensor-core FLOPs were counted
    asm: np.ndarray | None = None  # ProgramFeatures.asm, given to the features read_cached reads


def _read_chunk(path: str, rows: bool = True) -> dict | None:
    """One cache chunk's arrays (without ``rows``: hashes and offsets only, the rest not decompressed);
    None (reported) when it is unreadable."""
    try:
        with np.load(path, allow_pickle=False) as z:
            names = z.files if rows else [n for n in ("hashes", "offsets", "tensor_flops") if n in z.files]
            return {k: z[k] for k in names}
    except Exception as e:  # a torn chunk only costs re-featurization
        print(f"feature cache: skipping unreadable {path}: {e}", file=sys.stderr)
        return None


def _features(z: dict, i: int) -> ProgramFeatures:
    a, b = z["offsets"][i], z["offsets"][i + 1]
    f = ProgramFeatures(z["rows"][a:b], z["positions"][a:b], float(z["flops"][i]), str(z["hashes"][i]))
    if "loops" in z:
        f.loops = z["loops"][z["loop_offsets"][i]:z["loop_offsets"][i + 1]]
    f.tensor_flops = _tensor_flops(z, i)
    return f


def _tensor_flops(z: dict, i: int) -> float | None:
    """A cached program's tensor-core FLOPs; None in a chunk written before they were counted (NaN: not counted)."""
    if "tensor_flops" not in z:
        return None
    t = float(z["tensor_flops"][i])
    return None if np.isnan(t) else t


def read_cached(refs) -> list[ProgramFeatures]:
    """The features of ``CachedFeatures`` ``refs``, in their order, each cache chunk they touch read once."""
    by_path: dict[str, list[int]] = {}
    for k, r in enumerate(refs):
        by_path.setdefault(r.path, []).append(k)
    out = [None] * len(refs)
    for path, ks in by_path.items():
        z = _read_chunk(path)
        if z is None:
            raise RuntimeError(f"{path}: a feature cache chunk became unreadable while a store was written from it; "
                               "write the store again")
        for k in ks:
            out[k] = _features(z, refs[k].index)
            out[k].asm = refs[k].asm
    return out


class FeatureCache:
    """program hash → ProgramFeatures, persisted as ``features-v<version>-NNNN.npz`` chunks.
    ``stale``: entries of row-compatible older versions (their rows are valid, their FLOPs are not).
    Loop tokens are optional: chunks written before them, or by a featurizer without them, load with
    ``loops`` None, and readers that do not know them ignore the extra arrays.
    ``on_disk``: program hash → ``CachedFeatures`` instead (only hashes and offsets read; nothing can be added),
    for a reader that must not hold every program's features (``load_dataset(features_on_disk=True)``)."""

    CHUNK_PROGRAMS = 20_000  # at most this many programs per chunk: a chunk is read whole, so it must stay small

    def __init__(self, directory: str, on_disk: bool = False):
        self.directory, self.on_disk = directory, on_disk
        self.items: dict[str, ProgramFeatures | CachedFeatures] = {}
        self.stale: dict[str, ProgramFeatures] = {}
        self._new: list[ProgramFeatures] = []
        os.makedirs(directory, exist_ok=True)
        if not on_disk:
            for version in ROWS_COMPATIBLE_VERSIONS:
                self._read(version, self.stale)
        self._read(FEATURIZER_VERSION, self.items)

    def _read(self, version: str, into: dict) -> None:
        for path in sorted(glob.glob(os.path.join(self.directory, f"features-v{version}-*.npz"))):
            z = _read_chunk(path, rows=not self.on_disk)
            if z is None:
                continue
            counts = np.diff(z["offsets"])
            for i, h in enumerate(z["hashes"]):
                into[str(h)] = CachedFeatures(str(h), int(counts[i]), path, i, _tensor_flops(z, i)) if self.on_disk \
                    else _features(z, i)  # a later chunk's entry replaces an earlier one (a recount)

    def get(self, h: str) -> ProgramFeatures | CachedFeatures | None:
        return self.items.get(h)

    def put(self, f: ProgramFeatures) -> None:
        """Add ``f``, or replace an entry whose tensor-core FLOPs were not counted."""
        if self.on_disk:
            raise RuntimeError("a FeatureCache read with on_disk=True takes no new features")
        old = self.items.get(f.program_hash)
        if old is None or (old.tensor_flops is None and f.tensor_flops is not None):
            self.items[f.program_hash] = f
            self._new.append(f)
            if len(self._new) >= self.CHUNK_PROGRAMS:
                self.flush()

    def flush(self) -> None:
        if not self._new:
            return
        off = np.cumsum([0] + [f.n_leaves for f in self._new])
        fd, tmp = tempfile.mkstemp(prefix=".features-", suffix=".tmp.npz", dir=self.directory)
        os.close(fd)
        extra = {}
        if all(f.loops is not None for f in self._new):  # a chunk keeps loops only if all its programs have them
            extra = dict(loops=np.concatenate([f.loops for f in self._new]).reshape(-1, 3).astype(np.float32),
                         loop_offsets=np.cumsum([0] + [len(f.loops) for f in self._new]))
        np.savez_compressed(tmp, rows=np.concatenate([f.leaf_features for f in self._new]),
                            positions=np.concatenate([f.positions for f in self._new]), offsets=off,
                            flops=np.array([f.flops for f in self._new]),
                            tensor_flops=np.array([np.nan if f.tensor_flops is None else f.tensor_flops for f in self._new]),
                            hashes=np.array([f.program_hash for f in self._new]), **extra)
        publish_numbered(tmp, self.directory, f"features-v{FEATURIZER_VERSION}-", ".npz")
        self._new = []


def load_dataset(dataset_dir: str, task_table, devices=None, networks=None, tasks=None,
                 cache_dir: str | None = None, limit: int | None = None, progress: bool = True,
                 searched: bool = True, features_on_disk: bool = False, assembly_dir: str | None = None,
                 innermost: bool = False) -> Dataset:
    """Every successfully measured record of ``dataset_dir`` (filtered), featurized (cached). ``searched=False``
    leaves out the candidates of ``cdmpp collect --from-search`` and their twins measured on the other devices
    read (``--programs-from``: by program hash; the twin records carry no mark), as the protocol's settings
    score random schedules, so a search collected later does not move their numbers. ``features_on_disk``: each program's
    ``features`` a ``CachedFeatures`` left in the cache (``read_cached`` reads them), so the dataset in memory is
    its labels and ids; programs not featurized yet are featurized first, with the cache in memory. Each program
    carries the instruction counts of its build for its device's target where ``assembly_dir`` (default:
    ``datasets/assembly`` beside the dataset) has them (``ProgramFeatures.asm``; with ``innermost`` also its innermost
    loops', ``asm_inner``, in memory only)."""
    if innermost and features_on_disk:
        raise ValueError("innermost counts are attached to features in memory: not with features_on_disk")
    from tqdm import tqdm

    from cdmpp.records.importers import with_imported_workloads

    task_table = with_imported_workloads(task_table, dataset_dir)  # tasks of imported tuning logs
    store = RecordStore(dataset_dir)
    report = LoadReport()
    cache_dir = cache_dir or defaults.cache_dir(dataset_dir)
    cache = FeatureCache(cache_dir, on_disk=features_on_disk)
    records, failed, search_programs = [], 0, set()
    def chosen(traces: bool, report: LoadReport):  # with ``devices``, only their files (in file order, as without)
        return (r for d in sorted(devices, key=slug) for r in store.records(d, report, traces)) if devices \
            else store.records(report=report, traces=traces)

    for rec in chosen(False, report):  # labels and ids only: a trace is read again where features are missing
        if rec.extra.get("search"):
            search_programs.add(rec.program_hash)
            if not searched:
                continue
        y = label(rec)
        if y is None:
            failed += 1
            continue
        records.append((rec, y))
        if limit and len(records) >= limit:
            break
    if not searched:  # a candidate's twin on another device is a program of the search too
        records = [(r, y) for r, y in records if r.program_hash not in search_programs]
    for p in report.problems:
        print(f"dataset: {p}", file=sys.stderr)
    def current(rec) -> bool:  # cached, and a GPU program's tensor-core FLOPs counted (CPU code has none)
        f = cache.get(rec.program_hash)
        return f is not None and (f.tensor_flops is not None or target_kind_of_id(rec.device) != "cuda")

    missing = {r.id for r, _ in records if not current(r)}
    if missing:
        full = FeatureCache(cache_dir) if features_on_disk else cache
        _featurize_records([r for r in chosen(True, LoadReport()) if r.id in missing], task_table, full, progress)
        if features_on_disk:
            del full
            cache = FeatureCache(cache_dir, on_disk=True)
    ds = Dataset(failed=failed, report=report)
    with_counts = _assembly_counts(assembly_dir or defaults.assembly_dir(dataset_dir), innermost)
    for rec, y in records:
        f = cache.get(rec.program_hash)
        if f is None:
            continue  # its task is not in the table or its program no longer loads (reported above)
        ds.programs.append(LabeledProgram(with_counts(f, rec.device), rec.device, y, rec.task, rec.task_name or "",
                                          list(rec.networks or []), rec.id))
    return ds.filter(devices, networks, tasks)


def _assembly_counts(root: str, innermost: bool = False):
    """``(features, device) -> features``: a copy carrying the program's instruction counts built for the device's
    target (``ProgramFeatures.asm``; with ``innermost`` also its innermost loops', ``asm_inner``) where ``root`` has
    them, else the features as they are."""
    from cdmpp.devices.table import DeviceTable
    from cdmpp.program.assembly import AssemblyCounts, build_key

    if not os.path.isdir(root):
        return lambda f, device: f
    counts, table, keys = AssemblyCounts(root), DeviceTable(), {}

    def attach(f, device: str):
        if device not in keys:
            keys[device] = build_key(table.get(device).target) if device in table else None
        c = counts.get(f.program_hash, keys[device]) if keys[device] else None
        if c is None:
            return f
        if not innermost:
            return dataclasses.replace(f, asm=c)
        return dataclasses.replace(f, asm=c, asm_inner=counts.inner_table(keys[device]).get(f.program_hash))
    return attach


def _workload_of(rec: Record, task_table, mods: dict):
    """The record's task workload, loaded once per task into ``mods``; None if the table lacks the task."""
    from cdmpp.zoo.tasks import load_task_mod

    key = rec.task
    if key not in mods:
        mods[key] = load_task_mod(task_table[key]) if key in task_table.tasks else None
    return mods[key]


def _scheduled(rec: Record, workload):
    """The record's scheduled module: its trace replayed on ``workload``, or (Ansor and AutoTVM imports,
    ``cdmpp.records.import_logs``) its stored TVMScript ``program``."""
    from cdmpp.program.inputs import apply_trace, load_program

    if not rec.has_trace and rec.program:
        return load_program(rec.program).mod
    return apply_trace(workload, rec.trace)


def scheduled_module(rec: Record, task_table, mods: dict):
    """The module a record measured, rebuilt (its task's workloads loaded once into ``mods``)."""
    return _scheduled(rec, None if rec.program else _workload_of(rec, task_table, mods))


def _featurize_records(records: list[Record], task_table, cache: FeatureCache, progress: bool) -> None:
    from tqdm import tqdm

    from cdmpp.program.features import Featurizer, flops_and_tensor_flops
    from cdmpp.program.inputs import ProgramError, apply_trace, load_program

    featurizer = Featurizer()
    mods: dict[str, object] = {}
    last_flush = time.time()
    first = {}  # one record per program: its twins on other devices share its features (cache key: the hash)
    for rec in records:
        first.setdefault(rec.program_hash, rec)
    for rec in tqdm(list(first.values()), desc="featurize", unit="prog", disable=not progress, dynamic_ncols=True):
        workload = None if rec.program else _workload_of(rec, task_table, mods)
        if workload is None and not rec.program:
            print(f"dataset: task {rec.task} of {rec.id} is not in the task table; skipped", file=sys.stderr)
            continue
        try:
            mod = _scheduled(rec, workload)
            old = cache.stale.get(rec.program_hash) or cache.get(rec.program_hash)
            if old is not None:  # rows still valid: recount only the FLOPs
                flops, tensor = flops_and_tensor_flops(mod, target_kind_of_id(rec.device) == "cuda")
                f = ProgramFeatures(old.leaf_features, old.positions, flops, old.program_hash, old.loops, tensor)
            else:
                f = featurizer([load_program(mod, target_kind_of_id(rec.device))])[0]
            if rec.flops:  # an imported lowered program (no blocks): its workload's count
                f.flops = float(rec.flops)
        except ProgramError as e:
            print(f"dataset: {rec.id}: cannot featurize: {str(e).splitlines()[-1][:200]}", file=sys.stderr)
            continue
        f.program_hash = rec.program_hash  # the hash the collector stored (same function)
        cache.put(f)
        if time.time() - last_flush > 60:
            cache.flush()
            last_flush = time.time()
    cache.flush()


LOOPS_CACHE = "runs/loops"  # attach_loops's side cache (git-ignored)


def attach_loops(ds: Dataset, dataset_dir: str, task_table, cache_dir: str = LOOPS_CACHE,
                 progress: bool = True) -> int:
    """Give the programs of ``ds`` without loop tokens (features cached before there were any) the
    loops of their compact AST, for models with ``loop_tokens``. Each program is rebuilt from its record
    (workload + trace) and walked; TVM's feature extraction is not run. Results are cached by program
    hash in ``cache_dir`` (``loops-NNNN.npz`` chunks), so a second call only reads. Returns how many
    programs were left without loops (their program no longer rebuilds; a model with loop tokens
    refuses them)."""
    need: dict[str, list[ProgramFeatures]] = {}
    for p in ds.programs:
        if p.features.loops is None:
            need.setdefault(p.features.program_hash, []).append(p.features)
    if not need:
        return 0
    os.makedirs(cache_dir, exist_ok=True)
    cached: dict[str, np.ndarray] = {}
    for path in sorted(glob.glob(os.path.join(cache_dir, "loops-*.npz"))):
        with np.load(path, allow_pickle=False) as z:
            loops, off, hashes = z["loops"], z["offsets"], z["hashes"]
        cached.update((str(h), loops[off[i]:off[i + 1]]) for i, h in enumerate(hashes))
    todo = {h: fs for h, fs in need.items() if h not in cached}
    if todo:
        from cdmpp.records.importers import with_imported_workloads

        task_table = with_imported_workloads(task_table, dataset_dir)
        cached.update(_walk_loops(todo, dataset_dir, task_table, cache_dir, progress))
    for h, fs in need.items():
        for f in fs:
            f.loops = cached.get(h)
    return sum(len(fs) for h, fs in need.items() if h not in cached)


def _walk_loops(todo: dict[str, list[ProgramFeatures]], dataset_dir: str, task_table, cache_dir: str,
                progress: bool) -> dict[str, np.ndarray]:
    """Loop tokens of the programs ``todo`` (hash -> features), rebuilt from their records; new chunks
    of the side cache every minute, so an interrupted run keeps what it did."""
    from cdmpp.program.features import compact_ast_of
    from cdmpp.program.inputs import ProgramError, apply_trace, load_program

    recs = {}
    for rec in RecordStore(dataset_dir).records():
        h = rec.program_hash
        if h in todo and h not in recs and (rec.has_trace or rec.program):
            recs[h] = rec
    out: dict[str, np.ndarray] = {}
    new: dict[str, np.ndarray] = {}
    mods: dict[str, object] = {}
    start = last_flush = last_print = time.time()
    failed = 0

    def flush():
        if not new:
            return
        fd, tmp = tempfile.mkstemp(prefix=".loops-", suffix=".tmp.npz", dir=cache_dir)
        os.close(fd)
        np.savez_compressed(tmp, loops=np.concatenate(list(new.values())).reshape(-1, 3),
                            offsets=np.cumsum([0] + [len(v) for v in new.values()]), hashes=np.array(list(new)))
        publish_numbered(tmp, cache_dir, "loops-", ".npz")
        new.clear()

    for i, (h, rec) in enumerate(sorted(recs.items(), key=lambda kv: kv[1].task or "")):  # one task's programs together
        f = todo[h][0]
        workload = None if rec.program else _workload_of(rec, task_table, mods)
        try:
            if workload is None and not rec.program:
                raise ProgramError(f"task {rec.task} is not in the task table")
            prog = load_program(_scheduled(rec, workload), target_kind_of_id(rec.device))
            ast = compact_ast_of(prog, expected_leaves=f.n_leaves)
            if list(ast.leaf_positions) != [int(x) for x in f.positions]:
                raise ProgramError("its compact AST's leaf positions differ from the cached features'")
        except ProgramError as e:
            failed += 1
            print(f"attach_loops: {rec.id}: {str(e).splitlines()[-1][:200]}", file=sys.stderr)
            continue
        out[h] = new[h] = ast.loop_tokens()
        now = time.time()
        if progress and (now - last_print > 10 or i + 1 == len(recs)):
            rate = (i + 1) / (now - start)
            print(f"attach_loops: {i + 1:,}/{len(recs):,} programs, {rate:.0f}/s, "
                  f"ETA {(len(recs) - i - 1) / rate:.0f} s", file=sys.stderr, flush=True)
            last_print = now
        if now - last_flush > 60:
            flush()
            last_flush = now
    flush()
    if len(recs) < len(todo) or failed:
        print(f"attach_loops: {len(todo) - len(recs)} programs without a record, {failed} that did not rebuild",
              file=sys.stderr)
    return out


def summarize(dataset_dir: str) -> dict:
    """Per device, straight from the records (no featurization; ``cdmpp data``): labelled programs, of them
    search candidates (``collect --from-search``) and twins (the same program labelled on another device
    too), records without a label (failed, or measured while others were busy: kept, not labels), tasks,
    and labelled programs per network."""
    from collections import Counter, defaultdict

    report = LoadReport()
    labelled: dict[str, set] = defaultdict(set)
    programs, searched, failed, disturbed = Counter(), Counter(), Counter(), Counter()
    tasks: dict[str, set] = defaultdict(set)
    per_network: dict[str, Counter] = defaultdict(Counter)
    for rec in RecordStore(dataset_dir).iter_records(report=report, traces=False):
        dev = rec.get("device") or "?"
        if label(rec) is None:
            (failed if rec.get("error") or not rec.get("seconds") else disturbed)[dev] += 1
            continue
        programs[dev] += 1
        labelled[dev].add(rec["program_hash"])
        searched[dev] += bool(rec.get("search"))
        tasks[dev].add(rec["task"])
        for net in {o.split("@")[0] for o in rec.get("networks") or []}:
            per_network[dev][net] += 1
    devices_of = Counter(h for hashes in labelled.values() for h in hashes)
    return {
        "devices": {d: {"programs": programs[d], "search_candidates": searched[d],
                        "twins": sum(devices_of[h] > 1 for h in labelled[d]), "failed": failed[d],
                        "disturbed": disturbed[d], "tasks": len(tasks[d]),
                        "networks": dict(sorted(per_network[d].items()))}
                    for d in sorted(set(labelled) | set(failed) | set(disturbed))},
        "records": report.records, "problems": report.problems, "duplicates": report.duplicates,
    }


def per_device_counts(ds: "Dataset") -> dict:
    """Per device: programs, distinct tasks, and programs per network (a report's data summary)."""
    out: dict = {}
    for p in ds.programs:
        d = out.setdefault(p.device, {"programs": 0, "tasks": set(), "networks": {}})
        d["programs"] += 1
        d["tasks"].add(p.task)
        for net in {o.split("@")[0] for o in p.networks}:
            d["networks"][net] = d["networks"].get(net, 0) + 1
    return {k: {**v, "tasks": len(v["tasks"]), "networks": dict(sorted(v["networks"].items()))} for k, v in out.items()}

