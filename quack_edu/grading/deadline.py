"""A read from a learner's process that cannot hang the grader, and what one notebook's run
may cost it.

``poll``/``select`` say that a reply has begun, not that it will end: a learner's process can
write part of one and stop (red team 5: a 4-byte length header, then sleep). ``killed_after``
kills that process if the read has not returned by the deadline; the read then ends (the pipe
closes) and the caller reports a timeout. ``MAX_RESTARTS`` and ``BUDGET_S`` are the defaults
of ``executor.Executor``'s limits when the grader runs a notebook.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

#: seconds a reply may take to arrive once it has begun
READ_S = 30.0
#: the largest reply a learner's process may send (a value's tensors, a cell's output)
MAX_REPLY = 512 << 20
#: what the grader lets one notebook's run cost (``quack-edu grade --max-restarts/--budget``):
#: fresh processes after its cells crashed or hung, and seconds in all, replays included. An
#: honest solution needs no restart and a few minutes; a broken one a restart an exercise
MAX_RESTARTS = 8
BUDGET_S = 600.0


@dataclass(frozen=True)
class RunBounds:
    """What one notebook's run may reach and cost: ``secrets``, more paths no learner process
    may read (a class's submissions, its gradebook); ``root``, the class's submissions folder
    (the notebook is read as ``submission.read_notebook`` says); ``max_restarts`` fresh
    processes and ``budget_s`` seconds of its cells, replays included (``executor.Executor``)."""

    secrets: tuple = ()
    root: str | None = None
    max_restarts: int = MAX_RESTARTS
    budget_s: float = BUDGET_S


@contextmanager
def killed_after(seconds: float, kill: Callable[[], None]) -> Iterator[threading.Event]:
    """Run the block; call ``kill`` if it is still running after ``seconds``. The event
    yielded is set when it was killed."""
    fired = threading.Event()

    def fire():
        fired.set()
        kill()

    timer = threading.Timer(seconds, fire)
    timer.daemon = True
    timer.start()
    try:
        yield fired
    finally:
        timer.cancel()


class TooSlow(BaseException):
    """The grader's own work on a learner's text or reply ran past its bound (``cpu_bound``).
    A BaseException, so that a check's ``except Exception`` does not take it for the
    learner's error."""


#: seconds of the grader's own CPU time that similarity may spend on one answer, and that one
#: check may spend on what a worker sent back (PTX it parses and simulates): an honest answer
#: needs a fraction (2026-12-08, 2 shared cores: solutions 00, 02, 04, 06, 07 each graded whole,
#: notebook run included, in 7 to 31 s of wall time)
SIMILARITY_CPU_S = 60.0
CHECK_CPU_S = 240.0


@contextmanager
def cpu_bound(seconds: float, what: str) -> Iterator[None]:
    """Run the block; raise ``TooSlow(what)`` in it once this process has spent ``seconds`` of
    CPU time on it (``ITIMER_PROF``: waiting for a worker costs nothing). In the main thread
    only, and not inside another bound (the outer one holds); elsewhere the block runs
    unbounded."""
    import signal

    if (
        threading.current_thread() is not threading.main_thread()
        or not hasattr(signal, "setitimer")
        or signal.getitimer(signal.ITIMER_PROF)[0] > 0
    ):
        yield
        return

    def fire(signum, frame):  # noqa: ARG001
        raise TooSlow(what)

    old = signal.signal(signal.SIGPROF, fire)
    signal.setitimer(signal.ITIMER_PROF, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, old)
