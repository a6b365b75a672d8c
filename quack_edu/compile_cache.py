"""Compiled kernels kept on disk, so that a new process loads a kernel instead of compiling it.

``cute.compile`` of one of the library's kernels costs 0.3-0.5 s, and a process compiles every
configuration it uses once (0.77-1.0 s to the first result of a known key in a fresh process
on the H200's host). CuTe DSL can export a function compiled with the TVM-FFI convention to
an object file (``compiled.export_to_c(path, function_name=...)``) and load it back in
another process (``cute.runtime.load_module(path, enable_tvm_ffi=True)[name]``): the
"Exporting Compiled Module" section of the DSL's *Compile with TVM FFI* guide; QuACK keeps
its kernels the same way. Loading links the object in memory and takes ~0.04 s; what comes
back is the ``tvm_ffi.Function`` that the compiled kernel calls inside
(``runtime.direct_call``), taking the same positional arguments. It has no ``__ptx__`` or
``__cubin__``: compiles that ask for artifacts bypass the cache (``runtime.compile_kernel``).

An entry is two files named by the key's digest: ``<digest>.o`` (the object) and
``<digest>.json`` (the key in words, the object's size and SHA-256). The key is everything
that decides the compiled code: the kernel class, the source of every ``quack_edu`` module
its module imports (transitively), the kernel object's attributes (dtypes, N, config,
features, vec, ...: plain data, else the kernel is not cached), the compile options, the
DSL's compile settings (target arch included) and the versions of the DSL, TVM-FFI,
quack_edu and Python. Kernels whose class is not a module-level class of ``quack_edu`` (a
learner's subclass, a class built at run time) are never cached.

Where: ``~/.cache/quack_edu/kernels/`` (``$XDG_CACHE_HOME`` is honoured);
``QUACK_EDU_KERNEL_CACHE=/path`` moves it, ``QUACK_EDU_KERNEL_CACHE=0`` (or ``off``) turns it
off. It is used in GPU mode only: in compile-only mode nothing is launched, and a compiled
kernel is wanted for what it can show. ``quack-edu cache`` shows the folder and its size,
``quack-edu cache --clear`` empties it (as does deleting the folder).

Safety: files are written under temporary names and renamed into place, so a reader sees a
whole file or none; two processes compiling the same key both write whole entries and the
last rename wins. An entry whose object does not match its recorded hash, or that fails to
load, is deleted and compiled again. The folder is kept under ``MAX_BYTES``: after each
write the least recently used entries (a load touches its object) are deleted.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields, is_dataclass
from enum import Enum
from pathlib import Path

from ._env import cache_location

ENV_VAR = "QUACK_EDU_KERNEL_CACHE"
#: changes when the entry format or the key's meaning does
FORMAT_VERSION = 1
#: the folder is trimmed to this after a write (an entry is ~20-200 KB)
MAX_BYTES = 512 * 1024 * 1024
#: temporary files older than this are a writer that died: removed when trimming
_STALE_TMP_S = 3600
_PACKAGE = __name__.rpartition(".")[0]  # "quack_edu"


@dataclass
class Stats:
    """What the cache did in this process (read by tests and ``quack-edu cache``)."""

    hits: int = 0
    misses: int = 0
    writes: int = 0
    dropped: int = 0  # entries found broken and deleted
    uncacheable: int = 0  # kernels compiled without the cache (not plain data, not ours)
    errors: list[str] = field(default_factory=list)  # the last few problems, in words

    def note(self, text: str) -> None:
        self.errors = [*self.errors[-4:], text]


STATS = Stats()


# -- where ----------------------------------------------------------------------------------------
def cache_dir() -> Path | None:
    """The folder from ``QUACK_EDU_KERNEL_CACHE`` (default ``~/.cache/quack_edu/kernels``);
    None when the variable turns the cache off."""
    return cache_location(ENV_VAR, "kernels")


def active_dir() -> Path | None:
    """The folder the library uses now: ``cache_dir()`` in GPU mode, else None."""
    from ._env import MODE

    return cache_dir() if MODE.gpu else None


# -- the key --------------------------------------------------------------------------------------
class Uncacheable(Exception):
    """The kernel's compiled code may depend on something the key cannot name."""


