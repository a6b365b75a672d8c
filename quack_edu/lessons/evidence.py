"""The evidence after an exercise: the learner's own kernel, compiled as the grader compiles it,
and what its PTX shows.

The cell after a check cell shows the learner the facts the check read in their kernel. A graded
notebook may not import the grader's exercises (reference answers, hidden checks, mutants:
``grading.sandbox``), so the helpers those cells need live here, and the exercises import them
from here: the notebook and the checks compile and read the same kernel. Nothing here is an
answer or a verdict.

01b  ``scale_ptx``      the PTX of a ``scale_kernel`` in 01.scale_kernel's launch
06   ``scratch_op``     a custom op around the real kernel with the learner's fake (06.fake_impl)
07   ``report_for``     the backward kernel with the learner's ``grad_in`` (07.grad_in), shared
                        with the checks for the same function object (``checks.shared``)
     ``grad_flow``      what reaches its dx stores

and the PTX readers the grader uses before it launches a learner's kernel, for the lessons'
cells that launch one themselves (a notebook imports nothing from ``quack_edu.grading``):

03   ``divergent_barriers``                 barriers not every thread reaches (a hang)
04   ``exchange_from_ptx``, ``judge_exchange``  the cluster exchange replayed from the PTX

    ptx = scale_ptx(scale_kernel, 4104)
    print(grad_flow(report_for(grad_in).ptx))
"""

# (no ``from __future__ import annotations``: the DSL reads ``scale_launch``'s annotations,
# cute.Tensor, as objects, and ``cute`` is imported in that function, not in this module's globals)
import itertools
import os

from ..grading.context import no_shortcuts, shared
from ..grading.dsmem_sim import exchange_from_ptx, judge_exchange  # noqa: F401  (lesson 04)
from ..grading.holes import GRAD_IN_HOLE
from ..grading.ptx import REG, Ptx, divergent_barriers, f32_hex  # noqa: F401  (lesson 03)

#: Gemma's offset, the one 07.grad_in's kernel is compiled with:
#: recognisable in their PTX as the fp32 constant 0f3F800000
OFFSET = 1.0


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


# ---- 06: the op's fake ------------------------------------------------------------------------
_op_counter = itertools.count()


def scratch_op(fake):
    """A fresh custom op ``quack_edu_grading::fwd_<pid>_<k>`` with the schema of
    ``quack_edu::rmsnorm_fwd``, the real kernel as its body and ``fake`` (06.fake_impl's answer)
    as its fake: ``torch.library.opcheck`` and ``torch.compile`` run through the learner's fake."""
    import torch

    from ..rmsnorm import _fwd_body

    schema = str(torch.ops.quack_edu.rmsnorm_fwd.default._schema)
    schema = schema[schema.index("(") :]
    name = f"quack_edu_grading::fwd_{os.getpid()}_{next(_op_counter)}"
    op = torch.library.custom_op(name, _fwd_body, mutates_args=(), schema=schema)

    def fake_fn(x, weight, bias, residual, out_dtype, res_dtype, eps, store_rstd, offset):
        return fake(x, weight, bias, residual, out_dtype, res_dtype, eps, store_rstd, offset)

    op.register_fake(fake_fn)
    return op


# ---- 07: the backward kernel's g --------------------------------------------------------------
#: the no-weight kernel's offset: nonzero, so that a grad_in which applies it without a weight
#: shows it (0.375 and 1.375 are immediates no other part of the kernel uses)
NO_WEIGHT_OFFSET = 0.375


def learner_class(answer):
    """The backward kernel class with the learner's ``grad_in`` (one per answer object)."""
    return shared(answer, ("07.grad_in class",), lambda: GRAD_IN_HOLE.build(answer))


def report_for(answer, N: int = 1000, weighted: bool = True):
    """The backward kernel with the learner's ``grad_in``, compiled with x fp32, weight bf16,
    dout fp16 and weight_offset=1.0 at ``N`` (``weighted=False``: bf16 x, no weight,
    weight_offset=NO_WEIGHT_OFFSET, which must not reach dx). Kept for the answer object
    (``checks.shared``): after the check ran in this process, the report it read, not compiled
    again; otherwise compiled here, as the check compiles it."""
    import torch

    from ..stages.final_bwd import BwdFeatures
    from ..tools.inspect import kernel_report

    def make():
        cls = learner_class(answer)
        if weighted:
            f = BwdFeatures(dout_dtype=torch.float16, weight_offset=OFFSET)
            kernel = cls(torch.float32, N, None, torch.bfloat16, features=f)
        else:
            f = BwdFeatures(weight=False, dw=False, weight_offset=NO_WEIGHT_OFFSET)
            kernel = cls(torch.bfloat16, N, None, None, features=f)
        with no_shortcuts():
            return kernel_report(kernel, stage="final_bwd+07.grad_in")

    return shared(answer, ("07.grad_in report", N, weighted), make)


def grad_flow(ptx_text: str) -> dict:
    """What reaches the dx stores of a backward compiled with x fp32, weight bf16, dout fp16 and
    weight_offset=1.0: {"weight", "dout", "offset": bool, "offset_after": bool}. The dx stores
    are those the weight reaches (dw's partial sums do not depend on it)."""
    ptx = Ptx(ptx_text)
    k = f32_hex(OFFSET)
    weight_stores, offset, offset_after, dout_ok = [], False, False, True
    for st in (i for i in ptx.instrs if i.opcode.startswith("st.global")):
        anc = ptx.ancestors(st)
        if not any(a.opcode.startswith("cvt.f32.bf16") for a in anc):
            continue
        weight_stores.append(st)
        dout_ok &= any(a.opcode.startswith("cvt.f32.f16") for a in anc)
        for a in anc:
            if any(k in o for o in a.operands):
                offset = True
                if any(b.opcode.startswith("cvt.f32.f16") for b in ptx.ancestors(a)):
                    offset_after = True
    return {
        "weight": bool(weight_stores),
        "dout": bool(weight_stores) and dout_ok,
        "offset": offset,
        "offset_after": offset_after,
    }
