"""``FeatureCache``: every program a predictor sees becomes features here, once per key.

Parsing is the expensive part of a prediction (TVMScript ~60 ms, a workload+trace ~5 ms, against ~5 ms
to extract features and ~0.2 ms of model time), and compilers re-ask the same programs. So features
are kept in one LRU, by a key that costs no parsing:

* text and JSON items (TVMScript, workload+trace) by a digest of the item as sent, its target kind and
  the request's shared workload: equal bytes, equal program;
* TVM objects (PrimFunc, IRModule, Schedule, a MetaSchedule candidate) by target kind and structural hash;
* and, for a model that reads the built programs' instruction counts, by the build too (``build``: each program
  is built for the device's target where it is featurized, ``cdmpp.program.assembly``).

Text and JSON from callers that are not trusted are parsed and featurized in sandbox workers
(``cdmpp.sandbox.pool``), never here; TVMScript items go to workers of their own (a worker that ran
request code may have rewritten itself), and their features are never cached: they stay with the call
that sent them. TVM objects were built in this process and are featurized here.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import threading
import time
from dataclasses import dataclass
from typing import Any, Sequence

from cdmpp.lru import LRU


@dataclass
class FeatureStats:
    """Counters of featurization (monotone; read without a lock, so values may be a moment stale)."""

    cache_hits: int = 0
    cache_misses: int = 0
    programs_featurized: int = 0
    parse_seconds: float = 0.0
    featurize_seconds: float = 0.0


def _digest(*parts: bytes) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    for p in parts:
        h.update(len(p).to_bytes(8, "little"))
        h.update(p)
    return h.digest()


def _json_bytes(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def workload_digest(workload: Any) -> bytes:
    """The digest of a request's shared workload (b"" without one), for ``item_key``."""
    return _digest(_json_bytes(workload)) if workload is not None else b""


def item_key(kind: str, item: Any, shared_workload: bytes = b"") -> bytes:
    """Key of a text or JSON item as sent (``shared_workload``: ``workload_digest`` of the request's)."""
    if isinstance(item, str):
        return _digest(kind.encode(), b"s", item.encode())
    if isinstance(item, dict):
        if "workload" in item or not shared_workload:
            return _digest(kind.encode(), b"d", _json_bytes(item))
        return _digest(kind.encode(), b"w", shared_workload, _json_bytes(item))
    return _digest(kind.encode(), b"?", repr(item).encode())


def _hash_key(kind: str, structural_hash: str) -> bytes:
    return _digest(kind.encode(), b"h", structural_hash.encode())


def _program_error(errors: list[tuple[int, str]]):
    from cdmpp.program.inputs import ProgramError

    err = ProgramError("; ".join(f"program {i}: {r}" for i, r in errors[:5]))
    err.errors = [{"index": i, "reason": r} for i, r in errors]
    return err


