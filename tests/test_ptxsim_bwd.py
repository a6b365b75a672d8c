"""ptxsim runs the final stage's backward (``run_stage("final_bwd", ...)``: the backward kernel,
then ``PartialSum``) against ``rmsnorm_bwd_ref`` at small shapes.

Plans: the library's config (two buffers, 8 rows a CTA at N=1000 bf16), a persistent grid of 2
CTAs walking 7 row blocks of one row (each CTA several blocks, in two buffers), a 2-CTA
cluster, and a row length that is not a whole number of 16-byte vectors; x in bf16, fp16 and
fp32 with weights of another dtype beside them. dx and dw start poisoned (NaN bits). Orders: a
warp at a time, reversed, gives the same bits. Each kernel compiles once per process.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from quack_edu.ptxsim import run_bwd, run_stage
from quack_edu.reference import assert_close, rmsnorm_bwd_ref
from quack_edu.stages.final_bwd import default_config

BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32


def _inputs(M, N, dtype, wdtype, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, N, generator=g).to(dtype)
    w = (1 + 0.5 * torch.randn(N, generator=g)).to(wdtype)
    dout = torch.randn(M, N, generator=g).to(dtype)
    rstd = torch.rsqrt(x.float().pow(2).mean(-1) + 1e-6)
    return x, w, dout, rstd


def _check(dx, dw, x, w, dout, rstd):
    rdx, rdw, _ = rmsnorm_bwd_ref(x, w, dout, rstd, compute_dtype=torch.float64)
    assert dx.dtype == x.dtype and dw.dtype == w.dtype
    assert_close(dx, rdx, dtype=x.dtype, what="dx")
    assert_close(dw, rdw, dtype=w.dtype, what="dw")


CASES = [
    ("library", 1000, BF16, BF16, {}, None),
    ("library", 1000, FP32, BF16, {}, None),
    ("persistent 2 CTAs", 1000, FP16, FP32, dict(threads_per_row=128, num_threads=128), 2),
    ("2-CTA cluster", 2048, FP32, FP32, dict(cluster_n=2), None),
    ("ragged N", 1001, BF16, FP32, {}, None),
]


@pytest.mark.parametrize(
    "plan,N,dtype,wdtype,changes,grid_x",
    [pytest.param(*c, id=f"{c[0]}-{c[1]}-{str(c[2])[6:]}-w{str(c[3])[6:]}") for c in CASES],
)
def test_backward_values(plan, N, dtype, wdtype, changes, grid_x):
    cfg = replace(default_config(N, dtype, wdtype), **changes)
    for M in (1, 3, 7):
        x, w, dout, rstd = _inputs(M, N, dtype, wdtype, seed=M + N)
        _check(*run_bwd(x, w, dout, rstd, cfg, grid_x=grid_x), x, w, dout, rstd)


def test_run_stage_runs_the_backward_and_orders_agree():
    x, w, dout, rstd = _inputs(7, 1000, BF16, BF16, seed=3)
    dx, dw = run_stage("final_bwd", x, w, dout=dout, rstd=rstd)
    _check(dx, dw, x, w, dout, rstd)
    cfg = replace(default_config(1000, BF16, BF16), threads_per_row=128, num_threads=128)
    a = run_bwd(x, w, dout, rstd, cfg, grid_x=2)
    b = run_bwd(x, w, dout, rstd, cfg, grid_x=2, order="reversed")
    for u, v in zip(a, b, strict=True):
        assert torch.equal(u.view(torch.int16), v.view(torch.int16))
    with pytest.raises(ValueError, match="dout and the forward's rstd"):
        run_stage("final_bwd", x, w)
