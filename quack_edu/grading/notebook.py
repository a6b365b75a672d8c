"""Running and grading a notebook (the notebook files themselves: ``nbfiles``).

Grading (nbgrader's model, without nbgrader)
    ``grade_notebook`` runs a learner's notebook headless in a fresh kernel, cell by cell, with
    a per-cell timeout. Check cells are overwritten by the solution's version (without its hidden
    checks), as nbgrader does with its read-only test cells. A cell that raises does not
    stop the run; a cell that runs past the timeout is interrupted (and the kernel restarted
    and the cells before it replayed if the interrupt does not take). That run reports cell
    errors, hangs and crashes, mapped to exercises by grade_id; it decides nothing else (its
    ``check`` calls do nothing, it gets no seed and no hidden checks). Each exercise is then
    judged from its answer cell's source by ``judge``, in processes the notebook never ran in.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import re
import secrets
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

try:
    import nbformat
except ImportError:  # a machine without Jupyter packages (the H200 device machine)
    from . import _nblite as nbformat

from .nbfiles import (  # noqa: F401  (re-exported: notebook.read ...)
    BEGIN_HIDDEN,
    BEGIN_SOLUTION,
    CODE_STUB,
    END_HIDDEN,
    END_SOLUTION,
    NBGRADER_SCHEMA,
    PRELUDE,
    TEXT_STUB,
    VOLATILE_CELL_METADATA,
    _replace_regions,
    answer_from_source,
    clean_cell,
    comparable,
    exercise_cells,
    exercise_source,
    find_cell,
    generate_students,
    grade_id,
    is_solution_cell,
    is_test_cell,
    lesson_of,
    nbgrader_meta,
    notebooks_dir,
    out_of_date,
    read,
    repo_root,
    solutions_dir,
    student_for,
    to_student,
    validate_solution,
    write,
)
from .registry import Exercise, all_exercises
from .report import FAIL, NOT_ATTEMPTED, ExerciseResult, NotebookResult, RunResult

# ---- grading ----------------------------------------------------------------------------------
#: the CUDA errors after which a process's context cannot launch anything again
_STICKY_CUDA = re.compile(
    r"illegal memory access|illegal instruction|misaligned address|unspecified launch failure"
    r"|CUDA_ERROR_(?:ILLEGAL_ADDRESS|ILLEGAL_INSTRUCTION|MISALIGNED_ADDRESS|LAUNCH_FAILED)",
    re.IGNORECASE,
)


@dataclass
class CellEvent:
    index: int
    grade_id: str | None
    kind: str  # "error", "timeout", "died"
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
        if self.ename == "NotImplementedError" and not self.evalue:
            return f"{where} raised NotImplementedError (it uses an exercise not done yet)"
        from .hints import _ansi_free, diagnose_compile_text, short_text

        said = f"{where} raised {self.ename}: {short_text(self.evalue)}"[:400]
        rule = diagnose_compile_text(f"{self.ename}: {self.evalue}")
        return f"{said} ({rule})" if rule else _ansi_free(said)


def _kernel_env() -> dict:
    """The notebook kernel's environment: the grading marker, and nothing the grade depends on
    (no seed, no results file, no path to the solutions)."""
    from .checks import ENV_GRADING

    env = {k: v for k, v in os.environ.items() if not k.startswith("QUACK_EDU_GRAD")}
    root = str(repo_root())
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env[ENV_GRADING] = "1"
    env.setdefault("MPLBACKEND", "Agg")
    env.pop("JPY_PARENT_PID", None)
    return env


def _prepare(nb, lesson: str, solutions: Path | None) -> tuple[object, list[str]]:
    """Overwrite check cells from the solution (without its hidden tests); re-add missing ones."""
    notes = []
    nb = copy.deepcopy(nb)
    sol_path = (solutions / f"{lesson}.ipynb") if solutions else None
    if not sol_path or not sol_path.exists():
        notes.append(
            f"no solution notebook {sol_path}: check cells run as the learner left them "
            "(the hidden checks still run: they live in the registry)"
        )
        return nb, notes
    sol = read(sol_path)
    for cell in sol.cells:
        if not is_test_cell(cell):
            continue
        mine = find_cell(nb, grade_id(cell))
        if mine is None:
            nb.cells.append(copy.deepcopy(cell))
            notes.append(f"check cell '{grade_id(cell)}' was missing and was put back at the end")
        else:
            mine.source = cell.source
            mine.cell_type = "code"
    for cell in nb.cells:
        if is_test_cell(cell):  # the hidden checks never enter the learner's kernel
            cell.source = _replace_regions(cell.source, BEGIN_HIDDEN, END_HIDDEN, None)[0]
        clean_cell(cell)
    return nb, notes


_TIMEOUT = "QuackEduCellTimeout"


class _Replaying:
    """What both runners share: the cells whose state the notebook built (``ok_cells``), and
    what a cell's failure costs. A subclass runs one cell (``_exec``), makes a fresh process
    (``_fresh``), says whether its process still lives (``_alive``) and what to do after a
    timeout that left it alive (``_recover``)."""

    def run(self, cell, index, skip: set[int]) -> CellEvent | None:
        ev = self._exec(cell, index)
        if ev is None:
            self.ok_cells.append(index)
        elif ev.kind == "died" or ev.poisoned_gpu() or not self._alive():
            self._restart(skip | {index})  # dead, killed, or its CUDA context unusable
        elif ev.kind == "timeout":
            self._recover(skip | {index})
        else:
            self.ok_cells.append(index)  # an error: its definitions before it still count
        return ev

    def _restart(self, skip: set[int]) -> None:
        """A fresh process, then the cells that had run are replayed (not the skipped ones)."""
        self._fresh()
        for i in list(self.ok_cells):  # replay the state the notebook had built
            if i not in skip:
                self._exec(copy.deepcopy(self.nb.cells[i]), i)


class _Runner(_Replaying):
    """Executes cells one at a time in a Jupyter kernel, surviving errors, timeouts and dead
    kernels."""

    def __init__(self, nb, env: dict, cwd: str, timeout: float):
        from nbclient import NotebookClient
        from traitlets.config import Config

        self.nb = nb
        self.timeout = timeout
        # the kernel talks to the grader over Unix sockets in a private folder, not over TCP
        # (no "running over TCP without encryption" warning; nothing listens on a port)
        self._ipc = tempfile.mkdtemp(prefix="quack_edu_kernel_")
        config = Config({"KernelManager": {"transport": "ipc", "ip": f"{self._ipc}/kernel"}})
        # On a timeout nbclient interrupts the kernel and hands back this error as the cell's
        # reply (and stops listening for the cell's output), so later cells run normally.
        self.client = NotebookClient(
            nb,
            timeout=timeout,
            kernel_name="python3",
            allow_errors=True,
            record_timing=False,
            shutdown_kernel="immediate",
            startup_timeout=120,
            interrupt_on_timeout=True,
            config=config,
            error_on_timeout={
                "ename": _TIMEOUT,
                "evalue": f"ran past {timeout:g} s",
                "traceback": [],
            },
            on_cell_error=self._on_error,
        )
        self.env, self.cwd = env, cwd
        self.ok_cells: list[int] = []
        self._reply: dict | None = None

    def _on_error(self, cell, cell_index, execute_reply):
        self._reply = execute_reply.get("content", {})

    def __enter__(self):
        self._ctx = self.client.setup_kernel(env=self.env, cwd=self.cwd)
        self._ctx.__enter__()
        return self

    def __exit__(self, *exc):
        import gc
        import logging

        # the output pollers of interrupted or killed cells end with an exception nobody
        # awaits; collect them now, quietly, instead of logging at interpreter exit
        log = logging.getLogger("asyncio")
        level = log.level
        log.setLevel(logging.CRITICAL)
        try:
            return self._ctx.__exit__(*exc)
        except Exception:
            return False
        finally:
            gc.collect()
            log.setLevel(level)
            import shutil

            shutil.rmtree(self._ipc, ignore_errors=True)

    def _exec(self, cell, index, timeout=None) -> CellEvent | None:
        from nbclient.exceptions import CellTimeoutError, DeadKernelError

        old = self.client.timeout
        if timeout is not None:
            self.client.timeout = timeout
        self._reply = None
        try:
            self.client.execute_cell(cell, index)
        except CellTimeoutError:
            return CellEvent(index, grade_id(cell), "timeout")
        except DeadKernelError as e:
            return CellEvent(index, grade_id(cell), "died", evalue=str(e))
        finally:
            self.client.timeout = old
        if self._reply and self._reply.get("ename") == _TIMEOUT:
            return CellEvent(index, grade_id(cell), "timeout")
        err = next((o for o in cell.get("outputs", []) if o.get("output_type") == "error"), None)
        if err is not None:
            return CellEvent(
                index, grade_id(cell), "error", err.get("ename", ""), str(err.get("evalue", ""))
            )
        return None

    def _fresh(self) -> None:
        """A fresh kernel (the old one is killed)."""
        c = self.client
        try:
            c._cleanup_kernel()
        except Exception:
            pass
        c.km = c.create_kernel_manager()
        c.start_new_kernel(env=self.env, cwd=self.cwd)
        c.start_new_kernel_client()

    def _alive(self) -> bool:
        return True  # a dead kernel's cell comes back as "died"

    def _responsive(self) -> bool:
        timeout = min(15.0, self.timeout)
        probe = nbformat.v4.new_code_cell("pass")
        self.nb.cells.append(probe)
        try:
            return self._exec(probe, len(self.nb.cells) - 1, timeout=timeout) is None
        finally:
            self.nb.cells.pop()

    def _recover(self, skip: set[int]) -> None:
        """After a timeout (nbclient interrupted the kernel): if it does not answer, restart."""
        try:
            if self._responsive():
                return
        except Exception:
            pass
        self._restart(skip)


class _ChildRunner(_Replaying):
    """The same interface as ``_Runner`` for machines without Jupyter (the H200 device machine):
    the cells run in a child Python (``_cellworker``), one namespace for the notebook, with the
    grading environment and the notebook's folder. A cell's Python code is interrupted after
    the timeout inside the child; what cannot be (a GPU kernel that never finishes, a cell that
    ignores the alarm) is killed with the child after a grace period, and a child that dies
    (an illegal memory access, ``os._exit``) is replaced. The new child replays the cells that
    had run, except the failed exercise's, as ``_Runner`` does with a fresh Jupyter kernel."""

    def __init__(self, nb, env: dict, cwd: str, timeout: float):
        self.nb, self.env, self.cwd, self.timeout = nb, env, cwd, timeout
        self.ok_cells: list[int] = []
        self.proc = None
        self.log = Path(env.get("CUTE_DSL_DUMP_DIR", tempfile.gettempdir())) / "cells.log"

    def __enter__(self):
        self._start()
        return self

    def __exit__(self, *exc):
        self._stop()
        return False

    def _start(self) -> None:
        import subprocess

        req_r, self._req_w = os.pipe()
        self._rep_r, rep_w = os.pipe()
        cmd = [sys.executable, "-m", "quack_edu.grading._cellworker", str(req_r), str(rep_w)]
        with open(self.log, "ab") as log:  # the child's own stdout/stderr (fd level)
            self.proc = subprocess.Popen(
                cmd,
                env=self.env,
                cwd=self.cwd,
                pass_fds=(req_r, rep_w),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        os.close(req_r)
        os.close(rep_w)
        self._requests = os.fdopen(self._req_w, "w")
        self._replies = os.fdopen(self._rep_r, "r")

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
            self.proc.kill()
            self.proc.wait()

    def _exec(self, cell, index) -> CellEvent | None:
        """Run one cell; None when it ran cleanly. Its output is kept as Jupyter would."""
        import select

        msg = {"source": cell.source, "name": f"<graded-cell-{index}>", "timeout": self.timeout}
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
            self.proc.kill()
            self.proc.wait()
            return CellEvent(index, grade_id(cell), "timeout")
        line = self._replies.readline()
        if not line:
            return self._died(cell, index)
        out = json.loads(line)
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

    def _fresh(self) -> None:
        self._stop()
        self._start()

    def _alive(self) -> bool:
        return self.proc.poll() is None  # not killed after a stuck cell, not dead

    def _recover(self, skip: set[int]) -> None:
        """The child interrupted the cell's Python code itself and lives on: nothing to do."""


def jupyter_available() -> bool:

    return all(importlib.util.find_spec(m) for m in ("nbclient", "jupyter_client", "ipykernel"))


def lesson_by_cells(nb) -> str | None:
    """The lesson whose exercise cells the notebook holds (most of them), from its cells'
    grade_ids rather than from what its metadata says."""
    counts: dict[str, int] = {}
    for ex in all_exercises():
        if find_cell(nb, ex.cell_id) is not None:
            counts[ex.lesson] = counts.get(ex.lesson, 0) + 1
    return max(sorted(counts), key=counts.get) if counts else None


def _which_lesson(nb, path: Path, expected: str | None) -> tuple[str, list[str]]:
    """The lesson to grade and the flags raised on the way (metadata that claims another
    lesson than the cells, a submission of another lesson than the one expected)."""
    flags = []
    claimed = nb.metadata.get("quack_edu", {}).get("lesson")
    cells = lesson_by_cells(nb)
    if claimed and cells and claimed != cells:
        flags.append(
            f"the notebook's metadata says lesson {claimed!r} but its exercise cells are "
            f"lesson {cells!r}'s"
        )
    lesson = expected or cells or lesson_of(nb, path)
    if expected and cells and cells != expected:
        flags.append(f"the exercise cells are lesson {cells!r}'s, not {expected!r}'s")
    return lesson, flags


def grade_notebook(
    path,
    *,
    solutions: Path | str | None = None,
    timeout: float = 120,
    seed: int | None = None,
    hidden: bool = True,
    executed_dir: Path | str | None = None,
    lesson: str | None = None,
    only: str | None = None,
    run_notebook: bool = True,
) -> NotebookResult:
    """Execute a notebook headless and grade every exercise of its lesson (or ``lesson``).

    The notebook runs in a fresh kernel for its cell errors, hangs and crashes; each exercise
    is judged by ``judge.judge_exercise`` on its answer cell's source, outside that kernel.
    ``only``: one exercise id, judged without running the notebook (fast feedback).
    """
    from .._env import MODE
    from .judge import judge_exercise

    t0 = time.time()
    path = Path(path)
    seed = secrets.randbits(31) if seed is None else int(seed)
    solutions = Path(solutions) if solutions else solutions_dir()
    mode = "gpu" if MODE.gpu else "compile-only"
    try:
        nb = read(path)
    except Exception as e:
        res = NotebookResult(str(path), lesson or path.stem, mode=mode)
        res.problems.append(f"cannot read the notebook: {type(e).__name__}: {e}")
        return res
    lesson, flags = _which_lesson(nb, path, lesson)
    position = {grade_id(c): i for i, c in enumerate(nb.cells) if grade_id(c)}
    exercises = sorted(all_exercises(lesson), key=lambda e: position.get(e.cell_id, 10**9))
    if only:
        exercises = [e for e in exercises if e.id == only]
        run_notebook = False
    res = NotebookResult(str(path), lesson, mode=mode)
    res.flags += flags
    if not exercises:
        res.problems.append(
            f"no exercise {only!r} in lesson {lesson!r}"
            if only
            else f"no exercises are registered for lesson {lesson!r}"
        )
    sources = {
        ex.id: (find_cell(nb, ex.cell_id).source if find_cell(nb, ex.cell_id) else None)
        for ex in exercises
    }
    events: dict[str, list[CellEvent]] = {ex.id: [] for ex in exercises}
    if run_notebook:
        _run_cells(nb, path, lesson, solutions, exercises, events, res, timeout, executed_dir)
    for ex in exercises:
        forced = any(e.kind in ("timeout", "died") for e in events[ex.id]) or any(
            e.kind == "error" and e.grade_id == ex.cell_id for e in events[ex.id]
        )
        judged = None
        if not forced:
            judged = judge_exercise(
                ex, sources[ex.id], hidden=hidden, seed=seed, gpu=MODE.gpu, timeout=timeout
            )
        res.exercises.append(_final_result(ex, judged, events[ex.id], timeout, mode))
    res.seconds = time.time() - t0
    return res


def _run_cells(nb, path, lesson, solutions, exercises, events, res, timeout, executed_dir):
    """Run the notebook's cells in a fresh kernel; its cell errors, timeouts and crashes go to
    ``events`` (by exercise) or ``res.problems``."""
    nb, notes = _prepare(nb, lesson, solutions)
    res.problems += notes
    by_cell = {}
    for ex in exercises:
        by_cell[ex.cell_id] = ex.id
        by_cell[ex.test_cell_id] = ex.id
    with tempfile.TemporaryDirectory(prefix="quack_edu_grade_") as tmp:
        env = _kernel_env()
        env.setdefault("CUTE_DSL_DUMP_DIR", tmp)
        try:
            runner_cls = _Runner if jupyter_available() else _ChildRunner
            with runner_cls(nb, env, str(path.parent.resolve()), timeout) as runner:
                failed_cells: set[int] = set()
                for i, cell in enumerate(nb.cells):
                    if cell.cell_type != "code" or not cell.source.strip():
                        continue
                    ev = runner.run(cell, i, failed_cells)
                    if ev is None:
                        continue
                    ex_id = by_cell.get(ev.grade_id or "")
                    if ex_id:
                        events[ex_id].append(ev)
                        if ev.kind in ("timeout", "died"):
                            # do not replay this exercise's cells after a restart
                            failed_cells |= {
                                j
                                for j, c in enumerate(nb.cells)
                                if by_cell.get(grade_id(c) or "") == ex_id
                            }
                    else:
                        res.problems.append(ev.describe(timeout))
                        if ev.kind in ("timeout", "died"):
                            failed_cells.add(i)
        except Exception as e:  # the kernel could not start, or nbclient itself failed
            res.problems.append(f"the grader could not run the notebook: {type(e).__name__}: {e}")
        if executed_dir:
            write(nb, Path(executed_dir) / path.name)


def _final_result(
    ex: Exercise, judged: ExerciseResult | None, events: list[CellEvent], timeout, mode
) -> ExerciseResult:
    from . import hints

    r = judged or ExerciseResult(ex.id, ex.title, ex.lesson, dict(ex.points), mode=mode)
    r.points = dict(ex.points)  # the registry, not the notebook, decides the points
    hard = [e for e in events if e.kind in ("timeout", "died")]
    answer_errors = [e for e in events if e.kind == "error" and e.grade_id == ex.cell_id]
    if hard:
        e = hard[0]
        r.forced_status = FAIL
        hint = (ex.timeout_hint or hints.TIMEOUT) if e.kind == "timeout" else hints.DIED
        r.forced_message = f"{e.describe(timeout)}. hint: {hint}"
    elif answer_errors:
        e = answer_errors[0]
        if e.ename == "NotImplementedError":
            r.forced_status = NOT_ATTEMPTED
            r.forced_message = "not attempted: the exercise cell raises NotImplementedError"
        else:
            r.forced_status = FAIL
            r.forced_message = f"the exercise cell must run cleanly: {e.describe(timeout)}"
    elif judged is None:
        r.forced_status = FAIL
        why = "; ".join(e.describe(timeout) for e in events) or "no result came back"
        r.forced_message = f"not graded: {why}"
    for e in events:
        if e.kind == "error" and e.grade_id != ex.cell_id and e.grade_id and judged is not None:
            r.notes.append(e.describe(timeout))
    return r


def grade_paths(paths, **kwargs) -> RunResult:
    from .._env import MODE

    seed = kwargs.pop("seed", None)
    seed = secrets.randbits(31) if seed is None else seed
    hidden = kwargs.get("hidden", True)
    results = [grade_notebook(p, seed=seed, **kwargs) for p in paths]
    return RunResult(results, "gpu" if MODE.gpu else "compile-only", MODE.reason, hidden, seed)
