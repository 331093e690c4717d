"""Sandbox workers as the OS sees them (issue 53, items 6-9): what they inherit (descriptors, environment),
what they can touch (no file created, truncated or removed, even through TVM's C++ globals) and who
decides when they retire (the parent)."""

import json
import os
import signal
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from tests.attacks import IMP, SAMPLE, tvmscript_with

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs /proc")

SECRET = "isolation-secret-" + uuid.uuid4().hex
# what a worker of the old code could do: patch its own module so it neither retires nor tells the truth
PATCH = ("import sys; M = sys.modules['cdmpp.sandbox.worker']; M.is_tvmscript = lambda x: False; "
         "e = M.encode_features; M.encode_features = lambda f: dict(e(f), flops=float('nan'))")


@pytest.fixture(scope="module")
def sandbox():
    """One worker, started while the server's token is in the environment (as under ``cdmpp serve``)."""
    from cdmpp.sandbox.pool import Sandbox

    saved = {k: os.environ.get(k) for k in ("CDMPP_TOKEN", "MY_TOKEN")}
    os.environ.update(CDMPP_TOKEN=SECRET, MY_TOKEN=SECRET)  # MY_TOKEN: what --token-env names
    try:
        sb = Sandbox(1)
        assert sb.wait_ready(180), sb.start_errors
    finally:
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    yield sb
    sb.close()


@pytest.fixture(scope="module")
def good_item():
    """The shipped sample as workload + empty trace (built here, trusted)."""
    from cdmpp.program import tvm_env
    from cdmpp.program.inputs import load_program, parse_target

    tvm_env.setup(1)
    from tvm.s_tir.meta_schedule.database import Workload

    mod = load_program(SAMPLE, parse_target("llvm")).mod
    return json.dumps({"workload": Workload(mod).as_json(), "trace": [[], []]})


def _worker_pid(sb) -> int:
    assert sb.wait_ready(60)
    deadline = time.monotonic() + 30
    while not sb._idle.qsize():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    return sb._idle.queue[0].proc.pid


def _ppid(pid: int) -> int:
    return int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])


def test_workers_inherit_no_descriptor_but_their_two_pipes(sandbox):
    """multiprocessing's forkserver gave each worker the write end of the resource tracker's pipe (a
    worker registered /dev/shm/<name> and the server unlinked it at exit) and its own descriptors."""
    pid = _worker_pid(sandbox)
    fds = {int(fd): os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
    others = {fd: what for fd, what in fds.items() if what != "/dev/null"}
    assert len(others) == 2 and all(w.startswith("pipe:") for w in others.values()), fds
    assert all(fds.get(fd) == "/dev/null" for fd in (0, 1, 2)), fds


def test_workers_load_no_pytorch(sandbox):
    """Featurizing needs TVM only; tvm_ffi would import torch (twice the start-up time and memory, more code
    mapped in a process that reads hostile input): the zygote keeps it out, so no worker maps libtorch."""
    pid = _worker_pid(sandbox)
    for p in (_ppid(pid), pid):
        assert "libtorch" not in Path(f"/proc/{p}/maps").read_text(), p


def _readable_memory(pid: int, cap: int = 256 << 20):
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", buffering=0) as mem:
        for line in maps:
            addr, perms = line.split()[:2]
            lo, hi = (int(x, 16) for x in addr.split("-"))
            if perms[0] != "r" or hi - lo > cap or line.rstrip().endswith("[vvar]"):
                continue
            try:
                mem.seek(lo)
                yield mem.read(hi - lo)
            except OSError:
                continue


@pytest.mark.skipif(os.geteuid() != 0, reason="reads another process's memory (root)")
def test_the_process_workers_are_forked_from_never_held_the_token(sandbox):
    """The forkserver started with the server's environment, so the token was in every worker's memory.
    The zygote is exec'd with an allow-listed environment: neither its environment nor any byte of its
    memory (nor a worker's environment) holds the token."""
    pid = _worker_pid(sandbox)
    zygote = _ppid(pid)
    for p in (zygote, pid):
        assert SECRET.encode() not in Path(f"/proc/{p}/environ").read_bytes()
    needle = SECRET.encode()
    assert not any(needle in chunk for chunk in _readable_memory(zygote))


def _run_code(sb, expr: str):
    feats, errors, _, _ = sb.run([tvmscript_with(expr)], [0], "llvm", tvmscript=True)
    return errors


@pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="no /dev/shm")
def test_no_file_is_created_or_truncated_even_through_tvm_cpp_globals(sandbox):
    """TVM's C++ globals bypass Python's audit hook: ``runtime.SaveParamsToFile`` created a file as the
    worker's user (RLIMIT_FSIZE 0 stops growth, not creation or truncation)."""
    open_dir = Path(tempfile.mkdtemp(prefix="cdmpp-isolation-"))
    open_dir.chmod(0o777)  # writable for the worker's user, whoever it is: only confinement stops it
    victim = open_dir / "victim"
    victim.write_text("precious")
    victim.chmod(0o666)
    tag = uuid.uuid4().hex[:10]
    targets = [Path(tempfile.gettempdir()) / f"cdmpp-cpp-{tag}", Path("/dev/shm") / f"cdmpp-cpp-{tag}",
               open_dir / "new", victim]
    try:
        for t in targets:
            errors = _run_code(sandbox, f'{IMP}("tvm_ffi").get_global_func("runtime.SaveParamsToFile")({{}}, "{t}")')
            assert errors and errors[0][0] == 0  # the item fails: the file could not be opened
        assert not [t for t in targets[:3] if t.exists()], "a worker created a file"
        assert victim.read_text() == "precious", "a worker truncated a file"
    finally:
        for t in targets:
            t.unlink(missing_ok=True)
        open_dir.rmdir()


