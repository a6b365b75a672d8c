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
from collections import Counter
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
#: consecutive canonical statements per run (containment)
STMTS = 2
#: the share of an answer's runs (those off the page) found in the finished functions that
#: makes a copy: pastes with one branch deleted keep 0.93 or more, honest whole kernels 0.59
CONTAINED = 0.85
#: a solution whose own containment reaches this is written as the library writes it: the
#: exercise's containment tells nothing
HONEST_CONTAINED = 0.7
#: an answer with fewer runs off the page is too short to tell
MIN_RUNS = 8

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
    except Exception:  # noqa: BLE001  (a syntax error; nested past the parser's depth)
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
    try:
        return ast.unparse(tree)
    except Exception:  # noqa: BLE001  (RecursionError: a tree deeper than unparse recurses)
        return source


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
    except (tokenize.TokenError, IndentationError, SyntaxError, RecursionError, MemoryError):
        pass
    return out


def shingles(source: str, canon: bool = False) -> set[tuple[str, ...]]:
    """Runs of ``K`` tokens with every name one placeholder, of the text as the compiler reads
    it or (``canon``) of its canonical form (``canonical``: aliases folded, chains cut,
    docstrings gone; the text itself where it does not parse)."""
    text = canonical(source) if canon else None
    t = tokens(source if text is None else text, names=False)
    return {tuple(t[i : i + K]) for i in range(len(t) - K + 1)}


@functools.cache
def page_shingles(lesson: str, canon: bool = False) -> frozenset:
    """The shingles of the code a lesson's student notebook shows: its code cells and the
    fenced Python blocks of its text cells."""
    from .nbfiles import notebooks_dir, read

    path = notebooks_dir() / f"{lesson}.ipynb"
    if not path.exists():
        return frozenset()
    seen: set = set()
    for cell in read(path).cells:
        if cell.cell_type == "code":
            seen |= shingles(cell.source, canon)
        else:
            for block in re.findall(r"```(?:python)?\n(.*?)```", cell.source, re.S):
                seen |= shingles(block, canon)
    return frozenset(seen)


@functools.cache
def finished_shingles(dotted: str, canon: bool = False) -> frozenset:
    """The shingles of a library function's source (empty if it has none to read)."""
    from .worker import resolve  # (how the tripwires find the same function)

    try:
        obj = inspect.unwrap(resolve(dotted))
        return frozenset(shingles(textwrap.dedent(inspect.getsource(obj)), canon))
    except (ImportError, AttributeError, OSError, TypeError):
        return frozenset()


def cover(source: str, dotted: str, lesson: str, canon: bool = False) -> float | None:
    """The share of ``dotted``'s shingles, among those the lesson page does not show, found in
    ``source`` (``canon``: in both canonical forms); None when too few are left to tell."""
    off_page = finished_shingles(dotted, canon) - page_shingles(lesson, canon)
    if len(off_page) < MIN_SHINGLES:
        return None
    return len(shingles(source, canon) & off_page) / len(off_page)


@functools.cache
def telling(ex_id: str, canon: bool = False) -> tuple[str, ...]:
    """The finished functions of exercise ``ex_id`` that its solution does not resemble (the
    ones a copy can be told by, in the text as the compiler reads it or, ``canon``, in the
    canonical form); none where the solutions are not installed."""
    from .nbfiles import find_cell, read, solutions_dir
    from .registry import get

    ex = get(ex_id)
    path = solutions_dir() / f"{ex.lesson}.ipynb"
    if not path.exists():  # a student's copy: what its release found (``released_lists``)
        return _released(ex_id, "telling_canon" if canon else "telling")
    cell = find_cell(read(path), ex.cell_id)
    if cell is None:
        return ()
    out = []
    for dotted in pieces_of(ex):
        c = cover(cell.source, dotted, ex.lesson, canon)
        if c is not None and c < HONEST_MAX:
            out.append(dotted)
    return tuple(out)


