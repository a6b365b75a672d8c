"""Judging an answer outside the learner's process: the grader's side of the boundary.

``quack-edu grade`` runs a learner's notebook (to report its cell errors, hangs and crashes),
but what an exercise scores is decided here, in the grader's own process, which never runs the
learner's code:

1. The answer cell's source is screened (``answer_screen.screen``): a cell that names the
   grader, the process, the file system or the library's own implementation of the piece is
   flagged and scores 0, unjudged. The screen only gives an early, clear message; the boundary
   below does not rely on it.
2. The source is loaded into a worker (``worker.main``): a fork of a judge server that imported
   torch, CuTe DSL and the library, never the exercises or the solutions. The worker sets its
   tripwires, locks itself down (``sandbox``) in a session of its own that ``Worker.close``
   kills whole, and loads the cell.
3. The exercise's checks run here. Where a check calls the answer, compiles it into a stage
   kernel or launches that kernel, the worker does that one thing on inputs made here from the
   grading seed and sends back plain data (``wire``: numbers, arrays, PTX text, register
   counts, as JSON, never pickled back); the comparison with the reference happens here. What
   the sandbox refused, and the tripwires the answer reached, come back with every reply: any
   of them flags the exercise.
4. No check runs in the worker, and no verdict comes from it: a check that needs more than a
   call, a compile or a launch asks a probe (``Context.probe``, ``probes``): a function run
   where the answer lives that returns data.

A worker that runs past the time limit is killed; one that dies (``os._exit``, a fault) is
reported as a crash; neither stops the grader.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import sys
import tempfile
import time
from pathlib import Path

from . import answer_key, deadline, hints, record
from .answer_screen import screen
from .context import Context
from .deadline import CHECK_CPU_S, MAX_REPLY, SIMILARITY_CPU_S, TooSlow, cpu_bound, killed_after
from .registry import MISSING, Check, CheckFailed, Exercise
from .report import FAIL, NOT_ATTEMPTED, ExerciseResult, shown_text
from .runner import run_exercise
from .similarity import copied_at_run_time, copied_from_library
from .wire import Unencodable, decode, encode  # noqa: F401  (the judge's codec, re-exported)


def _plain_args(v, _depth=0) -> bool:
    """Whether ``v`` is data the grader may send (not a DSL value met while tracing)."""
    import torch

    if _depth > 16:
        return False
    if _depth == 0 and torch._C._len_torch_dispatch_stack():
        return False  # a check is watching torch's dispatch (counting kernels): trace it
    if type(v) is torch.Tensor:
        return v.device.type in ("cpu", "cuda")  # not meta tensors, not subclasses
    if v is None or type(v) in (bool, int, float, str) or isinstance(v, torch.dtype):
        return True
    if isinstance(v, list | tuple):
        return all(_plain_args(x, _depth + 1) for x in v)
    if isinstance(v, dict):
        return all(_plain_args(x, _depth + 1) for x in v.values())
    if isinstance(v, type) and (v.__module__ or "").startswith("cutlass"):
        return True  # a DSL numeric type (Float32, BFloat16): sent by reference
    return False


def hole_ref(hole):
    """(module, name) of a module-level KernelHole, so the worker can find the same object."""
    for name, mod in list(sys.modules.items()):
        if not name.startswith("quack_edu.grading") or mod is None:
            continue
        for k, v in vars(mod).items():
            if v is hole:
                return (name, k)
    return None


# ---- the grader's side ------------------------------------------------------------------------
class JudgeAbort(BaseException):
    """The worker ran past the time limit or died: the exercise fails with ``message``.
    A BaseException, so that a check's ``except Exception`` does not take it for the learner's
    error."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind, self.message = kind, message


class NeedsTrace(BaseException):
    """A check handed the answer something only a live DSL trace has (a DSL value)."""


class LearnerError(Exception):
    """An exception raised by the learner's code in the worker, rebuilt from its text."""


