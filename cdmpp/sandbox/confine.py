"""OS-level confinement of a sandbox worker: Landlock, applied by the worker to itself before it reads input.

Why: TVM's C++ globals (``runtime.SaveParamsToFile``, ...) open files without passing through Python's
audit hooks, and ``RLIMIT_FSIZE`` 0 stops a file from growing, not from being created, truncated or
unlinked. Landlock (Linux >= 5.13) is an unprivileged LSM: a process can take away from itself, for good,
the right to create, write, truncate, remove, rename or link files anywhere, to execute programs, to bind or
connect TCP sockets (ABI >= 4), and to signal or reach by abstract unix socket processes outside its
domain (ABI >= 6). It also stops ptrace-style access (``/proc/<pid>/mem``, ``environ``) to processes
outside the domain. Reading stays allowed (the worker reads nothing secret: the zygote never held secrets).
Where Landlock is missing (old kernel, disabled LSM, seccomp-filtered syscall) the worker keeps its other
layers and says so (``landlock`` → ``None`` with the reason)."""

from __future__ import annotations

import ctypes
import platform

_SYSCALLS = {"x86_64": (444, 445, 446), "aarch64": (444, 445, 446)}  # create_ruleset, add_rule, restrict_self
_VERSION = 1  # LANDLOCK_CREATE_RULESET_VERSION
_PR_SET_NO_NEW_PRIVS = 38

# LANDLOCK_ACCESS_FS_* by the ABI that introduced them; READ_FILE (1<<2) and READ_DIR (1<<3) stay unhandled
_FS = {1: (1 << 0) | (1 << 1) | sum(1 << b for b in range(4, 13)),  # EXECUTE, WRITE_FILE, REMOVE_*, MAKE_*
       2: 1 << 13,  # REFER (reparenting by rename / link)
       3: 1 << 14,  # TRUNCATE
       5: 1 << 15}  # IOCTL_DEV
_NET = 0b11  # ABI 4: BIND_TCP, CONNECT_TCP
_SCOPE = 0b11  # ABI 6: ABSTRACT_UNIX_SOCKET, SIGNAL


class _Attr(ctypes.Structure):
    _fields_ = [("fs", ctypes.c_uint64), ("net", ctypes.c_uint64), ("scoped", ctypes.c_uint64)]


def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


def landlock_abi() -> tuple[int, str]:
    """(ABI version, "") where Landlock is usable, else (0, why not)."""
    nums = _SYSCALLS.get(platform.machine())
    if nums is None:
        return 0, f"no Landlock syscall numbers for {platform.machine()}"
    libc = _libc()
    abi = libc.syscall(nums[0], None, ctypes.c_size_t(0), ctypes.c_uint32(_VERSION))
    if abi < 0:
        import os

        return 0, f"Landlock unavailable ({os.strerror(ctypes.get_errno())})"
    return int(abi), ""


def landlock() -> tuple[int | None, str]:
    """Take away from this process (and its future children) every file-changing right, execution, TCP and
    signals / abstract sockets outside it. Call while single-threaded (Landlock binds the calling thread
    and what it starts later). Returns (ABI, what is denied) or (None, why not)."""
    import os

    abi, why = landlock_abi()
    if not abi:
        return None, why
    nums = _SYSCALLS[platform.machine()]
    libc = _libc()
    attr = _Attr(sum(v for k, v in _FS.items() if abi >= k), _NET if abi >= 4 else 0, _SCOPE if abi >= 6 else 0)
    size = 8 if abi < 4 else 16 if abi < 6 else 24
    fd = libc.syscall(nums[0], ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if fd < 0:
        return None, f"landlock_create_ruleset failed ({os.strerror(ctypes.get_errno())})"
    try:
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            return None, f"PR_SET_NO_NEW_PRIVS failed ({os.strerror(ctypes.get_errno())})"
        if libc.syscall(nums[2], ctypes.c_int(fd), ctypes.c_uint32(0)) != 0:
            return None, f"landlock_restrict_self failed ({os.strerror(ctypes.get_errno())})"
    finally:
        os.close(fd)
    denied = ["file creation, writing, removal, renaming, linking", "exec"]
    denied += ["truncation"] if abi >= 3 else []
    denied += ["TCP bind/connect"] if abi >= 4 else []
    denied += ["signals and abstract unix sockets outside the sandbox"] if abi >= 6 else []
    return abi, ", ".join(denied)
