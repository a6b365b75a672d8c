"""The sandbox's rules as data (``sandbox.lock_down`` applies them): the audit events it
watches and what it allows of each, and the words a student reads of a refusal (an incident
comes from the learner's process, which could write anything in it)."""

from __future__ import annotations

import os
import sys

#: ``open`` flags that write
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
#: audit events of file operations that change the file system: the arguments that are paths
CHANGES = {
    "os.remove": (0,),
    "os.rmdir": (0,),
    "os.rename": (0, 1),
    "os.mkdir": (0,),
    "os.chmod": (0,),
    "os.chown": (0,),
    "os.utime": (0,),
    "os.truncate": (0,),
    "os.setxattr": (0,),
    "os.removexattr": (0,),
    "os.chflags": (0,),
    "os.lchflags": (0,),
    "os.lchmod": (0,),
    "shutil.rmtree": (0,),
    "shutil.copyfile": (1,),
    "shutil.copymode": (1,),
    "shutil.copystat": (1,),
    "shutil.copytree": (1,),
    "shutil.move": (0, 1),
    "shutil.chown": (0,),
    "os.link": (0, 1),  # a hard link from the scratch folder into it (caches write so)
}
#: events refused outright once locked
REFUSED = {
    "os.system": "starts a process",
    "os.exec": "starts a process",
    "os.posix_spawn": "starts a process",
    "os.spawn": "starts a process",
    "os.fork": "starts a process",
    "os.forkpty": "starts a process",
    "os.startfile": "starts a process",
    "pty.spawn": "starts a process",
    "os.symlink": "links a file",
    "os.chroot": "changes the root folder",
    "socket.connect": "opens a network connection",
    "socket.bind": "opens a network connection",
    "socket.sendto": "opens a network connection",
    "ctypes.dlsym": "looks up a native function",
    "ctypes.dlsym/handle": "looks up a native function",
    "ctypes.string_at": "reads raw memory",
    "ctypes.wstring_at": "reads raw memory",
    "ctypes.cdata": "reads raw memory",
    "ctypes.PyObj_FromPtr": "reads raw memory",
    "gc.get_objects": "walks every object of the process",
    "gc.get_referrers": "walks every object of the process",
    "gc.get_referents": "walks every object of the process",
    "sys.setprofile": "switches a profiler on or off",
    "sys.settrace": "switches a tracer on or off",
    "sys.monitoring.register_callback": "switches a profiler on or off",
}
#: modules that read or write files (or shared memory) without raising an audit event: not
#: importable once locked, and their functions replaced where they were imported before
UNAUDITED = (
    "readline",
    "_posixshmem",
    "_gdbm",
    "_dbm",
    "dbm",
    "_curses",
    "curses",
)
#: library code that reads source files and takes a refusal as "no file" (torch.compile's
#: line-to-function-name cache): its reads of a secret are refused without an incident
TOLERANT_READERS = (("torch/_dynamo/funcname_cache.py", "_add_file"),)
#: libraries imported before the hook is set, because importing them does what learner code may
#: not: filelock, as installed on the GPU machines (torch.compile imports it), adds an audit hook
#: of its own in ``_register_fork_hooks`` (2026-12-06, an H100: a compile in a worker was flagged)
PRELOADED = ("filelock",)
#: programs a learner process may start (from the Python installation only): the lessons show a
#: kernel's SASS, which ``nvdisasm`` makes, and torch.compile's kernels go through ``ptxas``;
#: they end with the process group
TOOLS = ("nvdisasm", "ptxas")
#: the arguments of a version query: any other program asked only this is answered "not
#: installed" (FileNotFoundError, as a missing program is), without an incident
VERSION_PROBES = (["--version"], ["-V"])
#: the CUDA driver, by the name the loader finds it by: a learner process may load it and look
#: its functions up through ctypes (``runtime.resident_clusters`` does); the driver's API is in
#: reach anyway, through the DSL's ``cuda.bindings``, and its files are the kernel's to guard
DRIVER = ("libcuda.so.1", "libcuda.so")
#: system programs a learner process may run with exactly these arguments: they only print
#: (``ldconfig -p``, the loader's cache: Triton and ``ctypes.util.find_library`` find libcuda
#: with it)
QUERIES = (("ldconfig", "-p"),)
#: the attributes that hand out a frame of the interpreter's stack (each raises the audit event
#: ``object.__getattr__``); ``sys._getframe`` and ``sys._current_frames`` raise their own
FRAME_ATTRIBUTES = frozenset(("tb_frame", "gi_frame", "cr_frame", "ag_frame"))
#: standard-library files that hand the frames they take to their caller (``inspect``'s
#: ``currentframe``/``stack``, ``traceback.walk_stack``, ``logging.currentframe``, a task's
#: ``get_stack``, a wrapped generator's ``gi_frame``, ``signal.signal``): a frame one of them takes
#: is taken for whoever called it
FRAME_HELPERS = (
    "/inspect.py", "/traceback.py", "/logging/__init__.py", "/functools.py", "/contextlib.py",
    "/types.py", "/signal.py", "/bdb.py", "/pdb.py", "/asyncio/base_tasks.py",
    "/asyncio/tasks.py", "/asyncio/coroutines.py", "/asyncio/format_helpers.py",
)  # fmt: skip
#: installed functions (file under the installation, function) that hand the frame, or the
#: locals, they take to their caller (found by reading the installation for ``sys._getframe``
#: and ``f_locals`` returned: docs/grading.md): a frame one of them takes is taken for its caller
FRAME_HELPER_FUNCTIONS = (
    ("/numpy/distutils/misc_util.py", "get_frame"),
    ("/IPython/core/interactiveshell.py", "get_local_scope"),
    ("/pip/_vendor/rich/console.py", "_caller_frame_info"),
    ("/typing_extensions.py", "_caller"),
    ("/jupyter_core/utils/__init__.py", "_get_frame"),  # (red team 17 took a frame with it)
    ("/pydevd_bundle/pydevd_constants.py", "get_frame"),
)
#: the same by function name: the files that hold one of that name (two of one name must not
#: hide each other: numpy's get_frame and pydevd's)
FRAME_HELPER_FILES = {
    fn: tuple(x for x, f in FRAME_HELPER_FUNCTIONS if f == fn) for _, fn in FRAME_HELPER_FUNCTIONS
}
#: /proc entries of this process that are not a way out (no cwd, root, fd, mem, environ)
PROC_SELF_OK = ("stat", "statm", "status", "maps", "cmdline", "comm", "limits", "cgroup", "task")

