"""The compile tier's values on the CPU (``grading.sim_values``): the learner's PTX run by ptxsim.

What the exercises' own tests do not show (tests/test_grading_exercises.py runs every solution
and every mutant, the ones this check catches included): a kernel that never ends fails within
the step budget, named an endless loop; a right kernel with an instruction the simulator does
not know passes, the check saying what it could not run; and the hint for an output scaled as a
whole (the weight added to itself) is told apart from a wrong sum of squares by the row at
eps's scale the inputs hold. Each kernel is 01.rstd's naive kernel at N=37 (about 0.3 s to
compile). Without a GPU, lesson 04's cluster kernel and lesson 05's pipeline are checked for
ordering too: a wait on the wrong mbarrier parity is a race naming the st.async and the read
(the exercise scores short of full, the solution full), a final cluster wait with no arrive a
hang, a part read while its cp.async group may be in flight a race with lesson 05's hint.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from quack_edu.grading import CheckFailed, get, hints
from quack_edu.grading.context import Context
from quack_edu.grading.nbfiles import answer_from_source
from quack_edu.grading.sim_values import ENDLESS, cpu_inputs
from quack_edu.reference import TOLERANCES, rmsnorm_ref

EPS = 1e-6


def _sim_check(ex_id: str):
    (check,) = [
        c for c in get(ex_id).checks if c.name.startswith("values on the CPU") and not c.hidden
    ]
    return check


def _run(ex_id: str, source: str):
    ex = get(ex_id)
    answer = answer_from_source(source, ex.answer)
    return _sim_check(ex_id).fn(Context(ex, answer, hidden=False, seed=1))


RSTD = """
@cute.jit
def rstd(sum_sq, eps, N):
    r = cute.math.rsqrt(sum_sq / N + eps)
{body}
    return r
