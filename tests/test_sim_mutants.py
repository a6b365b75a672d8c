"""Every mutant of an exercise whose kernel ptxsim runs fails the values check on the CPU
(``sim_values``, the check a learner without a GPU gets), except those listed in ``SIM_BLIND``
with the reason: only speed can show them (a cache hint, a narrower access, a wait that costs
overlap), or the simulator has nothing to run them against (PDL orders a grid after the
previous one; ptxsim runs one grid at a time). No mutant the gpu tier catches is among them.

tests/test_grading_exercises.py runs every mutant through the whole compile tier (a PTX probe
may catch it first); here the simulated values alone must. In particular 02.warp_kernel summing
``x*x + x*x`` and multiplying by ``w + w``: wrong values that compile to the right
instructions, which before ptxsim only the gpu tier saw; and 01.scale_kernel (lesson 01b)
computing ``x * factor + x``, whose PTX reads right. Its ``<=`` tail guard is failed on the CPU
by the PTX probe of its guard too (``test_scale_kernel_off_by_one_scores_short_without_a_gpu``).
"""

from __future__ import annotations

import functools

import pytest

from quack_edu.grading import COMPILE, GPU, CheckFailed, all_exercises, get, run_exercise
from quack_edu.grading.context import Context
from quack_edu.grading.nbfiles import answer_from_source
from quack_edu.grading.notebook import exercise_source, read, solutions_dir

SPEED = "right values: only speed shows it (the GPU's speed tier or a PTX probe reads it)"
#: (exercise, mutant) -> why the simulated values cannot show it
SIM_BLIND = {
    ("01.scale_kernel", "2-byte accesses"): SPEED + ": eight 2-byte accesses for one 16-byte",
    ("01.sum_squares", "squares in bf16"): "a bf16 square is within bf16's tolerance at N = 37; "
    "the error grows with N; a PTX probe sees the multiply in bf16",
    ("02.warp_reduce", "half the lanes in the mask"): "the mask names the lanes that must "
    "take part; all 32 run converged, so the shuffles return the same values (a PTX probe "
    "reads the mask)",
    ("02.tv_layout", "64-bit accesses"): SPEED + ": two 8-byte accesses for one 16-byte",
    ("02.tv_layout", "8 elements for every dtype"): SPEED + ": 32-byte fp32 vectors, two "
    "accesses each",
    ("05.g2s_atom", "64-bit copies through L1"): SPEED + ": cp.async.ca of 8 bytes",
    ("05.g2s_atom", "caches in L1 (.ca)"): SPEED + ": a cache hint",
    ("05.wait_groups", "waits for every group every time"): SPEED + ": no copy overlaps a sum",
    ("05.wait_groups", "counts reversed (returns stage)"): SPEED + ": waits for more groups "
    "than the part needs",
    ("05.pipeline", "waits for every group before each part"): SPEED + ": no overlap",
    ("05.pipeline", "waits inside the issue loop"): SPEED + ": one copy in flight at a time",
    ("05.pipeline", "after_issue() before the copies"): SPEED + ": the weight's load is issued "
    "before x's copies instead of behind them",
    ("05.pipeline", "commit inside if in_row"): "threads of rows past M commit no group and "
    "wait for none: the same values; a PTX probe finds the commit under the branch",
    ("06.persistent_kernel", "the weight from global memory in every block"): SPEED
    + ": the weight read again per block",
    ("06.persistent_kernel", "the slice kept in registers, not staged"): SPEED
    + ": the lesson's staging plan",
    ("06.persistent_kernel", "every row of threads stages the weight"): SPEED
    + ": each row loads the same slice and writes it into sW",
    **{
        ("08.pdl_kernel", name): "griddepcontrol orders a grid after the previous one on the "
        "stream; ptxsim runs one grid at a time, so there is nothing to order (a PTX probe "
        "reads where the wait is; the flag is read from the cell)"
        for name in (
            "wait missing",
            "wait after x's load",
            "wait after every load",
            "wait only for the rows in the tensor",
            "launch_dependents missing",
            "launch flag off",
        )
    },
}


def _sim_check(ex):
    found = [c for c in ex.checks if c.name.startswith("values on the CPU") and not c.hidden]
    return found[0] if found else None


SIMULATED = [ex for ex in all_exercises() if _sim_check(ex)]
CAUGHT = [(ex, m) for ex in SIMULATED for m in ex.mutants if (ex.id, m.name) not in SIM_BLIND]


@functools.cache
def _solution(ex_id: str) -> str:
    ex = get(ex_id)
    return exercise_source(read(solutions_dir() / f"{ex.lesson}.ipynb"), ex)


def test_the_blind_list_names_real_mutants_the_gpu_tier_does_not_catch():
    mutants = {(ex.id, m.name): m for ex in SIMULATED for m in ex.mutants}
    for key, why in SIM_BLIND.items():
        assert key in mutants, f"{key}: no such mutant of a simulated exercise"
        assert GPU not in mutants[key].tiers, f"{key}: the gpu tier catches it, ptxsim must"
        assert why


@pytest.mark.parametrize("ex,mutant", CAUGHT, ids=lambda x: getattr(x, "id", None) or x.name)
def test_mutant_fails_the_simulated_values(ex, mutant):
    answer = answer_from_source(mutant.apply(_solution(ex.id)), ex.answer)
    with pytest.raises(CheckFailed):
        _sim_check(ex).fn(Context(ex, answer, hidden=False, seed=1))


@pytest.mark.parametrize(
    "ex_id,name,hint",
    [
        ("02.warp_kernel", "x * x + x * x summed", "about 2x the true one"),
        ("02.warp_kernel", "the weight added to itself", "by the same factor in every row"),
    ],
)
def test_warp_kernel_value_mutants_score_short_without_a_gpu(ex_id, name, hint):
    """Graded as a learner without a GPU is (the compile tier alone): short of full, the
    simulated values failing with the hint of the known mistake."""
    ex = get(ex_id)
    (m,) = [m for m in ex.mutants if m.name == name]
    res = run_exercise(ex, answer_from_source(m.apply(_solution(ex_id)), ex.answer), gpu=False)
    assert res.tiers()[COMPILE]["score"] < ex.points[COMPILE], res.table()
    failed = [c for c in res.checks if c.status == "fail"]
    sim = [c for c in failed if c.name.startswith("values on the CPU")]
    assert sim and hint in (sim[0].hint or ""), res.table()


def test_scale_kernel_off_by_one_scores_short_without_a_gpu():
    from quack_edu.grading.exercises.lesson01b import OFF_BY_ONE

    ex = get("01.scale_kernel")
    (m,) = [m for m in ex.mutants if m.name == "a <= tail guard"]
    res = run_exercise(ex, answer_from_source(m.apply(_solution(ex.id)), ex.answer), gpu=False)
    assert res.tiers()[COMPILE]["score"] < ex.points[COMPILE], res.table()
    assert any(c.hint == OFF_BY_ONE for c in res.checks if c.status == "fail"), res.table()