@dataclass(frozen=True)
class Key:
    digest: str  # hex, names the entry's files
    parts: dict  # what was hashed, in words (stored beside the object)

    @property
    def function_name(self) -> str:
        """The exported symbol's name (``__tvm_ffi_<name>``): unique per key."""
        return f"quack_edu_{self.digest[:16]}"


def _our_class(cls: type) -> bool:
    """A class defined at the top level (or nested in classes) of a quack_edu module, and
    reachable there by its qualified name: not one built at run time or in a function."""
    module = sys.modules.get(cls.__module__)
    if module is None or not cls.__module__.startswith(_PACKAGE + "."):
        return False
    obj = module
    for part in cls.__qualname__.split("."):
        obj = getattr(obj, part, None)
    return obj is cls


def _resolve(module, qualname: str):
    """The object ``qualname`` names in ``module``, as stored (a staticmethod, classmethod or
    property unwrapped to its function); None when there is none."""
    obj = module
    for part in qualname.split("."):
        obj = vars(obj).get(part) if hasattr(obj, "__dict__") else None
        obj = getattr(obj, "__func__", None) or getattr(obj, "fget", None) or obj
    return obj


def _our_function(fn) -> bool:
    """A function of a quack_edu module, found there by its qualified name (not a lambda, a
    closure or a learner's function patched onto a class)."""
    name = getattr(fn, "__module__", None) or ""
    module = sys.modules.get(name)
    if module is None or not name.startswith(_PACKAGE + "."):
        return False
    return _resolve(module, getattr(fn, "__qualname__", "")) is fn


def _class_attrs(classes, modules: set[str]) -> list:
    """The plain-data class attributes of ``classes`` (switches such as ``pdl = True``: a
    patched class gets another key); raises ``Uncacheable`` for a method not defined in a
    quack_edu module."""
    out = []
    for cls in classes:
        for name, value in sorted(vars(cls).items()):
            fn = getattr(value, "__func__", None) or getattr(value, "fget", None) or value
            if callable(fn) and not isinstance(fn, type):
                if not _our_function(fn):
                    raise Uncacheable(f"{cls.__qualname__}.{name} is not a function of ours")
            elif not (name.startswith("__") and name.endswith("__")):
                out.append([cls.__qualname__, name, _canon(value, modules)])
    return out


