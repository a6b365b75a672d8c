"""``check``: a lesson's pass/fail table, judged by a grader process outside the notebook.

    from quack_edu.lessons import check
    check("02.warp_reduce", warp_reduce_sum)              # prints the table, returns the result
    check("02.warp_reduce", warp_reduce_sum, hidden=True)  # + hidden checks; raises unless passed

The notebook's process holds none of the grader: no exercise (reference answers, hidden checks,
mutants), no check, no registry, no judge. ``check`` imports nothing of ``quack_edu.grading``; it
starts the grader's ``_checkserver`` once (``python -m quack_edu.grading._checkserver``), keeps
it for the session and sends it, as JSON lines, what defines the answer:

- a function or class defined in a notebook cell: the cell's text (IPython registers each cell
  in ``linecache`` under the ``co_filename`` of what it defines); in a file: the file's text.
  The server judges it as ``quack-edu grade`` judges the answer cell: screened, run in a
  locked-down worker, every verdict computed in the server. So a cell judged here must stand
  on its own, as it must for the grade (it may use the lesson's first imports, nothing else
  the notebook defined);
- anything else: its data (``encode``: numbers, strings, lists, dicts, dtypes, tensors' bytes,
  in ``grading.wire``'s form, decoded and checked in the server). Every exercise asks for a
  function today, so a value fails there with the hint to pass the function.

The first call waits for the server to import torch, the DSL and the library (``start`` begins
that early); later calls reuse it. While ``quack-edu grade`` runs the notebook,
``check`` only prints a line: the grader judges each answer cell itself.

``check`` remembers, in this process, the exercises whose answer passed (``passed``): a lesson
shows the library's version of an answer only after the learner's own passed
(``show.show_kernel(..., after=exercise_id)``; never while ``quack-edu grade`` runs it).

Timeouts (seconds, from the environment): ``QUACK_EDU_CHECK_START_TIMEOUT`` (300) for the server
to be ready, ``QUACK_EDU_CHECK_TIMEOUT`` (900) for one check. Past either, or if the server dies,
``check`` raises ``GraderUnavailable`` with the end of the server's log, and the next call
starts a fresh server.
"""

from __future__ import annotations

import atexit
import functools
import json
import linecache
import os
import re
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

#: the environment variable ``quack-edu grade`` sets in the notebooks it runs (the same name as
#: ``quack_edu.grading.ENV_GRADING``; a test keeps them equal)
ENV_GRADING = "QUACK_EDU_GRADING"
SERVER_MODULE = "quack_edu.grading._checkserver"
START_TIMEOUT = float(os.environ.get("QUACK_EDU_CHECK_START_TIMEOUT", 300))
CHECK_TIMEOUT = float(os.environ.get("QUACK_EDU_CHECK_TIMEOUT", 900))
_MISSING = object()


class GraderUnavailable(RuntimeError):
    """The grader's process could not start, died, or ran past its timeout."""


@dataclass
class Result:
    """What the grader judged: ``ExerciseResult``'s data (``record``) and its text."""

    id: str
    status: str
    score: int
    max_score: int
    failures: list[str]
    record: dict = field(repr=False)
    text: str = field(repr=False, default="")
    summary_text: str = field(repr=False, default="")

    @property
    def passed(self) -> bool:
        return self.status == "pass"

    @property
    def flagged(self) -> bool:
        return bool(self.record.get("flagged"))

    @property
    def checks(self) -> list[dict]:
        return list(self.record.get("checks", []))

    def table(self) -> str:
        return self.text

    def summary(self) -> str:
        return self.summary_text

    def to_json(self) -> dict:
        return dict(self.record)

    def __repr__(self) -> str:
        return f"<{self.summary_text}>"


# ---- the answer, as the server is sent it ----------------------------------------------------
def _code_of(obj):
    """The code object of what defines ``obj``: a function's own (through decorators'
    ``__wrapped__``), a method's, or a class's first method defined in its body."""
    seen = 0
    while hasattr(obj, "__wrapped__") and seen < 16:  # @cute.jit, functools.wraps
        obj, seen = obj.__wrapped__, seen + 1
    obj = getattr(obj, "__func__", obj)  # a bound method
    if isinstance(obj, functools.partial):
        obj = obj.func
    if isinstance(obj, type):
        for v in vars(obj).values():
            v = getattr(v, "__func__", getattr(v, "fget", v))
            code = getattr(v, "__code__", None)
            if code is not None:
                return code
        return None
    return getattr(obj, "__code__", None)


