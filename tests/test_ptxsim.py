"""The PTX simulator (quack_edu.ptxsim) runs the naive, warp and block stages on the CPU.

The stage kernels are compiled for sm_90a as for a GPU and their PTX is simulated on fresh
random inputs at ragged shapes, every dtype and mixed weight dtypes; the outputs start as NaN
(poison) and are compared with the fp64 reference. Two wrong kernels (a piece replaced, as the
grader's exercises do) must give wrong values. Hand-written PTX checks the pieces the stages
lean on: shuffles, divergence, a barrier, the bf16 rounding, and the errors.

Each kernel is compiled once per test process (``ptxsim.stages`` caches the PTX).
"""

from __future__ import annotations

import operator

import cutlass
import cutlass.cute as cute
import numpy as np
import pytest
import torch
from cutlass import Float32

from quack_edu.config import RowConfig
from quack_edu.primitives import reduce as reduce_utils
from quack_edu.ptxsim import (
    MemoryFault,
    SimError,
    StepLimit,
    TensorArg,
    UnsupportedInstruction,
    launch,
    run_kernel,
    run_stage,
    stage_kernel,
)
from quack_edu.reference import assert_close, rmsnorm_ref
from quack_edu.stages.naive import NaiveRMSNorm
from quack_edu.stages.warp import WarpRMSNorm

BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
#: (x dtype, weight dtype): every dtype, and weights of another dtype than x
DTYPES = [(BF16, BF16), (FP16, FP16), (FP32, FP32), (BF16, FP32), (FP16, BF16), (FP32, BF16)]
MS = (1, 3, 7)


def _inputs(M, N, dtype, wdtype, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, N, generator=g).to(dtype)
    w = (1 + 0.5 * torch.randn(N, generator=g)).to(wdtype)
    return x, w


def _check(y, x, w, eps=1e-6):
    """The tolerance table, and more: a kernel that reduces in fp32 and rounds once to a half
    type is within half an ulp of the output dtype (plus fp32 noise) of the exact result."""
    ref = rmsnorm_ref(x, w, eps=eps, compute_dtype=torch.float64)
    assert_close(y, ref, dtype=x.dtype)
    if x.dtype != FP32:
        info = torch.finfo(x.dtype)
        # an upper bound of the ulp at |ref|; below the normal range (fp16 under 6e-5) the
        # spacing stays that of the subnormals
        ulp = (ref.abs() * info.eps).clamp_min(info.tiny * info.eps)
        err = (y.double() - ref).abs()
        assert (err <= 0.5 * ulp + 1e-5 * ref.abs()).all(), (err / ulp).max()


def _case_id(stage, N, dtype, wdtype, cfg=None):
    name = f"{stage}-{N}-{str(dtype)[6:]}-w{str(wdtype)[6:]}"
    return name if cfg is None else f"{name}-{cfg.threads_per_row}x{cfg.num_threads}"


def _cases():
    for dtype, wdtype in DTYPES:
        yield "naive", 1000, dtype, wdtype, None
        yield "warp", 1000, dtype, wdtype, None  # 125 (bf16) or 250 (fp32) vectors: ragged
        yield "warp", 384, dtype, wdtype, None
        yield "warp", 64, dtype, wdtype, None  # 8 or 16 lanes per row
    for dtype, wdtype in [(BF16, BF16), (FP32, FP32), (FP16, FP32)]:
        yield "naive", 37, dtype, wdtype, None  # any N: scalar accesses
        yield "warp", 8192, dtype, wdtype, None  # past a warp's registers: chunks
        yield "block", 1000, dtype, wdtype, None  # two warps per row: shared memory, bar.sync
    for cfg in [
        RowConfig(threads_per_row=32, num_threads=256),
        RowConfig(threads_per_row=16, num_threads=128),
        RowConfig(threads_per_row=32, num_threads=128, max_vecs=8),
    ]:
        yield "warp", 1000, BF16, BF16, cfg


@pytest.mark.parametrize(
    "stage,N,dtype,wdtype,cfg", [pytest.param(*c, id=_case_id(*c)) for c in _cases()]
)
def test_stage_values(stage, N, dtype, wdtype, cfg):
    for i, M in enumerate(MS):
        x, w = _inputs(M, N, dtype, wdtype, seed=1000 * i + N)
        y = run_stage(stage, x, w, eps=1e-6, config=cfg)
        assert y.shape == (M, N) and y.dtype == dtype
        _check(y, x, w)


