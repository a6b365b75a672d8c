"""Execute a notebook's code cells in this process, without Jupyter.

For machines that have no Jupyter kernel (the H200 device machine has torch and CuTe DSL but no
IPython). Each cell's source is registered with ``linecache`` under a name of its own before it
runs, as IPython does, so that CuTe DSL can read the source of a ``@cute.jit``/``@cute.kernel``
defined in a cell. Cells run in one shared namespace, in order, each with a timeout; a failing
cell is recorded and the run goes on. IPython magics (``%...``, ``!...``) are skipped; the
notebooks avoid them. ``display`` prints, and matplotlib draws off-screen.

    python -m quack_edu.lessons.nbexec solutions/01_naive.ipynb [--timeout 300]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import linecache
import signal
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path


class CellTimeout(Exception):
    pass


@dataclass
class CellResult:
    index: int
    ok: bool
    seconds: float
    stdout: str = ""
    error: str = ""


@dataclass
class NotebookRun:
    path: str
    cells: list[CellResult] = field(default_factory=list)
    namespace: dict = field(default_factory=dict, repr=False)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.cells)

    @property
    def failures(self) -> list[CellResult]:
        return [c for c in self.cells if not c.ok]


def _strip_magics(source: str) -> str:
    keep = []
    for line in source.splitlines():
        s = line.lstrip()
        keep.append("" if s.startswith(("%", "!")) else line)
    return "\n".join(keep)


def _display(*objs, **_):
    for o in objs:
        print(o)


@dataclass
class CellOutcome:
    ok: bool
    seconds: float
    stdout: str = ""
    error: str = ""  # the traceback's last lines
    ename: str = ""
    evalue: str = ""
    timed_out: bool = False


def exec_cell(source: str, name: str, ns: dict, timeout: float | None = None) -> CellOutcome:
    """Run one cell's source in ``ns``, registered with linecache under ``name``.

    ``timeout`` (seconds, main thread only) interrupts Python code that runs too long; it cannot
    interrupt a call blocked inside a C extension (a GPU kernel that never finishes).
    """
    src = _strip_magics(source)
    linecache.cache[name] = (len(src), None, [ln + "\n" for ln in src.splitlines()], name)
    buf = io.StringIO()
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


def run_notebook(
    path, timeout: float = 300, namespace: dict | None = None, echo=False
) -> NotebookRun:
    import matplotlib

    matplotlib.use("Agg")
    nb = json.loads(Path(path).read_text())
    ns = namespace if namespace is not None else {}
    ns.setdefault("__name__", "__main__")
    ns.setdefault("display", _display)
    run = NotebookRun(str(path), namespace=ns)
    for i, cell in enumerate(c for c in nb["cells"] if c["cell_type"] == "code"):
        src = cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
        out = exec_cell(src, f"<cell-{Path(path).stem}-{i}>", ns, timeout)
        res = CellResult(i, out.ok, out.seconds, out.stdout, out.error)
        run.cells.append(res)
        if echo:
            status = "ok " if res.ok else "ERR"
            print(f"  [{status}] cell {i:2d} {res.seconds:6.1f} s", flush=True)
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
