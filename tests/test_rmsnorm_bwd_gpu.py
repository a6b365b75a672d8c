"""The library's backward on a Hopper GPU (marked `gpu`): ``rmsnorm_bwd`` against float64, every
feature, determinism, autograd (``rmsnorm``, ``QuackRMSNorm``), gradcheck, torch.compile,
opcheck, CUDA graphs, and a few training steps against ``nn.RMSNorm``.

Tolerances. dx is one row's arithmetic rounded to its dtype: the forward's table
(``TOLERANCES``). dw (and db) are sums over the M rows of products of size ~1 with random
signs, so they grow like sqrt(M) and so does the fp32 error of summing them in another order
than float64 does: the weight dtype's table with ``atol`` scaled by sqrt(M). dx (and a
dresidual of another dtype) subtracts two terms of size rstd·|w·dy| that nearly cancel where a
row is short (N = 1: dx = rstd·w·dy·(1 − x̂²) with x̂² ≈ 1), so its error follows rstd, not dx:
``atol`` scaled by the row's rstd (at least 1), as the fuzz tests do. Seen on the H200: fp32,
N = 1, a row with rstd ≈ 40 was 2e-5 off a dx of ~0.
"""

import functools
import importlib
import math

import pytest
import torch

from quack_edu.reference import TOLERANCES, rstd_ref
from quack_edu.reference import rmsnorm_bwd_ref as bwd_ref

R = importlib.import_module("quack_edu.rmsnorm")  # quack_edu.rmsnorm is the function
B = importlib.import_module("quack_edu.host.backward")

pytestmark = pytest.mark.gpu

DTYPES = [torch.bfloat16, torch.float16, torch.float32]
MS = [1, 37, 199]
NS = [1, 7, 100, 1000, 4096, 4104, 65536 + 8, 100001, 262144]
WDTYPES = [None, torch.float16, torch.bfloat16, torch.float32]
SWEEP = [
    (N, dtype, WDTYPES[(i + j + 1) % 4]) for i, N in enumerate(NS) for j, dtype in enumerate(DTYPES)
]


def _poison_allocator(nbytes=64 << 20):
    torch.empty(nbytes, dtype=torch.uint8, device="cuda").fill_(0xFF)  # 0xFFFF.. is NaN


def _close(got, expected, what, rows=1, rstd=None):
    """Within the dtype's tolerance; ``rows``: a sum over that many rows (atol times sqrt);
    ``rstd``: a row's result (dx), atol times max(rstd, 1) per row. See the module docstring."""
    assert got is not None, f"{what}: missing"
    assert torch.isfinite(got).all(), f"{what}: not every element was written"
    tol = TOLERANCES[got.dtype]
    atol = tol["atol"] * math.sqrt(rows)
    if rstd is not None:
        scale = rstd.double().reshape(-1).clamp(min=1.0)
        atol = atol * scale.reshape(*got.shape[:-1], 1)
    g, e = got.double(), expected.double()
    bad = (g - e).abs() > atol + tol["rtol"] * e.abs()
    if bad.any():
        i = tuple(bad.nonzero()[0].tolist())
        raise AssertionError(
            f"{what}: {int(bad.sum())} of {got.numel()} elements beyond atol={tol['atol']} "
            f"(x sqrt({rows}){' x rstd' if rstd is not None else ''}), rtol={tol['rtol']}; "
            f"first at {list(i)}: got {g[i].item()!r}, expected {e[i].item()!r}"
        )


@functools.cache
def _grid3(fb):
    """The library's backward on a grid of 3 CTAs (clusters), so that each walks several row
    blocks (one class, compiled once per config)."""

    class Grid3(fb.FinalBwdRMSNorm):
        def grid_x(self, M, sm_count=fb.SM_COUNT, resident=None):
            return 3

    return Grid3


def _inputs(M, N, dtype, wdtype, dout_dtype=None):
    x = torch.randn(M, N, device="cuda", dtype=dtype)
    w = None if wdtype is None else torch.randn(N, device="cuda", dtype=wdtype)
    dout = torch.randn(M, N, device="cuda", dtype=dout_dtype or dtype)
    rstd = rstd_ref(x.double()).float()  # what the forward stores
    return x, w, dout, rstd


