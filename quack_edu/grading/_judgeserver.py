"""The judge's fork server: one per grading process, started before any learner code exists.

    python quack_edu/grading/_judgeserver.py CONTROL_FD

It is started as a file, not with ``-m``, so that importing it does not import ``quack_edu``
(whose GPU detection initialises CUDA: a process that forks must not have done that). It
imports what ``QUACK_EDU_JUDGE_PRELOAD`` names once, then waits on a Unix socket for requests from
the grader (``judge.Server``): each request carries one end of a new socket pair and one of a
record socket (``record.RECORD_FORMAT``), and the server forks a worker (``worker.main``) that
talks to the grader over the first and whose audit hook alone writes to the second. The worker's
first byte on the first carries its pid to the grader in the kernel's credentials
(``isolate.sender_pid``: the pid the server sees is its own PID namespace's under
``--isolate namespaces``). A worker
is a fresh copy of this process, so the learner's code it loads has never run anywhere the
grader reads from. ``QUACK_EDU_JUDGE_PRELOAD=0`` leaves the imports to each worker (slower;
for a machine where importing the DSL before a fork would be unsafe).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ctl = socket.socket(fileno=int(argv[0]))
    preload = os.environ.get("QUACK_EDU_JUDGE_PRELOAD", "all")
    if preload in ("all", "dsl", "torch"):
        import matplotlib
        import numpy  # noqa: F401
        import torch  # noqa: F401
        import torch._dynamo.pgo  # noqa: F401  (its file hashes are primed: tripwires.hide_sources)

        matplotlib.use("Agg")
    if preload == "all":  # quack_edu first: it pins the DSL's target to sm_90a without a Hopper
        import quack_edu  # noqa: F401
    if preload in ("all", "dsl"):
        import cutlass  # noqa: F401
        import cutlass.cute  # noqa: F401
    if preload == "all":  # the learner side's code and the library, never the exercises
        import tvm_ffi  # noqa: F401

        from quack_edu.grading import worker

        worker.preload_library()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # workers are reaped by the kernel
    while True:
        try:
            msg, fds, _, _ = socket.recv_fds(ctl, 64, 2)
        except OSError:
            return 0
        if not msg or not fds:
            return 0
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                os.write(fds[0], b"\0")  # the grader learns this worker's pid as it numbers it
                ctl.close()
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                from multiprocessing.connection import Connection

                from quack_edu.grading.worker import main

                main(Connection(fds[0]), fds[1] if len(fds) > 1 else None)
            except BaseException:
                code = 1
            finally:
                os._exit(code)
        for fd in fds:
            os.close(fd)
        ctl.sendall((json.dumps({"pid": pid}) + "\n").encode())


if __name__ == "__main__":
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sys.exit(main())