def copied_from_library(ex, source: str, run_time: bool = False) -> str | None:
    """Why ``source`` is a copy of the library's finished version of ``ex`` (a flag's words), or
    None. ``run_time``: text the answer's process compiled, judged against the finished
    versions only (``copy_of``'s code is what the honest process compiles: 06.row_loop's
    kernel, which the DSL parses with the learner's loop in it)."""
    judged = set(ex.finished) if run_time else None
    for canon in (False, True):  # (aliased chains: the canonical form)
        for dotted in telling(ex.id, canon):
            if judged is not None and dotted not in judged:
                continue
            c = cover(source, dotted, ex.lesson, canon)
            if c is not None and c >= COPIED:
                return f"copies the library's finished {dotted}"  # (no share: nothing to aim at)
    pieces = tuple(d for d in containing(ex.id) if judged is None or d in judged)
    if pieces:
        c = contained(source, pieces, ex.lesson)
        if c is not None and c[0] >= CONTAINED:
            return f"copies the library's finished {c[1]}"
    return None


def pieces_of(ex) -> tuple[str, ...]:
    """The library functions ``ex``'s answer must not be a copy of: its finished versions
    (tripwires too) and ``copy_of`` (text only: the honest answer's process runs them)."""
    return (*ex.finished, *getattr(ex, "copy_of", ()))


class _Canon(ast.NodeTransformer):
    """``canonical``'s rewrite: ``local`` names become ``_v``, ``aliases`` are folded, chains
    from a module are cut to their last name, ``dropped`` statements go."""

    def __init__(self, local, imported, aliases, dropped):
        self.local, self.imported, self.aliases, self.dropped = local, imported, aliases, dropped

    def _from_module(self, node) -> bool:
        while isinstance(node, ast.Attribute):
            node = node.value
        return isinstance(node, ast.Name) and (node.id not in self.local or node.id in self.aliases)

    def _body(self, body):
        out = [self.visit(st) for st in body if id(st) not in self.dropped]
        return out or [ast.Pass()]

    def generic_visit(self, node):
        for field, value in ast.iter_fields(node):
            if isinstance(value, list) and value and isinstance(value[0], ast.stmt):
                setattr(node, field, self._body(value))
            elif isinstance(value, list):
                setattr(node, field, [self.visit(v) if isinstance(v, ast.AST) else v
                                      for v in value])  # fmt: skip
            elif isinstance(value, ast.AST):
                setattr(node, field, self.visit(value))
        return node

    def visit_FunctionDef(self, node):
        node.name, node.returns = "_v", None
        return self.generic_visit(node)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ClassDef(self, node):
        node.name = "_v"
        return self.generic_visit(node)

    def visit_arg(self, node):
        node.arg, node.annotation = "_v", None
        return node

    def visit_Attribute(self, node):
        if self._from_module(node):
            return ast.Name(id=node.attr, ctx=node.ctx)
        node.value = self.visit(node.value)
        return node

    def visit_Name(self, node):
        if isinstance(node.ctx, ast.Load) and node.id in self.aliases:
            return self.visit(_copy(self.aliases[node.id]))
        if node.id in self.local:
            return ast.Name(id="_v", ctx=node.ctx)
        return ast.Name(id=self.imported.get(node.id, node.id), ctx=node.ctx)


def _copy(node):
    return ast.parse(ast.unparse(node), mode="eval").body


def _bindings(tree):
    """(locals, imported {name: what it imports}, loaded names) of a parsed source."""
    imported: dict[str, str] = {}
    stores: Counter = Counter()
    loads: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                first = a.name.split(".")[0]
                imported[a.asname or first] = a.name.rsplit(".", 1)[-1] if a.asname else first
        elif isinstance(node, ast.ImportFrom):
            for a in node.names:
                imported[a.asname or a.name] = a.name
        elif isinstance(node, ast.Name):
            if isinstance(node.ctx, ast.Load):
                loads.add(node.id)
            else:
                stores[node.id] += 1
        elif isinstance(node, ast.arg):
            stores[node.arg] += 2  # (never an alias)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            stores[node.name] += 2
        elif isinstance(node, ast.Global | ast.Nonlocal):
            stores.update({n: 2 for n in node.names})
    return stores, imported, loads


