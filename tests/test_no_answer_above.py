"""No answer above its exercise: what a learner can read before an exercise, in the student
notebook, shares at most a few lines with the exercise's solution; a hint or a check's label
shares none.

``test_answers_hidden`` looks for names (a cell that prints the helper an exercise replaces);
this one compares text. What a cell above the exercise shows is its source, its recorded
outputs, and what it prints of the library, resolved statically: ``inspect.getsource(X)``,
``show_source(X)``, ``X.__doc__``, ``show_doc(X)``, ``show_kernel(...)`` and
``show_excerpt(...)`` become the text they print, with ``X`` looked up through the imports of
the cells above (a loop ``for fn in (A, B):`` names each of its items). A print gated on an
earlier exercise (``after=``) counts: once that exercise passed, its text is on the page.

A line of the solution (a statement between the solution markers; an ``if``/``for`` by its
header) is *shown* when the text holds it, or a part of it: a sub-expression of 5 tokens or
more, or a shorter computation that is the line's whole value or argument (``it % 2``). Text
compares as tokens: whitespace and comments of the solution do not count, nor the prefix of a
dotted name (``cute.math.rsqrt`` is ``rsqrt``); ``x`` or ``×`` between two operands is ``*``
(``rows_per_cta x warps_per_row``); a name matches its first words (``sum`` for ``sum_sq``),
and one name in 7 tokens may be another (``val`` for ``sum_sq``). Prose (markdown) states
what to compute, in the exercise's names: it shows a line only by the whole line or by a part
of 5 tokens or more that calls something (``buffer.iterator + cute.crd2idx(...)``, not
``sum_sq / N + eps``). Code, outputs and printed library text show parts of any kind.

Trivial lines never count: a line that computes fewer than 3 names, numbers and operators
(``pass``, ``return y``, ``cute.arch.barrier()``, ``tXgX = thr.partition_S(gX)``); nor do parts
that only name a place (``acc[None, None, v]``). The page may show one significant line in
five (a call the statement gives, a helper's signature); a hint or a check's label, none.
"""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import keyword
import re
import textwrap
import types
from dataclasses import dataclass

import pytest

from quack_edu.grading import all_exercises, registry
from quack_edu.grading.notebook import (
    BEGIN_SOLUTION,
    END_SOLUTION,
    find_cell,
    notebooks_dir,
    read,
    solutions_dir,
)

EXERCISES = all_exercises()

# ---- tokens -----------------------------------------------------------------------------------
_TOKEN = re.compile(
    r"\d+(?:\.\d+)?(?:[eE][+-]?\d+)?"  # numbers: 4, 0.0, 1e-6
    r"|\w+"
    r"|//|\*\*|==|!=|<=|>=|->|<<|>>|\+=|-=|\*=|/="
    r"|[^\w\s]"
)
_KEYWORDS = frozenset(keyword.kwlist) | {"self"}
_OPERATORS = frozenset("+ - * / // % ** == != < > <= >= << >> & | ^ += -= *= /=".split())


def _word(tok: str | None) -> bool:
    return tok is not None and bool(re.match(r"\w", tok))


def _name(tok: str) -> bool:
    """An identifier (not a keyword, not a number)."""
    return _word(tok) and tok not in _KEYWORDS and not tok[0].isdigit()


def tokens(text: str) -> tuple[str, ...]:
    """The canonical tokens of ``text``: ``a.b.c`` -> ``c``; ``x`` or ``×`` between two
    operands (``rows_per_cta x warps_per_row``) -> ``*``."""
    raw = _TOKEN.findall(text.replace("×", " × ").replace("·", " * "))
    out: list[str] = []
    i = 0
    while i < len(raw):
        tok = raw[i]
        nxt = raw[i + 1] if i + 1 < len(raw) else None
        after = raw[i + 2] if i + 2 < len(raw) else None
        if _name(tok) or tok == "self":
            if nxt == "." and _word(after):
                i += 2  # the prefix of a dotted name
                continue
        if tok in ("x", "×") and out and nxt is not None:
            prev = out[-1]
            if (_word(prev) and prev not in _KEYWORDS or prev in (")", "]")) and (
                _word(nxt) or nxt == "("
            ):
                tok = "*"
        out.append("*" if tok == "×" else tok)
        i += 1
    return tuple(out)


def _content(toks) -> int:
    """Names, numbers and operators: what a line says beyond its punctuation."""
    return sum(1 for t in toks if (_word(t) and t not in _KEYWORDS) or t in _OPERATORS)


# ---- the solution's lines ---------------------------------------------------------------------
@dataclass(frozen=True)
class Line:
    """One statement of a solution: its text and its parts (sub-expressions)."""

    text: str
    parts: tuple[str, ...]  # source of each sub-expression that may give it away
    #: the part's kind: "call" (5 tokens or more, calls something), "long" (5 or more),
    #: "short" (3 or 4, the line's whole value or an argument of its call)
    kinds: tuple[str, ...]


