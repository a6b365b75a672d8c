"""Running a notebook's cells: one executor, one engine.

``Executor`` walks a notebook's code cells in order, one at a time, each with a timeout: a
cell that raises does not stop the run; a cell that times out is interrupted; a process that
died, hangs past the interrupt or whose CUDA context a fault made unusable is replaced by a
fresh one, and the cells that had run are replayed in it, not the failed ones. The other cells
of a failed cell's group (an exercise's) are left out of the replays after that one: the
restart its own failure causes still replays its group's earlier cells (the exercise's answer
cell). What went wrong comes back as a ``CellEvent`` per cell. The grader caps what that may
cost one notebook (red team 6: 30 crashing cells, each replaying 30 slow ones, would take a
day): ``max_restarts`` fresh processes and ``budget_s`` seconds of wall clock, replays included
(checked before each cell and each replayed one); past either, the cells left are not run, each
reported as "stopped", and ``Executor.stopped`` says why.

The engine, ``ChildEngine``, runs one cell in a child Python of the grader's (``_cellworker``)
and says how it went; the executor decides the rest. The child is the learner's side of the
grader's boundary: it locks itself down before the first cell (``sandbox.lock_down``) and is
killed with its process group at the end (under ``--isolate namespaces`` it runs inside bwrap
too: ``isolate``). Python code is interrupted in the child at the
timeout; what an alarm cannot reach (a GPU kernel that never finishes) is killed with the
child after a grace. (A Jupyter kernel is not used to grade: the grader could not lock it
down before the first cell, and it writes its own files.)
"""

from __future__ import annotations

import copy
import json
import os
import re
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

try:
    import nbformat
except ImportError:  # a machine without Jupyter packages (the H200 device machine)
    from . import nblite as nbformat

from . import deadline
from .deadline import MAX_REPLY, killed_after
from .nbfiles import grade_id, repo_root

#: the CUDA errors after which a process's context cannot launch anything again
_STICKY_CUDA = re.compile(
    r"illegal memory access|illegal instruction|misaligned address|unspecified launch failure"
    r"|CUDA_ERROR_(?:ILLEGAL_ADDRESS|ILLEGAL_INSTRUCTION|MISALIGNED_ADDRESS|LAUNCH_FAILED)",
    re.IGNORECASE,
)


@dataclass
class CellEvent:
    """What went wrong in one cell: it raised ("error"), ran past the timeout ("timeout"),
    took its process down ("died") or was not run, the notebook's limits spent ("stopped":
    ``evalue`` says which)."""

    index: int
    grade_id: str | None
    kind: str  # "error", "timeout", "died", "stopped"
    ename: str = ""
    evalue: str = ""

    def poisoned_gpu(self) -> bool:
        """Whether the cell's error leaves its process's CUDA context unusable (an illegal memory
        access, a kernel that faulted): every later CUDA call there fails too, so the process
        is replaced as if it had died."""
        return self.kind == "error" and bool(_STICKY_CUDA.search(f"{self.ename}: {self.evalue}"))

    def describe(self, timeout: float) -> str:
        where = f"cell {self.index}" + (f" ('{self.grade_id}')" if self.grade_id else "")
        if self.kind == "timeout":
            return f"{where} ran past the per-cell timeout of {timeout:g} s and was interrupted"
        if self.kind == "died":
            return f"{where} crashed the notebook's kernel ({self.evalue or 'it died'})"
        if self.kind == "stopped":
            return f"{where} was not run: {self.evalue}"
        if self.ename == "NotImplementedError" and not self.evalue:
            return f"{where} raised NotImplementedError (it uses an exercise not done yet)"
        from .hints import ansi_free, diagnose_compile_text, short_text

        said = f"{where} raised {self.ename}: {short_text(self.evalue)}"[:400]
        rule = diagnose_compile_text(f"{self.ename}: {self.evalue}")
        return f"{said} ({rule})" if rule else ansi_free(said)


@dataclass
class CellRun:
    """One code cell's run: its index in the notebook, what went wrong (None: nothing) and
    how long it took. Its outputs are on the notebook's cell."""

    index: int
    event: CellEvent | None
    seconds: float


