"""The gpu tiers of lessons 03 and 04 never launch an answer that would hang the GPU (a barrier
only some threads reach; a cluster exchange whose bytes do not add up): the guard refuses it
before any CUDA call, with the hint the compile tier gives. This runs the gpu tier's code on a
machine without a GPU, which only works because nothing is launched."""

from __future__ import annotations

import pytest

from quack_edu.grading import GPU, get, run_exercise
from quack_edu.grading.notebook import answer_from_source, exercise_source, read, solutions_dir

REFUSED = [
    ("03.block_reduce", "barrier inside the lane-0 branch", "a barrier inside a branch"),
    ("04.cluster_exchange", "stores only into CTA 0", "peers never receive"),
    ("04.cluster_exchange", "skips the last CTA of the cluster", "peers never receive"),
    ("04.cluster_exchange", "sends nothing", "peers never receive"),
    ("04.expected_tx_bytes", "forgets cluster_n", "completes early"),
    ("04.expected_tx_bytes", "counts elements, not bytes", "counts bytes"),
    ("04.expected_tx_bytes", "counts bits, not bytes", "never completes"),
]


def _mutant_answer(ex_id, name):
    ex = get(ex_id)
    src = exercise_source(read(solutions_dir() / f"{ex.lesson}.ipynb"), ex)
    mutant = next(m for m in ex.mutants if m.name == name)
    return ex, answer_from_source(mutant.apply(src), ex.answer)


@pytest.mark.parametrize("ex_id, name, hint", REFUSED, ids=[r[1] for r in REFUSED])
def test_an_answer_that_would_hang_is_not_launched(ex_id, name, hint):
    ex, answer = _mutant_answer(ex_id, name)
    res = run_exercise(ex, answer, seed=3, gpu=True)  # no GPU here: a launch would raise
    gpu = [c for c in res.checks if c.tier == GPU]
    assert gpu and all(c.status == "fail" for c in gpu), res.table()
    for c in gpu:
        assert c.message.startswith("not launched"), c.message
        assert hint in (c.hint or ""), c.hint


def test_a_safe_wrong_exchange_is_not_refused():
    # every CTA receives its bytes (from itself): safe to run, so the guard lets it through
    import torch

    from quack_edu.grading.context import Context
    from quack_edu.grading.exercises.lesson04 import _exchange_guard, exchange_config

    ex, answer = _mutant_answer("04.cluster_exchange", "stores only into its own CTA")
    ctx = Context(ex, answer, hidden=False, seed=1)
    _exchange_guard(ctx, 1000, "bf16", exchange_config(1000, torch.bfloat16))  # no raise


# Answers a learner might write that would leave a cluster kernel waiting on its mbarrier
# forever, as edits of the solution: exercise id -> (solution text, replacement). (The last two
# are also 04.cluster_exchange's mutants, refused before launch above.)
HANGING = {
    "wrong slots and bytes": {  # slot coordinates swapped; slots counted instead of bytes
        "04.cluster_exchange": ("(row, (warp_in_row, rank))", "(row, (rank, warp_in_row))"),
        "04.expected_tx_bytes": ("return slots * 4", "return slots"),
    },
    "a missing arrive": {  # the last CTA of the cluster never gets its partials
        "04.cluster_exchange": ("if lane < cluster_n:", "if lane < cluster_n - 1:"),
    },
    "no store at all": {
        "04.cluster_exchange": (
            "cute.arch.store_async_dsmem(slot, f32_bits(val), mbar_ptr, lane)",
            "pass",
        ),
    },
}


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize("answer", list(HANGING))
def test_grading_answers_that_would_hang_finishes_without_jupyter(
    tmp_path, without_jupyter, answer
):
    # On the H200 (no Jupyter: cells then ran in the grader's process, where a hung kernel
    # cannot be interrupted) grading the first of these answers once never returned: the
    # lesson's demo cell launched the learner's cluster kernel and it waited forever on its
    # mbarrier.
    import json
    import time

    from quack_edu.grading.cli import grade_main
    from quack_edu.grading.notebook import find_cell, write

    lesson = "04_cluster_reduction"
    nb = read(solutions_dir() / f"{lesson}.ipynb")  # every other exercise answered right
    wrong = HANGING[answer]
    for ex_id, (old, new) in wrong.items():
        cell = find_cell(nb, get(ex_id).cell_id)
        assert old in cell.source, (ex_id, old)
        cell.source = cell.source.replace(old, new)
    path, out, ran = tmp_path / f"{lesson}.ipynb", tmp_path / "grade.json", tmp_path / "ran"
    write(nb, path)

    t0 = time.time()
    rc = grade_main([str(path), "--json", str(out), "--timeout", "120", "--executed", str(ran)])
    took = time.time() - t0
    assert rc == 1 and took < 600, took
    exercises = {e["id"]: e for e in json.loads(out.read_text())["notebooks"][0]["exercises"]}
    for ex_id in wrong:
        ex = exercises[ex_id]
        assert ex["status"] == "fail" and ex["score"] == 0, ex
        gpu = [c for c in ex["checks"] if c["tier"] == GPU]
        assert gpu and all(c["status"] == "fail" for c in gpu), ex
        assert all(c["hint"] for c in ex["checks"] if c["status"] == "fail"), ex
    # the lesson's own cell that would launch the learner's kernel refused it, and said why
    demo = next(c for c in read(ran / path.name).cells if "not launched: {why}" in c.source)
    printed = "".join(o.get("text", "") for o in demo.outputs)
    assert "not launched:" in printed and "wait forever" in printed, printed