def _strip_comments(src: str) -> str:
    return "\n".join(re.sub(r"\s+#.*$|^\s*#.*$", "", ln) for ln in src.splitlines())


def _header(node, src) -> str | None:
    seg = functools.partial(ast.get_source_segment, src)
    if isinstance(node, (ast.If, ast.While)):
        return f"{'while' if isinstance(node, ast.While) else 'if'} {seg(node.test)}:"
    if isinstance(node, ast.For):
        return f"for {seg(node.target)} in {seg(node.iter)}:"
    if isinstance(node, ast.With):
        return "with " + ", ".join(seg(i) for i in node.items) + ":"
    if isinstance(node, ast.FunctionDef):
        return seg(node).splitlines()[0]
    return None


def _said(node, src) -> str:
    """What a statement computes, without what it names: the right-hand side of an
    assignment, the iterable of a ``for``, the test of an ``if``, the rest as it is."""
    seg = functools.partial(ast.get_source_segment, src)
    if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)) and node.value is not None:
        return seg(node.value)
    if isinstance(node, ast.For):
        return seg(node.iter)
    if isinstance(node, (ast.If, ast.While)):
        return seg(node.test)
    return _header(node, src) or seg(node)


def _exprs(node):
    """The expressions of a statement, not those of the statements nested in it."""
    stack = [c for c in ast.iter_child_nodes(node) if not isinstance(c, ast.stmt)]
    while stack:
        n = stack.pop()
        if isinstance(n, ast.expr):
            yield n
        stack += [c for c in ast.iter_child_nodes(n) if not isinstance(c, ast.stmt)]


def _top(node) -> list:
    """A statement's top-level expressions: its value, the arguments of the call it is, the
    operands of its test."""
    value = getattr(node, "value", None) if not isinstance(node, ast.For) else node.iter
    if isinstance(node, (ast.If, ast.While)):
        value = node.test
    out = [value] if isinstance(value, ast.expr) else []
    for v in list(out):
        if isinstance(v, ast.Call):
            out += [*v.args, *(k.value for k in v.keywords)]
        if isinstance(v, ast.BoolOp):
            out += v.values
    return out


_ACCESS = (ast.Name, ast.Constant, ast.Attribute, ast.Tuple, ast.Slice, ast.UnaryOp, ast.Load)


def _access(e) -> bool:
    """A place, not a computation: ``acc[None, None, v]``, ``tXcX[0][0]``, and what reads it
    as it is (``tXsX[None, None, v].load()``)."""
    if isinstance(e, ast.Call) and not e.args and not e.keywords:
        e = e.func
    return all(isinstance(n, (ast.Subscript, *_ACCESS)) for n in ast.walk(e))


def solution_lines(source: str) -> list[Line]:
    """The significant lines between a cell's solution markers."""
    regions, start = [], None
    for i, ln in enumerate(source.splitlines(), 1):
        if ln.strip() == BEGIN_SOLUTION:
            start = i
        elif ln.strip() == END_SOLUTION and start is not None:
            regions.append((start, i))
            start = None
    tree = ast.parse(source)
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.stmt) or not any(a < node.lineno < b for a, b in regions):
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        text = _strip_comments(_header(node, source) or ast.get_source_segment(source, node))
        if len(tokens(text)) < 4 or _content(tokens(_strip_comments(_said(node, source)))) < 3:
            continue  # trivial: pass, return y, cute.arch.barrier(), tXgX = thr.partition_S(gX)
        top = _top(node)
        parts, kinds = [], []
        for e in _exprs(node):
            seg = ast.get_source_segment(source, e)
            if seg is None or isinstance(e, ast.Attribute) or _access(e):
                continue
            ptoks = tokens(_strip_comments(seg))
            if _content(ptoks) < 3:
                continue
            calls = any(isinstance(n, ast.Call) for n in ast.walk(e))
            if len(ptoks) >= 5 or any(e is t for t in top):
                parts.append(seg)
                kinds.append("short" if len(ptoks) < 5 else "call" if calls else "long")
        out.append(Line(text, tuple(parts), tuple(kinds)))
    return out


# ---- matching ---------------------------------------------------------------------------------
def _same(a: str, b: str) -> bool:
    """Equal, or one name the other's first words (``sum`` for ``sum_sq``)."""
    return a == b or (_name(a) and _name(b) and (a.startswith(b + "_") or b.startswith(a + "_")))


