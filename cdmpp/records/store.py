"""Append-only, crash-safe storage of measurement records (JSON lines).

A dataset is a folder. Records are appended to ``<device-slug>.active.jsonl`` one line per record,
flushed and fsync'ed per batch, so a killed collection loses at most the batch in flight. When the
active file holds ``seal_every`` records it is *sealed*: compressed to ``<device-slug>.part-NNNN.jsonl.gz``
(written to a temporary name, fsync'ed, renamed) and only then removed. Readers deduplicate by record
id, so a crash between rename and removal never doubles a record. A truncated last line (a kill in
the middle of a write) is moved aside to ``*.partial`` on the next open, never silently dropped; any
other line that does not parse is reported with its file and line number, and the rest still loads.
``runs.jsonl`` holds one provenance entry per collection run; records refer to it by ``run`` id.
A later measurement of a stored program (``cdmpp remeasure``) is a record of its own, with id
``<record id>|pass<N>`` and ``of`` = the record's id; readers attach it to that record as
``remeasures`` instead of yielding it as a program.
A record measured while other processes were busy (``disturbed``) is kept but counts as not done: a
resumed collection measures the program again and the new record supersedes it when read.
A line is a ``cdmpp.records.record.Record`` (``records`` reads them typed; ``iter_records`` gives the stored
JSON objects as dicts, for readers that have not moved to records yet).
"""

from __future__ import annotations

import gzip
import json
import os
import re
import tempfile
import time
import zlib
from dataclasses import dataclass, field
from typing import Iterator

from cdmpp.records.record import MISSING, Record


