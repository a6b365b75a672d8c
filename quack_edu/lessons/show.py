"""Show a stage's kernel in a lesson, with the lines that changed since an earlier stage marked.

    show_kernel("warp", prev="naive")           # the warp stage's @cute.kernel, '+' on new lines
    show_kernel("final_bwd", prev="final")      # the backward kernel (and its dw partial sum)
    show_kernel("block", prev="warp", fn="row_sum")   # one method instead of the kernel
    show_excerpt("final", "# -- the weight", "seq = ")  # a few lines of the kernel, numbered
    show_source(reduce_utils.warp_reduce)       # a library function's source, as getsource has it
    show_doc(cluster)                           # a stage's docstring, as much as a cell holds

Lines are compared without their indentation, so a line that only moved into an ``if`` counts
as unchanged. In Jupyter the changed lines are highlighted; elsewhere (and in the plain-text
copy of the output) they carry a ``+`` in the gutter.

The library's version of an exercise's answer waits for the learner's own: with
``after="02.warp_kernel"`` (or a tuple of ids) each of them shows nothing but one line, "the
library's version is shown here once your `check("02.warp_kernel", ...)` passes", until that
check passed in this notebook session (``selfcheck.passed``); while ``quack-edu grade`` runs
the notebook, nothing at all.
"""

from __future__ import annotations

import ast
import difflib
import html
import inspect
import re
import textwrap
from dataclasses import dataclass

from ..stages import get_stage, kernel_class
from . import selfcheck

#: ``after=``: the exercise (or exercises) whose check must pass before the library's version
After = str | tuple[str, ...] | None


@dataclass(frozen=True)
class Shown:
    """One function's source as shown: its title and (changed?, line) pairs."""

    title: str
    lines: tuple[tuple[bool, str], ...]
    removed: int = 0  # lines of the earlier version that are gone

    @property
    def changed(self) -> int:
        return sum(c for c, _ in self.lines)


def _source(obj, owner: type | None = None) -> list[str]:
    """The function's source, decorators included. Read from its class's source when there is
    one: the DSL rewrites a traced function, and the rewritten one's source starts at ``def``."""
    name = getattr(inspect.unwrap(obj), "__name__", None)
    if owner is not None and name:
        lines, first = inspect.getsourcelines(owner)
        tree = ast.parse(textwrap.dedent("".join(lines)))
        for node in tree.body[0].body:
            if isinstance(node, ast.FunctionDef) and node.name == name:
                start = min([d.lineno for d in node.decorator_list] + [node.lineno])
                body = lines[start - 1 : node.end_lineno]
                return textwrap.dedent("".join(body)).rstrip("\n").splitlines()
    return textwrap.dedent(inspect.getsource(inspect.unwrap(obj))).rstrip("\n").splitlines()


def _owner(cls, name: str) -> type:
    """The class in cls's MRO whose body defines ``name``."""
    return next(k for k in cls.__mro__ if name in vars(k))


def _functions(stage: str, fn) -> list[tuple[str, object, type | None]]:
    """(title, function, class defining it) to show for a stage: its kernel (for final_bwd, the
    backward kernel and the kernel of its second reduction, PartialSum), or ``fn``."""
    cls = kernel_class(stage)
    if callable(fn):
        return [(getattr(fn, "__qualname__", repr(fn)), fn, None)]
    name = fn or "kernel"
    owner = _owner(cls, name)
    out = [(f"{owner.__name__}.{name}", getattr(cls, name), owner)]
    if fn is None and stage == "final_bwd":
        partial = get_stage(stage).PartialSum
        out.append(("PartialSum.kernel  (dw: sums the partial rows)", partial.kernel, partial))
    return out


def _mark(cur: list[str], old: list[str] | None) -> tuple[tuple[tuple[bool, str], ...], int]:
    if old is None:
        return tuple((False, line) for line in cur), 0
    matcher = difflib.SequenceMatcher(
        None, [s.strip() for s in old], [s.strip() for s in cur], autojunk=False
    )
    changed = [True] * len(cur)
    for block in matcher.get_matching_blocks():
        for j in range(block.b, block.b + block.size):
            changed[j] = False
    removed = len(old) - sum(b.size for b in matcher.get_matching_blocks())
    # blank lines never count as changes
    return tuple((c and bool(s.strip()), s) for c, s in zip(changed, cur, strict=True)), removed