def _near(hay: tuple[str, ...], unit: tuple[str, ...]) -> bool:
    """``unit`` in ``hay``, up to renamed names: one in every 7 tokens may be another name;
    the first token (a callee), the operators and the numbers may not."""
    n = len(unit)
    renames = n // 7
    first = unit[0]
    for i in range(len(hay) - n + 1):
        if not _same(hay[i], first):
            continue
        diff = 0
        for a, b in zip(hay[i : i + n], unit, strict=True):
            if _same(a, b):
                continue
            diff += 1
            if diff > renames or not (_name(a) and _name(b)):
                break
        else:
            return True
    return False


#: the parts each kind of text may show a line by (a whole line always shows it)
SHOWS = {"code": ("call", "long", "short"), "hint": ("call", "long"), "prose": ("call",)}


@dataclass(frozen=True)
class Text:
    """Something the learner reads: ``where`` it is, its text, and its kind: ``code`` (a
    cell's source or output, printed library text: line by line), ``prose`` (markdown) or
    ``hint`` (a hint or a check's label)."""

    where: str
    text: str
    kind: str = "code"
    cell: str = ""  # the id of the cell it is or comes from


@functools.cache
def _prepared(text: str, code: bool):
    if not code:
        return (tokens(text),)
    lines = [ln for ln in text.splitlines() if ln.strip()]
    # a statement wrapped over two lines is found in their join
    pairs = [f"{a}\n{b}" for a, b in zip(lines, lines[1:], strict=False)]
    return tuple(tokens(ln) for ln in lines + pairs)


def shown_lines(lines: list[Line], texts: list[Text]) -> dict[int, str]:
    """{index of a solution line: where it is shown} for the lines some text shows."""
    found: dict[int, str] = {}
    for t in texts:
        hay = _prepared(t.text, t.kind == "code")
        for k, line in enumerate(lines):
            if k in found:
                continue
            units = [(line.text, "line"), *zip(line.parts, line.kinds, strict=True)]
            for unit_src, kind in units:
                if kind != "line" and kind not in SHOWS[t.kind]:
                    continue
                unit = tokens(_strip_comments(unit_src))
                if any(_near(h, unit) for h in hay):
                    found[k] = f"{t.where}: `{' '.join(unit_src.split())}`"
                    break
    return found


def few(n: int) -> int:
    """How many of a solution's n significant lines a page may show: one in five."""
    return n // 5


# ---- what a page prints, resolved -------------------------------------------------------------
_PRINTERS = {"getsource", "getsourcelines", "getdoc"}


def _imports(tree, env: dict[str, str]) -> None:
    """Record in ``env`` the dotted path each name of the code's imports stands for."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                env[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                env[a.asname or a.name] = f"{node.module}.{a.name}"
        elif (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and isinstance(node.value, ast.Call)
            and getattr(node.value.func, "attr", None) == "import_module"
            and node.value.args
            and isinstance(node.value.args[0], ast.Constant)
        ):
            env[node.targets[0].id] = node.value.args[0].value


def _lookup(path: str):
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for p in parts[i:]:
            obj = getattr(obj, p)
        return obj
    raise LookupError(path)


def _dotted(node) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


def _objects(node, env, loops) -> list:
    """The library objects an expression of a cell stands for (a loop variable: each item)."""
    if isinstance(node, ast.Name) and node.id in loops:
        return [o for item in loops[node.id] for o in _objects(item, env, {})]
    name = _dotted(node)
    if name is None:
        return []
    head, _, rest = name.partition(".")
    if head not in env:
        return []
    try:
        return [_lookup(env[head] + ("." + rest if rest else ""))]
    except (LookupError, AttributeError):
        return []


def _source_of(obj) -> str:
    try:
        return inspect.getsource(inspect.unwrap(obj))
    except (TypeError, OSError):
        return ""


def _literal(node):
    return node.value if isinstance(node, ast.Constant) else None


@dataclass(frozen=True)
class Printed:
    """One library text a code cell prints: the text, the exercises whose check it waits for
    (``after=``, see ``quack_edu.lessons.show``; () when it is always shown), and the source of
    the expression that prints it."""

    text: str
    after: tuple[str, ...]
    call: str


def _ids(node) -> tuple[str, ...]:
    """The exercise ids a gate names: a string or a tuple of strings; () where it is not a
    literal (then what it gates counts as always shown)."""
    try:
        v = ast.literal_eval(node)
    except ValueError:
        return ()
    ids = (v,) if isinstance(v, str) else tuple(v) if isinstance(v, tuple) else ()
    return tuple(i for i in ids if isinstance(i, str))


def _gates(tree) -> dict[int, tuple[str, ...]]:
    """{id of a node: the exercise ids it waits for} for the nodes in the body of an
    ``if revealed(...):``, the gate of ``quack_edu.lessons.show``."""
    gates: dict[int, tuple[str, ...]] = {}
    for node in ast.walk(tree):
        test = getattr(node, "test", None)
        if not (isinstance(node, ast.If) and isinstance(test, ast.Call) and test.args):
            continue
        if _dotted(test.func) not in ("revealed", "show.revealed"):
            continue
        for stmt in node.body:
            for n in ast.walk(stmt):
                gates[id(n)] = gates.get(id(n), ()) + _ids(test.args[0])
    return gates


def _after(node: ast.Call) -> tuple[str, ...]:
    """The exercise ids of a call's ``after=``; () without one."""
    return next((_ids(k.value) for k in node.keywords if k.arg == "after"), ())