def _rebuild(reply: dict) -> BaseException:
    if reply.get("not_implemented"):
        return NotImplementedError(reply.get("evalue", ""))
    name = str(reply.get("raised", "Error"))
    cls = type(name if name.isidentifier() else "Error", (LearnerError,), {})
    e = cls(str(reply.get("evalue", "")))
    if reply.get("cause"):
        cname, _, cval = str(reply["cause"]).partition(": ")
        ccls = type(cname if cname.isidentifier() else "Error", (LearnerError,), {})
        e.__cause__ = ccls(cval)
    return e


class Server:
    """The grader's handle on its judge server (``_judgeserver``), started on first use."""

    _lock = None
    _proc = None
    _ctl = None
    _isolated = None  # the isolation the running server was started with (``isolate.mode``)
    #: under isolation: the folder its workers' scratch folders are made in (its view's own)
    box: str | None = None
    #: more paths its isolated view leaves empty (a class's submissions and gradebook)
    hidden: tuple = ()

    @classmethod
    def start(cls) -> None:
        """Start the server now (it imports while the grader does other work)."""
        import threading

        if cls._lock is None:
            cls._lock = threading.Lock()
        with cls._lock:
            cls._start()

    @classmethod
    def _start(cls) -> None:
        import atexit
        import shutil
        import socket
        import subprocess

        from . import isolate

        if cls._proc is not None and cls._proc.poll() is None and cls._isolated != isolate.mode():
            cls._proc.kill()  # (started under another isolation)
            cls._proc.wait()
        if cls._proc is None or cls._proc.poll() is not None:
            mine, theirs = socket.socketpair()
            env = {k: v for k, v in os.environ.items() if not k.startswith("QUACK_EDU_GRAD")}
            root = str(Path(__file__).resolve().parents[2])
            env["PYTHONPATH"] = root + (
                os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""
            )
            env.setdefault("MPLBACKEND", "Agg")
            # on a GPU each worker imports the DSL and quack_edu itself: a process that forks
            # must not have initialised CUDA, and quack_edu's GPU detection does
            from .. import MODE

            env.setdefault("QUACK_EDU_JUDGE_PRELOAD", "dsl" if MODE.gpu else "all")
            server = str(Path(__file__).with_name("_judgeserver.py"))  # a file: see its doc
            cmd = [sys.executable, server, str(theirs.fileno())]
            cls._isolated = isolate.mode()
            if cls._isolated != "none":
                if cls.box is None:
                    cls.box = tempfile.mkdtemp(prefix="quack_edu_judgebox_")
                    atexit.register(shutil.rmtree, cls.box, True)
                cmd = isolate.wrap(cmd, env=env, writable=[cls.box],
                                   hidden=secret_paths(cls.hidden))  # fmt: skip
            cls._proc = subprocess.Popen(
                cmd,
                pass_fds=(theirs.fileno(),),
                env=env,
                cwd=tempfile.gettempdir(),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                # a maintainer's view of what a worker printed as it died
                stderr=None if os.environ.get("QUACK_EDU_JUDGE_STDERR") else subprocess.DEVNULL,
            )
            theirs.close()
            cls._ctl = mine
            cls._ctl_file = mine.makefile("r")

    @classmethod
    def fork(cls):
        """A new worker: (its pid, the grader's end of its connection, the grader's end of its
        record: ``record.Record``)."""
        import socket
        import threading
        from multiprocessing.connection import Connection

        from . import isolate

        if cls._lock is None:
            cls._lock = threading.Lock()
        with cls._lock:
            cls._start()
            a, b = socket.socketpair()
            isolate.pass_credentials(a)
            rec, theirs = record.pair()
            socket.send_fds(cls._ctl, [b"fork"], [b.fileno(), theirs.fileno()])
            b.close()
            theirs.close()
            line = cls._ctl_file.readline()
            if not line:
                cls._proc = None
                raise JudgeAbort("died", "the grader's judge server did not start")
            # the worker's first byte: its pid as this process numbers it (under isolation the
            # server's is its own namespace's, another process's here)
            ours = isolate.sender_pid(a)
            pid = ours if cls._isolated != "none" else int(json.loads(line)["pid"])
        return pid, Connection(a.detach()), record.Record(rec)