class Executor:
    """Runs ``nb``'s code cells in order on ``engine`` (started: ``with engine``), surviving
    errors, timeouts and dead processes. ``group(cell)`` names the cells that fail together
    (the grader's: an exercise's answer and check cells): after one of them timed out or died,
    none of them is replayed in a later fresh process (the restart that its failure causes
    still replays the others that ran before it). ``max_restarts``, ``budget_s``: the limits
    (None: none); once one is spent, ``stopped`` says which and no further cell runs."""

    def __init__(
        self,
        nb,
        engine,
        group: Callable[[object], str | None] | None = None,
        *,
        max_restarts: int | None = None,
        budget_s: float | None = None,
    ):
        self.nb, self.engine = nb, engine
        self.group = group or (lambda cell: None)
        self.ok_cells: list[int] = []  # the cells whose state the notebook built
        self.failed: set[int] = set()  # the cells not replayed
        self.max_restarts, self.budget_s = max_restarts, budget_s
        self.restarts = 0
        self.t0 = time.time()
        #: why the cells from ``stopped_at`` on were not run (a limit spent); None: all ran
        self.stopped: str | None = None
        self.stopped_at: int | None = None

    def run(self) -> Iterator[CellRun]:
        """Each code cell's run, in order (a blank cell is not sent to the engine)."""
        self.t0 = time.time()
        for i, cell in enumerate(self.nb.cells):
            if cell.cell_type != "code":
                continue
            if not cell.source.strip():
                yield CellRun(i, None, 0.0)
                continue
            if self.stopped is None:
                self._check_budget()
            if self.stopped is not None:
                self.stopped_at = i if self.stopped_at is None else self.stopped_at
                yield CellRun(i, CellEvent(i, grade_id(cell), "stopped", evalue=self.stopped), 0.0)
                continue
            t = time.time()
            ev = self.engine.execute(cell, i)
            seconds = time.time() - t
            self._settle(cell, i, ev)
            yield CellRun(i, ev, seconds)

    def _settle(self, cell, index: int, ev: CellEvent | None) -> None:
        """What the cell's outcome costs: nothing, or a fresh process and a replay."""
        if ev is None:
            self.ok_cells.append(index)
            return
        lost = ev.kind == "died" or ev.poisoned_gpu() or not self.engine.alive()
        if lost or (ev.kind == "timeout" and not self.engine.responsive()):
            self._restart(self.failed | {index})  # dead, stuck, or its CUDA context unusable
        elif ev.kind == "error":
            self.ok_cells.append(index)  # its definitions before the error still count
        if ev.kind in ("timeout", "died"):
            key = self.group(cell)
            self.failed.add(index)
            if key is not None:
                self.failed |= {j for j, c in enumerate(self.nb.cells) if self.group(c) == key}

    def _check_budget(self) -> None:
        spent = time.time() - self.t0
        if self.budget_s is not None and spent >= self.budget_s:
            self.stopped = (
                f"its cells had run for {spent:.0f} s of the {self.budget_s:g} s the grader "
                "gives a notebook (replays after a crash or hang included)"
            )

    def _restart(self, skip: set[int]) -> None:
        """A fresh process, then the cells that had run are replayed (not the skipped ones);
        none once ``max_restarts`` were made, or the budget is spent."""
        if self.max_restarts is not None and self.restarts >= self.max_restarts:
            self.stopped = (
                f"its cells crashed or hung the notebook's process {self.restarts + 1} times; "
                f"the grader starts a fresh one, and replays the cells before, at most "
                f"{self.max_restarts} times a notebook"
            )
            return
        self.restarts += 1
        self.engine.restart()
        for i in list(self.ok_cells):
            self._check_budget()
            if self.stopped is not None:
                return
            if i not in skip:
                self.engine.execute(copy.deepcopy(self.nb.cells[i]), i)


# ---- engines ----------------------------------------------------------------------------------
#: seconds a fresh kernel or child Python may take to start (not counted in a cell's timeout)
_STARTUP_TIMEOUT = 120


