"""Optional OS isolation of the grader's learner processes: Linux namespaces through bubblewrap.

    quack-edu grade NOTEBOOK --isolate namespaces        (or QUACK_EDU_ISOLATE=namespaces)

Off by default (``none``): the learner processes are behind the sandbox (``sandbox``: the
audit hook; ``confine``: Landlock, seccomp, no capabilities) alone. With ``namespaces``, every
process that runs learner code (the notebook's cell worker, ``executor.ChildEngine``; the judge
server whose forks load the answers, ``judge.Server``) is started inside ``bwrap``
(bubblewrap, ``apt-get install bubblewrap``), which the kernel enforces whatever the process
does, in Python or in native code:

* the file system read-only (``--ro-bind / /``); the temporary folder, ``$HOME`` and ``/run``
  empty (their own tmpfs: other gradings' folders, sockets, caches), with the Python
  installation and the package put back read-only where they lie inside them; the secrets
  (``judge.secret_paths``: the solutions, the exercises, the checkout's history, a class's
  submissions and gradebook) empty; the process's scratch folder the only one it writes to
  outside those tmpfs (what it writes there is lost with it);
* its own process IDs (``--unshare-pid`` and a fresh ``/proc``: no other process is there to
  read, the grader's command line included), no network (``--unshare-net``: a loopback only;
  abstract unix sockets are per network namespace), its own System V IPC and host name;
* no capability (``--cap-drop ALL``), killed with its parent (``--die-with-parent``), in the
  grader's process group (no ``--new-session``: the grader kills the group).

``/dev`` is a fresh one (``--dev``: null, zero, full, random, urandom, tty) with the GPU's
device files bound in (``/dev/nvidia*``, with their device access), and a private ``/dev/shm``:
no disk, console or other device of the machine. bwrap is tried once with these options
(``bwrap ... true``): where it is missing or cannot make the namespaces (unprivileged user
namespaces off), ``require`` raises ``IsolationUnavailable`` and nothing is graded. The judge
learns each worker's pid from the kernel (``sender_pid``): the server's own pids are its
namespace's.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
from functools import cache
from pathlib import Path

#: the choices of ``--isolate`` and ``QUACK_EDU_ISOLATE``
MODES = ("none", "namespaces")
ENV = "QUACK_EDU_ISOLATE"

#: bwrap's options for every learner process (the folders are added per process: ``command``)
BWRAP_OPTIONS = (
    "--ro-bind", "/", "/",
    "--dev", "/dev",  # a /dev of its own: null, zero, full, random, urandom, tty (+ a GPU's)
    "--tmpfs", "/dev/shm",
    "--proc", "/proc",  # a procfs of its own PID namespace: its own processes only
    "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
    "--cap-drop", "ALL",
    "--die-with-parent",
)  # fmt: skip


def options() -> list[str]:
    """``BWRAP_OPTIONS`` and the GPU's device files here, bound into the fresh ``/dev``."""
    gpu = sorted(glob.glob("/dev/nvidia*"))
    return [*BWRAP_OPTIONS, *(a for p in gpu for a in ("--dev-bind", p, p))]


_chosen: list[str] = []  # what ``use`` chose in this process (over the environment's)


class IsolationUnavailable(RuntimeError):
    """``namespaces`` was asked for and this machine cannot give it."""


def mode() -> str:
    """The isolation of this process's learner processes: ``use``'s, else ``QUACK_EDU_ISOLATE``'s,
    else ``none``. An unknown name raises ``ValueError``."""
    chosen = _chosen[-1] if _chosen else (os.environ.get(ENV, "").strip() or "none")
    if chosen not in MODES:
        raise ValueError(f"{ENV}={chosen!r}: the isolation is one of {', '.join(MODES)}")
    return chosen


def use(name: str | None) -> str:
    """Isolate this process's learner processes as ``name`` from now on (None: as
    ``QUACK_EDU_ISOLATE`` says). ``namespaces`` is tried first: ``IsolationUnavailable`` where it
    cannot be had. Returns the mode now in force."""
    if name is not None and name not in MODES:
        raise ValueError(f"--isolate {name!r}: one of {', '.join(MODES)}")
    _chosen[:] = [name] if name else []
    if mode() == "namespaces":
        require()
    return mode()


def require() -> str:
    """The path of a bwrap that made the namespaces here, once (``IsolationUnavailable``
    otherwise, with what went wrong and what would fix it)."""
    ok, said = _probe()
    if not ok:
        raise IsolationUnavailable(said)
    return said