def answer_source(obj) -> str | None:
    """The text of the notebook cell or file that defines ``obj`` (None: no such text)."""
    code = _code_of(obj)
    if code is None:
        return None
    lines = linecache.getlines(code.co_filename)
    return "".join(lines) if lines else None


#: the library's own files: an answer defined there is not the learner's
_PACKAGE = Path(__file__).resolve().parents[1]


def library_file(obj) -> str | None:
    """Where in the library ``obj`` is defined, ``quack_edu/host/forward.py`` (None: in a
    notebook cell or a file of the learner's): an answer that is the library's own function
    (``rmsnorm_fwd_fake = forward._fwd_fake``) is not judged as if the library's file were the
    answer cell."""
    code = _code_of(obj)
    if code is None:
        return None
    try:
        path = Path(code.co_filename).resolve()
    except (OSError, ValueError):
        return None
    if not path.is_relative_to(_PACKAGE):
        return None
    return f"{_PACKAGE.name}/{path.relative_to(_PACKAGE).as_posix()}"


def stale_definition(answer) -> str | None:
    """Where ``answer`` is a function and the notebook's latest cell defining its name is not
    the cell it came from (that cell raised before its ``def`` ran: a SyntaxError, say), the
    line that says so; None where they agree, or outside IPython. Otherwise ``check`` would
    judge the version defined before (a cold learner's 2/2 for a cell that no longer ran)."""
    shell = getattr(sys.modules.get("IPython"), "get_ipython", lambda: None)()
    name = str(getattr(answer, "__name__", "") or "")
    text = answer_source(answer) if callable(answer) else None
    if shell is None or not name.isidentifier() or text is None:
        return None
    defines = re.compile(rf"^\s*def\s+{name}\s*\(", re.M)
    cells = [c for c in shell.user_ns.get("In", ()) if isinstance(c, str) and defines.search(c)]
    if not cells or "".join(cells[-1].split()) == "".join(text.split()):
        return None
    return (
        f"not checked: your latest cell that defines `{name}` stopped before its def ran (a "
        f"SyntaxError, or an error above it), so `{name}` is still the version from before. "
        "Fix that cell, run it, then check again."
    )


def encode(v, _depth: int = 0):
    """``v``'s data in ``grading.wire``'s form (JSON with typed leaves); TypeError if it is not
    plain data. Written here so that this process imports nothing of the grader."""
    if _depth > 32:
        raise TypeError("nested too deep")
    if v is None or type(v) in (str, bool):
        return v
    if isinstance(v, bool):
        return bool(v)
    if isinstance(v, int):
        return {"t": "int", "v": str(int.__index__(v))}
    if isinstance(v, float):
        return {"t": "float", "v": float.hex(float.__float__(v))}
    if isinstance(v, str):
        return str.__str__(v)
    if isinstance(v, list | tuple):
        kind = "tuple" if isinstance(v, tuple) else "list"
        return {"t": kind, "v": [encode(x, _depth + 1) for x in v]}
    if isinstance(v, dict) and all(type(k) is str for k in v):
        return {"t": "dict", "v": {k: encode(x, _depth + 1) for k, x in v.items()}}
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(v, torch.Tensor):
        import base64

        t = torch.Tensor.as_subclass(v.detach().to("cpu").contiguous(), torch.Tensor)
        raw = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
        return {
            "t": "tensor",
            "dtype": str(t.dtype).removeprefix("torch."),
            "shape": list(t.shape),
            "device": v.device.type,
            "data": base64.b64encode(raw).decode(),
        }
    if torch is not None and isinstance(v, torch.dtype):
        return {"t": "dtype", "v": str(v).removeprefix("torch.")}
    import numbers

    if isinstance(v, numbers.Integral):
        return encode(int(v), _depth + 1)
    if isinstance(v, numbers.Real):
        return encode(float(v), _depth + 1)
    raise TypeError(f"{type(v).__module__}.{type(v).__qualname__}")


