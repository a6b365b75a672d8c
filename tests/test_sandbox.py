"""The learner side of the grader's boundary (``grading.sandbox``): what a locked-down process
may not do, and the tripwires on the finished versions of what an exercise asks.

A lock-down cannot be undone, so each test locks down a child Python of its own and reports
back what each attempt did.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

#: each attempt, as the child runs it after ``lock_down``: name -> code (raising is refusal)
ATTEMPTS = {
    # red team 17: an installed library's handle renamed the driver's, to look up libc's system
    # through it; and posixpath's abspath replaced, for the hook's realpath to take a library of
    # the learner's for the installation's
    "a library named the driver's": (
        "import ctypes, _ctypes\n_l = ctypes.CDLL(_ctypes.__file__)\n_l._name = 'libcuda.so.1'\n"
        "_l.system"
    ),
    "the installation's path forged": (
        "import ctypes, posixpath\nopen('forged.so', 'wb').write(b'x')\n_a = posixpath.abspath\n"
        "posixpath.abspath = lambda p: sys.prefix + '/lib/forged.so'\n"
        "try:\n    ctypes.CDLL('./forged.so')\nfinally:\n    posixpath.abspath = _a"
    ),
    "write outside the scratch folder": "open(OUTSIDE + '/x.txt', 'w').write('1')",
    "write through ../": "open('../../../' + OUTSIDE.lstrip('/') + '/y.txt', 'w').write('1')",
    "append to a file outside": "open(PUBLIC + '/public.txt', 'a').write('1')",
    "read a secret": "open(SECRET + '/answer.txt').read()",
    "list a secret folder": "os.listdir(SECRET)",
    "read another process's command line": "open(f'/proc/{os.getppid()}/cmdline').read()",
    "read a secret through /proc/self/cwd": (
        "open('/proc/self/cwd/../' + os.path.relpath(SECRET, SCRATCH) + '/answer.txt').read()"
    ),
    "read a secret through /proc/self/root": "open('/proc/self/root' + SECRET + '/answer.txt')",
    "remove a file outside": "os.remove(PUBLIC + '/public.txt')",
    "rename a file outside": "os.rename(PUBLIC + '/public.txt', 'taken.txt')",
    "link a secret into the scratch folder": "os.symlink(SECRET + '/answer.txt', 'link.txt')",
    "change the working directory": "os.chdir('/')",
    "write through a folder's descriptor": (
        "os.open('x.txt', os.O_WRONLY | os.O_CREAT, dir_fd=os.open(OUTSIDE, os.O_RDONLY))"
    ),
    "climb from a folder's descriptor": (
        "os.makedirs('a/b', exist_ok=True); "
        "os.open('../../../../' + os.path.relpath(OUTSIDE, SCRATCH) + '/z.txt', "
        "os.O_WRONLY | os.O_CREAT, dir_fd=os.open('a/b', os.O_RDONLY))"
    ),
    "start a process": "subprocess.run(['true'])",
    "run ldconfig to change the cache": "subprocess.run(['/sbin/ldconfig', '-p', '-C', 'x'])",
    "a query with a loader variable": (
        "subprocess.run(['/sbin/ldconfig', '-p'], env={'LD_PRELOAD': SCRATCH + '/evil.so'})"
    ),
    "a query run outside": "subprocess.run(['/sbin/ldconfig', '-p'], cwd=OUTSIDE)",
    "compile with a version flag": "subprocess.run(['nvcc', '--version', 'x.cu'])",
    "start a detached process": "subprocess.Popen(['sleep', '60'], start_new_session=True)",
    "os.system": "os.system('true')",
    "start a process through _posixsubprocess": (
        "import _posixsubprocess; r, w = os.pipe(); _posixsubprocess.fork_exec("
        "['/bin/true'], [b'/bin/true'], True, (w,), None, None, -1, -1, -1, -1, -1, -1, r, w, "
        "False, True, -1, None, None, None, -1, None, False)"
    ),
    "a fresh copy of _posixsubprocess": (
        "import importlib.util as u; u.module_from_spec(u.find_spec('_posixsubprocess'))"
    ),
    "make a fifo outside": "os.mkfifo(OUTSIDE + '/fifo')",
    # a tool the lessons run (nvdisasm; ptxas, for torch.compile's kernels) runs outside the
    # hook: it may not be given a path outside, a folder outside or a loader variable
    "a tool given a path outside": "subprocess.run([TOOL, '-o', OUTSIDE + '/x.cubin', 'in.ptx'])",
    "a tool given a path outside with =": "subprocess.run([TOOL, '--output=' + OUTSIDE + '/x'])",
    "a tool run in a folder outside": "subprocess.run([TOOL, 'in.ptx'], cwd=OUTSIDE)",
    "a tool with LD_PRELOAD": "subprocess.run([TOOL], env={'LD_PRELOAD': 'evil.so'})",
    "LD_PRELOAD set for the tools": "os.environ['LD_PRELOAD'] = 'evil.so'",
    "hard-link a secret into the scratch folder": "os.link(SECRET + '/answer.txt', 'hl.txt')",
    "hard-link a file outside": "open('c.txt', 'w').write('1'); os.link('c.txt', OUTSIDE + '/c')",
    # torch.compile's line-to-name cache reads source files and takes a refusal as no file:
    # refused without an incident (checked below)
    "read a secret as torch's funcname cache": (
        "exec(compile('def _add_file(p):\\n    return open(p).read()\\n', "
        "'/x/torch/_dynamo/funcname_cache.py', 'exec'), globals()); "
        "_add_file(SECRET + '/source.py')"
    ),
    "read a secret through readline": (
        "import readline; readline.read_history_file(SECRET + '/answer.txt')"
    ),
    "write through readline": "import readline; readline.write_history_file(OUTSIDE + '/h')",
    "open an SQLite database": "import sqlite3; sqlite3.connect(':memory:')",
    "open an SQLite file": "import sqlite3; sqlite3.connect(OUTSIDE + '/db')",
    "shared memory": "import _posixshmem; _posixshmem.shm_open('/qe_x', os.O_CREAT | os.O_RDWR)",
    "read the parent's working directory": "os.readlink(f'/proc/{os.getppid()}/cwd')",
    "fork": "os.fork()",
    "signal the parent": "os.kill(os.getppid(), 0)",
    "import a denied module": "import secretpkg",
    "switch the profiler off": "sys.setprofile(None)",
    "switch a profiler on": "import cProfile; cProfile.Profile().enable()",
    "walk every object": "import gc; gc.get_objects()",
    "load libc": "import ctypes; ctypes.CDLL('libc.so.6')",
    "read raw memory": "import ctypes; ctypes.string_at(id(1), 8)",
    "open a socket": "import socket; socket.create_connection(('127.0.0.1', 9))",
    "call a tripwired function": "finished(1, 2)",
    # a frame leads, through f_back, to the grader's own code in the process (red team 8)
    "take a frame through sys._getframe": "sys._getframe()",
    "take a frame through inspect": "import inspect; inspect.currentframe()",
    "take frames through traceback": "import traceback; list(traceback.walk_stack(None))",
    "take a generator's frame": "_g = (i for i in [1]); _g.gi_frame",
    "take a traceback's frame": (
        "try:\n    1 / 0\nexcept ZeroDivisionError as e:\n    e.__traceback__.tb_frame"
    ),
    "take every thread's frame": "sys._current_frames()",
    "add an audit hook (handed frames)": (
        "_hooked = []; sys.addaudithook(lambda e, a: _hooked.append(e)); open('z', 'w').close()\n"
        "if not _hooked:\n    raise PermissionError('not added')"
    ),
    # ... and code that passes for the installation's would be taken for the library's
    "compile text under an installed file's name": "exec(compile('x = 1', json.__file__, 'exec'))",
    "compile a syntax tree": "import ast; compile(ast.parse('x = 1'), json.__file__, 'exec')",
    "a code object named as an installed file": (
        "(lambda: 0).__code__.replace(co_filename=json.__file__)"
    ),
    "load marshalled code": (
        "import marshal; marshal.loads(marshal.dumps(compile('1', 'x', 'eval')))"
    ),
    "rename a code object's file": (
        "import _imp; _imp._fix_co_filename(compile('1', 'x', 'eval'), json.__file__)"
    ),
    "a fresh copy of _signal": (
        "import importlib.util as u; u.module_from_spec(u.find_spec('_signal'))"
    ),
    "import compiled code from the scratch folder": (
        "import importlib.util as u, marshal\n"
        "open('evil.pyc', 'wb').write(u.MAGIC_NUMBER + bytes(12) + "
        "marshal.dumps(compile('x = 1', 'evil.py', 'exec')))\n"
        "sys.path.insert(0, os.getcwd()); import evil"
    ),
}
#: what a locked-down process may still do (each must run cleanly)
ALLOWED = {
    "write in the scratch folder": "open('mine.txt', 'w').write('1')",
    "a temporary file": "import tempfile; tempfile.NamedTemporaryFile().write(b'1')",
    "read a public file": "open(PUBLIC + '/public.txt').read()",
    "read this process's status": "open('/proc/self/status').read()",
    "signal itself": "os.kill(os.getpid(), 0)",
    "import an allowed module": "import json, fractions",
    "hard-link in the scratch folder": "open('a.txt', 'w').write('1'); os.link('a.txt', 'b.txt')",
    # filelock's read-write lock imports it, and torch.compile's caches filelock (on the GPU)
    "import sqlite3 (not connect)": "import sqlite3",
    "resolve a path": "os.path.realpath('/proc/self/status')",
    "call its own functions": "(lambda a: a + 1)(1)",
    # library code (the standard library's here) reads its caller's frame as before
    "a library reads its caller's frame": (
        "import collections, enum, typing; collections.namedtuple('P', 'a b'); "
        "typing.TypeVar('T'); enum.Enum('C', 'A B')"
    ),
    "a signal handler, handed no frame": (
        "import signal; _got = []; signal.signal(signal.SIGUSR1, lambda s, f: _got.append(f)); "
        "os.kill(os.getpid(), signal.SIGUSR1)\nif _got != [None]:\n    raise ValueError(_got)"
    ),
    "compile an installed file's own text": (
        "compile(open(json.__file__).read(), json.__file__, 'exec')"
    ),
    "exec text": "exec('x = 1')",
}

CHILD = textwrap.dedent(
    """
    import json, os, subprocess, sys
    OUTSIDE, PUBLIC, SECRET, SCRATCH = sys.argv[1:5]
    TOOL = sys.prefix + "/bin/ptxas"  # (need not exist: a refusal comes before it runs)
    attempts, allowed = json.loads(sys.argv[5]), json.loads(sys.argv[6])
    sys.path.insert(0, SECRET)  # the denied package lives there
    from quack_edu.grading import sandbox, tripwires

    def finished(a, b):
        return a + b

    tripwires.tripwire(finished, "finished")
    sandbox.lock_down(SCRATCH, secrets=[SECRET], denied_modules=("secretpkg",))
    out = {}
    for name, code in {**attempts, **allowed}.items():
        try:
            exec(code, globals())
            out[name] = "ran"
        except PermissionError as e:
            out[name] = "refused: " + str(e)
        except Exception as e:
            out[name] = f"error: {type(e).__name__}: {e}"
    import ctypes  # the CUDA driver (not on a CPU machine: the loader's own error, no refusal)
    try:
        ctypes.CDLL("libcuda.so.1").cuInit
        out["driver"] = "ran"
    except OSError as e:
        out["driver"] = "refused" if isinstance(e, PermissionError) else "not here"
    ld = subprocess.run(["/sbin/ldconfig", "-p"], capture_output=True)  # the loader's cache
    out["ldconfig -p"] = "ran" if ld.returncode == 0 else "failed"
    try:  # a library asking which compiler is there is told "none", without an incident
        subprocess.run(["nvcc", "--version"], capture_output=True)
        out["version probe"] = "ran"
    except FileNotFoundError:
        out["version probe"] = "not found"
    import time
    t = time.perf_counter()  # resolving links reads them: once each, not recursively
    out["resolved"] = os.path.realpath(PUBLIC + "/link3")
    out["resolve seconds"] = time.perf_counter() - t
    out["incidents"] = sandbox.incidents()
    out["cwd"] = os.getcwd()
    print(json.dumps(out))
    """
)


def test_a_locked_down_process_is_refused_what_would_reach_past_it(tmp_path, subprocess_env):
    outside, public, secret, scratch = (tmp_path / n for n in ("out", "pub", "sec", "scr"))
    for d in (outside, public, secret):
        d.mkdir()
    (public / "public.txt").write_text("public")
    for i in (1, 2, 3):  # a chain of links, as a venv's python is
        (public / f"link{i}").symlink_to(public / (f"link{i - 1}" if i > 1 else "public.txt"))
    (secret / "answer.txt").write_text("42")
    (secret / "source.py").write_text("ANSWER = 42\n")
    (secret / "secretpkg.py").write_text("ANSWER = 42\n")
    env = {**subprocess_env, "QUACK_EDU_LANDLOCK": "0"}  # the audit hook's own refusals
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(outside), str(public), str(secret), str(scratch),
         json.dumps(ATTEMPTS), json.dumps(ALLOWED)],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    for name in ATTEMPTS:  # (on Python 3.12 a refused profiler leaves cProfile half set up:
        # its enable() then fails with an AttributeError; the refusal is on the record)
        assert out[name].startswith("refused") or name == "switch a profiler on", (name, out[name])
        assert out[name] != "ran", name
    for name in ALLOWED:
        assert out[name] == "ran", (name, out[name])
    # nothing reached the outside, and every refusal is on the record
    assert not list(outside.iterdir()) and (public / "public.txt").read_text() == "public"
    assert not os.path.exists(scratch / "work" / "link.txt")
    assert not os.path.exists(scratch / "work" / "hl.txt")
    assert out["cwd"] == str((scratch / "work").resolve())
    # (a guard, not a timing: the readlink guard once resolved links recursively, 51 s for a
    # venv's python in a locked process with torch imported)
    assert out["resolved"] == str((public / "public.txt").resolve()), out["resolved"]
    assert out["resolve seconds"] < 5, out["resolve seconds"]
    incidents = out["incidents"]
    assert "reached: finished" in incidents
    assert not any("source.py" in i for i in incidents), incidents
    assert any("importing secretpkg" in i for i in incidents)
    assert any("subprocess.Popen" in i for i in incidents)
    assert out["driver"] in ("ran", "not here") and not any("libcuda" in i for i in incidents)
    assert out["ldconfig -p"] == "ran" or not os.path.exists("/sbin/ldconfig")
    assert out["version probe"] == "not found"  # and only the compile is on the record:
    assert len([i for i in incidents if "Popen of nvcc" in i]) == 1, incidents
    assert len([i for i in incidents if i.startswith("refused: ")]) >= len(ATTEMPTS) - 8


def test_a_tripwire_keeps_the_signature_and_compiles_as_dsl_code():
    """The DSL checks a @cute.kernel's parameters against its call and compiles it from its
    source: a tripwired kernel still raises the tripwire's error (not a DSL error)."""
    from quack_edu.grading import tripwires

    def f(a, b=2, /, c=3, *args, d, e=5, **kw):
        return a

    tripwires.tripwire(f, "f")
    try:
        f(1, d=2)
    except PermissionError as e:
        assert str(e).startswith(tripwires.REACHED)
    else:
        raise AssertionError("the tripwire did not raise")
    assert f.__defaults__ == (2, 3) and f.__kwdefaults__ == {"e": 5}