def _check(x, w, dout, rstd, dres_out=None, has_bias=False, has_residual=False, offset=0.0):
    _poison_allocator()
    dx, dw, db, dres = R.rmsnorm_bwd(x, w, dout, rstd, dres_out, has_bias, has_residual, offset)
    ex, ew, eb = bwd_ref(
        x, w, dout, rstd, dres_out, has_bias, compute_dtype=torch.float64, weight_offset=offset
    )
    what = f"{tuple(x.shape)} {x.dtype} w={None if w is None else w.dtype}"
    assert dx.dtype == x.dtype and dx.shape == x.shape
    _close(dx, ex, f"dx {what}", rstd=rstd)
    rows = x.numel() // x.shape[-1]
    if w is None:
        assert dw is None
    else:
        assert dw.dtype == w.dtype and dw.shape == w.shape
        _close(dw, ew, f"dw {what}", rows)
    if has_bias:
        _close(db, eb, f"db {what}", rows)
    else:
        assert db is None
    if dres_out is not None and dres_out.dtype != x.dtype:
        assert dres.dtype == dres_out.dtype
        _close(dres, ex, f"dresidual {what}", rstd=rstd)
    elif has_residual:
        assert dres is dx
    else:
        assert dres is None
    return dx, dw, db, dres


@pytest.mark.parametrize(("N", "dtype", "wdtype"), SWEEP)
def test_values_at_ragged_shapes(N, dtype, wdtype):
    for M in MS:  # one compile for all three: M is symbolic
        _check(*_inputs(M, N, dtype, wdtype))


@pytest.mark.parametrize(
    ("dtype", "N"), [(torch.bfloat16, 100), (torch.float16, 4104), (torch.float32, 65536 + 8)]
)
def test_every_feature(dtype, N):
    x, w, dout, rstd = _inputs(37, N, dtype, torch.float32)
    same = torch.randn_like(x)
    other = torch.randn(
        37, N, device="cuda", dtype=torch.float32 if dtype != torch.float32 else torch.bfloat16
    )
    _check(x, w, dout, rstd, has_bias=True, offset=1.0)
    _check(x, w, dout, rstd, same, has_residual=True)
    _check(x, w, dout, rstd, other, has_bias=True, has_residual=True)
    _check(x, None, dout, rstd, has_bias=True)
    dout2 = torch.randn(
        37, N, device="cuda", dtype=torch.bfloat16 if dtype != torch.bfloat16 else torch.float32
    )
    _check(x, w, dout2, rstd)  # dout in another dtype than x (autocast)


@pytest.mark.parametrize("dtype", DTYPES)
def test_per_head_weight(dtype):
    x = torch.randn(5, 3, 8, 72, device="cuda", dtype=dtype)
    w = torch.randn(8, 72, device="cuda", dtype=torch.float32)
    dout = torch.randn_like(x)
    rstd = rstd_ref(x.double()).float()
    _check(x, w, dout, rstd, has_bias=True)


def test_strided_rows_leading_shapes_and_no_rows():
    base = torch.randn(37, 576, device="cuda", dtype=torch.bfloat16)
    x = base[:, :512]  # rows 576 apart
    dout = torch.randn(37, 640, device="cuda", dtype=torch.bfloat16)[:, 64:576]
    w = torch.randn(512, device="cuda", dtype=torch.float32)
    _check(x, w, dout, rstd_ref(x.double()).float())
    x3 = torch.randn(2, 3, 40, device="cuda")
    _check(x3, w[:40].contiguous(), torch.randn_like(x3), rstd_ref(x3.double()).float())
    x0 = torch.empty(0, 4096, device="cuda", dtype=torch.bfloat16)
    dx, dw, db, _ = R.rmsnorm_bwd(
        x0, w.new_ones(4096), torch.empty_like(x0), x0.new_empty(0, dtype=torch.float32),
        has_bias=True,
    )  # fmt: skip
    assert dx.shape == x0.shape and torch.equal(dw, torch.zeros_like(dw))
    assert torch.equal(db, torch.zeros_like(db))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("D", [128, 72])