def _git_dirs(root: Path) -> list[Path]:
    """The git folders of a checkout at ``root``: ``.git``, and where ``.git`` is a file (a
    worktree, a submodule) the folders it points to (its own and the repository's shared one)."""
    dot = root / ".git"
    if dot.is_dir():
        return [dot]
    if not dot.is_file():
        return []
    out = [dot]
    text = dot.read_text(errors="replace").strip()
    if text.startswith("gitdir:"):
        gitdir = (root / text.removeprefix("gitdir:").strip()).resolve()
        out.append(gitdir)
        common = gitdir / "commondir"
        if common.is_file():
            out.append((gitdir / common.read_text().strip()).resolve())
    return out


#: a checkout's folders that hold or name its tests (red team 12 read .pytest_cache's list), .gpu
TEST_DIRS = ("tests", "scripts", ".ci", ".pytest_cache", ".ruff_cache", ".hypothesis", ".gpu")


def secret_paths(extra=()) -> list[str]:
    """What no learner process may read: the exercises (reference answers, hidden checks,
    mutants), the solutions, other judging runs' folders, and ``extra`` (a class's
    submissions, the gradebook)."""
    from . import exercises
    from .nbfiles import repo_root, solutions_dir

    root = repo_root()
    return [
        str(Path(exercises.__file__).parent),
        str(solutions_dir()),
        # a checkout's history (every solution and check), its tests, scripts and peers' wheels
        *map(str, _git_dirs(root)),
        *(str(root / d) for d in TEST_DIRS if (root / d).is_dir()),
        # other judging runs' folders (another submission's cells and answers)
        str(Path(tempfile.gettempdir()) / "quack_edu_*"),
        *map(str, extra),
    ]


def instructor_paths(solutions=None, executed=None) -> list[str]:
    """The folders a run was pointed at that no learner process may read either: ``--solutions``
    wherever it lies (``secret_paths`` names only the repository's own), and ``--executed``,
    where the graded notebooks are kept with their answers (made now, so that it is hidden
    from the start). Red team 11 read both from a later notebook."""
    out = []
    if solutions:
        out.append(str(Path(solutions).resolve()))
    if executed:
        Path(executed).mkdir(parents=True, exist_ok=True)
        out.append(str(Path(executed).resolve()))
    return out


