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

Also here: ``stage_values`` (the values of library stages at a small shape, beside the lessons'
recorded GPU timings: values only) and ``swap_demo`` (lesson 01b: two warps exchanging through
shared memory, with and without a barrier, and the race the simulator names).
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
#: exercise -> the config its kernel runs with here, as the grader's values check does (the
#: stage module and its function of (N, dtype[, groups]); a learner's process may not import
#: the grader's exercises); the stage's heuristic otherwise
CONFIGS = {
    "04.cluster_kernel": ("cluster", "exchange_config", ()),
    "05.wait_groups": ("cpasync", "stages_config", (4,)),
    "05.pipeline": ("cpasync", "stages_config", (4,)),
}


class OnCpu(tuple):
    """``on_cpu``'s (yours, ref): unpacks as a pair, shown as one line rather than two tensors."""

    def __repr__(self) -> str:
        yours, ref = self
        got = "none (see above)" if yours is None else f"{tuple(yours.shape)} {yours.dtype}"
        return f"(yours: {got}, ref: {tuple(ref.shape)} {ref.dtype})"


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
        module, name, args = CONFIGS[exercise]
        stage = importlib.import_module(f"quack_edu.stages.{module}")
        config = getattr(stage, name)(N, dtype, *args)
    else:
        config = get_stage(hole.stage).default_config(N, dtype)
    kernel = hole.build(answer)(dtype, N, config, weight_dtype)
    ref = rmsnorm_ref(x, w, eps=eps)
    try:
        yours = run_ptx(compiled_kernel(kernel), kernel, x, w, eps, order=order, seed=seed)
    except OrderingError as e:
        print(f"{exercise} on the CPU (PTX simulated, {order} order): {type(e).__name__}\n{e}")
        return OnCpu((None, ref))
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
    return OnCpu((yours, ref))


#: lesson 01b's demo kernel, in PTX: 64 threads (two warps) each store their index into shared
#: memory, then read the slot of the thread 32 away (in the other warp) and store it to out
SWAP_PTX = """.version 8.8
.target sm_90a
.address_size 64
.shared .align 16 .b8 s[256];
.visible .entry swap(.param .u64 out)
{
    .reg .b32 %r<8>;
    .reg .f32 %f<3>;
    .reg .b64 %rd<4>;
    ld.param.u64 %rd1, [out];
    mov.u32 %r1, %tid.x;          // a register: one value per thread
    mov.u32 %r2, s;
    shl.b32 %r3, %r1, 2;
    add.u32 %r4, %r2, %r3;
    cvt.rn.f32.u32 %f1, %r1;
    st.shared.f32 [%r4], %f1;     // s[tid] = tid
BARRIER
    add.u32 %r5, %r1, 32;
    and.b32 %r5, %r5, 63;         // the thread 32 away, in the other warp
    shl.b32 %r6, %r5, 2;
    add.u32 %r6, %r2, %r6;
    ld.shared.f32 %f2, [%r6];     // its slot
    mul.wide.u32 %rd2, %r1, 4;
    add.s64 %rd3, %rd1, %rd2;
    st.global.f32 [%rd3], %f2;    // out[tid] = s[(tid + 32) % 64]
    ret;
}
"""


def swap_demo(barrier: bool, order: str = "forward", check: bool = True):
    """Run ``SWAP_PTX`` (with ``bar.sync 0`` between the store and the load when ``barrier``)
    in ptxsim, in ``order``, and print what threads 0-3 and 32-35 read, or the race the
    happens-before check finds (``check``). Returns out (64 floats), or None on a race."""
    import numpy as np

    from ..ptxsim import Race, Schedule, TensorArg, launch

    ptx = SWAP_PTX.replace("BARRIER", "    bar.sync 0;" if barrier else "")
    out = np.full(64, 0x7FC00000, np.uint32)  # NaN until written
    try:
        (got,) = launch(ptx, (1,), (64,), [TensorArg(out)], schedule=Schedule(order, 0, check))
    except Race as e:
        print(f"{'with' if barrier else 'without'} bar.sync, {order}: Race\n{e}")
        return None
    got = got.view(np.float32)
    shown = " ".join(f"{v:g}" for v in (*got[:4], *got[32:36]))
    print(f"{'with' if barrier else 'without'} bar.sync, {order} order"
          f"{'' if check else ' (no check)'}: threads 0-3, 32-35 read {shown}")  # fmt: skip
    return got


def stage_values(configs: dict, *, M: int = 3, N: int = 2048, dtype=torch.bfloat16, seed: int = 0):
    """The values, never the speed, of stage kernels on this machine's CPU: each stage of
    ``configs`` (stage -> its config, None: its heuristic) simulated on the same M x N inputs,
    its largest error against ``rmsnorm_ref`` printed, after a line that names the inputs'
    special rows (the grader's: row 1 of zeros, whose y is zeros too). Returns {stage: y}."""
    from ..grading.sim_values import cpu_inputs
    from ..ptxsim import run_stage
    from ..reference import TOLERANCES, rmsnorm_ref

    x, w = cpu_inputs(M, N, dtype, dtype, torch.Generator().manual_seed(seed))
    ref = rmsnorm_ref(x, w)
    if M > 2:  # the rows printed below: a row of zeros is no bug
        print("x: the grader's CPU inputs; row 1 is all zeros on purpose (its sum of squares is "
              "0, so its y is 0), row 2 at eps's scale")  # fmt: skip
    out = {}
    for stage, config in configs.items():
        y = out[stage] = run_stage(stage, x, w, config=config)
        err = (y.float() - ref).abs().nan_to_num(float("inf")).max().item()
        ok = bool(torch.isclose(y.float(), ref, **TOLERANCES[dtype]).all())
        within = "every element within" if ok else "NOT within"
        print(f"{stage:>8} (PTX simulated, {M} x {N} {str(dtype)[6:]}): largest error "
              f"{err:.3g}, {within} the tolerance; no timing")  # fmt: skip
    return out
