"""The evidence after an exercise: the learner's own kernel, compiled as the grader compiles it,
and what its PTX shows.

The cell after a check cell shows the learner the facts the check read in their kernel. A graded
notebook may not import the grader's exercises (reference answers, hidden checks, mutants:
``grading.sandbox``), so the helpers those cells need live here, and the exercises import them
from here: the notebook and the checks compile and read the same kernel. Nothing here is an
answer or a verdict.

01b  ``scale_ptx``      the PTX of a ``scale_kernel`` in 01.scale_kernel's launch
06   ``scratch_op``     a custom op around the real kernel with the learner's fake (06.fake_impl)

and the PTX readers the grader uses before it launches a learner's kernel, for the lessons'
cells that launch one themselves (a notebook imports nothing from ``quack_edu.grading``):

03   ``divergent_barriers``                 barriers not every thread reaches (a hang)
04   ``exchange_from_ptx``, ``judge_exchange``  the cluster exchange replayed from the PTX

    ptx = scale_ptx(scale_kernel, 4104)
"""

# (no ``from __future__ import annotations``: the DSL reads ``scale_launch``'s annotations,
# cute.Tensor, as objects, and ``cute`` is imported in that function, not in this module's globals)
import itertools
import os

from ..grading.dsmem_sim import exchange_from_ptx, judge_exchange  # noqa: F401  (lesson 04)
from ..grading.ptx import divergent_barriers  # noqa: F401  (lesson 03)

# ---- 01b: scale_kernel ------------------------------------------------------------------------
#: 01.scale_kernel's launch: a CTA of 128 threads owns a tile of 1024 elements, 8 a thread
SCALE_TILE, SCALE_THREADS = 1024, 128


def scale_launch(kernel):
    """The ``@cute.jit`` host function that launches ``kernel(mX, mY, factor)`` on a vector:
    one CTA of ``SCALE_THREADS`` per tile of ``SCALE_TILE`` elements."""
    import cutlass.cute as cute
    from cutlass import Float32

    @cute.jit
    def launch(mX: cute.Tensor, mY: cute.Tensor, factor: Float32, stream):
        kernel(mX, mY, factor).launch(
            grid=[cute.ceil_div(cute.size(mX), SCALE_TILE), 1, 1],
            block=[SCALE_THREADS, 1, 1],
            stream=stream,
        )

    return launch


def scale_dtype(name: str):
    """The CuTe DSL type of 01.scale_kernel's vectors: "bf16" or "fp16"."""
    import cutlass

    return {"bf16": cutlass.BFloat16, "fp16": cutlass.Float16}[name]


def scale_ptx(kernel, N: int, dtype="bf16") -> str:
    """The PTX of ``kernel`` (a ``scale_kernel``) in the exercise's launch for a vector of N."""
    from cutlass import Float32

    from .dsl import fake_stream, fake_tensor, ptx_of

    dt = scale_dtype(dtype)
    x, y = fake_tensor(dt, (N,)), fake_tensor(dt, (N,))
    return ptx_of(scale_launch(kernel), x, y, Float32(2.0), fake_stream())


def scale_simulated(ptx, x, y, factor: float, *, order: str = "forward", max_steps=None):
    """``y`` after ``ptx`` (a ``scale_kernel`` in the exercise's launch) runs in ptxsim on
    ``x`` and ``y`` (2-byte torch tensors, whole tiles long) with ``factor``: a new tensor,
    ``y`` itself untouched. ptxsim's errors (``StepLimit``, ``MemoryFault``, ...) propagate."""
    import numpy as np
    import torch

    from ..ptxsim import Schedule, TensorArg, launch

    grid, block = (-(-x.numel() // SCALE_TILE), 1, 1), (SCALE_THREADS, 1, 1)
    args = [TensorArg(t.view(torch.int16).numpy()) for t in (x, y)] + [np.float32(factor)]
    steps = {} if max_steps is None else {"max_steps": max_steps}
    _, bits = launch(ptx, grid, block, args, schedule=Schedule(order=order), **steps)
    return torch.from_numpy(bits).view(y.dtype)


# ---- 06: the op's fake ------------------------------------------------------------------------
_op_counter = itertools.count()


def scratch_op(fake):
    """A fresh custom op ``quack_edu_grading::fwd_<pid>_<k>`` with the schema of
    ``quack_edu::rmsnorm_fwd``, the real kernel as its body and ``fake`` (06.fake_impl's answer)
    as its fake: ``torch.library.opcheck`` and ``torch.compile`` run through the learner's fake."""
    import torch

    from ..host.forward import _fwd_body

    schema = str(torch.ops.quack_edu.rmsnorm_fwd.default._schema)
    schema = schema[schema.index("(") :]
    name = f"quack_edu_grading::fwd_{os.getpid()}_{next(_op_counter)}"
    op = torch.library.custom_op(name, _fwd_body, mutates_args=(), schema=schema)

    def fake_fn(x, weight, bias, residual, out_dtype, res_dtype, eps, store_rstd, offset):
        return fake(x, weight, bias, residual, out_dtype, res_dtype, eps, store_rstd, offset)

    op.register_fake(fake_fn)
    return op
