"""The whole-kernel exercises of lessons 02-04 (``grading/exercises/whole_kernel.py``), on a CPU.

The PTX probes accept the stages' own kernels (the library is a right answer too), and the gpu
tier refuses, before anything reaches a GPU, the mutants whose launch would read or write past
the tensors or hang: the refusal comes from the compiled PTX, so it is checked here.
"""

from __future__ import annotations

import functools

import pytest
import torch

from quack_edu.grading import get
from quack_edu.grading.context import Context
from quack_edu.grading.exercises import lesson04, lesson04_cluster_kernel, whole_kernel
from quack_edu.grading.notebook import answer_from_source, exercise_source, read, solutions_dir
from quack_edu.grading.registry import GPU, CheckFailed
from quack_edu.stages.block import BlockRMSNorm
from quack_edu.stages.cluster import HoldRMSNorm
from quack_edu.stages.warp import WarpRMSNorm
from quack_edu.tools.inspect import kernel_report

BF16 = torch.bfloat16


@pytest.mark.parametrize(
    "cls,N,config",
    [
        (WarpRMSNorm, 1000, None),
        (BlockRMSNorm, 16384, None),
        (HoldRMSNorm, 1000, lesson04.exchange_config(1000, BF16)),
    ],
    ids=["warp", "block", "cluster"],
)
def test_the_stages_own_kernels_pass_the_probes(cls, N, config):
    kernel = cls(BF16, N, config, torch.float32)  # an fp32 weight beside bf16 x
    rep = kernel_report(kernel)
    msg = whole_kernel.probe_accesses(
        rep, kernel, cluster=config is not None, hint_tile="tile", hint_rank="rank"
    )
    assert "all tiled by the CTA" in msg
    assert lesson04_cluster_kernel._protocol(rep, kernel) if config is not None else True


@functools.cache
def _source(ex_id):
    ex = get(ex_id)
    return exercise_source(read(solutions_dir() / f"{ex.lesson}.ipynb"), ex)


REFUSED = [
    ("02.warp_kernel", "stores rows past M", "runs past the end of the tensor"),
    ("03.block_kernel", "stores rows past M", "runs past the end of the tensor"),
    ("03.block_kernel", "one slot per row", "one fp32 slot per (row of the CTA, warp of the row)"),
    ("03.block_kernel", "the block reduction under `if row < M:`", "a branch on the thread's row"),
    ("04.cluster_kernel", "sends before the peers are ready", "not behind a cluster wait"),
    ("04.cluster_kernel", "reads the slots before they land", "read before the peers' partials"),
    ("04.cluster_kernel", "no exchange", "peers never receive"),
    ("04.cluster_kernel", "waits on parity 1", "the mbarrier wait asks for phase parity 1"),
]


@pytest.mark.parametrize("ex_id,mutant,hint", REFUSED, ids=lambda x: x)
def test_the_gpu_tier_refuses_what_it_must_not_launch(ex_id, mutant, hint):
    ex = get(ex_id)
    (m,) = [m for m in ex.mutants if m.name == mutant]
    answer = answer_from_source(m.apply(_source(ex_id)), ex.answer)
    values = next(c for c in ex.checks if c.tier == GPU and not c.hidden)
    with pytest.raises(CheckFailed) as e:
        values.fn(Context(ex, answer, False, 1))  # raises before any CUDA call
    assert "not launched" in e.value.message, e.value.message
    assert hint in (e.value.hint or ""), e.value.hint


def test_the_gpu_guards_let_the_solutions_through():
    # the part of the gpu tier that runs before a launch, on each solution at the configs the
    # gpu tier uses (the guards' shapes: 04's speed at 65536, 03's 8 warps per row and its
    # values' 2 rows per CTA)
    from quack_edu.grading.exercises import lesson02, lesson03

    cases = {
        "02.warp_kernel": (lesson02.KERNEL_HOLE, [(1000, None)]),
        "03.block_kernel": (lesson03.KERNEL_HOLE, [(16384, None), (1000, None)]),
        "04.cluster_kernel": (
            lesson04_cluster_kernel.KERNEL_HOLE,
            [(1000, lesson04.exchange_config(1000, BF16)), (65536, None)],
        ),
    }
    for ex_id, (hole, configs) in cases.items():
        ex = get(ex_id)
        ctx = Context(ex, answer_from_source(_source(ex_id), ex.answer), False, 1)
        for N, cfg in configs:
            kernel, rep = whole_kernel.whole_report(ctx, hole, N, "bf16", "fp32", cfg)
            whole_kernel._refuse_out_of_bounds(rep, ex_id)
            if ex_id.startswith("03"):
                assert lesson03.launch_guard(rep) is None
                lesson03._warps_meet(rep, kernel)
            if ex_id.startswith("04"):
                lesson04_cluster_kernel._kernel_guard(ctx, kernel, rep)