def prints(source: str, env: dict[str, str]) -> list[Printed]:
    """What a code cell prints of the library: the texts of its source and docstring printers
    (``inspect.getsource``, ``show_source``, ``__doc__``) and of ``show_kernel`` /
    ``show_excerpt`` calls with literal arguments, each with its gate."""
    from quack_edu.lessons import show

    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    _imports(tree, env)
    loops: dict[str, list] = {}
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.For)
            and isinstance(node.target, ast.Name)
            and isinstance(node.iter, (ast.Tuple, ast.List))
        ):
            loops[node.target.id] = list(node.iter.elts)
    gates = _gates(tree)
    out = []
    for node in ast.walk(tree):
        seg = ast.get_source_segment(source, node) or ""
        gate = gates.get(id(node), ())
        if isinstance(node, ast.Attribute) and node.attr == "__doc__":
            out += [Printed(o.__doc__ or "", gate, seg) for o in _objects(node.value, env, loops)]
        if not isinstance(node, ast.Call):
            continue
        fname = (
            node.func.attr
            if isinstance(node.func, ast.Attribute)
            else getattr(node.func, "id", None)
        )
        if fname in _PRINTERS and node.args:
            out += [Printed(_source_of(o), gate, seg) for o in _objects(node.args[0], env, loops)]
        elif fname == "show_source":
            after = gate + _after(node)
            for a in node.args:
                out += [Printed(_source_of(o), after, seg) for o in _objects(a, env, loops)]
        elif fname == "show_doc" and node.args:
            # a docstring's opening (the words= of the call, when it gives one)
            kw = {k.arg: _literal(k.value) for k in node.keywords}
            objs = _objects(node.args[0], env, loops)
            out += [Printed(show.doc_text(o, **kw), gate, seg) for o in objs]
        elif fname in ("show_kernel", "show_excerpt"):
            args = [_literal(a) for a in node.args]
            kw = {k.arg: _literal(k.value) for k in node.keywords if k.arg != "after"}
            if None in args or None in kw.values():
                continue
            render = show.render_text if fname == "show_kernel" else show.excerpt_text
            out.append(Printed(render(*args, **kw), gate + _after(node), seg))
    return out


def printed(source: str, env: dict[str, str]) -> list[str]:
    """The texts of ``prints``, gated or not."""
    return [p.text for p in prints(source, env)]


def _outputs(cell) -> str:
    parts = []
    for o in cell.get("outputs", []):
        if "text" in o:
            parts.append(o["text"])
        for kind in ("text/plain",):
            if kind in o.get("data", {}):
                parts.append(o["data"][kind])
    return "\n".join(p if isinstance(p, str) else "".join(p) for p in parts)


@functools.cache
def _student(lesson: str):
    return read(notebooks_dir() / f"{lesson}.ipynb")


@functools.cache
def _solution(lesson: str):
    return read(solutions_dir() / f"{lesson}.ipynb")


def page_above(nb, cell_id: str) -> list[Text]:
    """Everything the learner reads above the cell: markdown, code, outputs, what code
    prints of the library."""
    env: dict[str, str] = {}
    texts = []
    for i, cell in enumerate(nb.cells):
        if cell.metadata.get("nbgrader", {}).get("grade_id") == cell_id:
            return texts
        cid = cell.get("id", "")
        if cell.cell_type == "markdown":
            texts.append(Text(f"cell {i} (markdown)", cell.source, "prose", cid))
            continue
        if cell.cell_type != "code":
            continue
        texts.append(Text(f"cell {i} (code)", cell.source, "code", cid))
        if _outputs(cell):
            texts.append(Text(f"cell {i} (its output)", _outputs(cell), "code", cid))
        for text in printed(cell.source, env):
            texts.append(Text(f"cell {i} (what it prints)", text, "code", cid))
    raise LookupError(f"no cell {cell_id}")


def _answer_lines(ex) -> list[Line]:
    cell = find_cell(_solution(ex.lesson), ex.cell_id)
    assert cell is not None, f"{ex.id}: no answer cell in the solution"
    return solution_lines(cell.source)