class Worker:
    """One learner answer loaded in its own process (``worker.main``), in a session of its own
    that ``close`` kills whole."""

    def __init__(self, source: str, ex: Exercise, timeout: float, secrets=()):
        self.source, self.ex, self.timeout = source, ex, timeout
        self.secrets = list(secrets)
        self.pid = self.conn = None
        self.kind = None
        self.value = None
        self.load_error: dict | None = None
        self.incidents: list[str] = []
        #: (file name, text) the answer compiled at run time, as the worker's record holds it
        #: (``record``; and as its replies said, where it has none)
        self.compiled: list[tuple[str, str]] = []
        self.scratch = None
        self.record, self._recorded = record.Record(None), 0

    def __enter__(self):
        self.pid, self.conn, self.record = Server.fork()
        self.scratch = tempfile.mkdtemp(prefix="quack_edu_judge_", dir=Server.box)
        job = {"source": self.source, "answer": self.ex.answer, "exercise": self.ex.id}
        job.update(
            finished=list(self.ex.finished),
            autograd_off=self.ex.autograd_off,
            watch_ops=self.ex.watch_ops,
        )
        job.update(secrets=secret_paths(self.secrets), scratch=self.scratch)
        self.conn.send_bytes(pickle.dumps(job))
        msg = self._receive(self.timeout + 60.0, "loading the answer cell")
        if msg.get("loaded"):
            self.kind = msg.get("kind")
            self.value = msg.get("value")
        else:
            self.load_error = msg
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def close(self) -> None:
        import shutil

        if self.conn is not None:
            try:
                self.conn.close()
            except OSError:
                pass
            self.conn = None
        self._kill()
        self._sync()  # (what the hook sent before the worker ended)
        self.record.close()
        if self.scratch:
            shutil.rmtree(self.scratch, ignore_errors=True)
            self.scratch = None

    def _kill(self) -> None:
        import signal

        if self.pid:
            for kill in (os.killpg, os.kill):  # the worker's session, or itself before it has one
                try:
                    kill(self.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            self.pid = None

    def _sync(self) -> None:
        """Take what the worker's record holds now into ``incidents`` and ``compiled``."""
        self.record.drain()
        for what in self.record.incidents:
            if what not in self.incidents:
                self.incidents.append(what)
        new = self.record.compiled[self._recorded :]
        self._recorded += len(new)
        self.compiled += new

    def _wait(self, timeout: float) -> bool:
        """Whether a reply began within ``timeout`` s; the record read meanwhile (its socket
        must never fill: the hook would wait on it)."""
        import select

        end = time.monotonic() + timeout
        while True:
            left = max(end - time.monotonic(), 0.0)
            watch = [self.conn] + ([self.record] if self.record.sock is not None else [])
            ready = select.select(watch, [], [], left)[0]
            if self.record in ready:
                self.record.drain()
            if self.conn in ready:
                return True
            if left <= 0:
                return False

    def _receive(self, timeout: float, what: str) -> dict:
        try:
            ready = self._wait(timeout)
        except (EOFError, OSError, ValueError):
            ready = True
        if not ready:
            self._kill()
            raise JudgeAbort(
                "timeout",
                f"{what} ran past the time limit of {timeout:g} s (timeout) and was stopped. "
                f"hint: {self.ex.timeout_hint or hints.TIMEOUT}",
            )
        with killed_after(deadline.READ_S, self._kill) as cut:
            try:
                data = self.conn.recv_bytes(MAX_REPLY)
            except (EOFError, OSError) as e:
                data, error = None, e
        self._sync()  # what the hook sent before this reply is waiting on its socket
        if data is None:
            self._kill()
            if cut.is_set() or "too long" in str(error).lower() or "bad message" in str(error):
                raise JudgeAbort(
                    "timeout",
                    f"{what}: the worker began a reply and did not finish it within "
                    f"{deadline.READ_S:g} s, or sent more than {MAX_REPLY >> 20} MiB: stopped",
                ) from None
            raise JudgeAbort(
                "died",
                f"{what} crashed the grader's worker process (it exited). hint: {hints.DIED}",
            ) from None
        try:  # whatever the bytes are (nested past the parser's depth, the wrong types): garbled
            return self._parse(data)
        except Exception as e:  # noqa: BLE001  (red team 8: a RecursionError ended the class run)
            self._kill()
            raise JudgeAbort("garbled", f"{GARBLED} ({type(e).__name__})") from None

    def _parse(self, data: bytes) -> dict:
        """A reply as data: a JSON object whose ``incidents`` is a list of strings and whose
        ``compiled`` is a list of [file name, text] pairs; anything else raises."""
        msg = json.loads(data)
        if type(msg) is not dict:
            raise ValueError("not an object")
        incidents, compiled = msg.pop("incidents", None) or [], msg.pop("compiled", None) or []
        if type(incidents) is not list or not all(type(w) is str for w in incidents):
            raise ValueError("incidents are not a list of strings")
        if type(compiled) is not list or not all(
            type(c) is list and len(c) == 2 and all(type(x) is str for x in c) for c in compiled
        ):
            raise ValueError("compiled is not a list of [file, text] pairs")
        for k, v in msg.items():  # every field but the value (``decoded``) is a scalar
            if k != "value" and type(v) not in (str, bool, int, float, type(None)):
                raise ValueError(f"the field {k!r} is not a scalar")
        for what in incidents:
            if what not in self.incidents:
                self.incidents.append(what)
        self.compiled += [(c[0], c[1]) for c in compiled]
        return msg

    def ask(self, req: tuple, what: str = "the answer") -> dict:
        try:
            payload = pickle.dumps(req)
        except Exception:
            raise NeedsTrace() from None
        try:
            self.conn.send_bytes(payload)
        except (BrokenPipeError, OSError):
            self._receive(0, what)  # reports the death
        return self._receive(self.timeout, what)

    def value_of(self, reply: dict, call: bool = False):
        """The reply's value, or the learner's exception / shortcut raised here."""
        if "shortcut" in reply:
            from .context import shortcut_failure

            raise shortcut_failure(str(reply["shortcut"]))
        if "raised" in reply:
            dsl = str(reply.get("module", "")).startswith("cutlass")
            if call and dsl and not reply.get("not_implemented"):
                # a DSL call outside the trace the grader had open: its error, for the message
                raise NeedsTrace(str(reply.get("short") or reply.get("raised") or ""))
            raise _rebuild(reply)
        if "unencodable" in reply:
            if str(reply.get("module", "")).startswith("cutlass"):
                raise NeedsTrace()
            raise CheckFailed(
                f"the answer returned a {reply['unencodable']}, not a number, string, list or "
                "tensor",
                hint="return the plain value (a number, a tuple of numbers, a torch tensor)",
            )
        return decoded(reply.get("value"))


def decoded(value):
    """``decode(value)``, a value that is not one (deep, of the wrong types) a ``JudgeAbort``."""
    try:
        return decode(value)
    except Exception as e:  # noqa: BLE001
        raise JudgeAbort("garbled", f"{GARBLED} ({type(e).__name__})") from None


#: how a reply that is not data is reported: the worker's own code writes data, so one that is
#: not was written by the learner's (red team 9 replaced the worker's reply function)
GARBLED = "flagged: the worker's reply was not data"
#: the longest text (PTX, SASS, a log) a probe's reply may hold, in characters: a lesson
#: kernel's PTX is under 100 kB (2026-12-08, ``tools.inspect.compile_report`` of the six stages
#: at N = 1024, 8192, 65536 in bf16: 4.9 kB to 82 kB); 80 times that, and nothing longer is parsed
TEXT_MAX = 8_000_000


def within_text_cap(value):
    """``value`` (a probe's decoded reply), unless a string in it is longer than ``TEXT_MAX``:
    then the reply is garbled (red team 9 appended ``'\\n/*x' * 100000`` to a PTX)."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str) and len(v) > TEXT_MAX:
            raise JudgeAbort(
                "garbled", f"{GARBLED} (a text of {len(v)} characters: more than {TEXT_MAX})"
            )
        if isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, list | tuple):
            stack.extend(v)
    return value


class RemoteAnswer:
    """Stands in for the learner's answer in the grader: a call is made in the worker."""

    def __init__(self, worker: Worker, name: str, source: str):
        self._worker = worker
        self.__name__ = name
        self._judge_source = source
        self.needs_trace = False
        self.dsl_error = ""  # the DSL's error when a call of the answer raised one

    def __call__(self, *args, **kwargs):
        if not (_plain_args(args) and _plain_args(kwargs)):
            self.needs_trace = True
            raise NeedsTrace()
        w = self._worker
        try:
            return w.value_of(w.ask(("call", args, kwargs), f"calling {self.__name__}"), call=True)
        except NeedsTrace as e:
            self.needs_trace = True
            self.dsl_error = str(e.args[0]) if e.args else ""
            raise

    def __repr__(self):
        return f"<{self.__name__} (in the grader's worker)>"

    def _traced_only(self):
        self.needs_trace = True
        raise NeedsTrace()

    # a check that reads the function itself (its source to replay, its cell's other
    # functions) runs whole in the worker, where the function is
    __globals__ = property(_traced_only)
    __wrapped__ = property(_traced_only)


class RemoteLauncher:
    def __init__(self, worker: Worker, ref, N, dtype, config, wdtype=None):
        self.worker, self.key = worker, (ref, N, dtype, config, wdtype)

    def __call__(self, x, w, out, eps):
        r = self.worker.ask(("launch", *self.key, (x, w, out, eps)), "launching your kernel")
        got = self.worker.value_of(r)
        out.copy_(got.to(out.device))

    def time_us(self, M: int, eps: float) -> float:
        r = self.worker.ask(("time", *self.key, (M, eps)), "timing your kernel")
        return float(self.worker.value_of(r))


class JudgeContext(Context):
    """A check's context in the grader: the answer lives in the worker."""

    def _ref(self, hole):
        ref = hole_ref(hole)
        if ref is None:
            self.answer.needs_trace = True
            raise NeedsTrace()
        return ref

    def call(self, *args, **kwargs):
        return self.answer(*args, **kwargs)

    def kernel(self, hole, N: int, dtype, config=None, wdtype=None):
        from .checks import stand_in

        return hole.kernel(stand_in, N, dtype, config, wdtype)  # for its tiling: never compiled

    def report(self, hole, N: int, dtype="bf16", config=None, sass=False):
        """The learner's kernel compiled where the answer lives (``probes.compiled``, for the
        config of the grader's own copy), reported on here."""
        from .context import dtype_key
        from .probes import compiled, hole_name, report_of

        key = ("report", hole, N, dtype_key(dtype), config, sass)
        if key not in self.cache:
            kernel = self.kernel(hole, N, dtype, config)
            data = self.probe(compiled, hole_name(hole), N, dtype, None, kernel.config, sass)
            self.cache[key] = report_of(kernel, f"{hole.stage}+{self.exercise.id}", data)
        return self.cache[key]

    def probe(self, fn, *args):
        """``fn(answer, *args)`` run in the worker; its data comes back (``Context.probe``)."""
        ref = (getattr(fn, "__module__", ""), getattr(fn, "__qualname__", ""))
        if not ref[0].startswith(f"{__package__}.") or ".exercises" in ref[0] or "." in ref[1]:
            raise ValueError(
                f"a probe must be a module-level function of a learner-side module: "
                f"{ref[0]}.{ref[1]}"
            )
        w = self.answer._worker if isinstance(self.answer, RemoteAnswer) else None
        if w is None:
            return super().probe(fn, *args)
        return within_text_cap(w.value_of(w.ask(("probe", ref, args), f"the probe {ref[1]}")))

    def launcher(self, hole, N: int, dtype, config=None, wdtype=None):
        from ..runtime import torch_dtype
        from .context import dtype_key

        wdtype = torch_dtype(wdtype) if wdtype is not None else None
        key = ("launch", hole, N, dtype_key(dtype), config, wdtype and dtype_key(wdtype))
        if key not in self.cache:
            kernel = self.kernel(hole, N, dtype, config, wdtype)
            worker = self.answer._worker
            launch = RemoteLauncher(worker, self._ref(hole), N, torch_dtype(dtype), config, wdtype)
            self.cache[key] = (kernel, launch)
        return self.cache[key]


def _judged_checks(ex: Exercise, worker: Worker, answer) -> Exercise:
    """``ex`` with each check run here. A check that would have to run the answer inside this
    process (hand it a DSL value, read its globals) fails: no verdict is taken from the
    learner's process."""

    def wrap(c: Check) -> Check:
        def fn(ctx):
            if worker.kind == "object":  # an object only the learner's process can hold
                raise CheckFailed(
                    "the answer is not plain data: a number, a string, a list, a tensor or a "
                    "function",
                    hint="return the plain value (a number, a tuple of numbers, a torch tensor)",
                )
            if not isinstance(answer, RemoteAnswer):
                return c.fn(ctx)  # plain data, here
            answer.needs_trace, answer.dsl_error = False, ""
            try:
                with cpu_bound(CHECK_CPU_S, f"the check '{c.name}'"):
                    out = c.fn(ctx)
            except TooSlow as e:  # the grader's own work on what the worker sent
                raise JudgeAbort(
                    "slow",
                    f"flagged: the grader spent more than {CHECK_CPU_S:g} s of its own time on "
                    f"what the worker sent back for {e}",
                ) from None
            except NeedsTrace:
                raise _untraceable(c, answer.dsl_error) from None
            except JudgeAbort:
                raise
            except BaseException:
                if answer.needs_trace:
                    raise _untraceable(c, answer.dsl_error) from None
                raise
            if answer.needs_trace:
                raise _untraceable(c, answer.dsl_error)
            return out

        return dataclasses.replace(c, fn=fn)

    return dataclasses.replace(ex, checks=[wrap(c) for c in ex.checks])


def _untraceable(c: Check, dsl_error: str = "") -> CheckFailed:
    if dsl_error:  # the answer, called with plain values, raised an error of the DSL: say it
        return CheckFailed(
            f"your answer raised an error of the CuTe DSL when '{c.name}' called it with plain "
            f"values: {dsl_error}",
            hint="the check calls your function with plain Python values (ints, tuples), "
            "outside any kernel or @cute.jit trace: a DSL call there fails. Compute the answer "
            "with Python arithmetic"
            + (
                f" ({hints.diagnose_compile_text(dsl_error)})"
                if hints.diagnose_compile_text(dsl_error)
                else ""
            ),
        )
    return CheckFailed(
        f"the grader cannot judge '{c.name}' without running your answer in its own process, "
        "which it never does",
        hint="the answer must be what the exercise asks: a function the checks call or "
        "compile, or a plain value",
    )


def _blank(ex: Exercise, hidden: bool, gpu: bool) -> ExerciseResult:
    return run_exercise(ex, MISSING, hidden=hidden, gpu=gpu)


def _judge_with(worker: Worker, ex: Exercise, source: str, hidden, seed, gpu) -> ExerciseResult:
    """The exercise's checks, run here, on the answer the worker loaded."""
    if worker.load_error is not None:
        res = _blank(ex, hidden, gpu)
        err = worker.load_error
        if err.get("not_implemented"):
            res.forced_status = NOT_ATTEMPTED
            res.forced_message = "not attempted: the exercise cell raises NotImplementedError"
        else:
            res.forced_status = FAIL
            res.forced_message = f"the exercise cell must run cleanly: it raised {err.get('short')}"
            rule = hints.diagnose_compile_text(f"{err.get('raised')}: {err.get('evalue')}")
            if rule:
                res.forced_message += f" ({rule})"
        return res
    if worker.kind == "missing":
        return _blank(ex, hidden, gpu)
    if worker.kind == "value":
        answer = decoded(worker.value)
    elif worker.kind == "callable":
        answer = RemoteAnswer(worker, ex.answer, source)
    else:
        answer = object()  # only the worker holds it: no check can judge it
    judged = _judged_checks(ex, worker, answer)
    return run_exercise(judged, answer, hidden=hidden, seed=seed, gpu=gpu, context=JudgeContext)


def run_time_copy(ex: Exercise, compiled: list) -> str | None:
    """``copied_at_run_time``, in bounded time: the grader's words when what the answer
    compiled at run time is a copy, or could not be read in time."""
    if not compiled:
        return None
    try:
        with cpu_bound(SIMILARITY_CPU_S, "reading what the answer compiled"):
            return copied_at_run_time(ex, compiled)
    except TooSlow:
        return f"that could not be read within {SIMILARITY_CPU_S:g} s"
    except Exception as e:  # noqa: BLE001
        return f"that could not be read ({type(e).__name__})"


#: how many incidents the instructor's record keeps, and how much of each
EVIDENCE_N, EVIDENCE_MAX = 20, 4000


def incident_words(incidents, ex: Exercise) -> list[str]:
    """The incidents as a student may read them: each one's fixed words, once."""
    from .sandbox_rules import incident_kind
    from .worker import FINISHED_EVERYWHERE, TORCH_AUTOGRAD, TORCH_NORMALISATION

    finished = {*FINISHED_EVERYWHERE, *ex.finished, TORCH_NORMALISATION, TORCH_AUTOGRAD}
    out: list[str] = []
    for what in incidents:
        kind = incident_kind(what, finished)
        if kind not in out:
            out.append(kind)
    return out


def read_answer(ex: Exercise, source: str) -> list[str]:
    """The screen's flags and the similarity's (``copied_from_library``) on ``source``, in
    bounded time; a text the grader cannot read (nested past the parser's depth: red team 9's
    ``1+1+...+1``, 20000 terms) or not within the bound is flagged, never an error."""
    try:
        with cpu_bound(SIMILARITY_CPU_S, "reading the answer cell"):
            flags = screen(source, ex)
            copied = copied_from_library(ex, source)
    except TooSlow:
        return [f"could not be read within {SIMILARITY_CPU_S:g} s"]
    except Exception as e:  # noqa: BLE001  (RecursionError, MemoryError: the grader goes on)
        return [f"could not be read ({type(e).__name__})"]
    if copied:  # the finished version's text, pasted (its functions are tripwired, its text not)
        flags.append(copied)
    return flags


def judge_exercise(
    ex: Exercise,
    source: str | None,
    *,
    hidden: bool = True,
    seed: int | None = None,
    gpu: bool | None = None,
    timeout: float = 120.0,
    screened: bool = True,
    secrets=(),
) -> ExerciseResult:
    """Grade ``ex`` on the answer cell ``source`` (None: the cell is missing), judged here."""
    from .. import MODE

    gpu = MODE.gpu if gpu is None else gpu
    seed = answer_key.seed_for(seed)
    t0 = time.perf_counter()
    if source is None:
        return _blank(ex, hidden, gpu)
    flags = read_answer(ex, source) if screened else []
    if flags:
        res = _blank(ex, hidden, gpu)
        res.forced_status = FAIL
        res.forced_message = (
            "flagged: the answer cell " + "; ".join(flags) + ". An answer computes from its "
            "inputs with torch, math and the DSL; it does not reach the grader, the process, "
            "files or the library's own implementation."
        )
        return res
    worker = Worker(source, ex, timeout, secrets)
    try:
        with worker:
            res = _judge_with(worker, ex, source, hidden, seed, gpu)
    except JudgeAbort as e:
        res = _blank(ex, hidden, gpu)
        res.forced_status = FAIL
        res.forced_message = e.message
    ran = run_time_copy(ex, worker.compiled)
    # what the worker reported is the learner's process's text: a student reads it in fixed
    # words (``sandbox_rules.incident_kind``), the instructor's record keeps it whole (red team 8: a
    # forged incident carried a hidden check's inputs into the feedback)
    said = incident_words(worker.incidents, ex)
    if ran:  # the finished version's text, compiled at run time (encoded in the cell, say):
        said.append(f"its code compiled at run time {ran}")  # (the grader's own words)
    if said:  # the sandbox refused something, or a tripwire was reached
        res = _blank(ex, hidden, gpu)
        res.forced_status = FAIL
        res.forced_message = (
            "flagged by the grader's sandbox (" + "; ".join(said[:4]) + "). An "
            "answer computes from its inputs with torch, math and the DSL; it does not reach "
            "the grader, the process, files or the library's finished version of what is asked."
        )
        res.evidence = [shown_text(w, EVIDENCE_MAX) for w in worker.incidents[:EVIDENCE_N]]
    res.seconds = time.perf_counter() - t0
    return res