COMPILE_CHILD = textwrap.dedent(
    """
    import json, os, sys
    ROOT, SCRATCH = sys.argv[1:3]
    SECRET = ROOT + "/hiddenpkg"  # a package made secret, as a worker makes quack_edu
    sys.path.insert(0, ROOT)
    import torch, torch._dynamo.pgo
    import hiddenpkg
    from quack_edu.grading import sandbox, tripwires

    tripwires.hide_sources(SECRET)
    sandbox.lock_down(SCRATCH, secrets=[SECRET])
    out = torch.compile(hiddenpkg.double, backend="eager", fullgraph=True)(torch.ones(3))
    print(json.dumps({"sum": float(out.sum()), "incidents": sandbox.incidents()}))
    """
)


def test_torch_compile_of_a_hidden_file_reads_nothing(tmp_path, subprocess_env):
    # torch.compile hashes the file of every function it traces (torch._dynamo.pgo): primed
    # before the lock-down, so compiling the library's functions in a worker is no incident
    secret = tmp_path / "root" / "hiddenpkg"
    secret.mkdir(parents=True)
    (secret / "__init__.py").write_text("def double(x):\n    return 2 * x\n")
    done = subprocess.run(
        [sys.executable, "-c", COMPILE_CHILD, str(secret.parent), str(tmp_path / "scr")],
        env=subprocess_env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out == {"sum": 6.0, "incidents": []}, out


NATIVE_CHILD = textwrap.dedent(
    """
    import json, os, sys
    import torch
    OUTSIDE, PUBLIC, SECRET, SCRATCH = sys.argv[1:5]
    from quack_edu.grading import sandbox

    sandbox.lock_down(SCRATCH, secrets=[SECRET])

    def read(p):
        return bytes(torch.from_file(p, shared=False, size=os.stat(p).st_size,
                                     dtype=torch.uint8).tolist()).decode()

    def write(p):
        torch.from_file(p, shared=True, size=4, dtype=torch.uint8)[:] = 65

    def signal_parent():  # no audit event for either call (red team 6 stopped the grader)
        import signal
        signal.pidfd_send_signal(os.pidfd_open(os.getppid()), 0)

    out = {}
    for name, fn in {"read a secret": lambda: read(SECRET + "/answer.txt"),
                     "write outside": lambda: write(OUTSIDE + "/x.bin"),
                     "read the library": lambda: read(sandbox.__file__),
                     "write in the scratch folder": lambda: write("mine.bin"),
                     "signal the parent": signal_parent,
                     "leave the process group": os.setsid,
                     "capabilities": lambda: [ln for ln in open("/proc/self/status")
                                              if ln.startswith("CapEff")][0].split()[1]}.items():
        try:
            got = fn()
            out[name] = got if name == "capabilities" else "ran"
        except Exception as e:
            out[name] = f"{type(e).__name__}: {e}"
    print(json.dumps(out))
    """
)


def test_native_code_is_confined_by_landlock(tmp_path, subprocess_env):
    # torch.from_file opens files in C++ (no audit event): where the kernel has Landlock, the
    # kernel refuses a secret and a write outside the scratch folder (red team 4's hole)
    from quack_edu.grading import confine

    if confine.abi() < 1:
        pytest.skip("this kernel has no Landlock")
    outside, public, secret, scratch = (tmp_path / n for n in ("out", "pub", "sec", "scr"))
    for d in (outside, public, secret):
        d.mkdir()
    (public / "public.txt").write_text("public")
    (secret / "answer.txt").write_text("42")
    env = {**subprocess_env, "QUACK_EDU_LANDLOCK": "1"}
    done = subprocess.run(
        [sys.executable, "-c", NATIVE_CHILD, str(outside), str(public), str(secret), str(scratch)],
        env=env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert "Permission denied" in out["read a secret"], out
    assert "Permission denied" in out["write outside"], out
    assert out["read the library"] == "ran" and out["write in the scratch folder"] == "ran", out
    assert not list(outside.iterdir())
    # seccomp: nothing leaves the group the grader kills (red team 6's native fork + setsid)
    assert "Operation not permitted" in out["leave the process group"], out
    assert int(out["capabilities"], 16) == 0, out  # none, even run as root (red team 7: TIOCSTI)
    if confine.abi() >= 6:  # Landlock's signal scope: the grader is outside the domain
        assert "Operation not permitted" in out["signal the parent"], out


def test_a_locked_down_process_dies_with_its_parent(tmp_path, subprocess_env):
    # (red team 5) a learner's process that outlives a grader killed from outside: the kernel
    # kills it when its parent ends (PR_SET_PDEATHSIG, set by lock_down)
    if not sys.platform.startswith("linux"):
        pytest.skip("prctl is Linux's")
    child = (
        "import time\nfrom quack_edu.grading import sandbox\n"
        f"sandbox.lock_down({str(tmp_path / 'scr')!r}, landlock=False)\ntime.sleep(120)\n"
    )
    parent = (
        "import subprocess, sys, time\n"
        f"p = subprocess.Popen([sys.executable, '-c', {child!r}], stdout=subprocess.DEVNULL, "
        "stderr=subprocess.DEVNULL)\n"
        "time.sleep(8)\nprint(p.pid, flush=True)\n"  # (the child has locked down by then)
    )
    done = subprocess.run(
        [sys.executable, "-c", parent], env=subprocess_env, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    pid = int(done.stdout.split()[0])

    def alive() -> bool:
        try:
            return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] not in "ZX"
        except (FileNotFoundError, IndexError):
            return False

    deadline = time.monotonic() + 10
    while alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(), f"process {pid} outlived its parent"


def test_a_run_may_list_its_own_folder_not_another_runs(tmp_path, subprocess_env):
    # the scratch folder's parent (this run's folder) lists its names; another run's folder,
    # matched by the same secret pattern, stays out of reach
    run, other = tmp_path / "quack_edu_grade_a", tmp_path / "quack_edu_grade_b"
    (run / "scratch").mkdir(parents=True)
    other.mkdir()
    (other / "cells.log").write_text("another student's cells")
    code = (
        "import json, os\nfrom quack_edu.grading import sandbox\n"
        f"sandbox.lock_down({str(run / 'scratch')!r}, secrets=[{str(tmp_path / 'quack_edu_')!r}"
        " + '*'], landlock=False)\nout = {}\n"
        f"for name, path in (('own', {str(run)!r}), ('other', {str(other)!r})):\n"
        "    try:\n        out[name] = sorted(os.listdir(path))\n"
        "    except PermissionError:\n        out[name] = 'refused'\n"
        "print(json.dumps(out))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=subprocess_env, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out == {"own": ["scratch"], "other": "refused"}, out


def test_without_capabilities_no_keystroke_reaches_another_terminal(subprocess_env):
    """Red team 7: under a root grader, native code pushed a command into the grader's terminal
    (TIOCSTI); on a terminal not its own that needs CAP_SYS_ADMIN, which a learner process
    drops (confine.drop_capabilities)."""
    if not sys.platform.startswith("linux") or os.geteuid() != 0:
        pytest.skip("the escape needs a root grader on Linux")
    child = textwrap.dedent(
        """
        import fcntl, os, pty, termios
        from quack_edu.grading import confine
        m, s = pty.openpty()
        def push():
            fd = os.open(os.ttyname(s), os.O_RDWR | os.O_NOCTTY)
            try:
                fcntl.ioctl(fd, termios.TIOCSTI, b"x")
                return "pushed"
            except OSError as e:
                return e.strerror
            finally:
                os.close(fd)
        before = push()
        confine.drop_capabilities()
        print(before, "|", push())
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", child], env=subprocess_env, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    before, after = done.stdout.strip().split(" | ")
    assert after == "Operation not permitted", done.stdout + done.stderr
    assert before in ("pushed", "Operation not permitted")  # (the kernel may forbid it anyway)


DENIED_CHILD = textwrap.dedent(
    """
    import importlib.machinery, importlib.util, json, os, sys
    import torch
    from quack_edu.grading import sandbox
    SCRATCH = sys.argv[1]
    suite = os.path.dirname(torch.__file__) + "/testing/_internal"
    vendored = os.path.dirname(torch.__file__) + "/_vendor/quack"
    sandbox.lock_down(SCRATCH)
    out = {}

    def attempt(name, f):
        try:
            f()
            out[name] = "ran"
        except PermissionError as e:
            out[name] = "refused: " + str(e)
        except Exception as e:
            out[name] = f"error: {type(e).__name__}: {e}"

    def under_another_name():  # red team 13: the vendored copy as a package of its own
        spec = importlib.machinery.ModuleSpec("tvq", None, is_package=True)
        spec.submodule_search_locations.append(vendored)
        sys.modules["tvq"] = importlib.util.module_from_spec(spec)
        importlib.import_module("tvq.reduce")

    def from_its_file(path):
        spec = importlib.util.spec_from_file_location("renamed", path)
        spec.loader.exec_module(importlib.util.module_from_spec(spec))

    attempt("vendored QuACK under another name", under_another_name)
    attempt("the suite's module by name",
            lambda: importlib.import_module("torch.testing._internal.common_modules"))
    attempt("the suite's module from its file",
            lambda: from_its_file(suite + "/common_methods_invocations.py"))
    attempt("the suite's text read", lambda: open(suite + "/common_modules.py").read())
    attempt("Liger", lambda: importlib.import_module("liger_kernel"))
    # what torch's own library imports from its test suite stays importable
    attempt("opcheck's helpers", lambda: importlib.import_module("torch.testing._internal.optests"))
    attempt("torch._refs", lambda: importlib.import_module("torch._refs"))
    attempt("torch.utils.checkpoint", lambda: importlib.import_module("torch.utils.checkpoint"))
    out["incidents"] = sandbox.incidents()
    print(json.dumps(out))
    """
)


@pytest.mark.parametrize("landlock", ["0", ""])
def test_denied_modules_are_refused_by_name_and_by_their_files(tmp_path, subprocess_env, landlock):
    """Red team 13 loaded torch's vendored QuACK under a package name of its own, and ran a
    reference RMSNorm of torch's test suite: a denied module's files are secrets, whatever the
    module is called, while what torch's library itself imports from its test suite (opcheck's
    helpers, lesson 06) still loads."""
    env = {**subprocess_env, "QUACK_EDU_LANDLOCK": landlock}
    done = subprocess.run(
        [sys.executable, "-c", DENIED_CHILD, str(tmp_path / "scr")],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    for name in ("vendored QuACK under another name", "the suite's module by name",
                 "the suite's module from its file", "the suite's text read"):  # fmt: skip
        assert out[name] != "ran", (name, out[name])  # (an import's finder takes the
        # refusal of its folder's listing for "no such module": the incident is what counts)
    assert out["Liger"] != "ran"  # (refused where installed, not found where not)
    for name in ("opcheck's helpers", "torch._refs", "torch.utils.checkpoint"):
        assert out[name] == "ran", (name, out[name])
    assert any("_vendor/quack" in i for i in out["incidents"]), out["incidents"]
    assert len([i for i in out["incidents"] if "testing/_internal" in i]) >= 3, out["incidents"]
    assert any("common_modules" in i for i in out["incidents"]), out["incidents"]


def test_what_is_denied_is_named_by_module_and_by_file():
    from quack_edu.grading.sandbox_rules import DENIED_MODULES, denied_files, denied_module

    for name in ("quack", "quack.rmsnorm", "torch._vendor.quack.reduce", "liger_kernel.ops",
                 "torch.testing._internal.common_modules", "torch.testing._internal.opinfo.core",
                 "torch.testing._internal.distributed._tensor.common_dtensor"):  # fmt: skip
        assert denied_module(name, DENIED_MODULES), name
    for name in ("quackery", "torch.testing", "torch.testing._internal",
                 "torch.testing._internal.optests.generate_tests",
                 "torch.testing._internal.distributed", "torch.testing._internal.common_dtype",
                 "torch.testing._internal.distributed.fake_pg", "torch._vendor"):  # fmt: skip
        assert not denied_module(name, DENIED_MODULES), name
    import torch

    files = denied_files(DENIED_MODULES)
    suite = Path(torch.__file__).parent / "testing" / "_internal"
    assert str(Path(torch.__file__).parent / "_vendor" / "quack") in files
    assert str(suite / "common_modules.py") in files and str(suite / "opinfo") in files
    kept = ("optests", "common_dtype", "logging_tensor", "fake_pg", "__init__")
    assert not any(Path(f).name.split(".")[0] in kept for f in files if "testing" in f), files