#: Worked examples an exercise is meant to follow, by the id of the cell that shows them, and
#: why: the lines they share with the answer are the lesson's to give and are not counted. An
#: entry whose cell no longer shares a line with the answer, or is not above it, fails.
WORKED: dict[str, dict[str, str]] = {
    "01.sum_squares": {
        "01-005": "the naive kernel, printed in section 1: its second pass has the loop and "
        "the load that the first pass repeats",
        "01-005a": "the naive kernel read line by line: its loop explained",
    },
    "02.warp_kernel": {
        "02-063": "the Doubler, y = 2 * x: the row kernel's tiles, partitions, predicates and "
        "copies on something else; the exercise adds the weight, the reduction and rstd",
    },
}


def revealed_above(ex) -> tuple[int, dict[int, str]]:
    lines = _answer_lines(ex)
    worked = WORKED.get(ex.id, {})
    texts = [t for t in page_above(_student(ex.lesson), ex.cell_id) if t.cell not in worked]
    return len(lines), shown_lines(lines, texts)


@pytest.mark.parametrize("ex_id", sorted(WORKED))
def test_every_worked_example_is_above_its_exercise_and_shows_some_of_it(ex_id):
    ex = registry.get(ex_id)
    texts = page_above(_student(ex.lesson), ex.cell_id)
    for cell, why in WORKED[ex_id].items():
        shown = [t for t in texts if t.cell == cell]
        assert shown, f"{ex_id}: no cell {cell} above the exercise ({why})"
        assert shown_lines(_answer_lines(ex), shown), f"{ex_id}: cell {cell} shows none of it"


@pytest.mark.parametrize("ex", EXERCISES, ids=[ex.id for ex in EXERCISES])
def test_the_page_above_an_exercise_does_not_hold_its_answer(ex):
    n, shown = revealed_above(ex)
    lines = _answer_lines(ex)
    assert len(shown) <= few(n), (
        f"{ex.id}: {len(shown)} of the solution's {n} lines are on the page above it "
        f"(at most {few(n)}):\n"
        + "\n".join(f"  {' '.join(lines[k].text.split())}  <-  {w}" for k, w in shown.items())
    )


# ---- predictions ------------------------------------------------------------------------------
#: a prediction the learner makes: the markdown asks (**Predict**), never states (**Prediction**)
_ASK = re.compile(r"\*\*Predict\b")
_STATE = re.compile(r"\*\*Prediction\b")
LESSONS = sorted(p.stem for p in notebooks_dir().glob("[0-9]*.ipynb"))


def guesses(source: str) -> list[str]:
    """The names a guess cell records: every statement is ``guess_... = ...`` (a dict or tuple
    of ``...`` too, with literal keys); [] for any other cell."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    names = []
    for node in tree.body:
        if not (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and node.targets[0].id.startswith("guess")
        ):
            return []
        values = [n for n in ast.walk(node.value) if isinstance(n, ast.Constant)]
        if not any(v.value is Ellipsis for v in values) or not all(
            isinstance(n, (ast.Dict, ast.Tuple, ast.Constant, ast.Load))
            for n in ast.walk(node.value)
        ):
            return []
        names.append(node.targets[0].id)
    return names


@pytest.mark.parametrize("lesson", LESSONS)
def test_every_prediction_is_a_guess_recorded_before_its_answer(lesson):
    """A prediction asks; the next cell records the learner's guess (left at ``...``); a code
    cell after it (within six) uses the guess, and shows the answer beside it."""
    cells = _student(lesson).cells
    for i, cell in enumerate(cells):
        if cell.cell_type != "markdown":
            continue
        stated = _STATE.search(cell.source)
        assert not stated, f"{lesson} cell {i} states a prediction: {cell.source[:120]!r}"
        if not _ASK.search(cell.source):
            continue
        names = guesses(cells[i + 1].source) if cells[i + 1].cell_type == "code" else []
        assert names, f"{lesson} cell {i}: a prediction with no guess cell after it"
        later = [c.source for c in cells[i + 2 : i + 8] if c.cell_type == "code"]
        for name in names:
            assert any(re.search(rf"\b{name}\b", src) for src in later), (
                f"{lesson} cell {i}: no cell after the guess shows {name} beside its answer"
            )


def test_a_guess_cell_is_recognised():
    assert guesses('guess_us = ...  # in µs\nguess_b = {"x": ..., 4: ...}') == [
        "guess_us",
        "guess_b",
    ]
    assert guesses("guess_us = 16") == []  # an answer typed in, not a blank to fill
    assert guesses("x = ...") == [] and guesses("guess = f(...)") == []


# ---- hints and labels -------------------------------------------------------------------------
def _exercise_modules(ex) -> list[types.ModuleType]:
    from quack_edu.grading import exercises

    out = []
    for name in sorted(vars(exercises)):
        mod = getattr(exercises, name)
        if isinstance(mod, types.ModuleType) and name.startswith(("lesson", "whole")):
            if f'"{ex.id}"' in inspect.getsource(mod):
                out.append(mod)
    return out


def _code(text: str) -> bool:
    """A snippet of the solution a mutant edits (``STORE_Y``), not a sentence."""
    try:
        ast.parse(textwrap.dedent(text))
    except SyntaxError:
        return False
    return True


def _strings(mod) -> list[tuple[str, str]]:
    """The module's hint texts: its public upper-case string constants that are not code, its
    variants' hints."""
    out = []
    for name, value in vars(mod).items():
        if name.isupper() and not name.startswith("_") and isinstance(value, str):
            if not _code(value):
                out.append((name, value))
        elif isinstance(value, (list, tuple)):
            out += [(f"{name}[{i}]", v.hint) for i, v in enumerate(value) if hasattr(v, "hint")]
    return out