#: what a student reads of a refusal, by how the sandbox's rule begins its words (an incident
#: comes from the learner's process, which could write anything in it: no word of it is shown
#: but these; the instructor's record keeps it whole)
INCIDENT_KINDS = (
    ("compiling, or an incident, that the grader", "tampering with the grader's record"),
    ("writing to the grader's record", "tampering with the grader's record"),
    ("compiling more text at run time", "compiling more text at run time than the grader keeps"),
    ("taking a frame", "taking a frame of the interpreter's stack"),
    ("compiling", "making code that passes for the library's"),
    ("making a code object", "making code from no text (bytecode, a code object)"),
    ("loading marshalled code", "making code from no text (bytecode, a code object)"),
    ("loading compiled code", "making code that passes for the library's"),
    ("renaming a code object", "making code that passes for the library's"),
    ("importing from the archive", "making code that passes for the library's"),
    ("adding an audit hook", "adding an audit hook"),
    ("a fresh copy of the built-in", "a fresh copy of a guarded built-in module"),
    ("a module that reads or writes", "a module that reads or writes files unaudited"),
    ("opening an sqlite", "opening an SQLite database"),
    ("making a fifo", "making a fifo or a device file"),
    ("writing", "writing outside its scratch folder"),
    ("opening", "opening a file or folder outside its scratch folder"),
    ("reading", "reading what it may not read"),
    ("listing", "listing a folder it may not read"),
    ("importing", "importing a module it may not import"),
    ("changing the working directory", "changing the working directory"),
    ("changing ", "changing a function's code or a library's class"),
    ("setting", "setting a loader variable"),
    ("loading the native library", "loading a native library"),
    ("ctypes.", "native functions or raw memory through ctypes"),
    ("gc.", "walking every object of the process"),
    ("sys.set", "switching a profiler or tracer"),
    ("sys.monitoring", "switching a profiler or tracer"),
    ("socket.", "opening a network connection"),
    ("os.kill", "signalling another process"),
    ("signal.", "signalling another process"),
    ("subprocess.", "starting a process"),
    ("starting", "starting a process"),
    ("running", "starting a process"),
    ("giving", "starting a process"),
    ("pty.", "starting a process"),
    ("os.system", "starting a process"),
    ("os.exec", "starting a process"),
    ("os.posix_spawn", "starting a process"),
    ("os.spawn", "starting a process"),
    ("os.fork", "starting a process"),
    ("os.startfile", "starting a process"),
    ("os.symlink", "linking a file"),
    ("os.chroot", "changing the root folder"),
    ("os.", "changing files outside its scratch folder"),
    ("shutil.", "changing files outside its scratch folder"),
)
#: what the worker reports of a module's function, class or module rebound by learner code
REBOUND = "rebound:"
#: an incident the learner's process reported that is none of the sandbox's
OTHER_INCIDENT = "something the sandbox refuses"