def kernel_diff(stage: str, prev: str | None = None, *, fn=None) -> list[Shown]:
    """What ``show_kernel`` shows, as data: one ``Shown`` per function."""
    shown = []
    old_fns = _functions(prev, fn if isinstance(fn, str) or fn is None else None) if prev else []
    for i, (title, obj, owner) in enumerate(_functions(stage, fn)):
        cur = _source(obj, owner)
        old = _source(*old_fns[min(i, len(old_fns) - 1)][1:]) if old_fns else None
        lines, removed = _mark(cur, old)
        shown.append(Shown(title, lines, removed))
    return shown


def _header(stage: str, prev: str | None, s: Shown) -> str:
    head = f"{stage}: {s.title}"
    if prev is None:
        return head
    if s.changed == 0 and s.removed == 0:
        return f"{head}  (the same as {prev}'s)"
    return f"{head}  (+ {s.changed} lines new or changed since {prev}, {s.removed} gone)"


def _overrides(stage: str) -> list[str]:
    """Methods the stage's class defines itself (what it changes when it inherits a kernel)."""
    cls = kernel_class(stage)
    return sorted(
        n for n, v in vars(cls).items() if callable(v) and not n.startswith("__") and n != "kernel"
    )


def render_text(stage: str, prev: str | None = None, *, fn=None) -> str:
    """The plain-text rendering: a ``+`` gutter on new or changed lines, then line numbers."""
    out = []
    for s in kernel_diff(stage, prev, fn=fn):
        out.append(_header(stage, prev, s))
        out += [f"{'+' if c else ' '}{i:4d}  {line}" for i, (c, line) in enumerate(s.lines, 1)]
        out.append("")
    if fn is None and "kernel" not in vars(kernel_class(stage)):
        out.append(f"{stage} inherits this kernel; it changes these methods: ")
        out.append("  " + ", ".join(_overrides(stage)))
    return "\n".join(out).rstrip("\n") + "\n"


def render_html(stage: str, prev: str | None = None, *, fn=None) -> str:
    """The Jupyter rendering: changed lines on a green background."""
    parts = []
    for s in kernel_diff(stage, prev, fn=fn):
        rows = []
        for i, (c, line) in enumerate(s.lines, 1):
            style = ' style="background:#d7f5d7"' if c else ""
            mark = "+" if c else " "
            rows.append(f"<span{style}>{mark}{i:4d}  {html.escape(line)}</span>")
        parts.append(
            f"<b>{html.escape(_header(stage, prev, s))}</b>"
            f'<pre style="line-height:1.25">{chr(10).join(rows)}</pre>'
        )
    if fn is None and "kernel" not in vars(kernel_class(stage)):
        parts.append(
            f"<p>{stage} inherits this kernel; it changes these methods: "
            f"<code>{html.escape(', '.join(_overrides(stage)))}</code></p>"
        )
    return "\n".join(parts)


def excerpt_text(stage: str, start: str, end: str, *, fn=None) -> str:
    """The lines of ``stage``'s kernel (or method ``fn``) from the first that holds ``start``
    up to, not including, the next that holds ``end``, numbered as ``show_kernel`` numbers
    them. A lesson prints a part of a kernel with it, and a test reads what the part shows."""
    ((title, obj, owner),) = _functions(stage, fn)[:1]
    lines = _source(obj, owner)
    first = next(i for i, line in enumerate(lines) if start in line)
    last = next(i for i in range(first + 1, len(lines)) if end in lines[i])
    body = textwrap.dedent("\n".join(lines[first:last])).rstrip().splitlines()
    out = [f"{stage}: {title}, lines {first + 1}-{first + len(body)}"]
    out += [f" {i:4d}  {line}" for i, line in enumerate(body, first + 1)]
    return "\n".join(out).rstrip() + "\n"


def gate_message(exercise_ids) -> str:
    """The line shown in place of the library's version until these exercises' checks pass."""
    ids = (exercise_ids,) if isinstance(exercise_ids, str) else tuple(exercise_ids)
    checks = " and ".join(f'`check("{i}", ...)`' for i in ids)
    verb = "passes" if len(ids) == 1 else "pass"
    return f"the library's version is shown here once your {checks} {verb}"


