"""Run a notebook's code cells without Jupyter, and say which failed.

For machines that have no Jupyter kernel (the H200 device machine has torch and CuTe DSL but no
IPython). The cells run as the grader runs them there (``grading.executor``: a child Python,
one namespace, in order, each with a timeout; a failing cell is recorded and the run goes on; a
cell that hangs past the interrupt or kills its process costs that process, which is replaced
and the cells before replayed). IPython magics (``%...``, ``!...``) are skipped; the notebooks
avoid them. ``display`` prints, and matplotlib draws off-screen.

    python -m quack_edu.lessons.nbexec solutions/01_naive.ipynb [--timeout 300]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class CellResult:
    index: int  # in the notebook, as tracebacks (<cell-stem-N>) and errors name it
    ok: bool
    seconds: float
    stdout: str = ""
    error: str = ""


@dataclass
class NotebookRun:
    path: str
    cells: list[CellResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.cells)

    @property
    def failures(self) -> list[CellResult]:
        return [c for c in self.cells if not c.ok]


def _result(index: int, cell, ran, timeout: float) -> CellResult:
    """A code cell's result, from its run and the outputs the engine put on it."""
    outputs = cell.get("outputs", []) if cell.source.strip() else []  # a blank cell is not run
    stdout = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
    if ran.event is None:
        return CellResult(index, True, ran.seconds, stdout)
    err = next((o for o in outputs if o.get("output_type") == "error"), None)
    error = "\n".join(err["traceback"]) if err else ran.event.describe(timeout)
    return CellResult(index, False, ran.seconds, stdout, error)


def run_notebook(path, timeout: float = 300, echo=False) -> NotebookRun:
    """Run the notebook at ``path`` in a child Python whose working directory is this one's."""
    from ..grading.executor import ChildEngine, Executor, child_env
    from ..grading.nbfiles import read

    nb = read(path)  # each cell's outputs: what this run prints (the engine clears the file's)
    run = NotebookRun(str(path))
    engine = ChildEngine(child_env(), os.getcwd(), timeout, label=f"cell-{Path(path).stem}")
    with engine:
        for ran in Executor(nb, engine).run():
            res = _result(ran.index, nb.cells[ran.index], ran, timeout)
            run.cells.append(res)
            if echo:
                status = "ok " if res.ok else "ERR"
                print(f"  [{status}] cell {res.index:2d} {res.seconds:6.1f} s", flush=True)
                if not res.ok:
                    print("    " + res.error.strip().replace("\n", "\n    "), flush=True)
    return run


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("notebooks", nargs="+")
    p.add_argument("--timeout", type=float, default=300, help="seconds per cell")
    a = p.parse_args(argv)
    bad = 0
    for path in a.notebooks:
        print(f"{path}:", flush=True)
        t = time.time()
        run = run_notebook(path, a.timeout, echo=True)
        print(
            f"  {len(run.cells) - len(run.failures)}/{len(run.cells)} cells ok in "
            f"{time.time() - t:.0f} s",
            flush=True,
        )
        bad += not run.ok
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
