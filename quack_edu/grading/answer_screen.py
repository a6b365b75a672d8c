"""The screen of an answer cell's source (``screen``), before it is judged: a cell that names
the grader, the process, the file system or the library's own implementation of the piece is
flagged and scores 0, unjudged. The screen only gives an early, clear message; the boundary
(``sandbox``, ``judge``) does not rely on it."""

from __future__ import annotations

import ast
from pathlib import Path

from .registry import Exercise

#: modules an answer cell may import (roots), and names it may import from quack_edu
ALLOWED_IMPORTS = {
    "math",
    "operator",
    "functools",
    "itertools",
    "typing",
    "dataclasses",
    "numpy",
    "torch",
    "cutlass",
}
ALLOWED_FROM_QUACK_EDU = {"f32_bits"}  # a bit-cast helper lesson 04 hands the learner
#: names that reach the process, the file system, the grader or Python's own machinery
FORBIDDEN_NAMES = {
    "os",
    "sys",
    "subprocess",
    "builtins",
    "importlib",
    "ctypes",
    "signal",
    "gc",
    "inspect",
    "pickle",
    "marshal",
    "shutil",
    "socket",
    "threading",
    "multiprocessing",
    "atexit",
    "pathlib",
    "Path",
    "io",
    "IPython",
    "get_ipython",
    "exec",
    "eval",
    "compile",
    "open",
    "globals",
    "locals",
    "vars",
    "getattr",
    "setattr",
    "delattr",
    "exit",
    "quit",
    "breakpoint",
    "input",
    "check",
    "run_exercise",
    "_record",
    "grading",
    "environ",
    "super",  # a whole-kernel answer sits on a subclass of the stage: super() is its kernel
    "attrgetter",  # operator.attrgetter("sys.modules")(torch): getattr by another name
    "methodcaller",
    "ForwardRef",  # its ``_evaluate`` evaluates a string the screen cannot read (red team 9)
    "get_type_hints",
}
#: the names above that reach the process or files through any module (``torch.sys``,
#: ``typing.sys``): flagged as attributes too
FORBIDDEN_ATTRIBUTES = {
    "os", "sys", "subprocess", "builtins", "importlib", "ctypes", "signal", "gc", "pickle",
    "marshal", "shutil", "socket", "multiprocessing", "atexit", "pathlib", "io", "modules",
    "readline", "sqlite3", "open", "exec", "eval", "globals", "locals", "getattr", "setattr",
    "attrgetter", "methodcaller",
    # text evaluated as code where the screen cannot read it (red team 9: a string evaluated by
    # ``typing.ForwardRef(s)._evaluate(...)`` reached ``sys.modules``)
    "ForwardRef", "_evaluate", "_eval_type", "get_type_hints", "evaluate_forward_ref",
    # frames and closures: a frame's f_back leads to the grader's code in the worker (red team 8)
    "f_back", "f_globals", "f_locals", "f_builtins", "gi_frame", "tb_frame", "cr_frame",
    "ag_frame", "currentframe", "_getframe", "inspect", "linecache", "__closure__",
    "cell_contents", "__globals__", "__builtins__",
    # code made from no text (red team 14: a function of marshalled bytecode or a CodeType)
    "types", "CodeType", "FunctionType", "_bootstrap", "_bootstrap_external",
    "_compile_bytecode",
}  # fmt: skip
#: special methods a class in an answer cell may not define (an answer that compares equal to
#: anything, or converts to whatever is asked)
FORBIDDEN_METHODS = {"__eq__", "__ne__", "__hash__", "__float__", "__int__", "__index__"}
FORBIDDEN_METHODS |= {"__bool__", "__str__", "__repr__", "__format__"}
FORBIDDEN_METHODS |= {"__array__", "__torch_function__", "__torch_dispatch__", "__getattr__"}
FORBIDDEN_METHODS |= {"__getattribute__", "__instancecheck__", "__class_getitem__", "__del__"}


def given_name(ex: Exercise, module: str, name: str) -> bool:
    """Whether ``name`` of the library module ``module`` is one the exercise hands over."""
    import importlib
    import types

    given = getattr(ex, "given", None) or {}
    if module not in given or name.startswith("_"):
        return False
    names = given[module]
    if names is not None:
        return name in names
    obj = getattr(importlib.import_module(module), name, None)
    return obj is not None and not isinstance(obj, types.ModuleType)


def holds_answer(ex: Exercise, module: str) -> str:
    """Why the library module ``module``, imported by the answer cell, is off limits when it
    holds the library's finished version of this exercise's answer (``Exercise.finished``),
    which another exercise may hand over as a tool; "" when it does not hold it."""
    names = [f[len(module) + 1 :] for f in ex.finished if f.startswith(f"{module}.")]
    if not names:
        return ""
    from .registry import all_exercises

    others = [e.id for e in all_exercises() if module in (e.given or {}) and e.id != ex.id]
    why = f": {module} holds this exercise's answer, {names[0]}, so it is off limits here"
    if others:
        why += (
            f"; {' and '.join(others[:2])} hand{'s' if len(others) == 1 else ''} it over, "
            f"where {names[0]} is a tool and not what is asked"
        )
    return why


def _imported_module(module: str, name: str) -> str:
    """The library module ``from module import name`` brings in: ``module.name`` when that is
    a module (``from quack_edu.primitives import copy``), else ``module``; read off the
    package's files (importing it could run a module's code: ``quack_edu.__main__``)."""
    package = Path(__file__).resolve().parents[1]  # quack_edu/
    path = package.joinpath(*module.split(".")[1:], name)
    is_module = path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()
    return f"{module}.{name}" if is_module else module