@cache
def _probe() -> tuple[bool, str]:
    """(True, bwrap's path) or (False, why not): bwrap run once with the options learner
    processes get."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return False, (
            "--isolate namespaces needs bubblewrap (bwrap), which is not installed here "
            "(Debian/Ubuntu: apt-get install bubblewrap; Fedora: dnf install bubblewrap)"
        )
    try:
        done = subprocess.run(
            [bwrap, *options(), "true"], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, f"--isolate namespaces: {bwrap} did not run ({type(e).__name__}: {e})"
    if done.returncode != 0:
        return False, (
            f"--isolate namespaces: {bwrap} cannot create the namespaces here "
            f"({done.stderr.strip()[-300:] or f'exit {done.returncode}'}); it needs unprivileged "
            "user namespaces (sysctl kernel.unprivileged_userns_clone=1, or on Ubuntu 24.04 "
            "kernel.apparmor_restrict_unprivileged_userns=0) or a setuid bwrap, and a container "
            "that allows them"
        )
    return True, bwrap


@cache
def _version() -> str:
    try:
        out = subprocess.run([require(), "--version"], capture_output=True, text=True, timeout=30)
        return out.stdout.strip() or "bwrap"
    except (OSError, subprocess.TimeoutExpired):
        return "bwrap"


def describe() -> str:
    """The isolation in force, in words (a grade's JSON: ``NotebookResult.boundary``)."""
    if mode() == "none":
        return (
            "none: the learner processes share the grader's view of the file system, its "
            "process list and its network (--isolate namespaces adds those)"
        )
    return (
        f"namespaces ({_version()}): a read-only file system, the secrets, the temporary "
        "folder, $HOME and /run empty, the scratch folder the only one written; its own "
        "process IDs (no other process in /proc), no network, no capability"
    )


def _under(p: str, root: str) -> bool:
    return p == root or p.startswith(root.rstrip("/") + "/")


def _needed(env: dict) -> list[str]:
    """What a learner process reads that may lie in a folder it gets empty: the Python
    installation, the package (PYTHONPATH, ``sys.path``), native libraries' folders, CUDA's,
    and a CUDA MPS server's pipes."""
    root = str(Path(__file__).resolve().parents[2])
    paths = [sys.prefix, sys.base_prefix, os.path.dirname(sys.executable), root, *sys.path]
    for var in ("PYTHONPATH", "LD_LIBRARY_PATH"):
        paths += env.get(var, "").split(os.pathsep)
    for var in ("CUDA_HOME", "CUDA_PATH", "CUDA_MPS_PIPE_DIRECTORY"):
        paths.append(env.get(var, ""))
    paths += glob.glob("/tmp/nvidia-mps") + glob.glob("/run/nvidia*")
    out = []
    for p in paths:
        if p and os.path.isabs(p) and os.path.exists(p):
            out += [p, os.path.realpath(p)]
    return list(dict.fromkeys(out))


def command(
    cmd: list[str], *, env: dict, writable=(), hidden=(), private: tuple | None = None
) -> list[str]:
    """``cmd`` run inside bwrap (``require``'s): writes only in ``writable`` (folders, made
    here), and ``hidden`` (folders or files; ``x_*``: every name with that prefix) found empty.
    ``private``: the folders given an empty tmpfs (default: the temporary folder, ``$HOME``,
    ``/run``)."""
    args = [require(), *options()]
    if private is None:
        private = (tempfile.gettempdir(), env.get("HOME") or os.environ.get("HOME", ""), "/run")
    private = sorted(
        {os.path.realpath(d) for d in private if d and os.path.isdir(d)} - {"/"}, key=len
    )
    for d in private:  # (outer folders first)
        args += ["--tmpfs", d]
    back = [p for p in _needed(env) if any(_under(p, d) and p != d for d in private)]
    back = [p for p in back if not any(_under(d, p) for d in private)]  # never a whole one
    for p in back:
        args += ["--ro-bind", p, p]

    def visible(p: str) -> bool:
        return not any(_under(p, d) for d in private) or any(_under(p, b) for b in back)

    for secret in hidden:
        secret = str(secret)
        found = glob.glob(glob.escape(secret[:-1]) + "*") if secret.endswith("*") else [secret]
        for p in sorted({os.path.realpath(f) for f in found if os.path.lexists(f)}):
            if visible(p) and p != "/":
                args += ["--tmpfs", p] if os.path.isdir(p) else ["--ro-bind", "/dev/null", p]
    for w in writable:
        w = os.path.realpath(w)
        os.makedirs(w, exist_ok=True)
        args += ["--bind", w, w]
    return [*args, "--", *cmd]


def wrap(cmd: list[str], *, env: dict, writable=(), hidden=()) -> list[str]:
    """``cmd`` as this process's isolation runs a learner process: itself (``none``), or inside
    bwrap (``command``)."""
    if mode() == "none":
        return list(cmd)
    return command(cmd, env=env, writable=writable, hidden=hidden)


def pass_credentials(sock: socket.socket) -> None:
    """Have the kernel say, with each message ``sock`` receives from now on, who sent it
    (``sender_pid``). Where it cannot (no ``SO_PASSCRED``), nothing."""
    if hasattr(socket, "SO_PASSCRED"):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)


def sender_pid(sock: socket.socket, timeout: float = 60.0) -> int | None:
    """Read one byte from ``sock`` (``pass_credentials`` before it was sent): the pid of the
    process that sent it, as this process numbers it (the kernel translates a pid of another
    PID namespace). None where none came in ``timeout`` s or the kernel says no pid."""
    sock.settimeout(timeout)
    try:
        if not hasattr(socket, "SCM_CREDENTIALS"):
            sock.recv(1)
            return None
        data, ancillary, _, _ = sock.recvmsg(1, socket.CMSG_SPACE(struct.calcsize("3i")))
    except OSError:
        return None
    finally:
        sock.settimeout(None)
    for level, kind, payload in ancillary:
        if data and (level, kind) == (socket.SOL_SOCKET, socket.SCM_CREDENTIALS):
            return struct.unpack("3i", payload[:12])[0] or None
    return None
