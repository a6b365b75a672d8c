"""The learner side of the grader's trust boundary: what a process that runs learner code may do.

The grader runs learner code (a notebook's cells, an answer cell loaded for judging) only in
processes of its own, and locks each down before the first line of it runs::

    lock_down(scratch="/tmp/quack_edu_judge_x1", secrets=[solutions_dir, results_dir])

From then on a Python audit hook (PEP 578: it cannot be removed, and every process, thread and
file operation of the interpreter passes through it) refuses, with a ``PermissionError`` that
names the rule:

* writing, renaming, removing or linking a file outside the scratch folder (the package, the
  grader, the results and the gradebook included), and changing the working directory;
* reading the secrets (solutions, the instructor bundle, results) or another process's
  ``/proc`` entries (a command line names the results file);
* starting a process (``subprocess``, ``os.system``, ``exec*``, ``fork``, ``posix_spawn``; but
  ``nvdisasm`` and ``ptxas`` from the Python installation, on files in the scratch folder),
  and the grader kills the process group at the end, so nothing outlives the grading run;
  signalling another process; opening a network connection;
* loading a native library from outside the Python installation, or reading raw memory, through
  ``ctypes``; walking every object the interpreter holds (``gc.get_objects``/``get_referrers``);
  installing or removing a profiler or tracer;
* importing, or reading the files of, the exercises, the solutions, QuACK, Liger, torch's tests;
* taking a frame of the interpreter's stack for learner code (``sys._getframe``, ``inspect``,
  a generator's ``gi_frame``, a traceback's ``tb_frame``, a signal handler's argument, an audit
  hook of its own): a frame's ``f_back`` leads to the grader's own code in the process (its
  request loop, its pipe, this module's record). Library code (CuTe DSL, torch, the library)
  that reads its caller's frame keeps doing so: who asks is the first frame outside the
  standard library's frame helpers (``learner_code``), and learner code cannot pass for
  library code (text compiled under an installed file's name must be that file's own text;
  syntax trees, code objects and marshalled code from learner code are refused; no caller
  gives a function code of another file than its own).

What it refused is kept (``incidents()``) and the judge reports it: a refusal is a flag.
Tripwires (``tripwires``) replace the code of the functions an answer may not reach; the hook
keeps the record of each one reached. The events and their rules are data (``sandbox_rules``).

The hook watches Python code. Native code that opens files itself (``torch.from_file``) raises
no audit event: where the kernel has Landlock, ``lock_down`` also confines the process's files
in the kernel (``confine``); new native libraries and raw memory are refused. More isolation
stacks on top: Linux namespaces (``isolate``, ``--isolate namespaces``), a separate user.
"""

from __future__ import annotations

import errno
import os
import sys

from . import record, sandbox_rules
from .record import RECORD_CHUNK, keep_compiled
from .sandbox_rules import (
    CHANGES,
    CODE_ATTRIBUTES,
    DENIED_MODULES,
    DRIVER,
    FRAME_ATTRIBUTES,
    FRAME_HELPER_FILES,
    FRAME_HELPERS,
    PRELOADED,
    PROC_SELF_OK,
    QUERIES,
    REFUSED,
    RELAY,
    TOLERANT_READERS,
    TOOLS,
    UNAUDITED,
    VERSION_PROBES,
    WRITE_FLAGS,
    denied_files,
    denied_module,
    driver_handles,
    foreign_code,
    frameless,
    private_names,
    stand_in,
    text_in_lines,
)
from .tripwires import SOURCES

#: the boundary every learner process of a grading run is behind (each grade's JSON says so)
BOUNDARY = (
    "sandbox: a Python audit hook (PEP 578) in every process that runs learner code, from before "
    "its first line (files outside its scratch folder, processes, signals, sockets, native "
    "libraries, frames of the stack, the exercises and the solutions refused); its process "
    "group killed at the end, "
    "which nothing it starts can leave (seccomp: setsid and setpgid fail); "
    "tripwires on the finished versions of what is asked; verdicts computed in the grader's "
    "process from the data sent back"
)
#: where the libraries' caches and dumps go in a learner process: ``{scratch}/tmp/<name>``
#: (the DSL reads its dump folder once, at import: a caller that imports it before the lock-down
#: sets that one in the process's environment first)
SCRATCH_ENV = {
    "CUTE_DSL_DUMP_DIR": "cute",
    "MPLCONFIGDIR": "matplotlib",
    "TORCHINDUCTOR_CACHE_DIR": "inductor",
    "TRITON_CACHE_DIR": "triton",
    "XDG_CACHE_HOME": "cache",
}