def test_eps_reaches_the_kernel():
    """eps is a kernel parameter: a large one changes the output as the reference says."""
    x, w = _inputs(3, 384, FP32, FP32, seed=7)
    y = run_stage("warp", x, w, eps=0.5)
    assert_close(y, rmsnorm_ref(x, w, eps=0.5, compute_dtype=torch.float64), dtype=FP32)


# ---- wrong kernels must give wrong values ------------------------------------------------------
class DoubledSquares(NaiveRMSNorm):
    """Sums x*x + x*x: every output is the right one over sqrt(2)."""

    @cute.jit
    def sum_squares(self, mX: cute.Tensor, row) -> Float32:
        sum_sq = Float32(0.0)
        for j in cutlass.range(self.N, unroll=4):
            v = mX[row, j].to(Float32)
            sum_sq += v * v + v * v
        return sum_sq


class HalfButterfly(WarpRMSNorm):
    """Reduces over 16 lanes of the row's 32: each half-warp normalises by its own half-sum."""

    def warp_reduce(self, val: Float32) -> Float32:
        return reduce_utils.warp_reduce(val, operator.add, width=16)


def _wrong(kernel_cls, N, dtype=BF16):
    cfg = stage_kernel(kernel_cls.name, N, dtype).config
    return kernel_cls(dtype, N, cfg, dtype)


def test_doubled_squares_is_wrong_by_sqrt2():
    x, w = _inputs(3, 1000, FP32, FP32, seed=3)
    y = run_kernel(_wrong(DoubledSquares, 1000, FP32), x, w)
    ref = rmsnorm_ref(x, w, compute_dtype=torch.float64)
    with pytest.raises(AssertionError):
        assert_close(y, ref, dtype=FP32)
    assert_close(y, ref / 2**0.5, dtype=FP32)  # the simulator computes what the kernel says


def test_half_butterfly_is_wrong():
    kernel = _wrong(HalfButterfly, 1024)
    assert kernel.config.threads_per_row == 32
    x, w = _inputs(3, 1024, BF16, BF16, seed=4)
    with pytest.raises(AssertionError):
        _check(run_kernel(kernel, x, w), x, w)


# ---- hand-written PTX ---------------------------------------------------------------------------
def _ptx(body: str, regs: str = "", params: str = ".param .u64 out") -> str:
    return f"""
.version 8.8
.target sm_90a
.address_size 64
.extern .shared .align 16 .b8 smem[];
.visible .entry probe({params})
{{
    .reg .pred %p<4>;
    .reg .b32 %r<20>;
    .reg .b64 %rd<8>;
    {regs}
    ld.param.u64 %rd1, [out];
    mov.u32 %r1, %tid.x;
    mul.wide.u32 %rd2, %r1, 16;
    add.s64 %rd3, %rd1, %rd2;
{body}
    ret;
}}
"""


def test_shuffles_and_divergence():
    body = """
    mul.lo.s32 %r2, %r1, 10;
    shfl.sync.bfly.b32 %r3, %r2, 1, 31, -1;
    shfl.sync.down.b32 %r4, %r2, 4, 31, -1;
    shfl.sync.idx.b32 %r5, %r2, 3, 31, -1;
    and.b32 %r6, %r1, 1;
    setp.ne.b32 %p1, %r6, 0;
    mov.b32 %r7, 100;
    @%p1 bra $ODD;
    mov.b32 %r7, 200;
$ODD:
    st.global.v4.b32 [%rd3], {%r3, %r4, %r5, %r7};
"""
    (out,) = launch(_ptx(body), (1,), (64,), [TensorArg(np.zeros((64, 4), np.uint32))])
    t = np.arange(64)
    lane, warp = t % 32, t // 32
    assert (out[:, 0] == (t ^ 1) * 10).all()
    assert (out[:, 1] == np.where(lane + 4 <= 31, t + 4, t) * 10).all()
    assert (out[:, 2] == (warp * 32 + 3) * 10).all()
    assert (out[:, 3] == np.where(t % 2, 100, 200)).all()