class FeatureCache:
    """Features of programs in any accepted form, cached (LRU, ``size`` entries). Thread-safe."""

    def __init__(self, size: int = 100_000):
        self.size = size
        self._cache = LRU(size)  # key -> ProgramFeatures
        self._lock = threading.Lock()
        self._featurizer = None

    def __len__(self) -> int:
        return len(self._cache)

    def clear(self) -> None:
        with self._lock:
            self._cache = LRU(self.size)

    def featurizer(self):
        """The in-process ``cdmpp.program.features.Featurizer`` (made on first use)."""
        with self._lock:
            if self._featurizer is None:
                from cdmpp.program.features import Featurizer

                self._featurizer = Featurizer()
            return self._featurizer

    def featurize(self, programs: Sequence, target: Any = "llvm", trusted: bool = False, workload: Any = None,
                  tvmscript: bool = True, sandbox=None, deadline: float | None = None, cancel=None,
                  stats: FeatureStats | None = None, keys: Sequence[bytes] | None = None,
                  build: dict | None = None) -> list:
        """``ProgramFeatures`` per program for ``target``: a kind ("llvm"/"cuda") or a TVM target.

        Text and dict items are parsed in ``sandbox`` (default: this process's ``default_sandbox``)
        unless ``trusted``; ``workload``: the unscheduled module shared by workload-less trace items;
        ``tvmscript=False`` refuses TVMScript items before any worker sees them; ``keys``: the items'
        ``item_key``s when the caller has them already; ``build``: a CPU device's target (dict) each program is
        also built for, its instruction counts in its features (``asm``, None where the build failed). Bad items
        raise ``ProgramError`` with ``errors`` = ``[{"index", "reason"}]``; ``Cancelled`` when ``cancel`` is set
        or the monotonic ``deadline`` passes.
        """
        from cdmpp.program.inputs import TARGET_KINDS, Program, ProgramError
        from cdmpp.sandbox.wire import TVMSCRIPT_OFF, is_tvmscript

        kind = target.strip() if isinstance(target, str) else str(target.kind.name)
        if kind not in TARGET_KINDS:
            raise ProgramError(f"unknown target {target!r}: expected one of {', '.join(TARGET_KINDS)}")
        where = kind if isinstance(target, str) else str(target)  # what the cache keys name
        if not tvmscript and not trusted:  # refused here, before any worker (or the cache) sees it
            refused = [(i, TVMSCRIPT_OFF) for i, p in enumerate(programs) if isinstance(p, str) and is_tvmscript(p)]
            if refused:
                raise _program_error(refused)
        shared = workload_digest(workload) if keys is None else b""
        local = [i for i, p in enumerate(programs)
                 if isinstance(p, Program) or not isinstance(p, (str, dict))]  # TVM objects: hashed here
        loaded = self._load(programs, local, kind if isinstance(target, str) else target)
        keyed: list = list(keys) if keys is not None else [None] * len(programs)
        for i, p in enumerate(programs):
            if i in loaded:
                keyed[i] = _hash_key(where, loaded[i][1])
            elif keyed[i] is None:
                keyed[i] = item_key(where, p, shared)
        if build is not None:  # a program's counts are its build's: one entry per build key
            from cdmpp.program.assembly import build_key

            built_by = build_key(build).encode()
            keyed = [_digest(k, b"asm", built_by) for k in keyed]
        with self._lock:
            out: list = [self._cache.get(k) for k in keyed]
            todo = [i for i, f in enumerate(out) if f is None]
            if stats is not None:
                stats.cache_hits += len(programs) - len(todo)
                stats.cache_misses += len(todo)
        if not todo:
            return out
        if cancel is not None and cancel.is_set():
            from cdmpp.sandbox.wire import Cancelled

            raise Cancelled("request timed out")
        here = [i for i in todo if i in loaded or trusted]
        there = [i for i in todo if i not in loaded and not trusted]
        code = {i for i in there if is_tvmscript(programs[i])}
        parse_s = feat_s = 0.0
        if here:
            t0 = time.perf_counter()
            feats = self._here(programs, here, loaded, kind if isinstance(target, str) else target, build)
            feat_s += time.perf_counter() - t0
            for i, f in zip(here, feats):
                out[i] = f
        if there:
            if sandbox is None:
                from cdmpp.sandbox.pool import default_sandbox

                sandbox = default_sandbox(kind)
            feats, p_s, f_s = self._there(sandbox, [programs[i] for i in there], there, code, kind, workload,
                                          deadline, cancel, build)
            parse_s, feat_s = parse_s + p_s, feat_s + f_s
            for i, f in zip(there, feats):
                out[i] = f
        with self._lock:
            for i in todo:
                if i not in code:  # features of a worker that ran TVMScript stay with this call
                    self._cache.put(keyed[i], out[i])
            if stats is not None:
                stats.parse_seconds += parse_s
                stats.featurize_seconds += feat_s
                stats.programs_featurized += len(todo)
        return out

    def candidates(self, context, candidates) -> list:
        """Features of MetaSchedule ``MeasureCandidate``s (None for one that fails), keyed by their
        schedules' structural hash: extracted on ``context``'s threads from the candidates' own schedules,
        as MetaSchedule's cost models do. Safe from several threads at once."""
        from cdmpp.program.features import program_hash

        where = str(context.target)
        hashes = [program_hash(c.sch.mod) for c in candidates]
        keys = [_hash_key(where, h) for h in hashes]
        with self._lock:
            feats = [self._cache.get(k) for k in keys]
        todo = [i for i, f in enumerate(feats) if f is None]
        new = self._extract(context, [candidates[i] for i in todo])
        with self._lock:
            for i, f in zip(todo, new):
                if f is not None:
                    f.program_hash = hashes[i]
                    self._cache.put(keys[i], f)
                feats[i] = f
        return feats

    # ---- the work ------------------------------------------------------------------------------------
    @staticmethod
    def _load(programs: Sequence, idx: list[int], target) -> dict[int, tuple[Any, str]]:
        """{index: (Program, structural hash)} of the TVM objects among ``programs``."""
        if not idx:
            return {}
        from cdmpp.program.features import program_hash
        from cdmpp.program.inputs import Program, load_program

        out = {}
        for i in idx:
            p = programs[i] if isinstance(programs[i], Program) else load_program(programs[i], target)
            out[i] = (p, program_hash(p.mod))
        return out

    def _here(self, programs: Sequence, idx: list[int], loaded: dict, target, build: dict | None = None) -> list:
        """Featurize (and with ``build``, build) in this process: TVM objects and text a trusted caller sent."""
        from cdmpp.program.inputs import load_program

        progs = [loaded[i][0] if i in loaded else load_program(programs[i], target) for i in idx]
        feats = self.featurizer()(progs)
        if build is None:
            return feats
        from cdmpp.program.assembly import with_counts
        from cdmpp.program.inputs import parse_target

        built_for = parse_target(build)
        return [with_counts(f, p.mod, built_for) for f, p in zip(feats, progs)]

    @staticmethod
    def _there(sandbox, items: list, where: list[int], code: set[int], kind: str, workload, deadline, cancel,
               build: dict | None = None):
        """``Sandbox.run`` on the items at request positions ``where``, TVMScript items (positions in
        ``code``) in workers of their own, which the sandbox retires after their job. Counts a worker sends
        unasked are dropped."""
        rest = [j for j, w in enumerate(where) if w not in code]
        script = [j for j, w in enumerate(where) if w in code]
        feats: list = [None] * len(items)
        errors: list = []
        parse_s = feat_s = 0.0
        for js, tvmscript in ((rest, False), (script, True)):
            if not js:
                continue
            f, e, p, t = sandbox.run([items[j] for j in js], [where[j] for j in js], kind, workload, tvmscript,
                                     deadline, cancel, build=build)
            if build is None:
                f = [x if getattr(x, "asm", None) is None else dataclasses.replace(x, asm=None) for x in f]
            errors += e
            parse_s, feat_s = parse_s + p, feat_s + t
            for j, x in zip(js, f):
                feats[j] = x
        if errors:
            raise _program_error(sorted(errors))
        return feats, parse_s, feat_s

    def _extract(self, context, candidates) -> list:
        """TVM's features of each candidate, on ``context``'s threads; None for one that fails."""
        if not candidates:
            return []
        featurizer = self.featurizer()
        try:
            return featurizer.from_candidates(context, candidates, with_hash=False)
        except Exception:
            out = []
            for c in candidates:
                try:
                    out.append(featurizer.from_candidates(context, [c], with_hash=False)[0])
                except Exception:
                    out.append(None)
            return out
