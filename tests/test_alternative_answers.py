"""Answers a cold learner wrote (issue 50), graded as they should be on the compile tier: right
alternatives to a solution pass, and wrong ones fail with the hint that names their mistake.
Each answer is its exercise's solution with one edit, as a mutant is."""

from __future__ import annotations

import functools

import pytest

from quack_edu.grading import COMPILE, registry, run_exercise
from quack_edu.grading.notebook import answer_from_source, exercise_source, read, solutions_dir


@functools.cache
def _solution(ex_id: str) -> str:
    ex = registry.get(ex_id)
    return exercise_source(read(solutions_dir() / f"{ex.lesson}.ipynb"), ex)


def _grade(ex_id: str, old: str, new: str, more=()):
    """The solution with ``old`` replaced by ``new`` (and each (old, new) of ``more``), graded
    on the compile tier, hidden checks too."""
    src = _solution(ex_id)
    for o, n in ((old, new), *more):
        assert src.count(o) == 1, o
        src = src.replace(o, n)
    ex = registry.get(ex_id)
    return run_exercise(ex, answer_from_source(src, ex.answer), seed=3, gpu=False, hidden=True)


def _failure_hints(res) -> list[str]:
    """The hints of the compile tier's failed checks."""
    return [c.hint or "" for c in res.checks if c.status == "fail" and c.tier == COMPILE]


SCALE_IF = """    if cute.elem_less(tXcX[0], mX.shape):
        cute.copy(copy, tXgX, tXrX)
        x = tXrX.load().to(Float32)
        tYrY.store((x * factor).to(mY.element_type))
        cute.copy(copy, tYrY, tYgY)
"""
SCALE_PRED = """    pred = cute.make_rmem_tensor(cute.make_layout(1), cutlass.Boolean)  # one atom
    pred[0] = cute.elem_less(tXcX[0], mX.shape)
    cute.copy(copy, tXgX, tXrX, pred=pred)
    x = tXrX.load().to(Float32)
    tYrY.store((x * factor).to(mY.element_type))
    cute.copy(copy, tYrY, tYgY{})
"""


def test_scale_kernel_with_a_predicate_passes_and_without_it_on_the_store_fails():
    res = _grade("01.scale_kernel", SCALE_IF, SCALE_PRED.format(", pred=pred"))
    assert res.tiers()[COMPILE]["status"] == "pass", res.table()
    res = _grade("01.scale_kernel", SCALE_IF, SCALE_PRED.format(""))
    assert res.tiers()[COMPILE]["score"] == 0, res.table()
    assert "the store of y is not guarded" in " ".join(res.table().split())


def test_pdl_kernel_may_let_the_next_kernel_launch_before_its_wait():
    """griddepcontrol.launch_dependents only lets the dependent grid launch early; that grid's
    griddepcontrol.wait still waits for this grid's completion and memory (PTX ISA): no order
    between the two is required."""
    both = "    cute.arch.griddepcontrol_wait()\n    cute.arch.griddepcontrol_launch_dependents()\n"
    swapped = (
        "    cute.arch.griddepcontrol_launch_dependents()\n    cute.arch.griddepcontrol_wait()\n"
    )
    res = _grade("08.pdl_kernel", both, swapped)
    assert res.tiers()[COMPILE]["status"] == "pass", res.table()


def test_persistent_kernel_takes_one_buffer_and_a_second_barrier():
    old = "        sum_sq = self.block_reduce(sum_sq, buffers[None, None, it % 2])\n"
    new = (
        "        sum_sq = self.block_reduce(sum_sq, buffers[None, None, 0])\n"
        "        cute.arch.barrier()  # every warp has read the slots before the next block\n"
    )
    res = _grade("06.persistent_kernel", old, new)
    assert res.tiers()[COMPILE]["status"] == "pass", res.table()
    assert "a barrier after its reads" in " ".join(res.table().split())


def test_a_dsl_error_inside_an_answer_is_shown():
    """01.sectors_per_request answered with a CuTe layout, called by the check with plain
    values: the DSL's own error is in the message, not only "cannot judge". (01.thread_elements,
    where a learner met it, now refuses the DSL as 01.layout_offset does: below.)"""
    from quack_edu.grading.judge import judge_exercise

    ex = registry.get("01.sectors_per_request")
    src = _solution(ex.id)
    body = src.split("### BEGIN SOLUTION")[1].split("### END SOLUTION")[0]
    dsl = (
        "\n    L = cute.make_layout(threads, stride=stride_bytes)\n"
        "    return len({L(t) // 32 for t in range(threads)})\n    "
    )
    res = judge_exercise(ex, src.replace(body, dsl), gpu=False)
    assert res.score == 0
    text = " ".join(res.table().split())
    assert "raised an error of the CuTe DSL" in text and "make_layout" in text, text


def test_layout_offset_refuses_a_layout_call():
    from quack_edu.grading.judge import judge_exercise

    ex = registry.get("01.layout_offset")
    src = _solution(ex.id)
    body = src.split("### BEGIN SOLUTION")[1].split("### END SOLUTION")[0]
    call = "\n    return int(cute.make_layout(shape, stride=stride)(coord))\n    "
    res = judge_exercise(ex, src.replace(body, call), gpu=False)
    assert res.score == 0 and "compute the offset in Python" in (res.forced_message or "")
    assert judge_exercise(ex, src, gpu=False).status == "pass"