def test_barrier_waits_for_threads_at_a_higher_address():
    """Warp 1 writes shared memory in code placed after the barrier, then jumps back to it:
    warp 0, parked at the barrier, must not read before that write."""
    body = """
    shl.b32 %r2, %r1, 2;
    mov.u32 %r3, smem;
    add.s32 %r4, %r3, %r2;
    setp.ge.u32 %p1, %r1, 32;
    @%p1 bra $WRITE;
$BARRIER:
    bar.sync 0;
    xor.b32 %r5, %r2, 128;
    add.s32 %r6, %r3, %r5;
    ld.shared.b32 %r7, [%r6];
    st.global.b32 [%rd3], %r7;
    bra $END;
$WRITE:
    add.s32 %r8, %r1, 1000;
    st.shared.b32 [%r4], %r8;
    bra $BARRIER;
$END:
"""
    (out,) = launch(
        _ptx(body), (1,), (64,), [TensorArg(np.zeros((64, 4), np.uint32))], dynamic_smem=256
    )
    t = np.arange(64)
    # warp 0 reads warp 1's values; warp 1 reads warp 0's slots, never written: poison
    assert (out[:32, 0] == t[32:] + 1000).all()
    assert (out[32:, 0] == 0xFFFFFFFF).all()


def test_bf16_rounds_to_nearest_even():
    values = np.array([1.0, 1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-7 + 2**-9, -0.0, np.inf], np.float32)
    body = """
    mul.wide.u32 %rd4, %r1, 4;
    add.s64 %rd5, %rd6, %rd4;
    ld.global.f32 %r2, [%rd5];
    cvt.rn.bf16.f32 %rs1, %r2;
    mul.wide.u32 %rd4, %r1, 2;
    add.s64 %rd5, %rd1, %rd4;
    st.global.b16 [%rd5], %rs1;
"""
    ptx = _ptx(body, regs=".reg .b16 %rs<2>;", params=".param .u64 out, .param .u64 inp")
    ptx = ptx.replace(
        "ld.param.u64 %rd1, [out];", "ld.param.u64 %rd1, [out];\n    ld.param.u64 %rd6, [inp];"
    )
    out, _ = launch(ptx, (1,), (6,), [TensorArg(np.zeros(6, np.uint16)), TensorArg(values)])
    expected = torch.from_numpy(values).to(BF16).view(torch.int16).numpy().view(np.uint16)
    assert (out == expected).all()


def test_unknown_instruction_names_itself_and_its_line():
    ptx = _ptx("    brev.b32 %r2, %r1;")
    line = next(i for i, s in enumerate(ptx.splitlines(), 1) if "brev" in s)
    with pytest.raises(UnsupportedInstruction, match=rf"`brev\.b32`.*PTX line {line}"):
        launch(ptx, (1,), (32,), [TensorArg(np.zeros((32, 4), np.uint32))])


def test_unsupported_form_names_its_line():
    ptx = _ptx("    cvt.rn.f32.u32 %r2, %r1;\n    add.rz.f32 %r3, %r2, %r2;")
    with pytest.raises(UnsupportedInstruction, match=r"add\.rz\.f32.*rounding \.rz.*PTX line"):
        launch(ptx, (1,), (32,), [TensorArg(np.zeros((32, 4), np.uint32))])


def test_out_of_bounds_and_divergent_shuffle_are_errors():
    store = "    st.global.b32 [%rd3], %r1;"  # 16 bytes apart: thread 4 is past 64 bytes
    with pytest.raises(MemoryFault, match="outside every buffer"):
        launch(_ptx(store), (1,), (8,), [TensorArg(np.zeros(16, np.uint32))])
    divergent = """
    setp.lt.u32 %p1, %r1, 16;
    @%p1 bra $END;
    shfl.sync.bfly.b32 %r2, %r1, 1, 31, -1;
$END:
"""
    with pytest.raises(SimError, match="member mask"):
        launch(_ptx(divergent), (1,), (32,), [TensorArg(np.zeros((32, 4), np.uint32))])


def test_an_endless_loop_spends_the_launch_budget_not_more():
    """max_steps bounds the whole launch: 3 CTAs of a 10-step kernel fit in 40 steps, not in
    25; a loop that never ends raises StepLimit."""
    ten = "    add.s32 %r2, %r1, 1;\n" * 5
    args = [TensorArg(np.zeros((32, 4), np.uint32))]
    launch(_ptx(ten), (3,), (32,), args, max_steps=40)
    with pytest.raises(StepLimit, match="no end after 25 steps in all"):
        launch(_ptx(ten), (3,), (32,), args, max_steps=25)
    with pytest.raises(StepLimit, match="endless loop"):
        launch(_ptx("$LOOP:\n    bra $LOOP;"), (1,), (32,), args, max_steps=1000)