def _canon(value, modules: set[str]):
    """``value`` as JSON-able plain data; the modules whose classes it uses go in ``modules``.
    Raises ``Uncacheable`` for anything else (a function, a tensor, an unknown object)."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return ["float", value.hex()]
    if isinstance(value, (tuple, list)):
        return [type(value).__name__, *(_canon(v, modules) for v in value)]
    if isinstance(value, dict):
        return ["dict", *sorted((str(k), _canon(v, modules)) for k, v in value.items())]
    if isinstance(value, type):
        if value.__module__.split(".")[0] == "cutlass":  # dtypes: fixed by the DSL's version
            return ["type", f"{value.__module__}.{value.__qualname__}"]
        if _our_class(value):
            modules.add(value.__module__)
            return ["type", f"{value.__module__}.{value.__qualname__}"]
        raise Uncacheable(f"a class from elsewhere: {value!r}")
    cls = type(value)
    if cls.__module__ == "torch" and cls.__name__ == "dtype":
        return ["torch", str(value)]
    if isinstance(value, Enum) and _our_class(cls):
        modules.add(cls.__module__)
        return ["enum", f"{cls.__module__}.{cls.__qualname__}", value.name]
    if is_dataclass(value) and _our_class(cls):
        modules.add(cls.__module__)
        items = [[f.name, _canon(getattr(value, f.name), modules)] for f in fields(value)]
        return ["dataclass", f"{cls.__module__}.{cls.__qualname__}", *items]
    raise Uncacheable(f"an attribute of type {cls.__module__}.{cls.__qualname__}")


_IMPORT = re.compile(
    rb"^[ \t]*from[ \t]+(\.*[\w.]*)[ \t]+import[ \t]+(\([^)]*\)|[^\n#]*)"
    rb"|^[ \t]*import[ \t]+([^\n#]*)",
    re.M,
)


def _module_file(name: str) -> Path | None:
    """The source file of module ``name`` of this package, or None."""
    if name != _PACKAGE and not name.startswith(_PACKAGE + "."):
        return None
    path = Path(__file__).resolve().parent.joinpath(*name.split(".")[1:])
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _imports(name: str, source: bytes) -> set[str]:
    """The modules of this package that ``source`` (module ``name``) imports, anywhere in
    the file (imports inside functions too: what a kernel calls at trace time counts)."""
    package = name if _module_file(name).name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for src, names, plain in _IMPORT.findall(source):
        if plain:  # import a.b as c, d
            found.update(n.split()[0] for n in plain.decode().split(",") if n.strip())
            continue
        src = src.decode()
        dots = len(src) - len(src.lstrip("."))
        if dots:
            base = package.rsplit(".", dots - 1)[0] if dots > 1 else package
            src = f"{base}.{src[dots:]}" if src[dots:] else base
        names = [n.split("#")[0].strip() for n in names.decode().strip("()").split(",")]
        subs = {f"{src}.{n.split()[0]}" for n in names if n}
        subs = {m for m in subs if _module_file(m) is not None}
        # ``from pkg import a, b``: the submodules a and b, or pkg itself for its names
        found |= subs if len(subs) == len([n for n in names if n]) else {src, *subs}
    return {m for m in found if _module_file(m) is not None}


#: when this module was imported: a source file changed later may not be the code running
_STARTED = time.time()
_SOURCES: dict[str, tuple[bytes, set[str]]] = {}  # module -> (source, its imports): per process
_DIGESTS: dict[frozenset, tuple[str, list[str]]] = {}


def source_digest(modules: set[str]) -> tuple[str, list[str]]:
    """SHA-256 of the source of ``modules`` and of every module of this package they import,
    transitively; and those modules' names. Files are read once a process."""
    hit = _DIGESTS.get(frozenset(modules))
    if hit is None:
        hit = _DIGESTS[frozenset(modules)] = _source_digest(modules)
    return hit


def _source_digest(modules: set[str]) -> tuple[str, list[str]]:
    todo, seen = set(modules), set()
    while todo:
        name = todo.pop()
        seen.add(name)
        if name not in _SOURCES:
            path = _module_file(name)
            if path.stat().st_mtime > _STARTED:
                raise Uncacheable(f"{path} changed after this process started")
            source = path.read_bytes()
            _SOURCES[name] = (source, _imports(name, source))
        todo |= _SOURCES[name][1] - seen
    h = hashlib.sha256()
    for name in sorted(seen):
        source = _SOURCES[name][0]
        h.update(f"{name}\0{len(source)}\0".encode())
        h.update(source)
    return h.hexdigest(), sorted(seen)


def _dsl_settings() -> str:
    """The DSL's settings that change what it compiles (its own JIT cache's key: target arch,
    compiler options, backend, ...); the ``CUTE_DSL_*`` variables where it cannot say."""
    try:
        from cutlass.cutlass_dsl import CuTeDSL

        return CuTeDSL._get_dsl().envar.cache_key_str()
    except Exception:  # noqa: BLE001 (a DSL without this method: the variables say it)
        env = sorted((k, v) for k, v in os.environ.items() if k.startswith("CUTE_DSL_"))
        from ._env import MODE

        return repr((env, MODE.capability))