class ChildEngine:
    """Runs a cell in a child Python (``_cellworker``), one namespace for the notebook, with
    ``env`` and ``cwd``. The child's own output (file descriptors) goes to ``log``, or to this
    process's where None; ``label`` names the cells in tracebacks (``<label-N>``)."""

    def __init__(
        self,
        env: dict,
        cwd: str,
        timeout: float,
        log: Path | None = None,
        label="graded-cell",
        sandbox: dict | None = None,
    ):
        self.env, self.cwd, self.timeout = env, cwd, timeout
        self.log, self.label = log, label
        #: ``sandbox.lock_down``'s keywords (scratch, secrets): the child locks itself down
        #: before the first cell, in a session of its own that ``_stop`` kills whole
        self.sandbox = sandbox
        #: what the sandbox refused in the cells, over every process of the run
        self.incidents: list[str] = []
        self.proc = None

    def __enter__(self):
        self._start()
        return self

    def __exit__(self, *exc):
        self._stop()
        return False

    def _start(self) -> None:
        import select
        import subprocess

        req_r, self._req_w = os.pipe()
        self._rep_r, rep_w = os.pipe()
        cmd = [sys.executable, "-m", "quack_edu.grading._cellworker", str(req_r), str(rep_w)]
        if self.sandbox is not None:  # a grading's: inside bwrap too where asked (``isolate``)
            from . import isolate

            cmd = isolate.wrap(cmd, env=self.env, writable=[self.sandbox["scratch"]],
                               hidden=self.sandbox.get("secrets", ()))  # fmt: skip
        log = open(self.log, "ab") if self.log else None
        try:
            self.proc = subprocess.Popen(
                cmd,
                env=self.env,
                cwd=self.cwd,
                pass_fds=(req_r, rep_w),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT if log else None,
                start_new_session=True,  # one process group: killed whole at the end
            )
        finally:
            if log:
                log.close()
        os.close(req_r)
        os.close(rep_w)
        self._requests = os.fdopen(self._req_w, "w")
        self._replies = os.fdopen(self._rep_r, "r")
        # its start (Python, matplotlib) is not the first cell's time
        ready, _, _ = select.select([self._replies], [], [], _STARTUP_TIMEOUT)
        if ready and self._replies.readline():
            if self.sandbox is None:
                return
            self._requests.write(json.dumps({"lock_down": self.sandbox}) + "\n")
            self._requests.flush()
            ready, _, _ = select.select([self._replies], [], [], _STARTUP_TIMEOUT)
            if ready and json.loads(self._replies.readline() or "{}").get("locked"):
                return
            self._kill()
            raise RuntimeError("the cell worker could not lock itself down")
        if ready:  # the end of its replies: the child exited (an ImportError in it)
            try:
                rc = self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                rc = None
            if rc is not None:
                raise RuntimeError(f"the cell worker exited with {rc} before it started")
        self._kill()
        raise RuntimeError(f"the cell worker did not start in {_STARTUP_TIMEOUT:g} s")

    def _kill(self) -> None:
        """Kill the child and everything in its process group."""
        import signal

        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.kill()
        self.proc.wait()

    def _stop(self) -> None:
        """End the child: its requests close (it leaves its loop), or it is killed."""
        import subprocess

        for f in (self._requests, self._replies):
            try:
                f.close()
            except OSError:
                pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        self._kill()  # and whatever it left in its group

    def execute(self, cell, index) -> CellEvent | None:
        """Run one cell; None when it ran cleanly. Its output is kept as Jupyter would."""
        import select

        cell.outputs = []  # as nbclient does: a child killed or dead leaves none, not the old
        msg = {"source": cell.source, "name": f"<{self.label}-{index}>", "timeout": self.timeout}
        try:
            self._requests.write(json.dumps(msg) + "\n")
            self._requests.flush()
        except (BrokenPipeError, OSError):
            return self._died(cell, index)
        # the child interrupts Python code at the timeout and answers; beyond the grace, it is
        # stuck where an alarm cannot reach (a GPU kernel that never finishes)
        grace = min(30.0, max(5.0, self.timeout))
        ready, _, _ = select.select([self._replies], [], [], self.timeout + grace)
        if not ready:
            self._kill()
            return CellEvent(index, grade_id(cell), "timeout")
        with killed_after(deadline.READ_S, self._kill) as cut:  # a reply begun must end
            line = self._replies.readline(MAX_REPLY)
        if cut.is_set() or (line and not line.endswith("\n")):
            self._kill()  # (a line cut short, or longer than MAX_REPLY)
            return CellEvent(index, grade_id(cell), "timeout")
        if not line:
            return self._died(cell, index)
        try:  # the child's reply, as data (red team 8: nesting past the parser's depth)
            out = _reply(line)
        except Exception as e:  # noqa: BLE001
            self._kill()
            return CellEvent(index, grade_id(cell), "died", evalue=f"its reply was not data "
                             f"({type(e).__name__})")  # fmt: skip
        for what in out["incidents"]:
            if what not in self.incidents:
                self.incidents.append(what)
        outputs = [{"output_type": "stream", "name": "stdout", "text": out["stdout"]}]
        if not out["ok"]:
            tb = out["error"].splitlines()
            outputs.append(
                {
                    "output_type": "error",
                    "ename": out["ename"],
                    "evalue": out["evalue"],
                    "traceback": tb,
                }
            )
        cell.outputs = [nbformat.from_dict(o) for o in outputs if o.get("text", True)]
        if out["ok"]:
            return None
        if out["timed_out"]:
            return CellEvent(index, grade_id(cell), "timeout")
        return CellEvent(index, grade_id(cell), "error", out["ename"], out["evalue"])

    def _died(self, cell, index) -> CellEvent:
        rc = self.proc.wait()
        return CellEvent(index, grade_id(cell), "died", evalue=f"the process exited with {rc}")

    def restart(self) -> None:
        self._stop()
        self._start()

    def alive(self) -> bool:
        return self.proc.poll() is None  # not killed after a stuck cell, not dead

    def responsive(self) -> bool:
        """After a timeout the child interrupted the cell's Python code itself: it answers
        while it lives."""
        return self.alive()


def _reply(line: str) -> dict:
    """A cell worker's reply (``_cellworker.serve``) checked to be what it says: its fields of
    their types, ``incidents`` a list of strings; anything else raises."""
    out = json.loads(line)
    kinds = {"ok": bool, "stdout": str, "error": str, "ename": str, "evalue": str,
             "timed_out": bool}  # fmt: skip
    if type(out) is not dict or any(type(out.get(k)) is not t for k, t in kinds.items()):
        raise ValueError("not a cell's outcome")
    incidents = out.setdefault("incidents", [])
    if type(incidents) is not list or not all(type(w) is str for w in incidents):
        raise ValueError("incidents are not a list of strings")
    return out


def child_env(base: dict | None = None) -> dict:
    """``base`` (default: this process's environment) with this copy of quack_edu first on
    PYTHONPATH, so that a kernel or child Python imports the same package."""
    env = dict(os.environ if base is None else base)
    root = str(repo_root())
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env