def test_rows_in_two_modes_through_autograd(dtype, D):
    """A Qwen3-style QK norm: q and k views of a fused projection normalised in place, forward
    and backward; the gradients of the projection and the weight against float64 autograd of
    the reference, dx bit for bit the contiguous rows' (dw summed in another grouping: close)."""
    B, S, H = 3, 37, 5
    qkv = torch.randn(B, S, 3 * H * D, device="cuda", dtype=dtype, requires_grad=True)
    w = torch.randn(D, device="cuda", dtype=torch.float32, requires_grad=True)
    q, k, _ = qkv.view(B, S, 3, H, D).unbind(2)
    for x in (q, k.transpose(1, 2)):
        y = R.rmsnorm(x, w)
        dy = torch.randn_like(y)
        dx, dw = torch.autograd.grad(y, (x, w), dy)
        x64 = x.detach().double().requires_grad_()
        w64 = w.detach().double().requires_grad_()
        y64 = R.rmsnorm_ref(x64, w64)
        ex, ew = torch.autograd.grad(y64, (x64, w64), dy.double())
        torch.testing.assert_close(dx.double(), ex, **TOLERANCES[dtype])
        torch.testing.assert_close(dw.double(), ew, rtol=1e-3, atol=1e-3 * math.sqrt(B * S * H))
        xc = x.detach().contiguous().requires_grad_()
        dxc, _ = torch.autograd.grad(R.rmsnorm(xc, w), (xc, w), dy.contiguous())
        assert torch.equal(dx, dxc)


@pytest.mark.parametrize("N", [4096, 262144])
def test_dw_is_bitwise_deterministic(N):
    x, w, dout, rstd = _inputs(4096 if N == 4096 else 256, N, torch.bfloat16, torch.float32)
    first = R.rmsnorm_bwd(x, w, dout, rstd, has_bias=True)
    for _ in range(3):
        again = R.rmsnorm_bwd(x, w, dout, rstd, has_bias=True)
        for a, b in zip(first[:3], again[:3], strict=True):
            assert torch.equal(a, b)


@pytest.mark.parametrize(("N", "wdtype"), [(131072, torch.bfloat16), (262144, torch.float32)])
def test_persistent_grid_is_the_clusters_the_gpu_holds(N, wdtype):
    """Clusters of 4 and 8: one wave of exactly the clusters the driver says fit (fewer than
    SMs / cluster_n: a cluster's CTAs share a GPC), each walking several row blocks, and the
    gradients still right."""
    from quack_edu.stages import final_bwd

    k = final_bwd.FinalBwdRMSNorm(torch.bfloat16, N, None, wdtype)
    cn, sms = k.tiling.cluster_n, final_bwd.sm_count(0)
    held = k.resident(0)
    assert cn > 1 and held is not None and 1 <= held <= sms * k.ctas_per_sm() // cn
    M = 2 * held * k.tiling.rows_per_cta + 3  # the first 3 clusters walk three row blocks
    x, w, dout, rstd = _inputs(M, N, torch.bfloat16, wdtype)
    dx = torch.full_like(x, float("nan"))
    dw_p, _ = final_bwd.launch_bwd(x, w, dout, None, rstd, dx, None, False)
    assert dw_p.shape == (held, N)
    ex, ew, _ = bwd_ref(x, w, dout, rstd, compute_dtype=torch.float64)
    _close(dx, ex, f"dx {M}x{N}", rstd=rstd)
    _close(dw_p.sum(0), ew, f"dw {M}x{N}", M)


@pytest.mark.parametrize("P", [1, 7, 15, 132, 264, 301])
@pytest.mark.parametrize("N", [1, 5, 1000, 4104])
def test_sum_partials_is_a_fixed_order_fp32_sum(P, N):
    """The second reduction against its own order replayed in torch (group g adds rows g,
    g + G, ... in fp32, then the groups in order): bitwise equal; against float64: close;
    in bf16, the fp32 sum rounded once; into an ``out`` view."""
    from quack_edu.stages import final_bwd

    partial = torch.randn(P, N, device="cuda") * 100
    G = final_bwd.PartialSum.plan(P)
    groups = []
    for g in range(G):
        acc = torch.zeros(N, device="cuda")
        for r in range(g, P, G):
            acc = acc + partial[r]
        groups.append(acc)
    expected = groups[0]
    for acc in groups[1:]:
        expected = expected + acc
    _poison_allocator()
    got = final_bwd.sum_partials(partial, torch.float32)
    assert torch.equal(got, expected)
    torch.testing.assert_close(got.double(), partial.double().sum(0), rtol=1e-5, atol=1e-3)
    assert torch.equal(final_bwd.sum_partials(partial, torch.bfloat16), expected.bfloat16())
    out = torch.full((2, N), float("nan"), device="cuda", dtype=torch.float16)
    final_bwd.sum_partials(partial, torch.float16, out=out[1])
    assert torch.equal(out[1], expected.half()) and out[0].isnan().all()