def keeps_artifacts() -> bool:
    """Whether the DSL was told to keep PTX, cubin or IR (``CUTE_DSL_KEEP``): a loaded
    function has none of them, so such a process compiles every kernel."""
    try:
        from cutlass.cutlass_dsl import CuTeDSL

        return bool(CuTeDSL._get_dsl().envar.keep_tokens)
    except Exception:  # noqa: BLE001 (a DSL without this attribute)
        return bool(os.environ.get("CUTE_DSL_KEEP", "").strip())


def _versions() -> dict:
    import cutlass
    import tvm_ffi

    return {
        "quack_edu": getattr(sys.modules.get(_PACKAGE), "__version__", None),
        "cutlass_dsl": cutlass.__version__,
        "tvm_ffi": tvm_ffi.__version__,
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
    }


def kernel_key(kernel, options: str) -> Key:
    """The key of ``kernel`` (an object ``cute.compile`` is called on) compiled with
    ``options``. Raises ``Uncacheable`` for a kernel the key cannot describe."""
    classes = [c for c in type(kernel).__mro__ if c is not object]
    foreign = [c for c in classes if not _our_class(c)]
    if foreign:
        raise Uncacheable(f"{foreign[0].__module__}.{foreign[0].__qualname__} is not ours")
    modules = {c.__module__ for c in classes}
    state = _canon(dict(vars(kernel)), modules)
    class_attrs = _class_attrs(classes, modules)
    source, module_names = source_digest(modules)
    cls = type(kernel)
    parts = {
        "format": FORMAT_VERSION,
        "kernel": f"{cls.__module__}.{cls.__qualname__}",
        "state": state,
        "class_attrs": class_attrs,
        "options": options,
        "source": source,
        "modules": module_names,
        "dsl": _dsl_settings(),
        **_versions(),
    }
    text = json.dumps(parts, sort_keys=True, separators=(",", ":"))
    return Key(hashlib.sha256(text.encode()).hexdigest()[:40], parts)


# -- entries --------------------------------------------------------------------------------------
def _paths(directory: Path, key: Key) -> tuple[Path, Path]:
    return directory / f"{key.digest}.o", directory / f"{key.digest}.json"


def _drop(directory: Path, key: Key, why: str) -> None:
    STATS.dropped += 1
    STATS.note(f"entry {key.digest[:12]} dropped: {why}")
    for p in _paths(directory, key):
        try:
            p.unlink()
        except OSError:
            pass


def load(directory: Path, key: Key):
    """The function stored for ``key``, loaded; None when there is none (or it is broken:
    then it is deleted). Never raises."""
    obj, meta = _paths(directory, key)
    try:
        info = json.loads(meta.read_text())
        data = obj.read_bytes()
    except (OSError, ValueError):
        return None  # no entry (or one being replaced: a miss either way)
    try:
        if info.get("format") != FORMAT_VERSION or info.get("key") != key.digest:
            raise ValueError("written for another key")
        if len(data) != info["bytes"] or hashlib.sha256(data).hexdigest() != info["sha256"]:
            raise ValueError("the object does not match its recorded hash")
        import cutlass.cute as cute

        fn = cute.runtime.load_module(str(obj), enable_tvm_ffi=True)[key.function_name]
    except Exception as e:  # noqa: BLE001 (any broken entry is a miss, never an error)
        _drop(directory, key, f"{type(e).__name__}: {str(e).strip()[:200]}")
        return None
    try:
        os.utime(obj)  # least recently used goes first when trimming
    except OSError:
        pass
    return fn


def _write(path: Path, write: Callable[[str], None]) -> None:
    """``write(tmp)`` to a temporary file beside ``path``, then rename it into place."""
    fd, tmp = tempfile.mkstemp(
        dir=path.parent, prefix=f".{path.stem}.", suffix=".tmp" + path.suffix
    )
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def store(directory: Path, key: Key, compiled) -> bool:
    """Export ``compiled`` (a function compiled with ``--enable-tvm-ffi``) under ``key``;
    False (and a note in ``STATS``) when it cannot be written. Never raises."""
    obj, meta = _paths(directory, key)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        _write(obj, lambda tmp: compiled.export_to_c(tmp, function_name=key.function_name))
        data = obj.read_bytes()
        info = {
            "format": FORMAT_VERSION,
            "key": key.digest,
            "bytes": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
            "written": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "parts": key.parts,
        }
        _write(meta, lambda tmp: Path(tmp).write_text(json.dumps(info, indent=1) + "\n"))
    except Exception as e:  # noqa: BLE001 (a full disk, a read-only home: compile each time)
        STATS.note(f"could not write {obj}: {type(e).__name__}: {str(e).strip()[:200]}")
        return False
    STATS.writes += 1
    trim(directory)
    return True