def canonical(source: str) -> str | None:
    """``source`` as the containment measure reads it (None where it does not parse): what a
    paste can change without changing what it does is made the same. Docstrings, imports, bare
    expressions without a call and stores that nothing reads are dropped; a name bound once to
    a constant or to an attribute chain from a module (``bar = cute.arch.barrier``) is folded
    into its uses; a chain from a module is cut to its last name (``cute.arch.barrier``,
    ``C.arch.barrier`` and an imported ``barrier`` read alike); every local name, argument and
    function name is ``_v``; annotations go; ``ast.unparse`` lays it out."""
    try:
        tree = ast.parse(source)
    except Exception:  # noqa: BLE001  (a syntax error; nested past the parser's depth)
        return None
    try:  # (the walks below recurse: a tree near the parser's depth goes past Python's)
        return _canonical_of(tree)
    except RecursionError:
        return None


def _canonical_of(tree: ast.Module) -> str | None:
    stores, imported, loads = _bindings(tree)
    local = set(stores)
    aliases: dict[str, ast.AST] = {}
    dropped: set[int] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Assign):
            continue
        names = [t.id for t in node.targets if isinstance(t, ast.Name)]
        if len(names) != len(node.targets):
            continue
        value = node.value
        root = value
        while isinstance(root, ast.Attribute):
            root = root.value
        if (len(names) == 1 and stores[names[0]] == 1
                and (isinstance(value, ast.Constant)
                     or isinstance(root, ast.Name) and root.id not in local)):  # fmt: skip
            aliases[names[0]] = value
            dropped.add(id(node))
        elif not any(n in loads for n in names) and not any(
            isinstance(n, ast.Call) for n in ast.walk(value)
        ):
            dropped.add(id(node))  # a store nothing reads
    for node in ast.walk(tree):
        for field in ("body", "orelse", "finalbody"):
            body = getattr(node, field, None)
            for st in body if isinstance(body, list) else ():
                if not isinstance(st, ast.stmt):
                    continue
                if isinstance(st, ast.Import | ast.ImportFrom | ast.Pass) or (
                    isinstance(st, ast.Expr)
                    and not any(isinstance(n, ast.Call) for n in ast.walk(st))
                ):
                    dropped.add(id(st))  # docstrings, bare names and constants
    tree = _Canon(local, imported, aliases, dropped).visit(tree)
    try:
        return ast.unparse(ast.fix_missing_locations(tree))
    except (ValueError, RecursionError):
        return None


#: canonical lines that say nothing alone
_EMPTY = {"pass", "else:", "try:", "finally:", "return"}


def runs(source: str) -> Counter:
    """The answer's runs of ``STMTS`` consecutive canonical statements (a compound statement's
    header is one; decorators are none), counted."""
    text = canonical(source) or ""
    lines = [ln.strip() for ln in text.splitlines()]
    lines = [ln for ln in lines if ln and ln not in _EMPTY and not ln.startswith("@")]
    return Counter(tuple(lines[i : i + STMTS]) for i in range(len(lines) - STMTS + 1))


@functools.cache
def page_runs(lesson: str) -> frozenset:
    """The runs of the code a lesson's student notebook shows (``page_shingles``' cells)."""
    from .nbfiles import notebooks_dir, read

    path = notebooks_dir() / f"{lesson}.ipynb"
    if not path.exists():
        return frozenset()
    seen: set = set()
    for cell in read(path).cells:
        if cell.cell_type == "code":
            seen |= set(runs(cell.source))
        else:
            for block in re.findall(r"```(?:python)?\n(.*?)```", cell.source, re.S):
                seen |= set(runs(block))
    return frozenset(seen)


@functools.cache
def finished_runs(dotted: str) -> Counter:
    """The runs of a library function's source (empty if it has none to read)."""
    from .worker import resolve

    try:
        return runs(textwrap.dedent(inspect.getsource(inspect.unwrap(resolve(dotted)))))
    except (ImportError, AttributeError, OSError, TypeError):
        return Counter()


