"""Answers that are somebody else's text: the library's finished version pasted into an answer
cell, and the same answer handed in by several students of a class.

Both are judged on the answer's tokens (comments, blank lines and layout dropped). A paste is
measured in shingles: runs of ``K`` tokens with every name replaced by one placeholder, so that
renaming variables does not hide it. Of the finished function's shingles that the lesson page
does not show (a learner may build on the kernel the page prints), the share found in the
answer is its *cover*. Honest solutions cover at most 0.49 of any finished function of their
exercise where they differ from the library at all (``tests/test_similarity.py`` measures
them); an answer covering ``COPIED`` or more is a copy: it scores 0 and is flagged. Where the
solution itself covers ``HONEST_MAX`` or more (a small hole with one natural answer, written
as the library writes it), a copy cannot be told from the work and is not looked for; nor
where the solutions are not installed. Identical answers in a class are only flagged: the
instructor decides.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import inspect
import io
import keyword
import re
import textwrap
import tokenize
from pathlib import Path

#: tokens per shingle
K = 10
#: the share of a finished function's shingles (those not on the lesson page) that makes a copy
COPIED = 0.75
#: a solution that covers this much of a finished function is written as the library writes
#: it: that function tells nothing
HONEST_MAX = 0.55
#: a finished function with fewer shingles off the page is too short to tell a copy from
#: an honest answer
MIN_SHINGLES = 15
#: identical answers shorter than this (in tokens) are not flagged: one-line answers coincide
MIN_SAME_TOKENS = 120

_SKIP = (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
         tokenize.ENDMARKER)  # fmt: skip


def compiler_view(source: str) -> str:
    """The source as the compiler reads it, written out again (``ast.unparse``: one layout
    for the answer and the library alike): identifiers NFKC-normalised and, where they are not
    ASCII, renamed ``u0``, ``u1``, ... (Python 3.11's ``tokenize`` splits a name holding a
    character such as U+00B7 into pieces: a paste renamed so covered 0.10 for 1.00, red team
    5); text that does not parse is left as it is."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return source
    renamed: dict[str, str] = {}

    def fix(name):
        if name is None or name.isascii():
            return name
        return renamed.setdefault(name, f"u{len(renamed)}")

    for node in ast.walk(tree):
        for field in ("id", "arg", "attr", "name"):
            value = getattr(node, field, None)
            if isinstance(value, str):
                setattr(node, field, fix(value))
        if isinstance(node, ast.alias):
            node.asname = fix(node.asname)
        if isinstance(node, ast.Global | ast.Nonlocal):
            node.names = [fix(n) for n in node.names]
    return ast.unparse(tree)


def tokens(source: str, *, names: bool = True) -> list[str]:
    """The source's tokens without comments and layout (``compiler_view``); ``names=False``
    replaces every name (not keywords) by ``N`` and every string by ``S``. Text that does not
    tokenize gives the tokens before the error."""
    out: list[str] = []
    try:
        for t in tokenize.generate_tokens(io.StringIO(compiler_view(source)).readline):
            if t.type in _SKIP:
                continue
            if not names and t.type == tokenize.STRING:
                out.append("S")
            elif not names and t.type == tokenize.NAME and not keyword.iskeyword(t.string):
                out.append("N")
            else:
                out.append(t.string)
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass
    return out


def shingles(source: str) -> set[tuple[str, ...]]:
    t = tokens(source, names=False)
    return {tuple(t[i : i + K]) for i in range(len(t) - K + 1)}


@functools.cache
def page_shingles(lesson: str) -> frozenset:
    """The shingles of the code a lesson's student notebook shows: its code cells and the
    fenced Python blocks of its text cells."""
    from .nbfiles import notebooks_dir, read

    path = notebooks_dir() / f"{lesson}.ipynb"
    if not path.exists():
        return frozenset()
    seen: set = set()
    for cell in read(path).cells:
        if cell.cell_type == "code":
            seen |= shingles(cell.source)
        else:
            for block in re.findall(r"```(?:python)?\n(.*?)```", cell.source, re.S):
                seen |= shingles(block)
    return frozenset(seen)