def test_the_parent_retires_a_worker_that_ran_tvmscript_and_checks_its_answers(sandbox, good_item):
    """TVMScript that patches its worker (no retirement, NaN answers) must not reach the next caller:
    the parent retires the worker whatever it says, and a non-finite answer is the item's error."""
    before = _worker_pid(sandbox)
    errors = _run_code(sandbox, f'{IMP}("builtins").exec("{PATCH}") or 1')
    assert errors and errors[0][0] == 0 and "finite" in errors[0][1], errors  # its own answer is patched
    after = _worker_pid(sandbox)
    assert after != before
    feats, errors, _, _ = sandbox.run([good_item], [0], "llvm")
    assert not errors and len(feats) == 1
    import numpy as np

    assert np.isfinite(feats[0].flops) and np.isfinite(feats[0].leaf_features).all()


def test_landlock_denies_every_file_change_where_the_kernel_has_it(tmp_path):
    """The confinement layer on its own, in a forked child: create, truncate, unlink, rename, mkdir and
    exec all fail; reading still works."""
    from cdmpp.sandbox.confine import landlock_abi

    abi, why = landlock_abi()
    if not abi:
        pytest.skip(why)
    victim = tmp_path / "victim"
    victim.write_text("precious")
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child reports which attempts succeeded
        os.close(r)
        try:
            from cdmpp.sandbox.confine import landlock

            done = [landlock()[0] is not None]
            attempts = [lambda: open(tmp_path / "new", "w"), lambda: os.truncate(victim, 0),
                        lambda: open(victim, "r+"), lambda: os.unlink(victim),
                        lambda: os.rename(victim, tmp_path / "moved"), lambda: os.mkdir(tmp_path / "d"),
                        lambda: os.execv("/bin/true", ["true"])]
            for a in attempts:
                try:
                    a()
                    done.append(True)
                except OSError:
                    done.append(False)
            done.append(victim.read_text() == "precious")
            os.write(w, json.dumps(done).encode())
        finally:
            os._exit(0)
    os.close(w)
    out = json.loads(os.read(r, 4096))
    os.waitpid(pid, 0)
    assert out[0], "landlock() did not apply"
    assert not any(out[1:-1]), f"allowed under Landlock: {out}"
    assert out[-1] and victim.read_text() == "precious" and sorted(os.listdir(tmp_path)) == ["victim"]


def test_worker_answers_are_validated_as_untrusted_input():
    """Types, shapes, indices and finite numbers: a bad answer is an error, never features."""
    import numpy as np

    from cdmpp.program.features import N_FEATURES, ProgramFeatures
    from cdmpp.sandbox.pool import _validate
    from cdmpp.sandbox.wire import NONFINITE, encode_features

    good = encode_features(ProgramFeatures(np.ones((1, N_FEATURES), np.float32), np.zeros(1, np.int64), 10.0, "h"))
    assert len(_validate({"feats": [good], "errors": []}, [3])[0]) == 1
    for bad_value in (dict(good, flops=float("nan")),
                      dict(good, rows=encode_features(ProgramFeatures(
                          np.full((1, N_FEATURES), np.inf, np.float32), np.zeros(1, np.int64), 1.0, "h"))["rows"])):
        assert _validate({"feats": [bad_value], "errors": []}, [3]) == ([], [(3, NONFINITE)])
    for nonsense in ({"feats": [good, good], "errors": []}, {"feats": [dict(good, n=2)], "errors": []},
                     {"feats": [dict(good, hash=None)], "errors": []}, {"feats": [], "errors": [[7, "x"]]},
                     {"feats": "x", "errors": []}):
        with pytest.raises((ValueError, KeyError, TypeError)):
            _validate(nonsense, [3])


def test_seccomp_filter_denies_file_changes_sockets_and_exec_on_its_own(tmp_path):
    """The second layer without Landlock (as on a kernel that lacks it): the same attempts fail with
    EPERM, as do sockets, new processes and signals to other processes; reading, threads and signals to
    itself work."""
    import platform
    import socket

    if platform.machine() != "x86_64":
        pytest.skip("the filter is written for x86_64")
    victim = tmp_path / "victim"
    victim.write_text("precious")
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            from cdmpp.sandbox.confine import seccomp

            done = [seccomp()[0]]
            attempts = [lambda: open(tmp_path / "new", "w"), lambda: os.truncate(victim, 0),
                        lambda: open(victim, "a"), lambda: os.unlink(victim), lambda: os.mkdir(tmp_path / "d"),
                        lambda: os.rename(victim, tmp_path / "moved"), lambda: socket.socket(),
                        lambda: os.kill(os.getppid(), 0), lambda: os.execv("/bin/true", ["true"]),
                        lambda: os.fork() or os._exit(0)]  # a child that got through exits at once
            for a in attempts:
                try:
                    a()
                    done.append(True)
                except OSError:
                    done.append(False)
            os.kill(os.getpid(), 0)
            import threading

            t = threading.Thread(target=lambda: None)
            t.start()
            t.join()
            done.append(victim.read_text() == "precious" and bool(os.listdir(tmp_path)))
            os.write(w, json.dumps(done).encode())
        finally:
            os._exit(0)
    os.close(w)
    out = json.loads(os.read(r, 4096) or b"[]")
    os.waitpid(pid, 0)
    assert out and out[0], "seccomp() did not apply"
    assert not any(out[1:-1]), f"allowed under the seccomp filter: {out}"
    assert out[-1] and victim.read_text() == "precious" and sorted(os.listdir(tmp_path)) == ["victim"]