def revealed(after: After) -> bool:
    """Whether the library's version may be shown: with no ``after``, yes; otherwise once the
    check of every exercise in ``after`` passed in this notebook session. Where not, prints
    ``gate_message`` of those still to pass (nothing while ``quack-edu grade`` runs it)."""
    if after is None:
        return True
    ids = (after,) if isinstance(after, str) else tuple(after)
    if selfcheck.grading():
        return False
    waiting = [i for i in ids if not selfcheck.passed(i)]
    if waiting:
        print(gate_message(waiting))
    return not waiting


def show_source(*objs, after: After = None) -> None:
    """Print each object's source, as ``print(inspect.getsource(obj))`` does; with ``after``,
    only once that exercise's check passed (``revealed``)."""
    if revealed(after):
        for obj in objs:
            print(inspect.getsource(obj))


#: the most words of a docstring a lesson prints in one go: a cell's (~300, STYLE.md)
DOC_WORDS = 300


def _doc_units(doc: str) -> list[tuple[int, str]]:
    """(paragraph, text) of each piece of a docstring that is printed whole or not at all: a
    paragraph, or an item of a list (``* `` or ``1. ``) with the lines that continue it."""
    out = []
    for p, para in enumerate(inspect.cleandoc(doc).split("\n\n")):
        unit: list[str] = []
        for line in para.splitlines():
            if unit and re.match(r"(\* |\d+\. )", line):
                out.append((p, "\n".join(unit)))
                unit = []
            unit.append(line)
        if unit:
            out.append((p, "\n".join(unit)))
    return out


def _where(obj) -> str:
    if inspect.ismodule(obj):
        path = obj.__name__.replace(".", "/")
        return f"the top of {path}/__init__.py" if hasattr(obj, "__path__") else f"{path}.py"
    return f"{obj.__module__}.{getattr(obj, '__qualname__', '')}"


def doc_text(obj, words: int = DOC_WORDS) -> str:
    """The opening of ``obj``'s docstring that a learner reads in one go: its paragraphs (a
    list item by item) from the top while they fit in ``words``, then a line that says how
    many words are left and where (a stage's docstring states its delta over the stage before
    first, its design detail after)."""
    units = _doc_units(obj.__doc__ or "")
    shown: list[tuple[int, str]] = []
    count = 0
    for p, text in units:
        n = len(text.split())
        if shown and count + n > words:
            break
        shown.append((p, text))
        count += n
    out = ""
    for i, (p, text) in enumerate(shown):
        if i:
            out += "\n" if p == shown[i - 1][0] else "\n\n"
        out += text
    left = sum(len(t.split()) for _, t in units) - count
    if left:
        out += f"\n\n[{left} more words of this docstring: {_where(obj)}]"
    return out + "\n"


def show_doc(obj, words: int = DOC_WORDS) -> None:
    """Print ``doc_text(obj, words)``: a docstring's opening, no more than a cell holds."""
    print(doc_text(obj, words), end="")


def show_excerpt(stage: str, start: str, end: str, *, fn=None, after: After = None) -> None:
    """Print ``excerpt_text(stage, start, end, fn=fn)``; with ``after``, only once that
    exercise's check passed (``revealed``)."""
    if revealed(after):
        print(excerpt_text(stage, start, end, fn=fn), end="")


def _in_jupyter() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


def show_kernel(stage: str, prev: str | None = None, *, fn=None, after: After = None) -> None:
    """Print ``stage``'s ``@cute.kernel`` body (for ``final_bwd`` the backward kernel and its
    dw partial sum), marking the lines that are new or changed since stage ``prev``'s kernel.
    ``fn``: a method name of the stage's kernel class (or a function) to show instead.
    ``after``: the exercise whose answer this shows, shown only once its check passed
    (``revealed``)."""
    if not revealed(after):
        return
    text = render_text(stage, prev, fn=fn)
    if _in_jupyter():
        from IPython.display import display

        display({"text/html": render_html(stage, prev, fn=fn), "text/plain": text}, raw=True)
    else:
        print(text, end="")