def slug(device_id: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", device_id)


def record_id(device: str, task: str, program_hash: str) -> str:
    return f"{device}|{task}|{program_hash}"


DISTURBED_SHARE = 0.10  # older records (no ``disturbed`` field): others used more CPU than this


def is_disturbed(rec: Record | dict) -> bool:
    """Measured while other processes were busy: the collector's ``disturbed`` flag; records from before
    that flag fall back to the CPU share others used (``others_cpu``)."""
    if isinstance(rec, Record):
        if rec.disturbed is not MISSING:
            return bool(rec.disturbed)
        return (0.0 if rec.others_cpu is MISSING else rec.others_cpu) > DISTURBED_SHARE
    return bool(rec.get("disturbed", rec.get("others_cpu", 0.0) > DISTURBED_SHARE))


@dataclass
class LoadReport:
    """What reading a dataset found: records kept, duplicates skipped, and bad lines with locations."""

    records: int = 0
    duplicates: int = 0
    remeasures: int = 0  # later passes over stored programs, attached to their records
    problems: list[str] = field(default_factory=list)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def publish_numbered(tmp: str, directory: str, prefix: str, suffix: str) -> str:
    """Give the finished file ``tmp`` the name ``<prefix>NNNN<suffix>`` with NNNN one past the largest
    number any file of ``directory`` carries after ``prefix`` (quarantined ``...part-0003.jsonl.gz.bad``
    included), never replacing a file: ``os.link`` fails if the name exists, and the next one is tried.
    Why not a count of the files: after one is moved aside the count names an existing file."""
    pat = re.compile(re.escape(prefix) + r"(\d+)")
    nums = [int(m.group(1)) for n in os.listdir(directory) if (m := pat.match(n))]
    n = max(nums) + 1 if nums else 0
    os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide the data from other users of a shared dataset
    while True:
        path = os.path.join(directory, f"{prefix}{n:04d}{suffix}")
        try:
            os.link(tmp, path)
        except FileExistsError:
            n += 1
            continue
        os.remove(tmp)
        return path


def _without_trace(line: str) -> dict:
    """The record of ``line`` without its ``trace``, which is most of the text and of the decoding time
    and is needed only to rebuild the program. The cut runs from ``,"trace":`` to ``,"seconds":``; it is
    taken only when the text cut out has no ``":`` (so no object key: it is the trace's value alone) and
    the rest decodes. An unescaped quote cannot sit inside a JSON string, so neither marker can come from
    a string's content; anything unusual (other key order, keys inside the trace) decodes in full."""
    start = line.find(',"trace":')
    end = line.find(',"seconds":', start)
    if start >= 0 and end > start and line.find('":', start + 9, end) < 0:
        try:
            return json.loads(line[:start] + line[end:])
        except json.JSONDecodeError:
            pass
    rec = json.loads(line)
    rec.pop("trace", None)
    return rec


def read_records(path: str, report: LoadReport, traces: bool = True) -> Iterator[dict]:
    """The records of one part or active file, in order; unreadable lines (no UTF-8, no JSON, no ``id``)
    and a corrupt or truncated tail go to ``report.problems`` with file and line instead of ending the
    read (nor the load of other files). ``traces=False`` leaves out each record's trace (several times
    faster to read)."""
    opener = gzip.open if path.endswith(".gz") else open
    decode = json.loads if traces else _without_trace
    lineno = 0
    try:
        with opener(path, "rb") as f:  # bytes: a bad byte spoils its line, not the rest of the file
            for lineno, raw in enumerate(f, 1):
                if not raw.strip():
                    continue
                try:
                    rec = decode(raw.decode("utf-8"))
                    rec["id"]
                except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as e:
                    report.problems.append(f"{path}:{lineno}: unreadable record ({e.__class__.__name__})")
                    continue
                yield rec
    except (OSError, EOFError, zlib.error) as e:  # BadGzipFile is an OSError; zlib.error: a corrupt stream
        report.problems.append(f"{path}: corrupt or truncated after line {lineno} ({e.__class__.__name__}: {e})")


_SEAL_TMP = re.compile(r"^\.(.+)\.seal-(\d+)-.*\.tmp$")
STALE_TMP_S = 24 * 3600  # a seal temporary without a pid (older versions) is stale after a day


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


class RecordStore:
    def __init__(self, root: str, seal_every: int = 2000):
        self.root = root
        self.seal_every = seal_every
        os.makedirs(root, exist_ok=True)
        self._remove_stale_tmp()

    def _remove_stale_tmp(self) -> None:
        """Remove ``.seal-*.tmp`` files left by a seal that was killed: its pid (in the name) no longer
        runs, or the name has no pid and the file is older than ``STALE_TMP_S``. Best effort (a reader may
        not be allowed to write here)."""
        now = time.time()
        for name in os.listdir(self.root):
            if not (name.startswith(".") and ".seal-" in name and name.endswith(".tmp")):
                continue
            path = os.path.join(self.root, name)
            m = _SEAL_TMP.match(name)
            try:
                if m:
                    if _pid_alive(int(m.group(2))):
                        continue
                elif now - os.path.getmtime(path) < STALE_TMP_S:
                    continue
                os.remove(path)
            except OSError:
                pass

    # ---- writing -------------------------------------------------------------------------------
    def _active(self, device: str) -> str:
        return os.path.join(self.root, f"{slug(device)}.active.jsonl")

    def _repair_tail(self, path: str) -> None:
        """Move an unterminated last line (a write cut short by a kill) to ``path.partial``."""
        if not os.path.exists(path) or os.path.getsize(path) == 0:
            return
        with open(path, "rb+") as f:
            f.seek(-1, os.SEEK_END)
            if f.read(1) == b"\n":
                return
            data = f.seek(0) or f.read()
            cut = data.rfind(b"\n") + 1
            with open(path + ".partial", "ab") as side:
                side.write(data[cut:] + b"\n")
            f.truncate(cut)
            f.flush()
            os.fsync(f.fileno())

    def append(self, device: str, records: list[Record | dict]) -> None:
        """Append finished records durably (one write, flush, fsync). A dict is written as it is (a copy
        of a stored line, ``cdmpp.records.importers.import_store``)."""
        if not records:
            return
        path = self._active(device)
        self._repair_tail(path)
        blob = "".join(json.dumps(r.to_dict() if isinstance(r, Record) else r, separators=(",", ":")) + "\n"
                       for r in records).encode()
        with open(path, "ab") as f:
            f.write(blob)
            f.flush()
            os.fsync(f.fileno())
        if self._count_lines(path) >= self.seal_every:
            self.seal(device)

    @staticmethod
    def _count_lines(path: str) -> int:
        with open(path, "rb") as f:
            return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))

    def seal(self, device: str) -> str | None:
        """Compress the active file into the next part; safe against a crash at any point."""
        path = self._active(device)
        self._repair_tail(path)
        if not os.path.exists(path) or os.path.getsize(path) == 0:
            return None
        fd, tmp = tempfile.mkstemp(prefix=f".{slug(device)}.seal-{os.getpid()}-", suffix=".tmp", dir=self.root)
        with open(path, "rb") as src, os.fdopen(fd, "wb") as raw:
            with gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=9, mtime=0) as gz:
                gz.write(src.read())
            raw.flush()
            os.fsync(raw.fileno())
        part = publish_numbered(tmp, self.root, f"{slug(device)}.part-", ".jsonl.gz")
        _fsync_dir(self.root)
        os.remove(path)
        return part

    def add_run(self, provenance: dict) -> str:
        """Record a collection run's provenance; returns its id."""
        run_id = provenance.get("run") or time.strftime("%Y%m%dT%H%M%S") + f"-{os.getpid()}"
        entry = dict(provenance, run=run_id)
        path = os.path.join(self.root, "runs.jsonl")
        self._repair_tail(path)  # a line torn by a kill would swallow this entry
        with open(path, "a") as f:
            f.write(json.dumps(entry) + "\n")
            f.flush()
            os.fsync(f.fileno())
        return run_id

    def runs(self) -> dict[str, dict]:
        path = os.path.join(self.root, "runs.jsonl")
        out = {}
        if os.path.exists(path):
            with open(path, "rb") as f:
                for line in f:
                    if line.strip():
                        try:
                            r = json.loads(line.decode("utf-8"))
                            out[r["run"]] = r
                        except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError):
                            continue
        return out

    # ---- reading -------------------------------------------------------------------------------
    def _parts(self, device: str | None = None) -> list[str]:
        prefix = slug(device) + "." if device else ""
        return sorted(os.path.join(self.root, n) for n in os.listdir(self.root)
                      if n.startswith(prefix) and ".part-" in n and n.endswith(".jsonl.gz"))

    def files(self, device: str | None = None) -> list[str]:
        prefix = slug(device) + "." if device else ""
        active = sorted(os.path.join(self.root, n) for n in os.listdir(self.root)
                        if n.startswith(prefix) and n.endswith(".active.jsonl"))
        return self._parts(device) + active

    def iter_records(self, device: str | None = None, report: LoadReport | None = None,
                     traces: bool = True) -> Iterator[dict]:
        """Every record once (by id), parts first; bad lines are reported, not fatal. The first record of
        an id wins, unless it was disturbed and a later one of the same id was not. Re-measurements come
        attached to their record (``remeasures``, in file order), not on their own. ``traces=False``:
        records without their traces, for readers that need only labels and ids. The stored JSON objects:
        ``records`` gives the same as ``Record``s."""
        yield from self._read(device, report, traces, typed=False)

    def records(self, device: str | None = None, report: LoadReport | None = None,
                traces: bool = True) -> Iterator[Record]:
        """``iter_records`` as ``Record``s, later passes in their ``remeasures``."""
        yield from self._read(device, report, traces, typed=True)

    def _read(self, device, report, traces, typed):
        report = report if report is not None else LoadReport()
        kept: dict = {}
        for path in self.files(device):
            for rec in read_records(path, report, traces):
                if typed:
                    rec = Record.from_dict(rec)
                    rid = rec.id
                else:
                    rid = rec["id"]
                old = kept.get(rid)
                if old is None:
                    kept[rid] = rec
                    report.records += 1
                    continue
                report.duplicates += 1
                if is_disturbed(old) and not is_disturbed(rec):
                    kept[rid] = rec
        passes = [rid for rid, rec in kept.items() if (rec.of is not MISSING if typed else "of" in rec)]
        for rid in passes:
            later = kept.pop(rid)
            report.records -= 1
            report.remeasures += 1
            of = later.of if typed else later["of"]
            if of in kept:
                if typed:
                    kept[of].remeasures.append(later)
                else:
                    kept[of].setdefault("remeasures", []).append(later)
        yield from kept.values()

    def done_ids(self, device: str) -> set[str]:
        """Ids a resumed collection skips: everything stored except disturbed records."""
        return {r["id"] for r in self.iter_records(device) if not is_disturbed(r)}