def hint_texts(ex) -> list[Text]:
    texts = [Text(f"label {c.name!r}", c.name, "hint") for c in ex.checks]
    texts += [Text(f"mutant {m.name!r}'s hint", m.hint, "hint") for m in ex.mutants]
    for mod in _exercise_modules(ex):
        short = mod.__name__.rsplit(".", 1)[-1]
        texts += [Text(f"{short}.{n}", s, "hint") for n, s in _strings(mod)]
    return texts


@pytest.mark.parametrize("ex", EXERCISES, ids=[ex.id for ex in EXERCISES])
def test_no_hint_or_label_prints_a_line_of_the_answer(ex):
    lines = _answer_lines(ex)
    shown = shown_lines(lines, hint_texts(ex))
    assert not shown, f"{ex.id}: " + "; ".join(
        f"`{' '.join(lines[k].text.split())}` in {w}" for k, w in shown.items()
    )


#: exercises whose every solution line is trivial here: what they ask is where a call goes and
#: a flag, which no text above them can print
ALL_TRIVIAL = {"08.pdl_kernel"}


def test_every_exercise_is_found():
    for ex in EXERCISES:
        if ex.id not in ALL_TRIVIAL:
            assert _answer_lines(ex), f"{ex.id}: no significant line in its solution"
        assert find_cell(_student(ex.lesson), ex.cell_id) is not None
    assert registry.all_exercises() == EXERCISES


# ---- the rule, on what the pages showed before issue 50 ---------------------------------------
_FAKE = textwrap.dedent(
    """
    def rmsnorm_fwd_fake(x, weight, bias, residual, out_dtype, residual_out_dtype, eps,
                         store_rstd, weight_offset):
        ### BEGIN SOLUTION
        outs = [x.new_empty(x.shape, dtype=out_dtype)]
        if residual_out_dtype is not None:
            outs.append(x.new_empty(x.shape, dtype=residual_out_dtype))
        if store_rstd:
            outs.append(x.new_empty(x.shape[:-1], dtype=torch.float32))
        return outs
        ### END SOLUTION
    """
)
_ROW_LOOP = textwrap.dedent(
    """
    @cute.jit
    def row_blocks(n_iter, blk0, tidx, issue, first_pass, send, wait_peers, combine, rearm,
                   second_pass):
        ### BEGIN SOLUTION
        for it in cutlass.range(n_iter, unroll=1):
            blk = blk0 + it
            buf = it % 2
            issue(blk + 1, 1 - buf)
            sum_sq = first_pass(it, blk, buf)
            parity = it % 2
            send(sum_sq, parity)
            wait_peers(parity, (it // 2) % 2)
            val = combine(parity)
            if tidx == 0 and it + 2 < n_iter:
                rearm(parity)
            second_pass(it, blk, buf, val)
        ### END SOLUTION
    """
)


def _lines(src):
    return solution_lines(src)