def _halves_in_out(body: str, a, b, c, out_dtype):
    """Thread t runs ``body`` on the 32-bit words a[t], b[t], c[t] (%r2, %r3, %r4; result in
    %r5, or %rs5 for a 16-bit one); returns the results viewed as ``out_dtype``."""
    load = """
    mul.wide.u32 %rd4, %r1, 4;
    add.s64 %rd5, %rd6, %rd4;
    ld.global.b32 %r2, [%rd5];
    ld.global.b32 %r3, [%rd5+128];
    ld.global.b32 %r4, [%rd5+256];
"""
    store = """
    mul.wide.u32 %rd4, %r1, 4;
    add.s64 %rd5, %rd1, %rd4;
    st.global.b32 [%rd5], %r5;
"""
    regs = ".reg .b16 %rs<8>;"
    ptx = _ptx(load + body + store, regs=regs, params=".param .u64 out, .param .u64 inp")
    ptx = ptx.replace(
        "ld.param.u64 %rd1, [out];", "ld.param.u64 %rd1, [out];\n    ld.param.u64 %rd6, [inp];"
    )
    words = np.stack([np.asarray(v).view(np.uint32) for v in (a, b, c)])
    out, _ = launch(ptx, (1,), (32,), [TensorArg(np.zeros(32, np.uint32)), TensorArg(words)])
    return torch.from_numpy(out.view(np.int32)).view(out_dtype)


@pytest.mark.parametrize("half", [BF16, FP16])
def test_half_pairs_are_floats_not_integers(half):
    """NVVM computes a product of two 16-bit values rounded to 16 bits as mul.bf16x2 (the warp
    kernel's y = x * w): each half is multiplied as a float and rounded once."""
    g = torch.Generator().manual_seed(5)
    a, b, c = (torch.randn(64, generator=g).to(half) for _ in range(3))
    words = [t.view(torch.int32).numpy() for t in (a, b, c)]
    name = "bf16x2" if half == BF16 else "f16x2"
    for body, want in [
        (f"    mul.rn.{name} %r5, %r2, %r3;", a.float() * b.float()),
        (f"    add.{name} %r5, %r2, %r3;", a.float() + b.float()),
        (f"    fma.rn.{name} %r5, %r2, %r3, %r4;", a.double() * b.double() + c.double()),
        (f"    max.{name} %r5, %r2, %r3;", torch.maximum(a.float(), b.float())),
    ]:
        got = _halves_in_out(body, *words, half)
        assert torch.equal(got, want.to(half)), body


def test_scalar_half_compare_and_sub():
    a = torch.tensor([1.5, -2.0, 0.25] * 22, dtype=BF16)[:64]
    b = torch.tensor([1.0, -1.0, 0.5] * 22, dtype=BF16)[:64]
    body = """
    mov.b32 {%rs1, %rs2}, %r2;
    mov.b32 {%rs3, %rs4}, %r3;
    sub.bf16 %rs5, %rs1, %rs3;
    setp.lt.bf16 %p1, %rs1, %rs3;
    selp.b16 %rs6, %rs5, %rs1, %p1;
    mov.b32 %r5, {%rs6, %rs2};
"""
    words = [t.view(torch.int32).numpy() for t in (a, b, b)]
    got = _halves_in_out(body, *words, BF16)
    lo_a, lo_b = a[0::2].float(), b[0::2].float()
    want_lo = torch.where(lo_a < lo_b, lo_a - lo_b, lo_a).to(BF16)
    assert torch.equal(got[0::2], want_lo) and torch.equal(got[1::2], a[1::2])


def test_other_half_arithmetic_is_refused():
    ptx = _ptx("    mul.rz.bf16x2 %r3, %r1, %r1;")
    with pytest.raises(UnsupportedInstruction, match=r"half-precision \.bf16x2"):
        launch(ptx, (1,), (32,), [TensorArg(np.zeros((32, 4), np.uint32))])