@functools.cache
def finished_shingles(dotted: str) -> frozenset:
    """The shingles of a library function's source (empty if it has none to read)."""
    from .worker import resolve  # (how the tripwires find the same function)

    try:
        obj = inspect.unwrap(resolve(dotted))
        return frozenset(shingles(textwrap.dedent(inspect.getsource(obj))))
    except (ImportError, AttributeError, OSError, TypeError):
        return frozenset()


def cover(source: str, dotted: str, lesson: str) -> float | None:
    """The share of ``dotted``'s shingles, among those the lesson page does not show, found in
    ``source``; None when too few are left to tell."""
    off_page = finished_shingles(dotted) - page_shingles(lesson)
    if len(off_page) < MIN_SHINGLES:
        return None
    return len(shingles(source) & off_page) / len(off_page)


@functools.cache
def telling(ex_id: str) -> tuple[str, ...]:
    """The finished functions of exercise ``ex_id`` that its solution does not resemble (the
    ones a copy can be told by); none where the solutions are not installed."""
    from .nbfiles import find_cell, read, solutions_dir
    from .registry import get

    ex = get(ex_id)
    path = solutions_dir() / f"{ex.lesson}.ipynb"
    cell = find_cell(read(path), ex.cell_id) if path.exists() else None
    if cell is None:
        return ()
    out = []
    for dotted in ex.finished:
        c = cover(cell.source, dotted, ex.lesson)
        if c is not None and c < HONEST_MAX:
            out.append(dotted)
    return tuple(out)


def copied_from_library(ex, source: str) -> str | None:
    """Why ``source`` is a copy of the library's finished version of ``ex`` (a flag's words), or
    None."""
    for dotted in telling(ex.id):
        c = cover(source, dotted, ex.lesson)
        if c is not None and c >= COPIED:
            return f"copies the library's finished {dotted}"  # (no share: no target to edit to)
    return None


def fingerprint(source: str) -> str | None:
    """A digest of the answer's tokens (names kept), or None when it is too short to tell."""
    t = tokens(source)
    if len(t) < MIN_SAME_TOKENS:
        return None
    return hashlib.sha256("\0".join(t).encode()).hexdigest()


def same_answers(answers: dict[str, str], template: str | None) -> dict[str, list[str]]:
    """``{student: [the other students who handed in the same answer]}`` for one exercise
    (``answers``: student -> answer cell source); the page's own cell (``template``) and short
    answers never count."""
    blank = fingerprint(template) if template is not None else None
    groups: dict[str, list[str]] = {}
    for student, source in answers.items():
        fp = fingerprint(source)
        if fp is not None and fp != blank:
            groups.setdefault(fp, []).append(student)
    out: dict[str, list[str]] = {}
    for members in groups.values():
        if len(members) > 1:
            for s in members:
                out[s] = sorted(m for m in members if m != s)
    return out


def copied_at_run_time(ex, compiled: list[tuple[str, str]]) -> str | None:
    """Why the text ``ex``'s answer compiled at run time ((file name, text) pairs, as the
    sandbox kept them) is a copy of the library's finished version, or None. Each text alone,
    and all of them together less the library's own: a text is the library's where it is a
    piece of the file it names (the DSL parses the source of every jit function it compiles,
    the library's among them) and no piece of the finished version itself."""
    finished = []
    for dotted in telling(ex.id):
        try:
            from .worker import resolve

            finished.append(inspect.getsource(inspect.unwrap(resolve(dotted))))
        except (ImportError, AttributeError, OSError, TypeError):
            pass
    kept = []
    for name, text in compiled:
        why = copied_from_library(ex, text)
        if why:
            return why
        if _in_file(name, text) and not any(_flat(text) in _flat(f) for f in finished):
            continue
        kept.append(text)
    return copied_from_library(ex, "\n".join(kept)) if kept else None


def _flat(text: str) -> str:
    """``text`` with every line's indentation and trailing space gone (a method's source as the
    DSL parses it is dedented)."""
    return "\n".join(line.strip() for line in text.strip().splitlines())


@functools.lru_cache(maxsize=64)
def _file_text(name: str) -> str:
    try:
        return _flat(Path(name).read_text()) if name.endswith(".py") else ""
    except (OSError, UnicodeDecodeError, ValueError):
        return ""


def _in_file(name: str, text: str) -> bool:
    """Whether ``text`` is a piece of the file ``name`` (a name alone proves nothing)."""
    body = _flat(text)
    return bool(body) and body in _file_text(name)
