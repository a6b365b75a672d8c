"""The kernel's own boundary for a learner process: Linux Landlock (5.13 and later, no root),
and the death signal that ends it with its parent (``die_with_parent``).

The audit hook (``sandbox``) sees what Python does; native code that opens files itself
(``torch.from_file``, a library's C++ writer) raises no audit event. Landlock makes the kernel
refuse it: once ``restrict`` ran, this process and its children may only read the folders it
names (the Python installation, the system's, the repository without its secrets) and only
write in its scratch folder; of ``/dev``, it opens ``devices()`` alone. A secret folder is
carved out of a readable one by allowing that folder's other entries one by one (Landlock only
ever allows). Nothing of it can be undone by the process.

Where the kernel has no Landlock, ``restrict`` returns False and the audit hook is the
boundary alone (a grade's JSON says which).
"""

from __future__ import annotations

import ctypes
import glob
import os
import sys

_CREATE, _ADD_RULE, _RESTRICT = 444, 445, 446  # the same numbers on x86_64 and aarch64
_PATH_BENEATH = 1
_NO_NEW_PRIVS = 38

EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
_CHANGES = sum(1 << b for b in range(4, 13))  # remove, make (dir, file, fifo, symlink, ...)
REFER, TRUNCATE = 1 << 13, 1 << 14
#: ABI 6 (Linux 6.12): no signal to a process outside the domain (the grader: red team 6
#: stopped and killed it with pidfd_send_signal, which raises no audit event), no connection
#: to an abstract unix socket made outside it
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1
_FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE

#: the device files a learner process may open besides a GPU's (``devices``); no other: red team
#: 11 read a block device and wrote an existing file of /dev/shm that a later grading read back
PLAIN_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")


def devices() -> list[str]:
    """The device files here a learner process may open: ``PLAIN_DEVICES`` and the CUDA
    driver's (``/dev/nvidia*``, the ``nvidia-caps`` folder included)."""
    found = (*PLAIN_DEVICES, *sorted(glob.glob("/dev/nvidia*")))
    return [p for p in found if os.path.exists(p)]


#: system folders a learner process reads (libraries, certificates, locales, devices' info)
SYSTEM = ("/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/etc", "/opt", "/proc", "/sys",
          "/run", "/var/lib")  # fmt: skip


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def die_with_parent() -> None:
    """Linux: the kernel kills this process (SIGKILL) when the one that started it ends, so a
    grader killed from outside leaves no learner process behind (red team 5: a cell that ignored
    its alarm outlived the grader). Without ``prctl`` (another OS), nothing."""
    import signal

    parent = os.getppid()
    try:
        _libc().prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent ended before the request: end now
        os._exit(1)


#: (audit arch, setsid, setpgid) by machine: the calls ``stay_in_group`` refuses
_GROUP_CALLS = {"x86_64": (0xC000003E, 112, 109), "aarch64": (0xC00000B7, 157, 154)}


