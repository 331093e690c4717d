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


# ---- seccomp: a second, independent layer (x86_64), also where Landlock is missing -------------------------
_AUDIT_ARCH_X86_64 = 0xC000003E
_ALLOW, _EPERM = 0x7FFF0000, 0x00050000 | 1  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | EPERM
_OPEN_WRITE = 0o1 | 0o2 | 0o100 | 0o1000 | 0o2000 | 0o20000000  # O_WRONLY O_RDWR O_CREAT O_TRUNC O_APPEND O_TMPFILE
_DENY_X86_64 = {  # changing files, running programs, reaching other processes or the network, new privileges
    "creat": 85, "truncate": 76, "rename": 82, "renameat": 264, "renameat2": 316, "mkdir": 83, "mkdirat": 258,
    "rmdir": 84, "link": 86, "linkat": 265, "unlink": 87, "unlinkat": 263, "symlink": 88, "symlinkat": 266,
    "mknod": 133, "mknodat": 259, "chmod": 90, "fchmod": 91, "fchmodat": 268, "chown": 92, "fchown": 93,
    "lchown": 94, "fchownat": 260, "utime": 132, "utimes": 235, "utimensat": 280, "futimesat": 261,
    "setxattr": 188, "lsetxattr": 189, "fsetxattr": 190, "removexattr": 197, "lremovexattr": 198,
    "fremovexattr": 199, "openat2": 437, "open_by_handle_at": 304, "name_to_handle_at": 303,
    "execve": 59, "execveat": 322, "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311,
    "socket": 41, "socketpair": 53, "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
    "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161, "unshare": 272, "setns": 308,
    "bpf": 321, "userfaultfd": 323, "perf_event_open": 298, "keyctl": 250, "add_key": 248, "request_key": 249,
    "tkill": 200, "fanotify_init": 300, "quotactl": 179, "swapon": 167, "swapoff": 168, "reboot": 169,
}
_OPEN, _OPENAT, _KILL, _TGKILL = 2, 257, 62, 234
_FORK, _VFORK, _CLONE, _CLONE3, _CLONE_THREAD, _ENOSYS = 57, 58, 56, 435, 0x10000, 0x00050000 | 38


class _Filter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _Prog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(_Filter))]


def _bpf(pid: int) -> list[tuple[int, int, int, int]]:
    """The filter: 32-bit (int 0x80) and x32 syscalls refused, the calls of ``_DENY_X86_64`` refused,
    ``open``/``openat`` refused with any writing flag, ``kill``/``tgkill`` only for ``pid`` itself, new
    threads but no new processes (``fork``, ``vfork``, ``clone`` without CLONE_THREAD)."""
    LD, JEQ, JGE, JSET, RET = 0x20, 0x15, 0x35, 0x45, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, ..., BPF_RET|K
    prog: list = []  # (code, jt, jf, k) with jt/jf as labels until resolved
    arg = lambda i: 16 + 8 * i  # offsetof(struct seccomp_data, args[i]), low 32 bits (little endian)
    prog += [(LD, 0, 0, 4), (JEQ, "nr", "deny", _AUDIT_ARCH_X86_64)]
    prog += [("nr", LD, 0, 0, 0), (JGE, "deny", 0, 0x40000000)]
    prog += [(JEQ, "open", 0, _OPEN), (JEQ, "openat", 0, _OPENAT), (JEQ, "self", 0, _KILL), (JEQ, "self", 0, _TGKILL)]
    prog += [(JEQ, "deny", 0, _FORK), (JEQ, "deny", 0, _VFORK), (JEQ, "clone", 0, _CLONE), (JEQ, "nosys", 0, _CLONE3)]
    prog += [(JEQ, "deny", 0, nr) for nr in sorted(set(_DENY_X86_64.values()))]
    prog += [(RET, 0, 0, _ALLOW)]
    prog += [("open", LD, 0, 0, arg(1)), (JSET, "deny", 0, _OPEN_WRITE), (RET, 0, 0, _ALLOW)]
    prog += [("openat", LD, 0, 0, arg(2)), (JSET, "deny", 0, _OPEN_WRITE), (RET, 0, 0, _ALLOW)]
    prog += [("self", LD, 0, 0, arg(0)), (JEQ, 0, "deny", pid & 0xFFFFFFFF), (RET, 0, 0, _ALLOW)]
    prog += [("clone", LD, 0, 0, arg(0)), (JSET, "allow", "deny", _CLONE_THREAD)]  # threads, not processes
    prog += [("nosys", RET, 0, 0, _ENOSYS)]  # clone3's flags are out of reach: glibc falls back to clone
    prog += [("allow", RET, 0, 0, _ALLOW), ("deny", RET, 0, 0, _EPERM)]
    where = {ins[0]: i for i, ins in enumerate(prog) if isinstance(ins[0], str)}
    out = []
    for i, ins in enumerate(prog):
        code, jt, jf, k = ins[1:] if isinstance(ins[0], str) else ins
        jt, jf = (where[j] - i - 1 if isinstance(j, str) else j for j in (jt, jf))
        assert 0 <= jt < 256 and 0 <= jf < 256
        out.append((code, jt, jf, k))
    return out


def seccomp() -> tuple[bool, str]:
    """Install the filter on this thread (and those it starts later); (True, what it refuses) or (False,
    why not). Refused calls fail with EPERM, so code that tries them gets an error, not a crash."""
    import os

    if platform.machine() != "x86_64":
        return False, f"no seccomp filter for {platform.machine()}"
    libc = _libc()
    ins = _bpf(os.getpid())
    arr = (_Filter * len(ins))(*[_Filter(*x) for x in ins])
    prog = _Prog(len(ins), arr)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        return False, f"PR_SET_NO_NEW_PRIVS failed ({os.strerror(ctypes.get_errno())})"
    if libc.prctl(22, 2, ctypes.byref(prog), 0, 0) != 0:  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
        return False, f"seccomp filter refused ({os.strerror(ctypes.get_errno())})"
    return True, ("opening files for writing, creating, removing, renaming, exec, new processes, sockets, ptrace, "
                  "signals to others")