@pytest.mark.parametrize(
    "hint,old,new",
    [
        (  # the weight partitioned by its own copy, multiplied with x's values
            "fragments cut by different copies",
            "tXsW = thr_X.partition_S(sW)",
            "tXsW = thr_W.partition_S(sW)",
        ),
    ],
)
def test_persistent_kernel_names_its_kernel_in_a_compile_error(hint, old, new):
    res = _grade("06.persistent_kernel", old, new)
    text = " ".join(res.table().split())
    assert "your persistent_kernel does not compile" in text and "your block kernel" not in text
    assert hint in text


# ---- 01.sectors_per_request: elem_bytes, straddling and stride 0 decide (issue 50) ------------
SECTORS_BODY = """    sectors = set()
    for t in range(threads):
        first = t * stride_bytes
        last = first + elem_bytes - 1
        sectors.update(range(first // 32, last // 32 + 1))
    return len(sectors)
"""


@pytest.mark.parametrize(
    "body",
    [
        "    return len({(t * stride_bytes + b) // 32 for t in range(threads)"
        " for b in range(elem_bytes)})\n",
        "    first = [t * stride_bytes for t in range(threads)]\n"
        "    return len({s for f in first\n"
        "                for s in range(f // 32, (f + elem_bytes - 1) // 32 + 1)})\n",
    ],
    ids=["every byte", "first to last sector"],
)
# (the first and the last byte's sectors alone were here as right: a cold learner's lesson-02
# helper so, wrong for elements over a sector, scored 1/1; now a mutant of the table)
def test_sectors_per_request_right_formulations_pass(body):
    res = _grade("01.sectors_per_request", SECTORS_BODY, body)
    assert res.status == "pass", res.table()


@pytest.mark.parametrize(
    "hint,body",
    [
        (
            "an element can cross a sector boundary",
            "    return len({t * stride_bytes // 32 for t in range(threads)})\n",
        ),
        (
            "not the span of the warp",
            "    import math\n    return min(threads, math.ceil(threads * stride_bytes / 32))\n",
        ),
        (
            "depends on elem_bytes too",
            "    return threads * stride_bytes // 32 if stride_bytes < 32 else threads\n",
        ),
    ],
    ids=["first byte only", "span over 32", "no elem_bytes"],
)
def test_sectors_per_request_weak_formulas_fail_visible_and_hidden_with_their_hint(hint, body):
    """Each scored full marks before: no case crossed a sector boundary, had stride 0 or
    depended on elem_bytes."""
    res = _grade("01.sectors_per_request", SECTORS_BODY, body)
    failed = [c for c in res.checks if c.status == "fail"]
    assert {c.hidden for c in failed} == {False, True}, res.table()
    assert all(hint in c.hint for c in failed), res.table()


# ---- one mistake, one hint: a check whose values only echo a mistake named before is blocked --
def test_block_reduce_rows_writing_row_0s_slots_get_only_the_slots_hint():
    """Every row writes its warps' totals into row 0's slots: the slot replay names it; the
    values of the rows reading slots never written are garbage (by chance the poison value,
    which read as "outputs never written" before)."""
    from quack_edu.grading.exercises.lesson03 import BUFFER_ROW

    write = ("buffer[row, warp % warps_per_row] = val", "buffer[0, warp % warps_per_row] = val")
    read = ("total += buffer[row, w]", "total += buffer[0, w]")
    for edits in ([write], [write, read]):  # row 0's slots written; written and read
        res = _grade("03.block_reduce", *edits[0], more=edits[1:])
        found = _failure_hints(res)
        assert found and set(found) == {BUFFER_ROW}, res.table()


def test_tv_layout_column_major_threads_get_only_the_thread_order_hint():
    from quack_edu.grading.exercises.lesson02 import THREAD_ORDER

    res = _grade("02.tv_layout", "order=(1, 0)", "order=(0, 1)")
    found = _failure_hints(res)
    assert found and set(found) == {THREAD_ORDER}, res.table()


# ---- lesson 01b: a hint that teaches the guard; a partition predicted by hand ---------------
def test_scale_kernel_tail_hint_teaches_without_the_answer_line():
    res = _grade("01.scale_kernel", "if cute.elem_less(tXcX[0], mX.shape):", "if True:")
    found = _failure_hints(res)
    assert found, res.table()
    for hint in found:
        assert "elem_less" not in hint and "tXcX" not in hint, hint
        assert "identity tensor" in hint and "first element" in hint, hint


def test_thread_elements_refuses_the_dsl_computing_the_partition():
    """As 01.layout_offset refuses a layout call: the exercise predicts a partition by hand, and
    a tiled copy traced in a @cute.jit function computes it (it scored 1/1 unflagged)."""
    from quack_edu.grading.judge import judge_exercise

    ex = registry.get("01.thread_elements")
    src = _solution(ex.id)
    body = src.split("### BEGIN SOLUTION")[1].split("### END SOLUTION")[0]
    traced = (
        "\n    found = []\n\n    @cute.jit\n    def trace():\n"
        "        thr = cute.make_layout(thr_shape, stride=thr_stride)\n"
        "        for r in range(thr_shape[0]):\n            for c in range(thr_shape[1]):\n"
        "                if thr((r, c)) == t:\n"
        "                    found.extend((r, c * vec + j) for j in range(vec))\n\n"
        "    trace()\n    return found\n    "
    )
    res = judge_exercise(ex, src.replace(body, traced), gpu=False)
    assert res.score == 0 and "predict a partition by hand" in (res.forced_message or "")