def stay_in_group() -> bool:
    """Linux seccomp: this process and what it starts can never leave its session and process
    group (setsid and setpgid fail with EPERM), so the grader's kill of the group reaches every
    one of them (red team 6: native code run through the DSL's JIT forked, called setsid and
    outlived the grading). No root needed (no_new_privs). Returns whether it is in force."""
    import platform

    calls = _GROUP_CALLS.get(platform.machine())
    if calls is None or not sys.platform.startswith("linux"):
        return False
    arch, setsid, setpgid = calls

    class Filter(ctypes.Structure):
        _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8),
                    ("k", ctypes.c_uint32)]  # fmt: skip

    class Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(Filter))]

    ld, jeq, ret = 0x20, 0x15, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, BPF_RET|K
    allow, eperm = 0x7FFF0000, 0x00050000 | 1  # SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO | EPERM
    code = [
        (ld, 0, 0, 4),  # seccomp_data.arch
        (jeq, 1, 0, arch),
        (ret, 0, 0, allow),  # another ABI (x32, compat): not this filter's to judge
        (ld, 0, 0, 0),  # seccomp_data.nr
        (jeq, 2, 0, setsid),
        (jeq, 1, 0, setpgid),
        (ret, 0, 0, allow),
        (ret, 0, 0, eperm),
    ]
    prog = (Filter * len(code))(*(Filter(*c) for c in code))
    fprog = Prog(len(code), prog)
    libc = _libc()
    if libc.prctl(_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        return False
    return libc.prctl(22, 2, ctypes.byref(fprog), 0, 0) == 0  # PR_SET_SECCOMP, MODE_FILTER


#: (audit arch, close, dup2 or None, dup3, close_range) by machine: the calls ``guard_fd`` watches
_FD_CALLS = {"x86_64": (0xC000003E, 3, 33, 292, 436), "aarch64": (0xC00000B7, 57, None, 24, 436)}


def _install(code: list) -> bool:
    """Install the seccomp filter ``code`` ((op, jt, jf, k) rows) on this process."""

    class Filter(ctypes.Structure):
        _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8),
                    ("k", ctypes.c_uint32)]  # fmt: skip

    class Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(Filter))]

    prog = (Filter * len(code))(*(Filter(*c) for c in code))
    fprog = Prog(len(code), prog)
    libc = _libc()
    if libc.prctl(_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        return False
    return libc.prctl(22, 2, ctypes.byref(fprog), 0, 0) == 0  # PR_SET_SECCOMP, MODE_FILTER


def guard_fd(fd: int) -> bool:
    """Linux seccomp: the descriptor ``fd`` can never be closed or replaced in this process
    (``close(fd)``, ``dup2``/``dup3`` onto it, a ``close_range`` over it fail with EPERM), so
    what the sandbox's hook writes to it (the judge's record) cannot be sent elsewhere. A
    descriptor closed on ``exec`` still is (no close call). Returns whether it is in force."""
    import platform

    calls = _FD_CALLS.get(platform.machine())
    if calls is None or not sys.platform.startswith("linux"):
        return False
    arch, close, dup2, dup3, close_range = calls
    ld, jeq, jge, jgt, ret = 0x20, 0x15, 0x35, 0x25, 0x06
    allow, eperm = 0x7FFF0000, 0x00050000 | 1
    arg0, arg1 = 16, 24  # seccomp_data.args[i]'s low word (little-endian machines)
    fd_rows = [(ld, 0, 0, arg0), (jeq, 0, 1, fd), (ret, 0, 0, eperm), (ret, 0, 0, allow)]
    onto = [(ld, 0, 0, arg1), (jeq, 0, 1, fd), (ret, 0, 0, eperm), (ret, 0, 0, allow)]
    # close_range(first, last): refused when first <= fd <= last
    spans = [(ld, 0, 0, arg0), (jgt, 4, 0, fd), (ld, 0, 0, arg1), (jge, 0, 2, fd),
             (ret, 0, 0, eperm), (ret, 0, 0, allow), (ret, 0, 0, allow)]  # fmt: skip
    dups = [c for c in (dup2, dup3) if c is not None]
    head = [(ld, 0, 0, 4), (jeq, 1, 0, arch), (ret, 0, 0, allow), (ld, 0, 0, 0)]
    # the dispatch on the call's number: close -> fd_rows, dup2/dup3 -> onto, close_range -> spans
    n_jumps = 1 + len(dups) + 1
    code = list(head)
    at_fd, at_onto = n_jumps + 1, n_jumps + 1 + len(fd_rows)
    at_spans = at_onto + len(onto)
    code.append((jeq, at_fd - 1, 0, close))
    for i, c in enumerate(dups):
        code.append((jeq, at_onto - 2 - i, 0, c))
    code.append((jeq, at_spans - 2 - len(dups), 0, close_range))
    code.append((ret, 0, 0, allow))
    code += fd_rows + onto + spans
    return _install(code)


#: capset(2)'s number by machine
_CAPSET = {"x86_64": 126, "aarch64": 91}


def drop_capabilities() -> bool:
    """This process (and what it starts) keeps no capability, even run as root: a root
    grader's learner process could otherwise push keystrokes into the grader's terminal
    (TIOCSTI on a terminal not its own needs CAP_SYS_ADMIN: red team 7 ran a command in the
    instructor's shell) or read another process's /proc entries that need CAP_SYS_PTRACE
    (its environment). Returns whether the capabilities are none now."""
    import platform

    nr = _CAPSET.get(platform.machine())
    if nr is None or not sys.platform.startswith("linux"):
        return False
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable x 2 words: all none
    return _libc().syscall(nr, ctypes.byref(header), ctypes.byref(data)) == 0


def abi() -> int:
    """The kernel's Landlock ABI version, 0 without Landlock."""
    if not sys.platform.startswith("linux"):
        return 0
    try:
        r = _libc().syscall(_CREATE, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    except (AttributeError, OSError):
        return 0
    return max(int(r), 0)


def readable_entries(root: str, secrets: tuple[str, ...]) -> list[str]:
    """``root``, or, where a secret lies under it, its other entries (recursively): what may be
    read of ``root`` without any secret."""
    root = os.path.realpath(root)
    if any(root == s or root.startswith(s + "/") for s in secrets):
        return []
    if not any(s.startswith(root + "/") for s in secrets):
        return [root]
    out = []
    try:
        entries = sorted(os.scandir(root), key=lambda e: e.name)
    except OSError:
        return []
    for e in entries:
        out += readable_entries(e.path, secrets)
    return out


def restrict(scratch: str, *, readable, executable, secrets) -> bool:
    """Confine this process (and what it starts) with Landlock: read ``readable`` (folders or
    files) less ``secrets`` (folders), execute ``executable``, write ``scratch``, open
    ``devices()`` and no other file of ``/dev``; from ABI 6 signal no process and reach no
    abstract socket outside the domain (``scoped``). Returns whether the kernel enforces it."""
    version = abi()
    if version < 1:
        return False
    handled = READ_FILE | READ_DIR | WRITE_FILE | EXECUTE | _CHANGES
    handled |= (REFER if version >= 2 else 0) | (TRUNCATE if version >= 3 else 0)
    secrets = tuple(os.path.realpath(s) for s in secrets)
    scoped = SCOPE_SIGNAL | SCOPE_ABSTRACT_UNIX_SOCKET if version >= 6 else 0
    attr = (ctypes.c_uint64 * 3)(handled, 0, scoped)
    size = 8 if version < 4 else (16 if version < 6 else 24)
    libc = _libc()
    fd = libc.syscall(_CREATE, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if fd < 0:
        return False

    class PathBeneath(ctypes.Structure):
        _pack_ = 1
        _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]

    def allow(path: str, access: int) -> None:
        try:
            pfd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            return  # not on this machine
        try:
            if not os.path.isdir(path):
                access &= _FILE_RIGHTS
            rule = PathBeneath(access & handled, pfd)
            if libc.syscall(_ADD_RULE, fd, _PATH_BENEATH, ctypes.byref(rule), 0) < 0:
                err = ctypes.get_errno()
                raise OSError(err, f"landlock_add_rule({path}): {os.strerror(err)}")
        finally:
            os.close(pfd)

    try:
        runs = tuple(os.path.realpath(p) for p in executable)
        for root in dict.fromkeys(readable):
            for path in readable_entries(root, secrets):
                ex = EXECUTE if any(path == r or path.startswith(r + "/") for r in runs) else 0
                allow(path, READ_FILE | READ_DIR | ex)
        for device in devices():
            allow(device, READ_FILE | READ_DIR | WRITE_FILE | TRUNCATE)
        allow(scratch, handled & ~EXECUTE)  # nothing written here is run
        if libc.prctl(_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            return False
        if libc.syscall(_RESTRICT, fd, 0) != 0:
            return False
        return True
    finally:
        os.close(fd)


def confine_default() -> bool:
    """Whether learner processes are confined with Landlock (``confine``) when the kernel has
    it: yes, unless ``QUACK_EDU_LANDLOCK=0``. (On an H100, 2026-12-06, the grader's boundary
    tests ran with it on: 209 of 211 passed, the two failures were the audit hook's, since
    fixed; the CUDA driver and the DSL found every file they read.)"""
    return os.environ.get("QUACK_EDU_LANDLOCK", "").strip() != "0"


def files_boundary() -> str:
    """What confines a learner process's own file access here, in words (a grade's JSON)."""
    version = abi()
    if not confine_default():
        return "the audit hook (Landlock off: QUACK_EDU_LANDLOCK=0)"
    if version < 1:
        return "the audit hook (this kernel has no Landlock)"
    scoped = (
        "; it signals no process outside its domain (the grader)"
        if version >= 6
        else "; signals to the grader from native code are not stopped (Landlock ABI 6 does)"
    )
    return (
        f"the audit hook and Landlock (ABI {version}): native code too reads only the system's "
        "and the Python installation's folders and the repository without its secrets, "
        "writes only its scratch folder and opens no device but null, zero, full, random, "
        f"urandom and a GPU's{scoped}"
    )
