"""One timed measurement at a time on a GPU, machine-wide.

A speed check compares a kernel's time with the copy bandwidth measured beside it; a kernel of
another grading running on the same GPU meanwhile slows either, and an honest answer fails
(issue 49: four gradings at once on one H100 took a lesson-04 notebook's speed check, 8/10;
graded alone, 10/10). ``timing()`` is an exclusive ``fcntl.flock`` on one file per GPU in
``LOCK_DIR``, so every process that times there queues on it: the gradings of
``quack-edu grade -j N``, several ``quack-edu grade`` at once, a learner's own ``check()``.
It is held while timing only; compiling and value checks run beside it.

A learner process the grader locked down (``sandbox``) has its own temporary directory and may
not create files outside it: the lock lives in /tmp, not in the process's temporary directory,
and such a process only opens a lock file that exists, for reading (flock needs no more).

The operating system releases the lock of a process that dies (a worker killed at its time
limit). A lock held past ``WAIT_S`` (a stuck process) is not waited for: the measurement is
taken without it, and ``timing()`` says so.
"""

from __future__ import annotations

import fcntl
import os
import re
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path

#: where the lock files are: the same folder for every process of the machine, whatever its
#: TMPDIR (a locked-down learner process has its own)
LOCK_DIR = Path("/tmp") if os.path.isdir("/tmp") else Path(tempfile.gettempdir())
#: seconds a measurement waits for the lock before it is taken without it (a speed check may
#: wait three times, inside the grader's worker's 120 s limit; a measurement holds it < 1 s)
WAIT_S = 20.0
#: seconds between two tries of a lock another process holds
POLL_S = 0.02

_local = threading.local()


def lock_path() -> Path:
    """The lock file of the current GPU, the same in every process of the machine: named by the
    GPU's UUID, which ``CUDA_VISIBLE_DEVICES`` does not renumber (its index where there is none)."""
    name = "0"
    try:
        import torch

        if torch.cuda.is_available():
            i = torch.cuda.current_device()
            name = str(getattr(torch.cuda.get_device_properties(i), "uuid", "") or i)
    except (ImportError, RuntimeError):
        pass
    name = re.sub(r"[^\w.-]", "_", name)
    # not "quack_edu_*": the sandbox keeps learner processes out of the grader's folders
    return LOCK_DIR / f"quack-edu-gpu-timing.{name}.lock"


def held(path: Path | None = None) -> bool:
    """Whether this thread holds the lock at ``path`` (default: the current GPU's)."""
    return _entries().get(str(path or lock_path()), False)


def _entries() -> dict:
    """This thread's timing blocks, outermost: lock path -> whether it holds the lock."""
    if not hasattr(_local, "entries"):
        _local.entries = {}
    return _local.entries


def _locked_down() -> bool:
    """Whether this is a learner process the grader locked down: creating a file outside its
    scratch folder there is refused, and the refusal flags the answer."""
    sandbox = sys.modules.get(__package__ + ".sandbox")
    return bool(sandbox and getattr(sandbox, "locked", lambda: False)())


def _open(path: Path) -> int | None:
    """A read-only descriptor of the lock file, made if missing (flock needs no write access:
    one user's file serves another's gradings), or None where it cannot be opened."""
    tries = [os.O_RDONLY]
    if not _locked_down():
        tries += [os.O_RDONLY | os.O_CREAT | os.O_EXCL, os.O_RDONLY]
    for flags in tries:
        try:
            fd = os.open(path, flags, 0o644)
        except OSError:
            continue
        if flags & os.O_CREAT:
            os.fchmod(fd, 0o644)  # whatever the umask: readable by every user's gradings
        return fd
    return None


def _acquire(fd: int, wait_s: float) -> bool:
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(POLL_S)


def _give_back_memory() -> None:
    """Return this process's cached GPU memory to the driver: a timed measurement's inputs are
    the largest tensors a grading makes (GiBs), and torch's allocator would keep them from the
    gradings and tests beside it (2026-12-06, H100: a check of another process ran out of
    memory with 24 GiB held by one whose tensors were long freed)."""
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_initialized():
            torch.cuda.empty_cache()
    except RuntimeError:
        pass


@contextmanager
def timing(path: Path | None = None):
    """Hold the timing lock at ``path`` (default: the current GPU's) while the block runs:
    exclusive among processes and threads, entered again for free by the thread that holds it.
    Yields whether it is held: False after ``WAIT_S`` of waiting, or where the file cannot be
    opened (the block runs anyway). Leaving the outermost block gives the process's cached GPU
    memory back."""
    key = str(path or lock_path())
    entries = _entries()
    if key in entries:  # inside this thread's own block: its lock already, or its wait spent
        yield entries[key]
        return
    fd = _open(Path(key))
    ok = fd is not None and _acquire(fd, WAIT_S)
    entries[key] = ok
    try:
        yield ok
    finally:
        del entries[key]
        _give_back_memory()
        if fd is not None:
            if ok:
                fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