"""


def test_a_kernel_that_never_ends_fails_as_an_endless_loop():
    # a loop of 2**30 dependent multiplies: a GPU would take seconds, the simulator years
    body = "    for i in cutlass.range(1 << 30, unroll=1):\n        r = r * 1.0000001"
    with pytest.raises(CheckFailed) as e:
        _run("01.rstd", RSTD.format(body=body))
    assert "did not end within" in e.value.message and e.value.hint == ENDLESS


def test_an_instruction_the_simulator_does_not_know_fails_the_values_check():
    # right values (0 * sin(r) adds 0); sin's range reduction has madc, which ptxsim does not
    # run. Red team 16 hid a wrong kernel so (a never-taken branch on activemask): what the CPU
    # cannot run is not judged right, and the hint says why
    with pytest.raises(CheckFailed) as e:
        _run("01.rstd", RSTD.format(body="    r = r + 0.0 * cute.math.sin(r)"))
    assert "not simulated" in e.value.message and e.value.hint == hints.NOT_SIMULATED
    assert "madc.hi.u32" in e.value.seen


def _diagnose(out, x, w):
    ref = rmsnorm_ref(x, w, eps=EPS)
    tol = TOLERANCES[x.dtype]
    return hints.diagnose_rmsnorm(out, ref, x, w, EPS, tol=tol, poison=None)


def test_a_scaled_output_and_a_doubled_sum_get_their_own_hints():
    x, w = cpu_inputs(7, 256, torch.float32, torch.float32, torch.Generator().manual_seed(2))
    ref = rmsnorm_ref(x, w, eps=EPS)
    assert "2 times rmsnorm_ref's, by the same factor in every row" in _diagnose(2 * ref, x, w)
    doubled = x * torch.rsqrt(2 * x.pow(2).mean(-1, keepdim=True) + EPS) * w
    assert "about 2x the true one" in _diagnose(doubled, x, w)
    # without a row at eps's scale the two look alike: no claim of a uniform factor
    big = torch.randn(4, 256, generator=torch.Generator().manual_seed(3))
    assert "same factor" not in (_diagnose(2 * rmsnorm_ref(big, w, eps=EPS), big, w) or "")


def test_a_learner_runs_their_kernel_on_the_cpu(tmp_path, monkeypatch, capsys):
    """quack_edu.lessons.simulate.on_cpu (lesson 02's cell after its exercise): the solution
    matches rmsnorm_ref; a wrong kernel is shown with its first differing element."""
    import importlib.util
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from test_cheats import solution

    from quack_edu.lessons.simulate import on_cpu

    head = "import torch, cutlass\nimport cutlass.cute as cute\nfrom cutlass import Float32\n"

    def load(src, name):  # from a file: the DSL reads a kernel's source
        path = tmp_path / f"{name}.py"
        path.write_text(head + src)
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module.warp_kernel

    src = solution("02.warp_kernel")
    on_cpu("02.warp_kernel", load(src, "right"))
    assert "every element matches rmsnorm_ref" in capsys.readouterr().out
    assert "rstd = " in src
    on_cpu("02.warp_kernel", load(src.replace("rstd = ", "rstd = 2.0 * ", 1), "doubled"))
    out = capsys.readouterr().out
    assert "elements differ; the first at row 0, column 0" in out, out


# ---- lesson 04's cluster kernel and lesson 05's pipeline, on the CPU ---------------------------
def _solution(ex):
    from quack_edu.grading.notebook import exercise_source, read, solutions_dir

    return exercise_source(read(solutions_dir() / f"{ex.lesson}.ipynb"), ex)


def _mutant(ex_id: str, name: str) -> str:
    ex = get(ex_id)
    (m,) = [m for m in ex.mutants if m.name == name]
    return m.apply(_solution(ex))


def test_04_wrong_parity_fails_on_the_cpu_with_an_ordering_hint():
    """04.cluster_kernel waiting on parity 1: the simulated cluster reads its slots with
    nothing ordering the peers' st.async before; the check names both instructions. The whole
    exercise, graded without a GPU, scores short of full; the solution scores full."""
    from quack_edu.grading import COMPILE, run_exercise
    from quack_edu.grading.exercises.lesson04_cluster_kernel import ORDERING, WRONG_PARITY

    with pytest.raises(CheckFailed) as e:
        _run("04.cluster_kernel", _mutant("04.cluster_kernel", "waits on parity 1"))
    assert e.value.hint == ORDERING
    assert "st.async.shared::cluster" in e.value.seen and "ld.shared" in e.value.seen
    assert "the read:  PTX line" in e.value.seen and "the write: PTX line" in e.value.seen

    ex = get("04.cluster_kernel")
    wrong = answer_from_source(_mutant("04.cluster_kernel", "waits on parity 1"), ex.answer)
    res = run_exercise(ex, wrong, seed=3, gpu=False)
    assert res.tiers()[COMPILE]["score"] == 0
    failed = {c.hint for c in res.checks if c.status == "fail"}
    assert ORDERING in failed and WRONG_PARITY in failed
    right = run_exercise(ex, answer_from_source(_solution(ex), ex.answer), seed=3, gpu=False)
    assert right.status == "pass" and right.score == ex.points[COMPILE]


def test_04_a_final_wait_with_no_arrive_hangs_on_the_cpu():
    from quack_edu.grading.sim_values import HANG

    with pytest.raises(CheckFailed) as e:
        _run("04.cluster_kernel", _mutant("04.cluster_kernel", "the final wait with no arrive"))
    assert e.value.hint == HANG and "barrier.cluster.wait" in e.value.seen


def test_05_a_part_read_before_its_group_lands_is_a_race_on_the_cpu():
    """05.wait_groups answering one group too many in flight: a part is read while its cp.async
    is still in flight, named (the copy and the read) whatever the values."""
    from quack_edu.grading.exercises.lesson05 import TOO_FEW

    with pytest.raises(CheckFailed) as e:
        _run("05.wait_groups", _mutant("05.wait_groups", "one group too many in flight"))
    assert e.value.hint == TOO_FEW
    assert "cp.async is still writing" in e.value.seen and "cp.async.cg" in e.value.seen


def test_a_learner_runs_the_cluster_kernel_on_the_cpu(tmp_path, capsys):
    """on_cpu for lesson 04: the solution runs as a 4-CTA cluster and matches; waiting on the
    wrong parity prints the race with its PTX lines."""
    import importlib.util

    from quack_edu.lessons.simulate import on_cpu

    head = "import torch, cutlass\nimport cutlass.cute as cute\nfrom cutlass import Float32\n"
    src = _solution(get("04.cluster_kernel"))

    def load(text, name):  # from a file: the DSL reads a kernel's source
        path = tmp_path / f"{name}.py"
        path.write_text(head + text)
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module.cluster_kernel

    yours, _ = on_cpu("04.cluster_kernel", load(src, "right04"), M=3)
    assert "every element matches rmsnorm_ref" in capsys.readouterr().out
    wrong = _mutant("04.cluster_kernel", "waits on parity 1")
    yours, _ = on_cpu("04.cluster_kernel", load(wrong, "parity04"), M=3)
    out = capsys.readouterr().out
    assert yours is None and "Race" in out and "st.async" in out, out


def test_the_01b_demo_shows_a_race_that_the_values_may_hide(capsys):
    """lesson 01b's swap demo: with bar.sync right in every order; without it right in
    lockstep, NaN a warp at a time (the other warp's slots not yet written), and a Race
    named by both PTX lines whatever the values."""
    import numpy as np

    from quack_edu.lessons.simulate import swap_demo

    want = (np.arange(64) + 32) % 64
    assert (swap_demo(True, "reversed") == want).all()
    assert (swap_demo(False, check=False) == want).all()
    assert np.isnan(swap_demo(False, "reversed", check=False)[32:]).all()
    capsys.readouterr()
    assert swap_demo(False) is None
    out = capsys.readouterr().out
    assert "Race" in out and "st.shared.f32" in out and "ld.shared.f32" in out


def test_stage_values_prints_values_never_times(capsys):
    from quack_edu.lessons.simulate import stage_values

    ys = stage_values({"warp": None}, M=1, N=64)
    out = capsys.readouterr().out
    assert ys["warp"].shape == (1, 64) and "every element within" in out and "no timing" in out