def test_the_rule_sees_what_the_pages_showed():
    # 06.fake_impl: the library's fake, printed above the exercise (a different name, the same
    # lines): every line
    lib = (
        "def _fwd_fake(\n    x, weight, bias, residual, out_dtype, residual_out_dtype, eps,\n):\n"
        + "\n".join(ln for ln in _FAKE.splitlines()[4:] if "###" not in ln)
    )
    fake = _lines(_FAKE)
    assert len(shown_lines(fake, [Text("print", lib)])) == len(fake) == 3
    # 06.row_loop: the final stage's docstring states the protocol's expressions
    doc = (
        "two reduction buffers and two mbarriers used\nalternately (block ``it`` uses ``it % "
        "2``, waits on phase ``(it // 2) % 2``, and thread 0\nre-arms the barrier for block "
        "``it + 2`` once it has passed the wait)."
    )
    loop = _lines(_ROW_LOOP)
    assert len(loop) == 10 and few(len(loop)) == 2  # val = combine(parity): trivial
    assert len(shown_lines(loop, [Text("doc", doc)])) == 3  # buf, parity, the wait
    # ... while prose that states the rules in words shows none, and the helpers' signatures
    # one line, a signature the exercise must state (`b` for `buf`: one name in 8 tokens)
    words = (
        "a block's exchange uses one of two buffers and mbarriers, alternately; a wait names "
        "the phase parity it expects; send(val, p), rearm(p), second_pass(it, blk, b, total)"
    )
    assert shown_lines(loop, [Text("md", words, "prose")]) == {}
    signature = "`first_pass(it, blk, b)`: wait for block `blk`'s copies in buffer `b`"
    assert len(shown_lines(loop, [Text("md", signature, "prose")])) == 1
    # 04.expected_tx_bytes: the cluster stage's docstring, "x" for "*"
    tx = _lines(
        "def f(rows_per_cta, warps_per_row, cluster_n):\n    ### BEGIN SOLUTION\n"
        "    slots = rows_per_cta * warps_per_row * cluster_n\n    return slots * 4\n"
        "    ### END SOLUTION\n"
    )
    said = "a block, i.e. ``rows_per_cta x warps_per_row x cluster_n x 4`` bytes."
    assert few(len(tx)) == 0 and len(shown_lines(tx, [Text("doc", said)])) == 1
    label = "rows x warps x cluster_n x 4 for the stage's configs"
    assert shown_lines(tx, [Text("label", label, "hint")])
    # 01.rstd: the naive stage's docstring, another name for the sum
    rstd = _lines(
        "def rstd(sum_sq, eps, N):\n    ### BEGIN SOLUTION\n"
        "    return cute.math.rsqrt(sum_sq / N + eps)\n    ### END SOLUTION\n"
    )
    doc01 = "to sum the squares (in fp32), computes ``rstd = rsqrt(sum / N + eps)``, then"
    assert shown_lines(rstd, [Text("doc", doc01)])
    # ... but not the exercise's statement, which says what to compute
    assert not shown_lines(rstd, [Text("md", "`1 / sqrt(sum_sq / N + eps)`", "prose")])
    # 04.cluster_exchange: the statement spelled the slot's pointer out
    exch = _lines(
        "def f(val, buffer, mbar_ptr):\n    ### BEGIN SOLUTION\n    if lane < cluster_n:\n"
        "        slot = buffer.iterator + cute.crd2idx((row, (warp_in_row, rank)), "
        "buffer.layout)\n        cute.arch.store_async_dsmem(slot, f32_bits(val), mbar_ptr, "
        "lane)\n    ### END SOLUTION\n"
    )
    md = (
        "* the slot, as a pointer: `buffer.iterator + cute.crd2idx((row, (warp_in_row, "
        "rank)), buffer.layout)`;\n* `cute.arch.store_async_dsmem(slot, f32_bits(val), "
        "mbar_ptr, p)` maps the slot"
    )
    assert len(exch) == 3 and len(shown_lines(exch, [Text("md", md, "prose")])) == 2
    # 07.dw_partial: a hint that printed the line
    acc = _lines(
        "def accumulate_dw(acc, v, dy, x_hat):\n    ### BEGIN SOLUTION\n"
        "    acc[None, None, v].store(acc[None, None, v].load() + dy * x_hat)\n"
        "    ### END SOLUTION\n"
    )
    hint = (
        "acc is overwritten, not added to. Add: acc[None, None, v].store("
        "acc[None, None, v].load() + dy * x_hat)"
    )
    assert shown_lines(acc, [Text("hint", hint, "hint")])


def test_printed_library_text_is_resolved():
    env: dict[str, str] = {}
    src = (
        "from quack_edu.host import forward\nfrom quack_edu.stages import naive\n"
        "import inspect\nprint(inspect.getsource(forward._fwd_fake))\nprint(naive.__doc__)\n"
        "for fn in (naive.NaiveRMSNorm.rstd,):\n    print(inspect.getsource(fn))\n"
        'show_kernel("naive", fn="rstd")\n'
        "from quack_edu.lessons.show import show_source\n"
        'show_source(naive.NaiveRMSNorm.sum_squares, after="01.sum_squares")\n'
        'show_kernel("naive", fn="sum_squares", after=("01.sum_squares", "01.rstd"))\n'
        'if revealed("01.rstd"):\n    print(inspect.getsource(naive.NaiveRMSNorm.rstd))\n'
    )
    found = prints(src, env)
    texts = [p.text for p in found]
    assert len(texts) == 7 and all(texts)
    assert any("def _fwd_fake" in t for t in texts)
    assert any("Stage 0, naive" in t for t in texts)
    assert sum("def rstd" in t for t in texts) == 3
    assert sum("def sum_squares" in t for t in texts) == 2  # gated, still on the page after
    gated = [(p.text.split("(")[0].split()[-1], p.after) for p in found if p.after]
    assert gated == [
        ("sum_squares", ("01.sum_squares",)),
        ("sum_squares", ("01.sum_squares", "01.rstd")),
        ("rstd", ("01.rstd",)),
    ]