#: the DSL's trace of a jit function (``cute.compile`` and a ``@cute.jit`` call both run it: no
#: DSL value exists outside one): a tripwire where an exercise asks for what the DSL computes
DSL_TRACE = "cutlass.base_dsl.dsl.BaseDSL.generate_mlir"


#: what an exercise that asks a count (``Exercise.watch_ops``) reports of a torch operator run
#: on a tensor of more than one element, from the cell's load on
MEASURED = "torch operators run on tensors"


def incident_kind(text: str, finished=()) -> str:
    """What a student reads of the incident ``text``: a fixed phrase (``INCIDENT_KINDS``), and
    of a tripwire reached its name only where it is one of ``finished`` (the grader's own)."""
    if not isinstance(text, str):
        return OTHER_INCIDENT
    if text.startswith(f"reached: {REBOUND}"):
        return "changing the grader's or the library's code in memory"
    if text.startswith("reached: "):
        name = text.removeprefix("reached: ")
        if name == DSL_TRACE:
            return "running the DSL where the exercise asks you to compute it yourself"
        if name == MEASURED:
            return "measuring with torch operators where the exercise asks you to count"
        what = "reaching the finished version of what is asked"
        return f"{what} ({name})" if name in finished else what
    rule = text.removeprefix("refused: ").lower()
    return next((kind for start, kind in INCIDENT_KINDS if rule.startswith(start)), OTHER_INCIDENT)


#: the modules a learner process may neither import (prefixes of dotted names) nor read the
#: files of: the exercises and the solutions; the peers' RMSNorms, QuACK (installed, and the
#: copy vendored in torch, which red team 13 loaded under a package name of its own) and Liger;
#: torch's own test suite, whose helpers hold reference RMSNorms (red team 13 ran one)
DENIED_MODULES = (
    "quack_edu.grading.exercises",
    "solutions",
    "quack",
    "torch._vendor.quack",
    "liger_kernel",
    "torch.testing._internal",
)
#: the parts of a denied module a learner process may import all the same: what torch's own
#: library imports from its test suite (``torch.library.opcheck``, which lesson 06 runs: optests;
#: ``torch._refs``: common_dtype; ``torch.utils.checkpoint``: logging_tensor; FSDP: fake_pg)
DENIED_EXCEPT = (
    "torch.testing._internal.optests",
    "torch.testing._internal.common_dtype",
    "torch.testing._internal.logging_tensor",
    "torch.testing._internal.distributed.fake_pg",
)


def denied_module(name: str, denied, allowed=DENIED_EXCEPT) -> bool:
    """Whether a learner process may not import ``name``: it is under a denied module, and is
    neither an allowed part (or under one) nor a package on the way to one."""
    if not any(name == d or name.startswith(d + ".") for d in denied):
        return False
    return not any(name == a or name.startswith(a + ".") or a.startswith(name + ".")
                   for a in allowed)  # fmt: skip


def denied_files(denied, allowed=DENIED_EXCEPT) -> list[str]:
    """The files and folders that hold the denied modules' code, less the allowed parts (and
    the ``__init__`` files of the packages on the way to them): a module is read from them
    under whatever name it is loaded by. Found before the lock-down (``find_spec`` imports the
    parents of a dotted name, never the module)."""
    import importlib.util

    out: list[str] = []
    for name in denied:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError, AttributeError):
            continue  # not installed here (or a parent that does not import)
        if spec is None:
            continue
        if not spec.submodule_search_locations:  # a module of one file
            if spec.origin and os.path.isfile(spec.origin):
                out.append(spec.origin)
            continue
        keep = [a[len(name) + 1 :].split(".") for a in allowed if a.startswith(name + ".")]
        for folder in spec.submodule_search_locations:
            out += _folder_less(folder, keep)
    return out


def _folder_less(folder: str, keep: list) -> list[str]:
    """``folder``, or, where parts of it are kept (each a list of names below it), its other
    entries (compiled files in ``__pycache__`` by their module's name)."""
    if not keep:
        return [folder]
    if any(not k for k in keep):  # the whole folder is kept
        return []
    heads = {k[0] for k in keep}
    out = []
    for entry in sorted(os.listdir(folder)):
        path, stem = os.path.join(folder, entry), entry.split(".", 1)[0]
        if entry == "__pycache__":
            out += [f"{path}/{c}" for c in sorted(os.listdir(path))
                    if c.split(".", 1)[0] not in heads | {"__init__"}]  # fmt: skip
        elif stem in heads and os.path.isdir(path):
            out += _folder_less(path, [k[1:] for k in keep if k[0] == stem])
        elif stem not in heads and stem != "__init__":
            out.append(path)
    return out