# Pipelines the heuristic does not pick but the tuner may: three and four buffers (short rows,
# no cluster), one buffer refilled a vector at a time next to a weight read from L2. A grid
# of 3 CTAs makes each walk many row blocks, so the rings wrap many times.
PIPELINES = [
    (256, torch.bfloat16, torch.float32, {"buffers": 3}),
    (1000, torch.float16, torch.bfloat16, {"buffers": 4}),
    (4104, torch.float32, torch.float32, {"buffers": 3}),
    (65544, torch.bfloat16, torch.float32, {"buffers": 1, "refill_early": True}),
    (131072, torch.bfloat16, torch.float32, {"refill_early": True}),
]


@pytest.mark.parametrize(("N", "dtype", "wdtype", "changes"), PIPELINES)
def test_deeper_and_refilled_pipelines(N, dtype, wdtype, changes):
    from dataclasses import replace

    from quack_edu.stages import final_bwd as fb

    cfg = replace(fb.bwd_config(N, dtype, wdtype), **changes)
    for M in (1, 37, 199):
        x, w, dout, rstd = _inputs(M, N, dtype, wdtype)
        _poison_allocator()
        dx = torch.full_like(x, float("nan"))
        dw_p, db_p = _grid3(fb).launch(x, w, dout, None, rstd, dx, None, True, config=cfg)
        ex, ew, eb = bwd_ref(x, w, dout, rstd, None, True, compute_dtype=torch.float64)
        what = f"{M}x{N} {dtype} w={wdtype} {changes}"
        _close(dx, ex, f"dx {what}", rstd=rstd)
        _close(dw_p.sum(0), ew, f"dw {what}", M)
        _close(db_p.sum(0), eb, f"db {what}", M)


@pytest.mark.parametrize("invariant", [True, False])
@pytest.mark.parametrize(("N", "wdtype"), [(16384, torch.bfloat16), (65544, torch.float32)])
def test_invariant_loads_with_a_dresidual_out(N, wdtype, invariant):
    # invariant_loads (the default) turns the second pass's dresidual_out loads into
    # ld.global.nc, the plain loads are the knob's other side: the values must not change
    from dataclasses import replace

    from quack_edu.stages import final_bwd as fb

    bf16 = torch.bfloat16
    feats = fb.BwdFeatures(dres_out_dtype=bf16)
    cfg = replace(fb.bwd_config(N, bf16, wdtype, feats), invariant_loads=invariant)
    for M in (1, 37, 199):
        x, w, dout, rstd = _inputs(M, N, bf16, wdtype)
        dres_out = torch.randn_like(x)
        _poison_allocator()
        dx = torch.full_like(x, float("nan"))
        dw_p, _ = _grid3(fb).launch(x, w, dout, dres_out, rstd, dx, None, False, config=cfg)
        ex, ew, _ = bwd_ref(x, w, dout, rstd, dres_out, False, compute_dtype=torch.float64)
        what = f"{M}x{N} w={wdtype} invariant_loads={invariant}, dresidual_out"
        _close(dx, ex, f"dx {what}", rstd=rstd)
        _close(dw_p.sum(0), ew, f"dw {what}", M)


def _ref_forward(x, w, b, res, eps, offset):
    """float64 autograd reference: (out, residual_out)."""
    h = x.double() + (res.double() if res is not None else 0)
    y = h * torch.rsqrt(h.square().mean(-1, keepdim=True) + eps)
    if w is not None:
        y = y * (w.double() + offset)
    if b is not None:
        y = y + b.double()
    return y, h


