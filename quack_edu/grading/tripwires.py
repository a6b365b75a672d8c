"""Tripwires on what an answer may not reach, and the library's text with them blanked.

``tripwire(fn, name)`` replaces, in this process only, the code of a function an answer may
not reach (torch's RMSNorm, the library's reference and finished kernels, the piece an exercise
asks for): every route to it (an attribute of an allowed module, ``getattr`` with a built
string, ``importlib``, ``sys.modules``, an alias) ends in the same function object, whose code
now records the reach (the audit event ``quack_edu.sandbox.reached``, which ``sandbox``'s hook
keeps) and raises. The original code is gone from the process, so a learner who silences the
record still gets no answer from it. ``hide_sources`` then puts the library's text, those
functions blanked, where ``inspect`` reads it, so that the package itself can be a secret.
Both run before ``sandbox.lock_down``.
"""

from __future__ import annotations

import os
import sys

#: (file, first line, last line) of each tripwired function's text (``hide_sources`` blanks it)
HIDDEN: list[tuple[str, int, int]] = []
#: file name -> its lines as the line cache has them (``hide_sources``): what ``lock_down``
#: takes for "the file's own text"
SOURCES: dict[str, list[str]] = {}


def hide_sources(root: str) -> int:
    """Put the source of every module imported from under ``root`` in ``linecache`` (where
    ``inspect``, and so CuTe DSL, reads a function's source) with the text of each tripwired
    function blanked (its lines kept, as empty lines), so that ``root`` itself can then be made
    a secret: a learner process reads no finished function's text, from the cache or the disk.
    Before ``lock_down``. Returns how many files."""
    import linecache

    root = os.path.realpath(root)
    blank: dict[str, list] = {}
    for filename, first, last in HIDDEN:
        blank.setdefault(os.path.realpath(filename), []).append((first, last))
    n = 0
    for mod in list(sys.modules.values()):
        path = getattr(mod, "__file__", None)
        if not path or not path.endswith(".py"):
            continue
        real = os.path.realpath(path)
        if not real.startswith(root + "/"):
            continue
        try:
            st = os.stat(path)
            with open(path, encoding="utf-8") as f:
                lines = f.readlines()
        except OSError:
            continue
        for first, last in blank.get(real, ()):
            for i in range(first - 1, min(last, len(lines))):
                lines[i] = "\n"
        linecache.cache[path] = (st.st_size, st.st_mtime, lines, path)
        for name in {path, real}:  # (lock_down keeps a copy: what "the file's own text" is)
            SOURCES[name] = list(lines)
        for name in {path, real}:  # torch.compile hashes the file of each function it traces
            _prime_dynamo_file_hash(name)
        n += 1
    return n


def _prime_dynamo_file_hash(path: str) -> None:
    """Fill torch.compile's cache of file hashes (``torch._dynamo.pgo``, where its caller has
    imported it) for ``path``, so that compiling a function of a hidden file reads nothing."""
    pgo = sys.modules.get("torch._dynamo.pgo")
    file_hash = getattr(pgo, "_hash_containing_file", None)
    if callable(file_hash):
        try:
            file_hash(path)
        except Exception:  # noqa: BLE001  (another torch: then it reads the file, and is refused)
            pass


def _parameters(sig) -> list[str]:
    """A ``def``'s parameter list for ``sig``, without defaults or annotations (a function's
    defaults live on the function object, not on its code)."""
    P = type(next(iter(sig.parameters.values()))) if sig.parameters else None
    out, star, prev = [], False, None
    for p in sig.parameters.values():
        if prev == P.POSITIONAL_ONLY and p.kind != P.POSITIONAL_ONLY:
            out.append("/")
        if p.kind == P.KEYWORD_ONLY and not star:
            out.append("*")
        star = star or p.kind in (P.VAR_POSITIONAL, P.KEYWORD_ONLY)
        out.append({P.VAR_POSITIONAL: "*", P.VAR_KEYWORD: "**"}.get(p.kind, "") + p.name)
        prev = p.kind
    if P is not None and prev == P.POSITIONAL_ONLY:
        out.append("/")
    return out


def tripwire(fn, name: str) -> tuple:
    """Replace the code of the Python function ``fn`` (and of what it wraps) by one that records
    ``name`` as reached and raises ``PermissionError``. Before ``lock_down``: afterwards a
    learner could do the same to a grader's function (nothing forbids it; it gains nothing).

    The new code keeps the function's parameters and free variables, and its source is where
    ``inspect`` finds a function's source (``linecache``): CuTe DSL, which compiles a
    ``@cute.jit`` function from its source, compiles the tripwire too. Returns (the function,
    its new code): ``sandbox.lock_down``'s ``hold`` watches that it stays."""
    import inspect
    import linecache

    target = inspect.unwrap(fn)
    code = getattr(target, "__code__", None)
    if code is None:
        raise TypeError(f"{name}: not a Python function")
    try:  # where its text is, to leave out of the sources a learner process may read
        lines, first = inspect.getsourcelines(target)
        HIDDEN.append((code.co_filename, first, first + len(lines) - 1))
    except (OSError, TypeError):
        pass
    params = _parameters(inspect.signature(target, follow_wrapped=False))
    free = code.co_freevars
    message = f"{REACHED} {name}, the finished version of what is asked: an answer computes it"
    # a closure of the same free variables (a code object keeps its closure's size); what it
    # says lives in its constants, not in globals that code elsewhere could change
    lines = ["def _outer():", *(f"    {v} = None" for v in free), "    pass"]
    lines += [f"    def {code.co_name}({', '.join(params)}):"]
    lines += [f"        ({', '.join(free)},)"] if free else []
    lines += [
        f"        __import__('sys').audit('quack_edu.sandbox.reached', {name!r})",
        f"        raise PermissionError({message!r})",
        f"    return {code.co_name}",
    ]
    source = "\n".join(lines) + "\n"
    filename = f"<tripwire {name}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    glob: dict = {}
    exec(compile(source, filename, "exec"), glob)
    new = glob["_outer"]().__code__
    target.__code__ = new.replace(co_qualname=code.co_qualname)
    return (target, target.__code__)  # (what ``sandbox.lock_down(hold=...)`` watches)


#: how a tripwire's error begins
REACHED = "the grader's sandbox: the answer reached"