#: the audit event by which a stand-in asks the hook to call the function it stands for
RELAY = "quack_edu.sandbox.call"
#: a function's attributes learner code may not set: its code would be no text's
CODE_ATTRIBUTES = frozenset(("__code__", "__defaults__", "__kwdefaults__"))


def foreign_code(fn, code) -> bool:
    """Whether ``code`` is of another file than ``fn``'s own code (or is no code): what no
    caller may put in a function (the DSL replaces a function's code by its own, preprocessed
    from the same file)."""
    return getattr(getattr(fn, "__code__", None), "co_filename", 0) != getattr(
        code, "co_filename", None
    )


def stand_in(what: str):
    """What learner code reaches in place of a guarded function (the process, signal, readlink
    and ``_imp`` functions, torch's ``set_eval_frame``): it holds its name alone and asks the
    hook, which alone holds the function and its rule, to call it. The guards it replaces
    closed over the real functions and the hook's own helpers, which a learner read and rebound
    through ``__closure__`` (red team 16)."""

    def stand_in(*args, **kwargs):
        box: list = []
        sys.audit(RELAY, what, args, kwargs, box)
        return box[0] if box else None  # (the hook raises where it refuses)

    stand_in.__qualname__ = stand_in.__name__ = what
    return stand_in


def frameless(handler):
    """A learner's signal handler, handed None in place of the frame."""

    def on_signal(signum, frame):  # noqa: ARG001  (the frame stays here)
        return handler(signum, None)

    return on_signal


def text_in_lines(text: str, lines: list) -> bool:
    """Whether ``text`` is ``lines`` (a file's), whole, or a whole block of them, dedented as
    CuTe DSL parses a function (``sandbox``'s rule for text compiled under a file's name)."""
    want = text.splitlines()
    first = next((i for i, w in enumerate(want) if w.strip()), None)
    if first is None:
        return True
    head = want[first]
    for i, line in enumerate(lines):
        k = i - first
        if k < 0 or not line.endswith(head) or line[: len(line) - len(head)].strip():
            continue
        pad = line[: len(line) - len(head)]
        if k + len(want) <= len(lines) and all(
            (lines[k + j] == pad + w) if w.strip() else not lines[k + j].strip()
            for j, w in enumerate(want)
        ):
            if whole_block(lines, k + first, k + len(want), pad, head):
                return True
    return False


def whole_block(lines: list, start: int, end: int, pad: str, head: str) -> bool:
    """Whether ``lines[start:end]`` is the whole file or a whole block of it (a ``def``,
    ``class`` or decorated one, to where the file goes back to its indentation): not one
    line of it (red team 9 compiled a line of matplotlib under its name, to pass for it)."""
    rest = [ln for ln in lines[end:] if ln.strip()]
    if not any(ln.strip() for ln in lines[:start]) and not rest:
        return True  # the whole file
    if not head.startswith(("def ", "async def ", "class ", "@")):
        return False
    nxt = rest[0] if rest else ""
    return not nxt or len(nxt) - len(nxt.lstrip()) <= len(pad)


def private_names(module, builtins_copy: dict, **names) -> dict:
    """A private copy of ``module``'s names (with ``names`` in place of some), every function of
    it rebuilt on the copy, so that the calls between them stay on it too: what the sandbox's
    hook calls runs on names learner code cannot rebind (red team 16 rebound the rules the hook
    read, red team 17 ``posixpath.abspath`` under ``os.path.realpath``). Never for a function
    handed to learner code (``stand_in``): its globals would hand out the copy."""
    import types

    copy = dict(vars(module), __builtins__=builtins_copy, **names)
    for k, f in list(copy.items()):
        if isinstance(f, types.FunctionType):
            copy[k] = types.FunctionType(f.__code__, copy, k, f.__defaults__, f.__closure__)
            copy[k].__kwdefaults__ = f.__kwdefaults__
    return copy


def driver_handles() -> frozenset:
    """The CUDA driver's library handles (where it loads), before the lock-down."""
    import ctypes

    out = set()
    for name in DRIVER:
        try:
            out.add(ctypes.CDLL(name)._handle)
        except OSError:
            pass
    return frozenset(out)