def screen(source: str, ex: Exercise) -> list[str]:
    """Why the answer cell is flagged (empty: it may be judged). A syntax error is not a flag:
    loading the cell reports it. The library's code is off limits except what the exercise
    hands the learner (``Exercise.given``): a given module may be imported under a name
    (``from quack_edu.primitives import copy as copy_utils``) and used only as
    ``copy_utils.<given helper>``; a given helper may be imported by name."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    except Exception as e:  # noqa: BLE001  (RecursionError: ``1+1+...+1``, 20000 terms, red team 9)
        why = "too deeply nested" if isinstance(e, RecursionError) else type(e).__name__
        return [f"could not be read ({why})"]
    why: list[str] = []
    given = getattr(ex, "given", None) or {}
    forbidden = getattr(ex, "forbidden", None) or {}

    def flag(node, text):
        line = getattr(node, "lineno", None)
        msg = f"line {line}: {text}" if line else text
        if msg not in why:
            why.append(msg)

    # the names a given module is bound to, and their uses as `alias.helper`
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name in given and a.asname:
                    aliases[a.asname] = a.name
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            for a in node.names:
                if f"{node.module}.{a.name}" in given:
                    aliases[a.asname or a.name] = f"{node.module}.{a.name}"
    used_ok: set[int] = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in aliases
        ):
            if given_name(ex, aliases[node.value.id], node.attr):
                used_ok.add(id(node.value))
            else:
                flag(node, f"uses {node.value.id}.{node.attr} (not one of the helpers given)")
                used_ok.add(id(node.value))

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                root = a.name.split(".")[0]
                if a.name in given and a.asname:
                    continue  # a module the exercise hands over, under its own name
                if root == "quack_edu":
                    held = holds_answer(ex, a.name)
                    flag(node, f"imports {a.name} (the library's own code{held})")
                elif root not in ALLOWED_IMPORTS:
                    flag(node, f"imports {a.name}")
                bad = [p for p in a.name.split(".") if p in forbidden]
                if bad:  # ``import cutlass.cute as c``: the name the exercise forbids, renamed
                    flag(node, f"imports {a.name} ({forbidden[bad[0]]})")
        elif isinstance(node, ast.ImportFrom):
            root = (node.module or "").split(".")[0]
            if node.level:
                flag(node, "a relative import")
            elif root == "quack_edu":
                bad = [
                    a.name
                    for a in node.names
                    if a.name not in ALLOWED_FROM_QUACK_EDU
                    and f"{node.module}.{a.name}" not in given
                    and not given_name(ex, node.module, a.name)
                ]
                if bad:
                    held = [holds_answer(ex, _imported_module(node.module, b)) for b in bad]
                    held = next((h for h in held if h), "")
                    flag(
                        node,
                        f"imports {', '.join(bad)} from {node.module} (the library's own{held})",
                    )
            elif root not in ALLOWED_IMPORTS:
                flag(node, f"imports from {node.module}")
            names = [*(node.module or "").split("."), *(a.name for a in node.names)]
            bad = [n for n in names if n in forbidden]
            if bad:  # ``from cutlass.cute import make_layout as ml``: renamed, still forbidden
                flag(node, f"imports {bad[0]} ({forbidden[bad[0]]})")
            reach = [a.name for a in node.names if a.name in FORBIDDEN_NAMES | FORBIDDEN_ATTRIBUTES]
            if reach:  # ``from torch import importlib as _il``: the reach, renamed (red team 14)
                flag(node, f"imports {reach[0]} (the process, files or Python's machinery)")
        elif isinstance(node, ast.Name):
            if node.id in FORBIDDEN_NAMES:
                flag(node, f"uses `{node.id}`")
            elif node.id in (getattr(ex, "forbidden", None) or {}):
                flag(node, f"uses `{node.id}` ({ex.forbidden[node.id]})")
            elif node.id == "quack_edu":
                flag(node, "uses the library's own code (quack_edu...)")
            elif node.id.startswith("__") and node.id.endswith("__") and node.id != "__name__":
                flag(node, f"uses `{node.id}`")
            elif node.id in aliases and id(node) not in used_ok:
                flag(node, f"uses `{node.id}` other than to call the helpers it gives")
        elif isinstance(node, ast.Attribute):
            a = node.attr
            if a in (getattr(ex, "forbidden", None) or {}):  # cute.make_layout, c.make_layout
                flag(node, f"uses `{a}` ({ex.forbidden[a]})")
            elif a.startswith("__") and a.endswith("__"):
                flag(node, f"uses the attribute `{a}`")
            elif a in ("_record", "run_exercise", "environ", "check", "showtraceback"):
                flag(node, f"uses the attribute `{a}`")
            elif a in FORBIDDEN_ATTRIBUTES:  # torch.sys, x.os, torch.builtins: the same reach
                flag(node, f"uses the attribute `{a}` (the process, files or Python's machinery)")
        elif isinstance(node, ast.MatchClass):  # ``case object(__globals__=g)`` reads the
            # attributes it names, as ``getattr`` would (red team 15 reached sys.modules so)
            for a in node.kwd_attrs:
                if a.startswith("_") or a in FORBIDDEN_ATTRIBUTES or a in forbidden:
                    flag(node, f"reads the attribute `{a}` in a class pattern")
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            if node.name in FORBIDDEN_METHODS:
                flag(node, f"defines `{node.name}` (an answer that compares or converts as asked)")
        elif isinstance(node, ast.Delete):
            flag(node, "deletes names (`del`)")
        elif isinstance(node, ast.Global | ast.Nonlocal):
            flag(node, "declares `global`/`nonlocal` names")
    return why