@pytest.mark.parametrize("prenorm", [False, True])
@pytest.mark.parametrize("residual", [False, True])
def test_autograd_matches_float64(prenorm, residual):
    M, N, dtype = 37, 1000, torch.bfloat16

    def leaf(shape, dt):
        return torch.randn(shape, device="cuda", dtype=dt).requires_grad_()

    x, w, b = leaf((M, N), dtype), leaf(N, torch.float32), leaf(N, torch.float32)
    res = leaf((M, N), torch.float32) if residual else None
    g, g2 = torch.randn(M, N, device="cuda"), torch.randn(M, N, device="cuda")
    got = R.rmsnorm(x, w, b, res, eps=1e-5, prenorm=prenorm, weight_offset=0.5)
    out, res_out = got if prenorm else (got, None)
    loss = (out.float() * g).sum() + ((res_out.float() * g2).sum() if prenorm else 0)
    leaves = [t for t in (x, w, b, res) if t is not None]
    grads = torch.autograd.grad(loss, leaves)
    ref_leaves = [t.detach().clone().requires_grad_() for t in leaves]
    rx, rw, rb = ref_leaves[:3]
    rres = ref_leaves[3] if residual else None
    ey, eh = _ref_forward(rx, rw, rb, rres, 1e-5, 0.5)
    # the kernel's dout is out's gradient in out's dtype: round g as autograd does
    eloss = (ey * g.to(dtype).double()).sum() + ((eh * g2.double()).sum() if prenorm else 0)
    egrads = torch.autograd.grad(eloss, ref_leaves)
    for name, a, e in zip("x w b residual".split(), grads, egrads, strict=False):
        _close(a, e, f"grad {name}", rows=M if name in ("w", "b") else 1)


def test_gradcheck_small():
    x = torch.randn(3, 16, device="cuda", requires_grad=True)
    w = torch.randn(16, device="cuda", requires_grad=True)
    b = torch.randn(16, device="cuda", requires_grad=True)
    # fp32 kernels: finite differences with a large step and tolerances to match (the
    # numerical Jacobian's error is ~ eps**2 * f''' + 1e-7 / eps)
    assert torch.autograd.gradcheck(
        lambda x, w, b: R.rmsnorm(x, w, b), (x, w, b), eps=1e-2, atol=5e-3, rtol=5e-3,
        nondet_tol=1e-6,
    )  # fmt: skip


def test_module_training_follows_nn_rmsnorm():
    torch.manual_seed(0)

    def model(norm_cls):
        torch.manual_seed(1)
        return torch.nn.Sequential(
            torch.nn.Linear(64, 256), norm_cls(256), torch.nn.GELU(), torch.nn.Linear(256, 1)
        ).cuda()

    data = torch.randn(512, 64, device="cuda")
    target = torch.randn(512, 1, device="cuda")
    losses = {}
    for cls in (R.QuackRMSNorm, lambda d: torch.nn.RMSNorm(d, eps=1e-6)):
        m = model(cls)
        opt = torch.optim.SGD(m.parameters(), lr=0.05)
        curve = []
        for _ in range(20):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = torch.nn.functional.mse_loss(m(data).float(), target)
            opt.zero_grad()
            loss.backward()
            opt.step()
            curve.append(loss.item())
        losses[cls] = curve
    a, b = losses.values()
    assert a[-1] < a[0] * 0.9  # it trains
    for la, lb in zip(a, b, strict=True):
        assert abs(la - lb) <= 2e-2 * abs(lb), (a, b)


def test_opcheck_backward_op():
    x, w, dout, rstd = _inputs(37, 1000, torch.bfloat16, torch.float32)
    dres = torch.randn(37, 1000, device="cuda", dtype=torch.float32)
    op = torch.ops.quack_edu.rmsnorm_bwd.default
    for args in [
        (x, w, dout, rstd, None, False, None, 0.0),
        (x, w, dout, rstd, dres, True, torch.float32, 1.0),
        (x, None, dout, rstd, None, True, None, 0.0),
    ]:
        torch.library.opcheck(op, args)