def contained(source: str, pieces, lesson: str) -> tuple[float, str] | None:
    """The share of ``source``'s runs (those the lesson page does not show, each as often as it
    comes) found in the finished functions ``pieces``, and the one holding most of them; None
    when too few are left to tell."""
    page = page_runs(lesson)
    mine = Counter({r: n for r, n in runs(source).items() if r not in page})
    total = sum(mine.values())
    if total < MIN_RUNS:
        return None
    lib: Counter = Counter()
    best, most = "", -1
    for dotted in pieces:
        theirs = finished_runs(dotted)
        lib |= theirs
        found = sum(min(n, theirs[r]) for r, n in mine.items())
        if found > most:
            best, most = dotted, found
    return sum(min(n, lib[r]) for r, n in mine.items()) / total, best


@functools.cache
def containing(ex_id: str) -> tuple[str, ...]:
    """The finished functions of ``ex_id`` its answers' containment is measured against: all
    of them, where one is long enough to tell (``MIN_RUNS``), the solution's own containment
    stays under ``HONEST_CONTAINED`` and the solutions are installed; else none."""
    from .nbfiles import find_cell, read, solutions_dir
    from .registry import get

    ex = get(ex_id)
    pieces = tuple(d for d in pieces_of(ex) if finished_runs(d))
    if max((finished_runs(d).total() for d in pieces), default=0) < MIN_RUNS:
        return ()  # no finished function long enough to find in an answer
    path = solutions_dir() / f"{ex.lesson}.ipynb"
    if not path.exists():  # a student's copy: what its release found
        return _released(ex_id, "containing")
    cell = find_cell(read(path), ex.cell_id) if pieces else None
    if cell is None:
        return ()
    c = contained(cell.source, pieces, ex.lesson)
    return pieces if c is None or c[0] < HONEST_CONTAINED else ()


def released_lists(ex_id: str) -> dict:
    """What a student's copy needs to tell a copy as the instructor's does (``telling`` and
    ``containing`` decide by the solution, which the copy has not): written into its public
    key by ``quack-edu student --release``. Names of library functions only."""
    return {
        "telling": list(telling(ex_id)),
        "telling_canon": list(telling(ex_id, True)),
        "containing": list(containing(ex_id)),
    }


def _released(ex_id: str, which: str) -> tuple[str, ...]:
    from .answer_key import public_key

    return tuple(((public_key() or {}).get("copy_checks") or {}).get(ex_id, {}).get(which, ()))


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
    blank = _fingerprint_or_none(template) if template is not None else None
    groups: dict[str, list[str]] = {}
    for student, source in answers.items():
        fp = _fingerprint_or_none(source)
        if fp is not None and fp != blank:
            groups.setdefault(fp, []).append(student)
    out: dict[str, list[str]] = {}
    for members in groups.values():
        if len(members) > 1:
            for s in members:
                out[s] = sorted(m for m in members if m != s)
    return out


def _fingerprint_or_none(source: str) -> str | None:
    """``fingerprint``, or None where the text cannot be read (the answer's own grading flags
    it: red team 9's ``1+1+...+1`` ended a class's run before its gradebook)."""
    try:
        return fingerprint(source)
    except Exception:  # noqa: BLE001
        return None


def copied_at_run_time(ex, compiled: list[tuple[str, str]]) -> str | None:
    """Why the text ``ex``'s answer compiled at run time ((file name, text) pairs, as the
    sandbox kept them) is a copy of the library's finished version, or None. Each text alone,
    and all of them together less the library's own: a text is the library's where it is a
    piece of the file it names (the DSL parses the source of every jit function it compiles,
    the library's among them) and no piece of the finished version itself."""
    finished = []
    for dotted in dict.fromkeys((*telling(ex.id), *telling(ex.id, True), *containing(ex.id))):
        try:
            from .worker import resolve

            finished.append(inspect.getsource(inspect.unwrap(resolve(dotted))))
        except (ImportError, AttributeError, OSError, TypeError):
            pass
    kept = []
    for name, text in compiled:
        why = copied_from_library(ex, text, run_time=True)
        if why:
            return why
        if _in_file(name, text) and not any(_flat(text) in _flat(f) for f in finished):
            continue
        kept.append(text)
    return copied_from_library(ex, "\n".join(kept), run_time=True) if kept else None


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
