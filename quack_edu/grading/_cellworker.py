"""The child process that runs a notebook's cells (``executor.ChildEngine``), without Jupyter.

    python -m quack_edu.grading._cellworker REQUEST_FD REPLY_FD

The engine starts it with the notebook's environment and folder, and talks to it over two
pipes, one JSON object a line. Once started, the child says ``{"ready": true}``; then each
request ``{"source", "name", "timeout"}`` runs one cell in the child's namespace
(``exec_cell``) and the reply is the cell's ``CellOutcome`` as a dict. The child exists so that
what cannot be interrupted (a GPU kernel that never finishes) or what kills a process (an
illegal memory access poisons its CUDA context; ``os._exit``) costs the child, not its caller:
the executor kills or loses it, starts another and replays the cells before.

A cell's source is registered with ``linecache`` under its name before it runs, as IPython
does, so that CuTe DSL can read the source of a ``@cute.jit``/``@cute.kernel`` defined in a
cell. IPython magics (``%...``, ``!...``) are skipped; the notebooks avoid them. ``display``
prints, and matplotlib draws off-screen.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import linecache
import os
import signal
import sys
import time
import traceback
from dataclasses import dataclass


class CellTimeout(Exception):
    pass


#: what a cell may print (characters); past it the cell stops with ``OutputFlood``, reported as
#: what it is rather than as the timeout an endless print loop would reach (red team 12)
OUTPUT_MAX = 1_000_000


class OutputFlood(BaseException):  # (not an Exception: ``except Exception`` does not swallow it)
    pass


class _CappedOutput(io.StringIO):
    def write(self, text):
        if self.tell() + len(text) > OUTPUT_MAX:
            super().write(text[: max(0, OUTPUT_MAX - self.tell())])
            raise OutputFlood(f"the cell printed more than {OUTPUT_MAX:,} characters")
        return super().write(text)


@dataclass
class CellOutcome:
    ok: bool
    seconds: float
    stdout: str = ""
    error: str = ""  # the traceback's last lines
    ename: str = ""
    evalue: str = ""
    timed_out: bool = False


def _strip_magics(source: str) -> str:
    keep = []
    for line in source.splitlines():
        s = line.lstrip()
        keep.append("" if s.startswith(("%", "!")) else line)
    return "\n".join(keep)


def _display(*objs, **_):
    for o in objs:
        print(o)


def exec_cell(source: str, name: str, ns: dict, timeout: float | None = None) -> CellOutcome:
    """Run one cell's source in ``ns``, registered with linecache under ``name``.

    ``timeout`` (seconds, main thread only) interrupts Python code that runs too long; it cannot
    interrupt a call blocked inside a C extension (a GPU kernel that never finishes).
    """
    src = _strip_magics(source)
    linecache.cache[name] = (len(src), None, [ln + "\n" for ln in src.splitlines()], name)
    buf = _CappedOutput()
    t = time.time()

    def on_alarm(signum, frame):
        raise CellTimeout(f"cell ran past the per-cell timeout of {timeout:g} s")

    old = signal.signal(signal.SIGALRM, on_alarm) if timeout else None
    if timeout:
        signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        with contextlib.redirect_stdout(buf):
            exec(compile(src, name, "exec"), ns)
        return CellOutcome(True, time.time() - t, buf.getvalue())
    except BaseException as e:  # noqa: BLE001  (a cell's failure is data, not a crash)
        if isinstance(e, KeyboardInterrupt):
            raise
        tb = "".join(traceback.format_exception(type(e), e, e.__traceback__)[-6:])
        return CellOutcome(
            False,
            time.time() - t,
            buf.getvalue(),
            tb,
            type(e).__name__,
            str(e),
            timed_out=isinstance(e, CellTimeout),
        )
    finally:
        if timeout:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)


def _lock_down(policy: dict) -> None:
    """Import what every lesson's first cell does, then lock the process down: the cells that
    follow are the learner's."""
    import cutlass.cute  # noqa: F401
    import matplotlib.pyplot  # noqa: F401
    import torch  # noqa: F401
    import tvm_ffi  # noqa: F401

    import quack_edu  # noqa: F401  (before cutlass: it pins the DSL's target)
    from quack_edu.grading import sandbox

    sandbox.lock_down(policy["scratch"], secrets=policy.get("secrets", ()))


def serve(requests, replies) -> None:
    import matplotlib

    matplotlib.use("Agg")
    replies.write(json.dumps({"ready": True}) + "\n")  # started: the cells' timeouts begin
    replies.flush()
    ns = {"__name__": "__main__", "display": _display}
    for line in requests:
        msg = json.loads(line)
        if "lock_down" in msg:  # the grader's: before the first cell (see grading.sandbox)
            _lock_down(msg["lock_down"])
            replies.write(json.dumps({"locked": True}) + "\n")
            replies.flush()
            continue
        out = exec_cell(msg["source"], msg["name"], ns, msg.get("timeout"))
        reply = dataclasses.asdict(out)
        if "quack_edu.grading.sandbox" in sys.modules:  # what the sandbox refused so far
            reply["incidents"] = sys.modules["quack_edu.grading.sandbox"].incidents()
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    request_fd, reply_fd = (int(a) for a in argv)
    with os.fdopen(request_fd, "r") as requests, os.fdopen(reply_fd, "w") as replies:
        serve(requests, replies)
    return 0


if __name__ == "__main__":
    sys.exit(main())