_state: dict = {}  # "locked": the scratch folder, once lock_down ran


def locked() -> bool:
    """Whether this process is a locked-down learner process."""
    return "scratch" in _state


def _normal(path: str, cwd: str) -> str:
    """``path`` made absolute and free of ``.``/``..``/``//`` with str methods only (no helper
    that code in this process could replace)."""
    if not path.startswith("/"):
        path = cwd + "/" + path
    out: list[str] = []
    for part in path.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if out:
                out.pop()
            continue
        out.append(part)
    return "/" + "/".join(out)


_realpath = os.path.realpath  # (lock_down's hook: a private copy, ``private_names``)
DRIVER_HANDLES: frozenset = frozenset()


def lock_down(scratch: str, **kwargs) -> None:
    """Lock this process down (``_lock_down``'s keywords). The hook and its helpers run on a
    private copy of this module's names and of the builtins, which learner code cannot rebind
    (red team 16 rebound ``sandbox.QUERIES`` and the hook let a shell through)."""
    import builtins
    import posixpath
    import stat
    import types

    b = dict(builtins.__dict__)
    rules, kept = private_names(sandbox_rules, b), private_names(record, b)
    paths = private_names(posixpath, b, os=types.SimpleNamespace(**vars(os)),
                          stat=types.SimpleNamespace(**vars(stat)))  # fmt: skip
    private = dict(globals(), __builtins__=b, DRIVER_HANDLES=driver_handles())
    private.update(denied_module=rules["denied_module"], text_in_lines=rules["text_in_lines"],
                   foreign_code=rules["foreign_code"], keep_compiled=kept["keep_compiled"],
                   _realpath=paths["realpath"])  # fmt: skip
    private["_normal"] = types.FunctionType(_normal.__code__, private, "_normal")
    run = types.FunctionType(_lock_down.__code__, private, "lock_down")
    run.__kwdefaults__ = _lock_down.__kwdefaults__
    run(scratch, **kwargs)