def test_torch_compile_fullgraph_forward_and_backward():
    torch._dynamo.reset()
    norm = R.QuackRMSNorm(1024, device="cuda")
    proj = torch.nn.Linear(1024, 1024, device="cuda")

    def f(x, res):
        out, res = R.rmsnorm(x, norm.weight, residual=res, prenorm=True)
        return norm(proj(out)).sum() + res.sum()

    x = torch.randn(8, 1024, device="cuda", requires_grad=True)
    res = torch.randn(8, 1024, device="cuda", requires_grad=True)
    f(x, res).backward()
    eager = [t.grad.clone() for t in (x, res, norm.weight)]
    for t in (x, res, norm.weight):
        t.grad = None
    torch.compile(f, fullgraph=True)(x, res).backward()
    for a, e in zip([x.grad, res.grad, norm.weight.grad], eager, strict=True):
        torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-4)


def test_compiled_qk_norm_of_a_training_step_runs_the_kernels():
    # the compile policy's training rule: per-head rows (N = 128) with a gradient, over 2^20
    # elements, take the kernels inside the compiled graph; values and gradients as eager's
    torch._dynamo.reset()
    torch.manual_seed(3)
    B, S, H, D = 2, 2048, 4, 128  # 2^21 elements
    norm = R.QuackRMSNorm(D, device="cuda")
    with torch.no_grad():
        norm.weight.normal_(1.0, 0.1)
    proj = torch.nn.Linear(H * D, H * D, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(B, S, H * D, device="cuda", dtype=torch.bfloat16)
    g = torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16)

    def f(x):
        return norm(proj(x).view(B, S, H, D))

    assert R.compile_policy().path(torch.empty(B, S, H, D, device="meta"), grad=True) == "kernel"
    runs = []
    for fn in (f, torch.compile(f, fullgraph=True)):
        for t in (norm.weight, *proj.parameters()):
            t.grad = None
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            out = fn(x)
            out.backward(g)
            torch.cuda.synchronize()
        ours = [e.name for e in prof.events() if "quack_edu" in e.name]
        assert any("Bwd" in n for n in ours) and any("Bwd" not in n for n in ours), ours
        runs.append([out.detach(), norm.weight.grad, proj.weight.grad])
    (eager, compiled) = runs
    tol = TOLERANCES[torch.bfloat16]
    torch.testing.assert_close(compiled[0], eager[0], **tol)
    torch.testing.assert_close(compiled[1], eager[1], rtol=1e-3, atol=1e-3 * math.sqrt(B * S * H))
    torch.testing.assert_close(compiled[2].float(), eager[2].float(), rtol=2e-2, atol=2e-2)
    torch._dynamo.reset()