def entries(directory: Path) -> list[tuple[Path, int, float]]:
    """(object, bytes of the entry's two files, last use) of every entry, oldest use first."""
    found = []
    try:
        for obj in directory.glob("*.o"):
            if obj.name.startswith("."):
                continue
            try:
                size = obj.stat().st_size
                used = obj.stat().st_mtime
                meta = obj.with_suffix(".json")
                size += meta.stat().st_size if meta.exists() else 0
            except OSError:
                continue
            found.append((obj, size, used))
    except OSError:
        return []
    return sorted(found, key=lambda e: e[2])


def usage(directory: Path | None) -> tuple[int, int]:
    """(entries, bytes) in ``directory``."""
    if directory is None or not directory.is_dir():
        return 0, 0
    found = entries(directory)
    return len(found), sum(size for _, size, _ in found)


def trim(directory: Path, max_bytes: int | None = None) -> int:
    """Delete the least recently used entries until ``directory`` holds at most ``max_bytes``
    (``MAX_BYTES``), and temporary files a dead writer left; the number of entries deleted."""
    max_bytes = MAX_BYTES if max_bytes is None else max_bytes
    now = time.time()
    for tmp in directory.glob(".*.tmp.*"):
        try:
            if now - tmp.stat().st_mtime > _STALE_TMP_S:
                tmp.unlink()
        except OSError:
            pass
    found = entries(directory)
    total = sum(size for _, size, _ in found)
    deleted = 0
    for obj, size, _ in found:
        if total <= max_bytes:
            break
        for p in (obj, obj.with_suffix(".json")):
            try:
                p.unlink()
            except OSError:
                pass
        total -= size
        deleted += 1
    return deleted


def clear(directory: Path | None) -> int:
    """Delete every entry in ``directory``; the number deleted."""
    if directory is None or not directory.is_dir():
        return 0
    return trim(directory, max_bytes=-1)


def describe() -> str:
    """One line: where the cache is, whether it is used, what it holds."""
    from ._env import MODE

    directory = cache_dir()
    if directory is None:
        return f"off ({ENV_VAR}=0): every process compiles the kernels it uses"
    n, size = usage(directory)
    held = f"{n} kernels, {size / 2**20:.1f} MiB of at most {MAX_BYTES // 2**20} MiB"
    if not MODE.gpu:
        return f"{directory} ({held}; used in GPU mode only)"
    return f"{directory} ({held})"


# -- the way in -----------------------------------------------------------------------------------
def cached_compile(kernel, options: str, compile: Callable[[], object], directory=None):
    """``compile()`` (``cute.compile`` of ``kernel`` with ``options``), or the function stored
    for the same key in ``directory`` (default ``active_dir()``: None turns the cache off).
    A new compile is stored for the next process."""
    directory = active_dir() if directory is None else Path(directory)
    if directory is None or keeps_artifacts():
        return compile()
    try:
        key = kernel_key(kernel, options)
    except Uncacheable:
        STATS.uncacheable += 1
        return compile()
    except Exception as e:  # noqa: BLE001 (a source file unreadable, ...: compile as before)
        STATS.note(f"no key for {type(kernel).__name__}: {type(e).__name__}: {e}")
        return compile()
    fn = load(directory, key)
    if fn is not None:
        STATS.hits += 1
        return fn
    STATS.misses += 1
    compiled = compile()
    store(directory, key, compiled)
    return compiled