def request(exercise_id: str, answer=_MISSING, *, hidden=False, seed=None) -> dict:
    """The JSON request that sends ``answer`` to the grader (see the module's doc)."""
    req = {"exercise": str(exercise_id), "hidden": bool(hidden), "seed": seed}
    if answer is _MISSING or answer is None:
        req["missing"] = True
        return req
    library = library_file(answer) if callable(answer) else None
    if library is not None:
        req["library"] = library
        req["name"] = str(getattr(answer, "__qualname__", "") or "")
        return req
    source = answer_source(answer) if callable(answer) else None
    if source is not None:
        req["source"] = source
        req["name"] = str(getattr(answer, "__name__", "") or "")
        return req
    try:
        req["value"] = encode(answer)
    except TypeError as e:
        req["unencodable"] = str(e)
    return req


# ---- the server -------------------------------------------------------------------------------
def server_argv() -> list[str]:
    """The grader's command line: this Python, the server module."""
    return [sys.executable, "-m", SERVER_MODULE]


class _Server:
    """The grader's process, started once and kept (``start``, ``ask``)."""

    def __init__(self):
        import subprocess
        import tempfile

        root = str(Path(__file__).resolve().parents[2])  # this copy of quack_edu, not another
        env = {k: v for k, v in os.environ.items() if not k.startswith("QUACK_EDU_GRAD")}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
        env.setdefault("MPLBACKEND", "Agg")
        self.log = tempfile.NamedTemporaryFile(  # noqa: SIM115  (kept open while it runs)
            prefix="quack_edu_check_", suffix=".log", delete=False
        )
        try:
            self.proc = subprocess.Popen(
                server_argv(),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self.log,
                env=env,
                cwd=tempfile.gettempdir(),  # the DSL may write files where it runs
                start_new_session=True,  # a group of its own: ``stop`` ends it with its children
            )
        except OSError as e:
            self.log.close()
            raise GraderUnavailable(
                f"could not start the grader's process ({sys.executable} -m {SERVER_MODULE}): {e}"
            ) from e
        self.buf = b""
        self.ready: dict | None = None
        self.started = time.monotonic()
        self.next_id = 0

    def alive(self) -> bool:
        return self.proc.poll() is None

    def _line(self, deadline: float, doing: str, limit: str) -> dict:
        """The server's next reply; GraderUnavailable if it exits or ``deadline`` passes."""
        import select

        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buf:
            # what it already sent counts however late it is read (a notebook that started
            # the server long before its first check): the deadline is for an answer not sent
            left = deadline - time.monotonic()
            ready, _, _ = select.select([fd], [], [], min(max(left, 0.0), 1.0))
            if not ready:
                if left <= 0:
                    self.stop()
                    raise GraderUnavailable(
                        f"the grader's process did not answer while {doing} within {limit}; "
                        f"it was stopped (the next check starts a fresh one){self.tail()}"
                    )
                continue
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                try:
                    code = self.proc.wait(5)
                except Exception:  # noqa: BLE001  (closed its output but still running)
                    code = "unknown"
                raise GraderUnavailable(
                    f"the grader's process exited (code {code}) while {doing}{self.tail()}"
                )
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        return json.loads(line)

    def wait_ready(self) -> dict:
        if self.ready is None:
            limit = f"{START_TIMEOUT:g} s (QUACK_EDU_CHECK_START_TIMEOUT)"
            self.ready = self._line(self.started + START_TIMEOUT, "starting", limit)
        return self.ready

    def ask(self, req: dict) -> dict:
        self.wait_ready()
        self.next_id += 1
        req = {**req, "id": self.next_id}
        doing = f"checking {req.get('exercise')}"
        try:
            self.proc.stdin.write((json.dumps(req) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            self._line(time.monotonic() + 5, doing, "5 s")  # reports the exit
        deadline = time.monotonic() + CHECK_TIMEOUT
        limit = f"{CHECK_TIMEOUT:g} s (QUACK_EDU_CHECK_TIMEOUT)"
        while True:
            reply = self._line(deadline, doing, limit)
            if reply.get("id") == self.next_id:
                return reply

    def tail(self, lines: int = 12) -> str:
        try:
            text = Path(self.log.name).read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        text = text[-lines:]
        return (f". Its log ({self.log.name}) ends:\n    " + "\n    ".join(text)) if text else ""

    def stop(self) -> None:
        import signal

        if self.alive():
            try:
                self.proc.stdin.close()
            except OSError:
                pass
            try:
                self.proc.wait(2)
            except Exception:  # noqa: BLE001
                try:
                    os.killpg(self.proc.pid, signal.SIGTERM)  # the judge server goes with it
                    self.proc.wait(5)
                except Exception:  # noqa: BLE001
                    try:
                        os.killpg(self.proc.pid, signal.SIGKILL)
                    except OSError:
                        pass
        self.log.close()


_lock = threading.Lock()
_server: _Server | None = None
#: the exercises whose answer ``check`` saw pass in this process
_passed: set[str] = set()


def grading() -> bool:
    """True inside a notebook that ``quack-edu grade`` is running."""
    return os.environ.get(ENV_GRADING) == "1"


def passed(exercise_id: str) -> bool:
    """Whether an answer to ``exercise_id`` passed its ``check`` in this process (a notebook
    session); never while ``quack-edu grade`` runs the notebook."""
    return not grading() and str(exercise_id) in _passed


def start() -> None:
    """Start the grader's process now, without waiting for it (the first check then waits less).
    Does nothing while ``quack-edu grade`` runs the notebook, or if it is already running."""
    global _server
    if grading():
        return
    with _lock:
        if _server is None or not _server.alive():
            if _server is not None:
                _server.stop()
            try:
                _server = _Server()
            except GraderUnavailable:
                _server = None  # the first check says why


def stop() -> None:
    """Stop the grader's process (the next check starts another)."""
    global _server
    with _lock:
        if _server is not None:
            _server.stop()
            _server = None


atexit.register(stop)


def _ask(req: dict) -> dict:
    global _server
    with _lock:
        if _server is None or not _server.alive():
            if _server is not None:
                _server.stop()
            _server = _Server()
        server = _server
        try:
            return server.ask(req)
        except GraderUnavailable:
            server.stop()
            _server = None
            raise
        except ValueError as e:  # a line that is not JSON: the protocol is broken
            server.stop()
            _server = None
            raise GraderUnavailable(f"the grader's reply was not data ({e}){server.tail()}") from e


def check(
    exercise_id: str,
    answer=_MISSING,
    *,
    hidden: bool = False,
    quiet: bool = False,
    seed: int | None = None,
) -> Result | None:
    """Check an answer: print a pass/fail table (what was expected, what was seen, a hint).

    ``hidden=True`` adds the hidden checks (more shapes, a fresh seed) and raises AssertionError
    unless every check that can run here passes. The answer is judged by the grader's process,
    outside this notebook (see the module's doc); while ``quack-edu grade`` runs the notebook it
    does nothing but print a line. A pass is remembered for the session (``passed``).
    """
    if grading():  # the grader judges the answer cell itself, outside this notebook
        if not quiet:
            print(f"{exercise_id}: judged by the grader, outside this notebook")
        return None
    stale = stale_definition(answer) if answer is not _MISSING else None
    if stale:
        print(f"{exercise_id}: {stale}")
        return None
    reply = _ask(request(exercise_id, answer, hidden=hidden, seed=seed))
    if not reply.get("ok"):
        kind = {"KeyError": KeyError, "ValueError": ValueError, "TypeError": TypeError}
        raise kind.get(reply.get("type"), RuntimeError)(reply.get("error", "the grader failed"))
    rec = reply["result"]
    res = Result(
        rec["id"],
        rec["status"],
        rec["score"],
        rec["max_score"],
        list(rec.get("failures", [])),
        rec,
        reply.get("table", ""),
        reply.get("summary", ""),
    )
    if res.passed:
        _passed.add(str(exercise_id))
    if not quiet:
        print(res.table())
    if hidden and res.status not in ("pass", "skip"):
        raise AssertionError(f"{res.summary()}: {'; '.join(res.failures)[:2000]}")
    return res
