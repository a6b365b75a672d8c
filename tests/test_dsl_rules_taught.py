"""The CuTe DSL rules the exercises rely on are taught in lesson 01b, or in the lesson of the
exercise that first needs one, above that exercise (issue 50: cold learners guessed them)."""

from __future__ import annotations

import pytest

from quack_edu.grading.notebook import read, solutions_dir

#: (lesson, a phrase of the markdown that teaches the rule, the exercise it must precede: its
#: answer cell's grade_id, or None for a lesson whose every exercise comes later)
RULES = [
    # 01b: run-time values, predicates, slices, scalars, loops, a second dtype
    ("01b_cute_dsl", "An `if` on a **DSL value**", "01_scale_kernel"),
    ("01b_cute_dsl", "`and`, `or` and `not` on DSL values work too", "01_scale_kernel"),
    (
        "01b_cute_dsl",
        "`cute.elem_less(coord, bound)` is true when every coordinate",
        "01_scale_kernel",
    ),
    ("01b_cute_dsl", "`.store(value)` writes through it", "01_scale_kernel"),
    ("01b_cute_dsl", "a scalar meets every value", "01_scale_kernel"),
    ("01b_cute_dsl", "`(start, stop)` as Python's `range`", "01_scale_kernel"),
    ("01b_cute_dsl", "needs its own partition and its own predicate", None),
    # issue 50's second cold learner: a predicate's shape (01b), and for 06.persistent_kernel a
    # copy into shared memory with the plain atom and a slice at a run-time index
    ("01b_cute_dsl", "Its shape is the copy's partition's with the first mode", "01_scale_kernel"),
    ("01b_cute_dsl", "`((8, 1), 1)` takes `make_layout(1)`", "01_scale_kernel"),
    # lesson 04: an mbarrier's wait takes the parity of a phase
    ("04_cluster_reduction", "a wait names one by its parity, `phase % 2`", "04_cluster_exchange"),
    # an fp32 weight beside bf16 x: its predicate from its own copy's partition (01b's rule,
    # restated where the whole kernel is written)
    (
        "04_cluster_reduction",
        "The weight's predicate comes from its own copy's partition, not x's",
        "04_cluster_kernel",
    ),
    # lesson 05: the cache modes, and the part a commit group holds
    (
        "05_cp_async_pipelining",
        "`LoadCacheMode.ALWAYS` is `.ca`, `.GLOBAL` is `.cg`",
        "05_g2s_atom",
    ),
    ("05_cp_async_pipelining", "`per_stage`: the vectors of one part", "05_pipeline"),
    # lesson 06: a copy into shared memory, a run-time slice; phases past the first, and where
    # the kernel's one cluster wait is
    (
        "06_final_kernel",
        "`cute.copy` with the plain atom (`CopyUniversalOp`) moves between any two memories",
        "06_persistent_kernel",
    ),
    (
        "06_final_kernel",
        "a slice's index may be a DSL value known only on the GPU",
        "06_persistent_kernel",
    ),
    # issue 50's third cold learner: broadcast_rows's row coordinate is a tuple, and a test of
    # it against 0 is Python's False (the weight's copy compiled away)
    ("06_final_kernel", "`(0,) == 0` is Python's `False`", "06_persistent_kernel"),
    ("06_final_kernel", "A wait names the phase by its **parity**, `phase % 2`", "06_row_loop"),
    ("06_final_kernel", "made its one cluster wait", "06_row_loop"),
    # first_pass's wait_group counts the next block's groups (lesson 05 taught it; issue 50: the
    # hint gave a speed reason for issuing the next block first)
    (
        "06_final_kernel",
        "counts on them being the next block's, committed before it",
        "06_row_loop",
    ),
]


def _markdown_above(lesson: str, grade_id: str | None) -> str:
    cells = read(solutions_dir() / f"{lesson}.ipynb").cells
    end = len(cells)
    if grade_id is not None:
        ids = [c.metadata.get("nbgrader", {}).get("grade_id") for c in cells]
        assert grade_id in ids, f"{lesson} has no exercise {grade_id}"
        end = ids.index(grade_id)
    text = " ".join(c.source for c in cells[:end] if c.cell_type == "markdown")
    return " ".join(text.split())  # one space between words: the phrase may wrap


@pytest.mark.parametrize("lesson,phrase,before", RULES, ids=[r[1][:40] for r in RULES])
def test_rule_is_taught_above_the_exercise_that_needs_it(lesson, phrase, before):
    assert phrase in _markdown_above(lesson, before)


def test_a_rule_below_its_exercise_is_not_taught():
    """The check reads above the exercise only: lesson 06 teaches parity after its first
    exercise (06.persistent_kernel needs none), so the phrase is not above that one."""
    phrase = "A wait names the phase by its **parity**"
    assert phrase in _markdown_above("06_final_kernel", "06_row_loop")
    assert phrase not in _markdown_above("06_final_kernel", "06_persistent_kernel")
