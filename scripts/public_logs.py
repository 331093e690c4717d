"""Gather one device's AutoTVM or Ansor log lines from a public repository into one log for
``cdmpp import autotvm|ansor``: duplicates (same input and schedule, e.g. grid and random search meeting)
dropped, optionally at most N evenly spaced records per task (a full DropletSearch device is ~100,000
distinct records: 50 minutes of import on 2 cores).

    python scripts/public_logs.py autotvm DropletSearch/results/x86_AMD3700X --per-task 40 -o amd3700x.log

Files are every ``*.log`` / ``*.json`` under the folders given; a git snapshot without a work tree can be
read with ``--git-dir DIR`` (paths are then inside its HEAD, or ``--rev REV``: another branch or commit). Lines that are not JSON are kept out.
"""

import argparse
import json
import subprocess
import sys


def files(roots, git_dir=None, rev="HEAD"):
    if git_dir:
        names = subprocess.run(["git", "--git-dir", git_dir, "ls-tree", "-r", "--name-only", rev, *roots],
                               check=True, capture_output=True, text=True).stdout.splitlines()
        for n in sorted(names):
            if n.endswith((".log", ".json")):
                r = subprocess.run(["git", "--git-dir", git_dir, "show", f"{rev}:{n}"], capture_output=True)
                if r.returncode == 0:  # a snapshot may lack its largest files
                    yield n, r.stdout.decode("utf-8", "replace")
        return
    import pathlib

    for root in roots:
        for p in sorted(pathlib.Path(root).rglob("*")):
            if p.suffix in (".log", ".json") and p.is_file():
                yield str(p), p.read_text(errors="replace")


def identity(fmt, d):
    """(task, schedule) of a record, or None if it is not one of ``fmt``."""
    try:
        if fmt == "autotvm":
            return json.dumps(d["input"][1:3]), json.dumps([d["input"], d["config"]["entity"]])
        return json.dumps(d["i"][0][0]), json.dumps(d["i"])
    except (KeyError, IndexError, TypeError):
        return None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("format", choices=("autotvm", "ansor"))
    ap.add_argument("roots", nargs="+", help="folders (or paths inside --git-dir's HEAD)")
    ap.add_argument("--git-dir")
    ap.add_argument("--rev", default="HEAD", help="branch or commit of --git-dir to read (default HEAD)")
    ap.add_argument("--per-task", type=int, default=0, help="at most N records per task, evenly spaced (0: all)")
    ap.add_argument("-o", "--out", required=True)
    args = ap.parse_args(argv)
    seen, tasks, nfiles = set(), {}, 0
    for _, text in files(args.roots, args.git_dir, args.rev):
        nfiles += 1
        for line in text.splitlines():
            try:
                d = json.loads(line)
            except ValueError:
                continue
            ident = identity(args.format, d) if isinstance(d, dict) else None
            if ident is None or ident[1] in seen:
                continue
            seen.add(ident[1])
            tasks.setdefault(ident[0], []).append(line.strip())
    n = 0
    with open(args.out, "w") as f:
        for lines in tasks.values():
            if args.per_task and len(lines) > args.per_task:
                step = len(lines) / args.per_task
                lines = [lines[int(i * step)] for i in range(args.per_task)]
            f.write("".join(x + "\n" for x in lines))
            n += len(lines)
    print(json.dumps({"files": nfiles, "distinct": len(seen), "tasks": len(tasks), "written": n, "out": args.out}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