def _lock_down(
    scratch: str,
    *,
    secrets=(),
    denied_modules=DENIED_MODULES,
    landlock: bool | None = None,
    record_fd: int | None = None,
    hold: tuple = (),
) -> None:
    """Lock this process down (see the module docstring), once, after the grader's side is
    imported and before any learner code runs; the working directory becomes ``scratch/work``,
    temporary files go to ``scratch/tmp``. ``secrets``: folders no path under which may be
    read, or name prefixes (``/tmp/x_*``). ``landlock``: confine the files in the kernel too
    (``confine``; default ``confine_default()``) where it can. ``record_fd``: a
    ``SOCK_SEQPACKET`` socket to the judge for each text compiled at run time and each incident
    (``record.RECORD_FORMAT``), sent at once; a compile it cannot send is refused. ``hold``: the
    tripwires to keep and watch, out of learner code's reach: torch ``Library`` objects (whose
    ``_destroy`` undoes them), (function, tripwire code) pairs; one undone is reached."""
    if locked():
        raise RuntimeError("this process is locked down already")
    from . import confine

    confine.die_with_parent()
    for name in PRELOADED:  # imported now: their import does what learner code may not
        try:
            __import__(name)
        except ImportError:
            pass
    import site
    import tempfile
    from _thread import get_ident
    from io import open_code
    from stat import S_ISDIR as is_dir

    realpath, fspath, getpid, stat = _realpath, os.fspath, os.getpid, os.stat

    home = realpath(scratch)
    # the working directory starts empty; temporary files (the answer's module, compile dumps)
    # go beside it, inside the scratch folder too
    os.makedirs(home + "/work", exist_ok=True)
    os.makedirs(home + "/tmp", exist_ok=True)
    os.chdir(home + "/work")
    cwd = home + "/work"  # for good: relative paths are resolved against it
    tempfile.tempdir = home + "/tmp"
    os.environ["TMPDIR"] = home + "/tmp"
    for var, sub in SCRATCH_ENV.items():  # caches the libraries write (inductor's, triton's...)
        os.environ[var] = f"{home}/tmp/{sub}"
    # the library's kernel cache keys its entries by the package's source: off (a learner
    # process may not read the package, and a cache in the scratch folder dies with it)
    os.environ["QUACK_EDU_KERNEL_CACHE"] = "off"
    # torch.compile compiles in this process, not a pool of Python processes
    os.environ["TORCHINDUCTOR_COMPILE_THREADS"] = "1"
    if "torch._inductor.config" in sys.modules:
        sys.modules["torch._inductor.config"].compile_threads = 1
    # where native libraries may be loaded from: the Python installation (learner code cannot
    # write there)
    prefixes = {sys.prefix, sys.base_prefix, *site.getsitepackages(), site.getusersitepackages()}
    prefixes |= {p for p in sys.path if p and os.path.isdir(p)}  # PYTHONPATH's packages too
    installed = tuple(
        r for r in (realpath(p) for p in prefixes if p) if not (r == home or r.startswith(home))
    )
    # a secret: a folder or file, or (ending in "*") a prefix of names; the denied modules' too
    folders = [s for s in secrets if s and not str(s).endswith("*")] + denied_files(denied_modules)
    hidden = tuple(realpath(str(s)) for s in folders)
    starts = tuple(
        realpath(os.path.dirname(str(s))) + "/" + os.path.basename(str(s))[:-1]
        for s in secrets
        if s and str(s).endswith("*")
    )
    # the kernel's own file boundary, for native code that opens files without an audit event
    # (before the hook: the hook would refuse its opening of the folders it allows)
    if confine.confine_default() if landlock is None else landlock:
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        _state["landlock"] = confine.restrict(
            home,
            readable=(*confine.SYSTEM, *installed, root),  # root: the folder quack_edu is in
            # (the tools, and the system's dynamic loader and libraries they are run with)
            executable=(*installed, *confine.SYSTEM),
            secrets=hidden,
        )
    _state["in_group"] = confine.stay_in_group()  # (native code too: the group is killed whole)
    if record_fd is not None:  # the record's socket cannot be closed or replaced (seccomp)
        _state["record_guarded"] = confine.guard_fd(record_fd)
    _state["no_capabilities"] = confine.drop_capabilities()  # (a root grader's are not theirs)
    pid = str(getpid())
    run_folder = os.path.dirname(home)
    # and, once locked, a fresh copy of the modules whose process and file functions are
    # replaced below (``importlib.util.module_from_spec`` would make one)
    denied = (*denied_modules, "_posixsubprocess", "posix", "_signal", *UNAUDITED)
    seen: list[str] = []  # what was refused or reached, in order: only ever appended to
    _state.update(scratch=home, seen=seen)
    changes, refused, write_flags, proc_ok = CHANGES, REFUSED, WRITE_FLAGS, PROC_SELF_OK
    tools, loader_env = TOOLS, ("LD_", "GCONV_PATH")
    from .confine import SYSTEM as system_dirs
    from .confine import devices as _devices

    devices = frozenset(_devices())
    loader0 = {k: v for k, v in os.environ.items() if k.startswith(loader_env)}
    tripped = "quack_edu.sandbox.reached"

    def text(a) -> str:
        """A path or argument as a str (bytes decoded as the file system does)."""
        a = fspath(a) if isinstance(a, str | bytes | os.PathLike) else str(a)
        return a.decode("utf-8", "surrogateescape") if isinstance(a, bytes) else a

    def as_path(p):
        """(the path made absolute lexically, the path the kernel would open: symlinks and
        ``..`` after them resolved), or None for an open file descriptor (no new access)."""
        if isinstance(p, int):
            return None
        p = text(p)
        raw = p if p.startswith("/") else cwd + "/" + p
        try:
            real = realpath(raw)
        except Exception:
            real = "/"  # cannot tell: treated as outside the scratch folder
        return _normal(raw, cwd), real

    def under(p: str, root: str) -> bool:
        return p == root or p.startswith(root + "/")

    def in_scratch(pp) -> bool:
        return under(pp[0], home) and under(pp[1], home)

    def proc_secret(p: str) -> bool:
        parts = p.split("/")
        who = parts[2] if len(parts) > 2 else ""
        if who.isdigit() and who != pid:
            return True
        if who in ("self", "thread-self", pid) and len(parts) > 3:
            return parts[3] not in proc_ok
        return False

    def secret(pp) -> bool:
        return any(
            any(under(p, s) for s in hidden)
            or p.startswith(starts)
            or (p.startswith("/proc/") and proc_secret(p))
            for p in pp
        )

    def program(exe, argv) -> str | None:
        """What a learner process may run: "tool" (``TOOLS``, from the Python installation),
        "query" (``QUERIES``, from the system's folders, exactly those arguments), or None."""
        if exe is None:
            return None
        name = exe[1].rsplit("/", 1)[-1]
        if (name, *(text(a) for a in argv[1:])) in QUERIES:
            return "query" if any(under(exe[1], r) for r in system_dirs) else None
        return "tool" if name in tools and any(under(exe[1], r) for r in installed) else None

    getframe, own_file = sys._getframe, lock_down.__code__.co_filename
    relayed = stand_in("").__code__  # (a stand-in's frame is this module's own, as the hook's)

    def callers(n: int = 8) -> list:
        """(file, function) of the Python frames above the audited call, nearest first (this
        module's own frames left out). Data only: it hands no frame to anyone."""
        f, out = getframe(0), []  # (the hook lets a frame of this code through: ``own_codes``)
        while f is not None and len(out) < n:
            code = f.f_code
            if code.co_filename != own_file and code is not relayed:
                out.append((code.co_filename, code.co_name))
            f = f.f_back
        return out

    known: dict = {}  # file name -> whether it names a file of the installation
    import ast as ast_module

    ast_parse, modules = ast_module.parse, sys.modules

    def library_type(obj) -> bool:
        """Whether ``obj`` is a class of the installation's (torch's, the DSL's, the library's)."""
        if not isinstance(obj, type):
            return False
        mod = modules.get(getattr(obj, "__module__", None) or "")
        return library_file(getattr(mod, "__file__", None))

    def library_file(filename) -> bool:
        """Whether code under ``filename`` is the installation's: one of Python's frozen
        modules, or a real file of the installation outside the scratch folder. (Learner code
        cannot take such a name: see "compile", "code.__new__" and "marshal.loads".)"""
        if type(filename) is not str:
            return False
        hit = known.get(filename)
        if hit is None:
            if filename.startswith("<frozen "):
                hit = True
            elif not filename.startswith("/") or under(_normal(filename, cwd), home):
                hit = False  # a cell, exec'd text, a relative path (into the scratch folder)
            else:
                try:
                    real = realpath(filename)
                    hit = (
                        not under(real, home)
                        and any(under(real, r) for r in installed)
                        and not is_dir(stat(real).st_mode)
                    )
                except Exception:  # noqa: BLE001  (no such file)
                    hit = False
            if len(known) < 100_000:
                known[filename] = hit
        return hit

    def learner_asks() -> bool:
        """Whether the code that raised the audited event is learner code: the first frame
        above it (this module's frames and the standard library's frame helpers passed) is not
        a file of the installation. Data only: it hands no frame to anyone."""
        f = getframe(0)
        while f is not None:
            name = f.f_code.co_filename
            fn = frame_functions.get(f.f_code.co_name)
            helper = name.endswith(FRAME_HELPERS) or (fn is not None and name.endswith(fn))
            if name != own_file and f.f_code is not relayed and not (helper and library_file(name)):
                return not library_file(name)
            f = f.f_back
        return False  # (no Python frame: the interpreter itself)

    own_codes = (callers.__code__, learner_asks.__code__)
    # installed functions that hand the frame they take to their caller: who asks is their
    # caller (``FRAME_HELPER_FILES``: a function's name -> the files that hold one)
    frame_functions = dict(FRAME_HELPER_FILES)
    sources = dict(SOURCES)  # the library's text as the line cache has it
    file_lines: dict = {}

    def own_text(text: str, filename: str) -> bool:
        """Whether ``text`` is ``filename``'s own (the whole file, as an import compiles it,
        or a function of it, dedented, as CuTe DSL parses one). A secret is never read: only
        its text in the line cache (``tripwires.hide_sources``), which the learner can read
        anyway."""
        lines = file_lines.get(filename)
        if lines is None:
            lines = sources.get(filename) or sources.get(realpath(filename))
            if lines is None and not secret(as_path(filename)):
                try:
                    with open(filename, "rb") as fh:
                        lines = fh.read().decode("utf-8", "replace").splitlines()
                except OSError:
                    lines = None
            lines = [ln.rstrip("\r\n") for ln in lines or ()]
            file_lines[filename] = lines
        return text_in_lines(text, lines)

    def tolerant_reader(frames) -> bool:
        return any(file.endswith(tf) and fn == tfn
                   for file, fn in frames for tf, tfn in TOLERANT_READERS)  # fmt: skip

    def by(frames) -> str:
        """Who asked, for the record: the first frames outside the standard library's readers."""
        named = [f"{'/'.join(file.rsplit('/', 2)[-2:])}:{fn}" for file, fn in frames
                 if not file.endswith(("/tokenize.py", "/linecache.py", "/codecs.py",
                                       "grading/sandbox.py"))]  # fmt: skip
        return " < ".join(named[:3])

    def refuse(what: str, *, quiet: bool = False):
        """Refuse (``quiet``: without an incident, for a reader that takes it as no file)."""
        if "(by " not in what and "; by " not in what:  # who asked, for the record
            what = f"{what} (by {by(callers(12)) or 'the cell'})"
        if not quiet and f"refused: {what}" not in seen:
            seen.append(f"refused: {what}")
        e = PermissionError(f"{REFUSED_PREFIX}{what}")
        e.quack_edu_quiet = quiet  # (the hook records a refusal that is not quiet)
        raise e

    def relative_up(p) -> bool:
        """A relative path that climbs (``..``): it may be relative to a folder descriptor
        (``dir_fd``), which the audit event does not name, not to the working directory."""
        if isinstance(p, int):
            return False
        p = text(p)
        return not p.startswith("/") and ".." in p.split("/")

    last_pyc: dict = {}  # thread -> the installation's compiled file it opened last

    def installed_code(data) -> bool:
        """Whether ``data`` is the code of the compiled file of the installation this thread
        opened last, as it is on disk: what an import unmarshals (red team 14 handed the
        import system's ``_compile_bytecode`` bytes of its own)."""
        path = last_pyc.get(get_ident())
        try:
            with open_code(path) as f:
                return path is not None and f.read()[16:] == bytes(data)
        except (OSError, TypeError):
            return False

    def a_folder(real: str) -> bool:
        try:
            return is_dir(stat(real).st_mode)
        except OSError:
            return False

    def hook(event: str, args: tuple) -> None:
        if event == "open":
            if relative_up(args[0]):
                refuse(f"opening {args[0]} (a relative path that climbs with ..)")
            p = as_path(args[0])
            if p is None:
                return
            if under(p[1], "/dev") and not any(under(p[1], d) for d in devices):
                refuse(f"opening the device {p[0]} (not a GPU's, null, zero or random)")
            if not in_scratch(p) and a_folder(p[1]):  # its descriptor would be a dir_fd
                refuse(f"opening the folder {p[0]} (outside the scratch folder)")
            mode, flags = args[1], args[2] if len(args) > 2 else 0
            writes = bool(flags & write_flags) or (
                isinstance(mode, str) and any(c in mode for c in "wax+")
            )
            if writes and not (in_scratch(p) or p[1] == "/dev/null"):
                refuse(f"writing {p[0]} (outside the scratch folder)")
            if secret(p) and not in_scratch(p):
                frames = callers()
                refuse(f"reading {p[0]} (by {by(frames)})", quiet=tolerant_reader(frames))
            if in_scratch(p) and not writes:  # compiled code made in the scratch folder would
                # carry any file name it likes: an import reads the source instead
                if p[1].endswith(".pyc"):
                    refuse(f"loading compiled code from {p[0]}", quiet=True)
                if any(file == "<frozen zipimport>" for file, _ in callers()):
                    refuse(f"importing from the archive {p[0]}")
            if p[1].endswith(".pyc") and any(under(p[1], r) for r in installed):
                last_pyc[get_ident()] = p[1]  # (what an import unmarshals next: its code)
        elif event in changes:
            if any(relative_up(a) for a in args if isinstance(a, str | bytes)):
                refuse(f"{event} on a relative path that climbs with ..")
            for i in changes[event]:
                p = as_path(args[i]) if i < len(args) else None
                if p is not None and not in_scratch(p):
                    refuse(f"{event} on {p[0]} (outside the scratch folder)")
        elif event in ("os.listdir", "os.scandir"):
            p = as_path(args[0]) if args and args[0] is not None else None
            # (the scratch folder's own parent, this run's folder, lists its names: something
            # on a GPU machine lists it in every lesson-00 notebook, 2026-12-06, an H100)
            if p is not None and secret(p) and not in_scratch(p) and p[1] != run_folder:
                refuse(f"listing {p[0]}")
        elif event in ("os.chdir", "os.fchdir"):
            refuse("changing the working directory")
        elif event == "subprocess.Popen":
            exe = as_path(args[0]) if args and args[0] is not None else None
            name = exe[1].rsplit("/", 1)[-1] if exe else ""
            argv = list(args[1]) if isinstance(args[1], list | tuple) else []
            kind = program(exe, argv)
            if kind is None:
                if [text(a) for a in argv[1:]] in VERSION_PROBES:  # a library asking which
                    # compiler is there (torch.compile on a GPU asks nvcc) takes "none"
                    raise FileNotFoundError(errno.ENOENT, "not in the grader's sandbox", name)
                refuse(f"subprocess.Popen of {args[0]} (starts a process; by {by(callers())})")
            # a tool or a query runs outside this hook: it runs in the scratch folder, every
            # file a tool is given is in it (a query's arguments are fixed), and nothing in
            # its environment loads native code into it
            cwd_arg = args[2] if len(args) > 2 else None
            if cwd_arg is not None and not in_scratch(as_path(cwd_arg)):
                refuse(f"running {name} in {cwd_arg} (outside the scratch folder)")
            for a in argv[1:] if kind == "tool" else ():
                for part in text(a).split("="):
                    if ("/" in part or ".." in part) and not in_scratch(as_path(part)):
                        refuse(f"giving {name} the path {part} (outside the scratch folder)")
            env = args[3] if len(args) > 3 else None
            for k, v in (env or {}).items():
                if text(k).startswith(loader_env) and text(v) != loader0.get(text(k)):
                    refuse(f"running {name} with {text(k)} changed (loads native code)")
        elif event == "os.putenv" and text(args[0]).startswith(loader_env):
            if text(args[1]) != loader0.get(text(args[0])):
                refuse(f"setting {text(args[0])} (loads native code into a tool)")
        elif event == "ctypes.dlsym" and len(args) > 1:  # (the library, the function's name)
            # the CUDA driver's own functions (reachable anyway: the DSL's cuda.bindings), told by
            # the handle searched, not the name a learner can set (red team 17 renamed libc10's
            # handle "libcuda.so.1" and called system; a handle finds its dependencies' too)
            if getattr(args[0], "_handle", None) in DRIVER_HANDLES and str(args[1])[:2] == "cu":
                return
            refuse(f"{event} of {text(args[1])} ({refused[event]})")
        elif event in refused:
            refuse(f"{event} ({refused[event]})")
        elif event in ("os.kill", "os.killpg", "signal.pthread_kill"):
            if event == "signal.pthread_kill" or str(args[0]) != pid:
                refuse(f"{event} (signals another process)")
        elif event == "sqlite3.connect":  # its SQL can ATTACH any file, unaudited
            refuse("opening an SQLite database")
        elif event == "ctypes.dlopen":
            p = as_path(args[0]) if args and args[0] else None
            if args and args[0] in DRIVER:
                return
            if p is None or not any(under(p[1], r) for r in installed):
                refuse(f"loading the native library {args[0] if args else None}")
        elif event in watch_events and not intact():
            undone("a tripwire undone")
        if event == "import":
            name = str(args[0])
            if denied_module(name, denied):
                refuse(f"importing {name}")
        elif event == tripped:
            what = f"reached: {args[0]}"
            if record_fd is not None:
                record(b"I", str(what)[:4000].encode("utf-8", "surrogatepass"))
            if what not in seen:
                seen.append(what)
        elif event == "compile":
            src, filename = (tuple(args) + (None, None))[:2]
            if isinstance(src, str | bytes | bytearray):
                if library_file(filename):  # text that says it is the installation's file
                    text_ = src if isinstance(src, str) else bytes(src).decode("utf-8", "replace")
                    if filename.startswith("<frozen ") or not own_text(text_, filename):
                        refuse(f"compiling text under the name of {filename} (not its text)")
            elif learner_asks():  # a syntax tree: its file name is the compiler's, unaudited
                refuse("compiling a syntax tree (learner code compiles text)")
            elif ast_module.parse is not ast_parse:  # a library's tree (the DSL's) is parsed
                # from text, which is recorded, by ast.parse as it was (red team 16 put one of
                # its own in place of ast.parse, whose tree held the finished kernel)
                refuse("compiling a syntax tree after ast.parse was replaced")
            keep_compiled(args)
            if record_fd is not None:
                record_compile(src, filename)
        elif event == "code.__new__":  # (``CodeType(...)``, ``code.replace``: code of no text)
            if learner_asks():
                refuse("making a code object (learner code compiles text)")
        elif event == "marshal.loads":  # code from bytes: only as an import reads them
            if not args or not installed_code(args[0]):
                refuse("loading marshalled code (not an installed compiled file, as an import)")
        elif event == "marshal.load":
            refuse("loading marshalled code from a file (an import reads it as bytes)")
        elif event == "sys.addaudithook":
            refuse("adding an audit hook (it would be handed frames)")

    # A process started through _posixsubprocess.fork_exec (what subprocess and multiprocessing
    # call) raises no audit event of its own: the C function is held by the hook alone, and what
    # code can reach in its place asks the hook to start the process (an allowed tool only).
    import _posixsubprocess

    spawn = _posixsubprocess.fork_exec
    # What learner code reaches in place of a guarded function is a stand-in (``stand_in``): it
    # holds nothing, and asks the hook, through the audit event ``RELAY``, to call the
    # function, which ``calls`` below alone holds with its rule.
    calls: dict = {}

    def install(original, what: str, mods=None) -> None:
        """Put the stand-in for ``what`` wherever ``original`` is bound in a module."""
        new = stand_in(what)
        for mod in list(sys.modules.values()) if mods is None else mods:
            names = getattr(mod, "__dict__", None)
            for k, v in list(names.items()) if isinstance(names, dict) else ():
                if v is original:
                    names[k] = new
                elif type(v) is type(install) and v.__dict__.get("__wrapped__") is original:
                    v.__wrapped__ = new  # (signal.signal's @wraps)

    def checked_spawn(*args):
        exes = args[1] if len(args) > 1 and args[1] else args[0]
        exe = as_path(exes[0]) if exes else None
        argv = list(args[0]) if isinstance(args[0], list | tuple) else []
        if program(exe, argv) is None:
            refuse(f"starting {exes[0] if exes else None!r}")
        return spawn(*args)

    calls["fork_exec"] = checked_spawn
    install(spawn, "fork_exec")

    def refuser(what: str):
        def refused_call(*args, **kwargs):
            refuse(what)

        return refused_call

    for name in ("mkfifo", "mknod"):  # they make a file anywhere and raise no audit event
        calls[name] = refuser("making a fifo or a device file")
        for mod in (os, sys.modules.get("posix")):
            if mod is not None and hasattr(mod, name):
                install(getattr(mod, name), name, (mod,))
    calls["unaudited"] = refuser("a module that reads or writes files without an audit event")
    for modname in UNAUDITED:  # already imported: their file functions go
        mod = sys.modules.get(modname)
        for name in [n for n in dir(mod) if callable(getattr(mod, n, None))] if mod else ():
            if not name.startswith("__") and not isinstance(getattr(mod, name), type):
                setattr(mod, name, stand_in("unaudited"))

    readlink = os.readlink

    def checked_readlink(path, *args, **kwargs):  # no audit event: /proc/<pid>/cwd says where
        # the path as written, made absolute (not resolved: resolving a link reads it, here)
        p = _normal(text(path), cwd)
        if p.startswith("/proc/") and proc_secret(p):
            refuse(f"reading the link {p}")
        return readlink(path, *args, **kwargs)

    calls["readlink"] = checked_readlink
    install(readlink, "readlink", [m for m in (os, sys.modules.get("posix")) if m is not None])

    # A signal handler is handed the frame that ran when the signal came: a learner's handler
    # gets None in its place (``sandbox_rules.frameless``). ``_signal`` is denied a fresh copy.
    import _signal

    set_handler, builtin = _signal.signal, type(len)

    def checked_signal(signalnum, handler):
        if callable(handler) and not isinstance(handler, builtin) and learner_asks():
            handler = frameless(handler)
        return set_handler(signalnum, handler)

    calls["signal"] = checked_signal
    install(set_handler, "signal")

    # ``_imp`` makes a fresh copy of a built-in module (a new ``_signal.signal``) and renames a
    # code object's file (``_fix_co_filename``) without an audit event: both for the import
    # system alone
    import _imp

    create_builtin, fix_co_filename = _imp.create_builtin, _imp._fix_co_filename
    held = {"_signal", "_imp", "posix", "_posixsubprocess", *UNAUDITED}
    spec_type = type(sys.implementation)

    def checked_create_builtin(spec):
        name = str(spec.name)
        if name in held:
            refuse(f"a fresh copy of the built-in module {name}")
        return create_builtin(spec_type(name=name))

    def checked_fix_co_filename(code, path):
        if learner_asks():
            refuse("renaming a code object's file")
        return fix_co_filename(code, path)

    calls["create_builtin"], calls["_fix_co_filename"] = (
        checked_create_builtin, checked_fix_co_filename)  # fmt: skip
    _imp.create_builtin = stand_in("create_builtin")
    _imp._fix_co_filename = stand_in("_fix_co_filename")
    # torch's ``set_eval_frame`` (C: no audit event) hands its callback every frame Python
    # evaluates: learner code may not set one (red team 9); torch.compile, library code, does
    torch = sys.modules.get("torch")
    frames = getattr(getattr(getattr(torch, "_C", None), "_dynamo", None), "eval_frame", None)
    eval_frame = getattr(frames, "set_eval_frame", None)

    def checked_eval_frame(*args, **kwargs):
        if learner_asks():
            refuse("taking a frame (torch's set_eval_frame; learner code gets none)")
        return eval_frame(*args, **kwargs)

    if eval_frame is not None:
        calls["set_eval_frame"] = checked_eval_frame
        install(eval_frame, "set_eval_frame")
        frames.set_eval_frame = stand_in("set_eval_frame")

    kept_wires = tuple(hold)  # (not `held`: the built-in modules above)
    watch_events = frozenset(("import", "compile", "exec", "code.__new__"))
    undone_seen: list = []

    def intact() -> bool:
        for h in kept_wires:
            if type(h) is tuple:
                if h[0].__code__ is not h[1]:
                    return False
            elif getattr(h, "m", None) is None:  # (torch.library.Library._destroy sets it None)
                return False
        return True

    def undone(name: str) -> None:
        if undone_seen:
            return
        undone_seen.append(name)
        what = f"reached: {name}"
        seen.append(what)
        if record_fd is not None:
            record(b"I", what.encode())

    # The record (``record.RECORD_FORMAT``): written by the hook alone. Nothing a learner can reach
    # closes over these names (``refuse`` and the guarded functions above are reachable, through
    # a function's closure: they do not), so none of them can be changed from learner code.
    import threading

    record_write, record_seq, record_lock = os.write, [0], threading.Lock()

    def record(kind: bytes, payload: bytes) -> None:
        try:
            if record_write(record_fd, kind + payload) != len(kind) + len(payload):
                raise OSError("short write")
        except OSError as e:  # the record cannot be kept: what it would record is refused
            raise PermissionError(
                f"{REFUSED_PREFIX}compiling, or an incident, that the grader's record could not "
                f"take ({type(e).__name__})"
            ) from None

    def record_compile(src, filename) -> None:
        if isinstance(src, bytes | bytearray):
            text = bytes(src).decode("utf-8", "replace")
        elif isinstance(src, str):
            text = src
        else:
            return
        if not text:
            return
        name = str(filename).replace("\0", "?").encode("utf-8", "surrogatepass")[:4000]
        with record_lock:  # (a text's pieces in order, whatever thread compiles)
            record_seq[0] += 1
            for i in range(0, len(text), RECORD_CHUNK):
                last = i + RECORD_CHUNK >= len(text)
                head = f"{record_seq[0]}:{int(last)}:".encode()
                body = text[i : i + RECORD_CHUNK].encode("utf-8", "surrogatepass")
                record(b"C", head + name + b"\0" + body)

    def guarded(event: str, args: tuple) -> None:
        if record_fd is None:
            return watched(event, args)
        try:
            watched(event, args)
        except PermissionError as e:
            message = str(e)
            if message.startswith(REFUSED_PREFIX) and not getattr(e, "quack_edu_quiet", False):
                what = "refused: " + message.removeprefix(REFUSED_PREFIX)
                record(b"I", what[:4000].encode("utf-8", "surrogatepass"))
            raise

    def watched(event: str, args: tuple) -> None:
        if event == "object.__getattr__":
            if args[1] in FRAME_ATTRIBUTES and learner_asks():
                refuse(f"taking a frame ({args[1]}; learner code gets none)")
        elif event == "sys._getframe":
            code = args[0].f_code if args[0] is not None else None
            if code is own_codes[0] or code is own_codes[1]:
                return  # this module's own look at the stack (``callers``, ``learner_asks``)
            if learner_asks():
                refuse("taking a frame (sys._getframe, inspect; learner code gets none)")
        elif event == "sys._current_frames":
            if learner_asks():
                refuse("taking a frame (sys._current_frames; learner code gets none)")
        elif event == RELAY:  # a stand-in's call: (what, args, kwargs, a list for the result)
            what, a, k, box = (tuple(args) + (None,) * 4)[:4]
            call = calls.get(what) if type(what) is str else None
            if call is not None and type(box) is list:
                box.append(call(*a, **k))
        elif event == "object.__setattr__" and (
            args[1] in CODE_ATTRIBUTES or library_type(args[0])
        ):  # (code of no text; the library's class; code of another file, by any caller: red
            # team 20 had the DSL's code swap put the learner's code into the grader's probe)
            if learner_asks() or (args[1] == "__code__" and foreign_code(args[0], args[2])):
                refuse(f"changing {args[1]} of a function or of a library's class")
        else:
            hook(event, args)

    sys.addaudithook(guarded)


#: how a refusal's error begins
REFUSED_PREFIX = "the grader's sandbox refused: "


def incidents() -> list[str]:
    """What the sandbox refused, and the tripwires reached, since ``lock_down`` (a copy)."""
    return list(_state.get("seen", ()))


def reached(since: int = 0) -> list[str]:
    """The tripwires reached (their names), among the incidents from index ``since`` on."""
    return [x.removeprefix("reached: ") for x in incidents()[since:] if x.startswith("reached: ")]
