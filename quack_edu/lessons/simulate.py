"""Run your kernel on this machine's CPU: its PTX simulated (``quack_edu.ptxsim``), its output
against the reference.

    from quack_edu.lessons.simulate import on_cpu
    on_cpu("02.warp_kernel", warp_kernel)             # M = 4 rows of N = 1000, bf16

The simulator executes the PTX the DSL compiled for sm_90a, the threads of a CTA together (or a
warp at a time), so it shows what the kernel computes without a GPU: wrong values, rows or
columns never written (the output starts as NaN), and reads of shared memory that no barrier
orders after their write (a race), or a kernel that hangs, each named with its PTX lines. It is
slow (tens of thousands of instructions a second): small shapes only. It says nothing about
speed. The stages it runs: naive, warp, block, cluster and cpasync (lessons 01-05, and lesson
06's persistent kernel, which is the block stage's); lesson 04's kernel runs as a 4-CTA cluster,
lesson 05's with 4 commit groups.
"""

from __future__ import annotations

import torch

#: exercise -> the name of its hole (``quack_edu.grading.holes``: which piece of which stage
#: kernel the answer fills; no answers there)
HOLES = {
    "01.sum_squares": "SUM_HOLE",
    "01.rstd": "RSTD_HOLE",
    "02.warp_reduce": "REDUCE_HOLE",
    "02.warp_kernel": "WARP_KERNEL_HOLE",
    "03.block_reduce": "BLOCK_HOLE",
    "03.block_kernel": "BLOCK_KERNEL_HOLE",
    "04.cluster_kernel": "CLUSTER_KERNEL_HOLE",
    "05.g2s_atom": "ATOM_HOLE",
    "05.wait_groups": "WAIT_HOLE",
    "05.pipeline": "PIPE_HOLE",
    "06.persistent_kernel": "PERSISTENT_KERNEL_HOLE",
}
#: exercise -> the config its kernel runs with here, as the grader's values check does (module
#: of ``quack_edu.grading.exercises``, function of (N, dtype)); the stage's heuristic otherwise
CONFIGS = {
    "04.cluster_kernel": ("lesson04", "exchange_config"),
    "05.wait_groups": ("lesson05", "four_stages"),
    "05.pipeline": ("lesson05", "four_stages"),
}


def on_cpu(exercise: str, answer, *, M: int = 4, N: int = 1000, dtype=torch.bfloat16,
           weight_dtype=None, seed: int = 0, eps: float = 1e-6, order="forward"):  # fmt: skip
    """Build the exercise's kernel with ``answer`` in its hole, simulate it on M x N fresh
    inputs and print how its output compares with ``rmsnorm_ref``: the largest error, and the
    first element that differs (row, column, expected, yours). Returns (yours, reference);
    (None, reference) when the simulator finds a race, a hang or a barrier only part of a CTA
    reaches (printed, with the PTX lines). ``order``: "forward", "reversed" or "random" (the
    order the threads run in, ``ptxsim.launch``; a right kernel gives the same values in each).
    """
    import importlib

    from ..grading import holes
    from ..grading.sim_values import cpu_inputs
    from ..ptxsim import OrderingError
    from ..ptxsim.stages import compiled_kernel, run_ptx
    from ..reference import TOLERANCES, rmsnorm_ref
    from ..stages import get_stage

    if exercise not in HOLES:
        raise ValueError(f"the simulator runs {', '.join(HOLES)}; not {exercise!r}")
    hole = getattr(holes, HOLES[exercise])
    weight_dtype = weight_dtype or dtype
    # the grader's own CPU inputs: rows at very different scales, a zero row, one at eps's scale
    x, w = cpu_inputs(M, N, dtype, weight_dtype, torch.Generator().manual_seed(seed))
    if exercise in CONFIGS:
        module, name = CONFIGS[exercise]
        grading = importlib.import_module(f"quack_edu.grading.exercises.{module}")
        config = getattr(grading, name)(N, dtype)
    else:
        config = get_stage(hole.stage).default_config(N, dtype)
    kernel = hole.build(answer)(dtype, N, config, weight_dtype)
    ref = rmsnorm_ref(x, w, eps=eps)
    try:
        yours = run_ptx(compiled_kernel(kernel), kernel, x, w, eps, order=order, seed=seed)
    except OrderingError as e:
        print(f"{exercise} on the CPU (PTX simulated, {order} order): {type(e).__name__}\n{e}")
        return None, ref
    close = torch.isclose(yours.float(), ref.float(), **TOLERANCES[dtype])
    err = (yours.float() - ref.float()).abs().nan_to_num(float("inf")).max().item()
    print(f"{exercise} on the CPU (PTX simulated), x {M} x {N} {str(dtype)[6:]}, "
          f"weight {str(weight_dtype)[6:]}: largest error {err:.3g}")  # fmt: skip
    if bool(close.all()):
        print("  every element matches rmsnorm_ref within the tolerance")
    else:
        r, c = (int(i) for i in (~close).nonzero()[0])
        print(f"  {int((~close).sum())} of {M * N} elements differ; the first at row {r}, "
              f"column {c}: expected {ref[r, c].item():.6g}, yours {yours[r, c].item():.6g}"
              + (" (never written)" if torch.isnan(yours[r, c]) else ""))  # fmt: skip
    return yours, ref