def test_a_docstrings_opening_is_resolved():
    from quack_edu.lessons.show import doc_text
    from quack_edu.stages import cluster

    src = "from quack_edu.stages import cluster\nshow_doc(cluster)\nshow_doc(cluster, words=40)\n"
    (whole, short) = prints(src, {})
    assert whole.text == doc_text(cluster) and "Delta over block" in whole.text
    assert short.text == doc_text(cluster, 40) and "Delta over block" not in short.text


def test_tokens():
    assert tokens("cute.math.rsqrt(sum_sq / N + eps)") == tuple(
        "rsqrt ( sum_sq / N + eps )".split()
    )
    assert tokens("rows_per_cta x warps_per_row × 4") == tuple(
        "rows_per_cta * warps_per_row * 4".split()
    )
    assert tokens("return x * self.N") == ("return", "x", "*", "N")
    assert _near(tokens("rstd = rsqrt(sum / N + eps)"), tokens("rsqrt(sum_sq / N + eps)"))
    assert not _near(tokens("1 / sqrt(sum_sq / N + eps)"), tokens("rsqrt(sum_sq / N + eps)"))
    assert _near(tokens("send(val, p, q, r)"), tokens("send(sum, p, q, r)"))
    assert not _near(tokens("send(val, p)"), tokens("send(sum, p)"))  # 6 tokens: no rename
    assert not _near(tokens("make_layout(128) + make_layout(8)"), tokens("make_layout(T) + x"))


# ---- the page under the check -----------------------------------------------------------------
def page_under_check(nb, cell_id: str) -> list[Text]:
    """The markdown a learner sees under the exercise while writing it: the cells after its
    answer cell (its check cell skipped) up to the next code cell, read as code: an expression
    in backticks there is the answer's own text, not a statement of what to compute (issue 50:
    a cell under 06.row_loop's check listed every rule of the loop as its expressions)."""
    cells = nb.cells
    ids = [c.metadata.get("nbgrader", {}).get("grade_id") for c in cells]
    i = ids.index(cell_id) + 1
    texts = []
    while i < len(cells):
        c = cells[i]
        if c.cell_type == "code" and "check" not in c.metadata.get("tags", []):
            break
        if c.cell_type == "markdown":
            texts.append(Text(f"cell {i} (markdown under the check)", c.source, "code", c.id))
        i += 1
    return texts


@pytest.mark.parametrize("ex", EXERCISES, ids=[ex.id for ex in EXERCISES])
def test_the_markdown_under_an_exercise_does_not_hold_its_answer(ex):
    lines = _answer_lines(ex)
    shown = shown_lines(lines, page_under_check(_student(ex.lesson), ex.cell_id))
    assert len(shown) <= few(len(lines)), (
        f"{ex.id}: {len(shown)} of the solution's {len(lines)} lines are in the markdown under "
        f"it (at most {few(len(lines))}):\n"
        + "\n".join(f"  {' '.join(lines[k].text.split())}  <-  {w}" for k, w in shown.items())
    )


def test_the_rule_under_the_check_sees_the_row_loop_recap():
    """What 06's page showed under row_loop's check before issue 50's fix: three of its ten
    lines (two may be shown)."""
    recap = (
        "Each rule is a line of the loop: buffer `it % 2`; the next block into `1 - buf` first;\n"
        "exchange buffer and mbarrier `it % 2`, phase `(it // 2) % 2`; one re-arm by thread 0, "
        "after the\nwait, for a block that follows."
    )
    loop = _lines(_ROW_LOOP)
    assert len(shown_lines(loop, [Text("md", recap, "code")])) > few(len(loop))
    assert shown_lines(loop, [Text("md", recap, "prose")]) == {}  # as prose it passed


def test_no_check_title_states_its_answer():
    """A check's title prints with its table, before a learner has solved anything (a cold
    learner copied 07.dx_row's formula from it): a title names the task, not the answer."""
    from quack_edu.grading import get

    told = {
        "07.dx_row": ("mean(", "x_hat *", "rstd *"),
        "01.rstd": ("sqrt", "sum_sq / N", "+ eps"),
        "08.pdl_kernel": ("before the first", "griddepcontrol.wait"),
    }
    for ex_id, answers in told.items():
        title = get(ex_id).title
        assert not any(a in title for a in answers), (ex_id, title)
