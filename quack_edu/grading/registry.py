"""The exercise registry: what each exercise is, what it is worth, and how it is checked.

An exercise is a hole the learner fills in a lesson notebook: a device function compiled inside
a stage's real kernel (``01.rstd``: the learner writes ``rstd``, the naive kernel is built
around it), or a small host function (``00.bytes_moved``). Its checks come in two tiers:

* ``compile`` runs on any machine: the learner's kernel compiles for sm_90a and its PTX/SASS
  has what the exercise is about; pure-Python answers are checked by value here too.
* ``gpu`` needs a Hopper GPU: values against ``rmsnorm_ref`` on fresh random inputs at ragged
  shapes, and, where the exercise is about speed, GB/s against the copy bandwidth measured now.

Points are per tier and all-or-nothing within a tier: every check of the tier must pass. On a
machine without a Hopper GPU the gpu tier is reported as skipped and its points are left out of
that run's ``max_score`` (and shown as ``skipped_points``), so a complete answer scores full
marks of what could be run there. Checks marked ``hidden`` run only when grading (``quack-edu
grade``, or ``check(..., hidden=True)`` in a hidden-tests cell): more shapes and a seed that
changes every grading run.

How to add an exercise (a later lesson does this in ``quack_edu/grading/exercises/lessonNN.py``;
every ``lesson*`` module there is imported automatically)::

    from .. import checks, hints
    from ..registry import COMPILE, GPU, TIERS, Exercise, mutants, register

    # the answer fills the stage kernel's ``warp_reduce`` method
    HOLE = checks.KernelHole(stage="warp", piece="warp_reduce",
                             adapt=lambda answer: lambda self, val: answer(val))

    ex = register(Exercise(
        id="02.warp_reduce", lesson="02_warp", answer="warp_reduce_sum",
        title="the butterfly: sum a value over the 32 lanes of a warp",
        points={COMPILE: 1, GPU: 1},
        mutants=[  # edits of the solution cell, and the hint each must produce
            *mutants(TIERS, ("one step short", "shuffle step", "range(5)", "range(4)")),
            *mutants(COMPILE, ("no mask", "...", "mask=0xFFFFFFFF", "mask=0x0000FFFF")),
        ],
    ))
    ex.add(
        checks.compiles(HOLE, N=4096),                      # named "compiles"
        checks.ptx_count(HOLE, "shfl.sync.bfly", 5, hint=hints.MISSING_SHUFFLE, N=4096),
        checks.no_local_memory(HOLE, N=4096),
        checks.compiles(HOLE, hidden=True),                 # a random ragged N, fit for the stage
        checks.gpu_values(HOLE),                            # values vs rmsnorm_ref, with hints
        checks.gpu_values(HOLE, hidden=True),               # more shapes, the grading seed
        checks.gpu_speed(HOLE, fraction=0.5),               # >= 50% of the copy bandwidth now
    )

A cluster exercise adds ``timeout_hint=hints.CLUSTER_SYNC`` to its Exercise (a hang is reported
with it) and ``gpu_values(HOLE, config=..cluster_n=4.., baseline=..cluster_n=1..,
baseline_hint=hints.CLUSTER_SYNC)`` (wrong only with a cluster: the exchange). Custom checks are
functions of a ``checks.Context`` that raise ``CheckFailed(message, expected=, seen=, hint=)``::

    @ex.check("what it checks", tier=COMPILE)
    def _(ctx):
        rep = ctx.report(HOLE, 4096, "bf16")      # the compiled learner kernel: PTX, SASS, regs
        ...

Then, in ``solutions/02_warp.ipynb``: a code cell with nbgrader metadata ``grade_id`` =
``ex.cell_id`` (``02_warp_reduce``), ``solution: true``, holding the answer between
``### BEGIN SOLUTION`` / ``### END SOLUTION``; and the check cell (``ex.test_cell_id``,
``grade: true``, ``locked: true``, ``points`` = the exercise's total) with::

    check("02.warp_reduce", warp_reduce_sum)
    ### BEGIN HIDDEN TESTS
    check("02.warp_reduce", warp_reduce_sum, hidden=True)
    ### END HIDDEN TESTS

``quack_edu.grading.nbfiles.exercise_cells(ex, source)`` makes both cells with that metadata.
An exercise cell may use the imports of ``notebook.PRELUDE`` (the lesson's first cell) and
nothing else from earlier cells. Run ``quack-edu student`` to regenerate ``notebooks/``. The
generic tests (``tests/test_grading_exercises.py``) then check, for every registered exercise,
that the solution passes, the blank student version scores 0 ("not attempted") and every
mutant fails with its hint: a new exercise is tested by adding it, nothing more.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field


class _Missing:
    def __repr__(self):
        return "MISSING"


#: what an exercise's answer is when the notebook does not define it
MISSING = _Missing()

COMPILE = "compile"
GPU = "gpu"
TIERS = (COMPILE, GPU)
TIER_LABELS = {COMPILE: "compile (any machine)", GPU: "gpu (Hopper)"}

_ID_RE = re.compile(r"^(\d\d)\.([a-z][a-z0-9_]*)$")


class CheckFailed(AssertionError):
    """Raised by a check: what was expected, what was seen, and a hint when the signature of the
    failure is a known one."""

    def __init__(self, message: str, *, expected=None, seen=None, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.expected = None if expected is None else str(expected)
        self.seen = None if seen is None else str(seen)
        self.hint = hint


class ShortcutUsed(CheckFailed):
    """The answer called a library RMSNorm (torch's, QuACK's, the package's own) instead of
    computing it. ``what``: the call, in words."""

    what: str | None = None


@dataclass(frozen=True)
class Check:
    """One check of an exercise. ``fn(ctx)`` raises ``CheckFailed`` (or anything) to fail and may
    return a short string saying what it saw when it passed."""

    name: str
    tier: str
    fn: Callable
    hidden: bool = False
    #: names of checks that must have passed for this one to run (else it is "blocked")
    needs: tuple[str, ...] = ()

    def __post_init__(self):
        if self.tier not in TIERS:
            raise ValueError(f"check {self.name!r}: tier must be one of {TIERS}, got {self.tier!r}")


@dataclass(frozen=True)
class Mutant:
    """A wrong version of an exercise's solution, made by text edits of the solution cell.

    Grading it must fail, in each tier of ``tiers`` that can run, with ``hint`` appearing in the
    hint (or message) of a failing check. The tests run every mutant of every exercise.
    """

    name: str
    replace: Sequence[tuple[str, str]]
    hint: str
    tiers: tuple[str, ...] = (COMPILE,)

    def apply(self, source: str) -> str:
        for old, new in self.replace:
            if old not in source:
                raise ValueError(f"mutant {self.name!r}: {old!r} is not in the solution source")
            source = source.replace(old, new)
        return source


def mutants(tiers: str | tuple[str, ...], *rows: tuple) -> list[Mutant]:
    """The mutants of a table, each seen in ``tiers`` (a tier or a tuple of them; ``TIERS``:
    both). A row is ``(name, hint, old, new)``, one edit of the solution cell, or
    ``(name, hint, [(old, new), ...])``, several. An exercise file keeps its table as a module
    constant between ``# fmt: off`` and ``# fmt: on``, a row a mutant on a line or two::

        # fmt: off
        EPILOGUE_MUTANTS = mutants(TIERS,
            ("offset forgotten", "weight_offset never reaches the output",
             "y * (w + weight_offset)", "y * w"),
        )
        # fmt: on
    """
    tiers = (tiers,) if isinstance(tiers, str) else tuple(tiers)
    out = []
    for name, hint, *edit in rows:
        replace = edit[0] if len(edit) == 1 else [tuple(edit)]
        out.append(Mutant(name, replace, hint=hint, tiers=tiers))
    return out


@dataclass
class Exercise:
    id: str
    lesson: str
    answer: str
    title: str
    points: dict[str, int]
    checks: list[Check] = field(default_factory=list)
    mutants: list[Mutant] = field(default_factory=list)
    #: added to the message when a cell of this exercise runs past the per-cell timeout
    timeout_hint: str | None = None
    #: library modules the exercise hands the learner, which its answer cell may import:
    #: {module: the names of it the cell may use (None: every public name that is not a
    #: module)}. Not the stage's own implementation of the piece: that stays off limits.
    given: dict[str, frozenset[str] | None] = field(default_factory=dict)
    #: names the answer cell may not use in this exercise: {name: why}, e.g. the builtins that
    #: tell a grader's plain-Python replay of the answer from its compiled run
    forbidden: dict[str, str] = field(default_factory=dict)
    #: the library's finished versions of what the exercise asks (dotted names of functions,
    #: ``quack_edu.stages.warp.WarpRMSNorm.kernel``): in the learner's process each is a
    #: tripwire (``tripwires.tripwire``) that flags the answer reaching it, by any route
    finished: tuple[str, ...] = ()
    #: a gradient asked by hand: autograd is off in the learner's process, and nothing there
    #: can switch it back on (``worker._no_grad_mode``)
    autograd_off: bool = False
    #: a count asked, not a measurement: from the answer cell's load on, a torch operator that
    #: computes on a tensor of more than one element is reported (``worker._watch_ops``)
    watch_ops: bool = False
    #: library functions whose text the answer must not copy but which its process may run
    #: (the stage around the hole calls them): judged like ``finished``'s text
    #: (``similarity.copied_from_library``), never tripwires
    copy_of: tuple[str, ...] = ()
    #: (what the answer does instead, why) where it calls a library RMSNorm and computing one
    #: is not what the exercise asks (a fake implementation): the shortcut's message reads "your
    #: answer calls X instead of <what>", its hint <why>. None: ``hints.SHORTCUT``'s words
    shortcut: tuple[str, str] | None = None

    def __post_init__(self):
        if not _ID_RE.match(self.id):
            raise ValueError(f"exercise id {self.id!r} must look like '01.rstd'")
        # a lesson's second part carries a letter: 01b_cute_dsl holds exercises 01.*
        if not re.match(rf"{self.id[:2]}[a-z]?_", self.lesson):
            raise ValueError(
                f"exercise {self.id}: lesson {self.lesson!r} must start with {self.id[:2]}_ "
                f"(or {self.id[:2]}b_ for a lesson's second part)"
            )
        bad = set(self.points) - set(TIERS)
        if bad:
            raise ValueError(f"exercise {self.id}: unknown tiers {bad}")

    # nbgrader grade_ids allow [A-Za-z0-9_-] only
    @property
    def cell_id(self) -> str:
        """grade_id of the answer cell (nbgrader: solution cell)."""
        return self.id.replace(".", "_")

    @property
    def test_cell_id(self) -> str:
        """grade_id of the check cell (nbgrader: autograder tests cell, carries the points)."""
        return self.cell_id + "_check"

    @property
    def max_points(self) -> int:
        return sum(self.points.values())

    def add(self, *new: Check | Iterable[Check]) -> Exercise:
        for item in new:
            for c in [item] if isinstance(item, Check) else item:
                if any(c.name == old.name for old in self.checks):
                    raise ValueError(f"exercise {self.id}: two checks named {c.name!r}")
                self.checks.append(c)
        return self

    def check(self, name: str, tier: str = COMPILE, hidden: bool = False, needs=()):
        """Decorator form of ``add``: ``@ex.check("counts reads and writes")``."""

        def deco(fn):
            self.add(Check(name, tier, fn, hidden, tuple(needs)))
            return fn

        return deco

    def validate(self) -> None:
        for tier, pts in self.points.items():
            if pts and not any(c.tier == tier for c in self.checks):
                raise ValueError(f"exercise {self.id}: {pts} points on tier {tier} but no check")
        names = {c.name for c in self.checks}
        for c in self.checks:
            missing = set(c.needs) - names
            if missing:
                raise ValueError(f"exercise {self.id}: check {c.name!r} needs unknown {missing}")


_REGISTRY: dict[str, Exercise] = {}
_loaded = False


def register(ex: Exercise) -> Exercise:
    if ex.id in _REGISTRY and _REGISTRY[ex.id] is not ex:
        raise ValueError(f"exercise {ex.id} is registered twice")
    _REGISTRY[ex.id] = ex
    return ex


def _load() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    from . import exercises

    for info in sorted(pkgutil.iter_modules(exercises.__path__), key=lambda m: m.name):
        if info.name.startswith("lesson"):
            importlib.import_module(f"{exercises.__name__}.{info.name}")
    for ex in _REGISTRY.values():
        ex.validate()


def get(exercise_id: str) -> Exercise:
    _load()
    try:
        return _REGISTRY[exercise_id]
    except KeyError:
        known = ", ".join(sorted(_REGISTRY)) or "none"
        raise KeyError(f"no exercise {exercise_id!r}; registered: {known}") from None


def all_exercises(lesson: str | None = None) -> list[Exercise]:
    """Every registered exercise (of one lesson, e.g. ``"01_naive"``), lessons in order and
    exercises in the order their lesson module registers them (the order of the notebook)."""
    _load()
    order = {ex_id: i for i, ex_id in enumerate(_REGISTRY)}
    out = sorted(_REGISTRY.values(), key=lambda e: (e.lesson, order[e.id]))
    return [e for e in out if lesson is None or e.lesson == lesson]


def lessons() -> list[str]:
    return sorted({e.lesson for e in all_exercises()})