def test_cuda_graph_capture_of_forward_and_backward():
    x = torch.randn(64, 4096, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(4096, device="cuda", requires_grad=True)
    g = torch.randn(64, 4096, device="cuda", dtype=torch.bfloat16)

    def step():
        x.grad = w.grad = None
        R.rmsnorm(x, w).backward(g)
        return x.grad, w.grad

    expected = [t.clone() for t in step()]  # compiles and warms up outside the capture
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    x.grad = w.grad = None
    with torch.cuda.graph(graph):
        out = R.rmsnorm(x, w)
        gx, gw = torch.autograd.grad(out, (x, w), g)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(gx, expected[0]) and torch.equal(gw, expected[1])


def test_rmsnorm_bwd_tuned(tmp_path, monkeypatch):
    monkeypatch.setenv("QUACK_EDU_AUTOTUNE_CACHE", str(tmp_path / "tune.json"))
    monkeypatch.setattr(importlib.import_module("quack_edu.host.ops"), "_tuner", None)
    x, w, dout, rstd = _inputs(512, 4096, torch.bfloat16, torch.float32)
    tuned = R.rmsnorm_bwd_tuned(x, w, dout, rstd, has_bias=True)
    plain = R.rmsnorm_bwd(x, w, dout, rstd, has_bias=True)
    for t, p in zip(tuned[:3], plain[:3], strict=True):
        torch.testing.assert_close(t.float(), p.float(), rtol=2e-2, atol=2e-2)


def test_plain_call_fast_path_matches_and_still_checks():
    """The second plain call (x, weight, dout, rstd) goes through the cached fast path: the same
    values, a fresh dx, and a wrong shape still gets the checked path's error."""
    B._BWD_PLANS.clear()
    x, w, dout, rstd = _inputs(37, 1000, torch.bfloat16, torch.float32)
    first = _check(x, w, dout, rstd)
    assert len(B._BWD_PLANS) == 1
    x2, _, dout2, rstd2 = _inputs(199, 1000, torch.bfloat16, None)
    got = _check(x2, w, dout2, rstd2)  # another M through the cache
    assert got[0].data_ptr() != first[0].data_ptr()
    again = R.rmsnorm_bwd(x, w, dout, rstd)
    assert torch.equal(again[0], first[0]) and torch.equal(again[1], first[1])
    with pytest.raises(ValueError, match="dout"):
        R.rmsnorm_bwd(x, w, dout[:, :999], rstd)
    with pytest.raises(ValueError, match="rstd"):
        R.rmsnorm_bwd(x, w, dout, rstd[:5])


@pytest.mark.parametrize("M", MS)
@pytest.mark.parametrize(
    "x_dtype,res_dtype",
    [(torch.bfloat16, torch.float32), (torch.bfloat16,) * 2, (torch.float32,) * 2],
)
def test_the_modules_short_ways_train_as_float64_does(M, x_dtype, res_dtype):
    """``norm(x, residual)`` (``_PrenormRMSNorm``) and ``norm(q)`` of a fused projection's
    unbind view (``_PlainRMSNorm`` reading rows in place), from their second call on (the
    short ways through the plans): every output against float64, every gradient against the
    float64 reference backward (``rmsnorm_bwd_ref``) from the saved rows and rstd, as the
    kernels define it (residual_out is rounded to its dtype, rstd is of the unrounded sum)."""
    torch.manual_seed(M)
    N, H, D = 1000, 4, 128
    norm = R.QuackRMSNorm(N, device="cuda")
    qk = R.QuackRMSNorm(D, device="cuda")
    with torch.no_grad():
        norm.weight.normal_(1.0, 0.2)
        qk.weight.normal_(1.0, 0.2)
    for _ in range(3):  # plans made, then the backward's found by the forward's, then used
        _poison_allocator()
        x = torch.randn(M, 3, N, device="cuda", dtype=x_dtype, requires_grad=True)
        r = torch.randn(M, 3, N, device="cuda", dtype=res_dtype, requires_grad=True)
        qkv = torch.randn(M, 3, 3 * H * D, device="cuda", dtype=x_dtype, requires_grad=True)
        q = qkv.view(M, 3, 3, H, D).unbind(2)[0]
        for t in (norm.weight, qk.weight):
            t.grad = None
        out, res = norm(x, r)
        y = qk(q)
        dy, dh, dq = torch.randn_like(out), torch.randn_like(res), torch.randn_like(y)
        torch.autograd.backward([out, res, y], [dy, dh, dq])
    assert type(out.grad_fn).__name__ == "_PrenormRMSNormBackward"
    assert type(y.grad_fn).__name__ == "_PlainRMSNormBackward"
    f64 = torch.float64
    h = x.detach().double() + r.detach().double()
    rstd = rstd_ref(h, compute_dtype=f64)
    _close(res, h, "residual_out")
    _close(out, h * rstd[..., None] * norm.weight.detach().double(), "out")
    dx, dw, _ = bwd_ref(res.detach(), norm.weight.detach(), dy, rstd, dh, compute_dtype=f64)
    _close(x.grad, dx, "dx", rstd=rstd)
    _close(r.grad, dx, "dresidual", rstd=rstd)
    _close(norm.weight.grad, dw, "dw", rows=3 * M)
    qd = q.detach().double()
    rstd_q = rstd_ref(qd, compute_dtype=f64)
    _close(y, qd * rstd_q[..., None] * qk.weight.detach().double(), "q's norm")
    dq_x, dq_w, _ = bwd_ref(q.detach(), qk.weight.detach(), dq, rstd_q, compute_dtype=f64)
    _close(qkv.grad.view(M, 3, 3, H, D)[:, :, 0], dq_x, "dq", rstd=rstd_q)
    assert not qkv.grad.view(M, 3, 3, H, D)[:, :, 1:].any()  # k and v had no gradient
    _close(qk.weight.grad, dq_w, "dw of q's norm", rows=3 * M * H)
