"""quack_edu.rmsnorm on the CPU: QuACK 0.6.5's API, the argument errors, nn.RMSNorm
compatibility, the fake implementation, and the Python plumbing around the kernel.

No kernel runs here. The "plumbing" tests replace the kernel launcher (``final.launch_fwd``)
with one that writes the fp32 reference into the outputs it is given, and switch off the
device check: they test what the Python layer passes to the kernel and returns, not the
kernel's numbers (tests/test_rmsnorm_gpu.py does that).
"""

import importlib
import inspect
import types

import pytest
import torch

from quack_edu.reference import rmsnorm_bwd_ref as bwd_ref32
from quack_edu.reference import rmsnorm_ref as ref32
from quack_edu.reference import rstd_ref

R = importlib.import_module("quack_edu.rmsnorm")  # quack_edu.rmsnorm is the function
OPS = importlib.import_module("quack_edu.host.ops")
F = importlib.import_module("quack_edu.host.forward")
B = importlib.import_module("quack_edu.host.backward")

# --------------------------------------------------------------------------------------------
# The API is QuACK 0.6.5's (quack/rmsnorm.py): names, parameters, defaults
# --------------------------------------------------------------------------------------------

FWD_PARAMS = [
    ("x", inspect.Parameter.empty),
    ("weight", None),
    ("bias", None),
    ("residual", None),
    ("out_dtype", None),
    ("residual_dtype", None),
    ("eps", 1e-6),
    ("store_rstd", False),
    ("weight_offset", 0.0),
]
QUACK_0_6_5 = {
    "rmsnorm_fwd": FWD_PARAMS,
    # QuACK's own rmsnorm_fwd_tuned takes preallocated outputs; ours mirrors rmsnorm_fwd
    "rmsnorm_fwd_tuned": FWD_PARAMS,
    "rmsnorm": [*FWD_PARAMS[:7], ("prenorm", False), ("weight_offset", 0.0)],
    "rmsnorm_ref": [
        ("x", inspect.Parameter.empty),
        ("w", None),
        ("bias", None),
        ("residual", None),
        ("eps", 1e-6),
        ("weight_offset", 0.0),
    ],
}


@pytest.mark.parametrize("name", sorted(QUACK_0_6_5))
def test_signature_matches_quack_0_6_5(name):
    params = inspect.signature(getattr(R, name)).parameters.values()
    assert [(p.name, p.default) for p in params] == QUACK_0_6_5[name]


def test_module_and_function_signatures():
    params = inspect.signature(R.QuackRMSNorm.__init__).parameters.values()
    assert [(p.name, p.default) for p in params][1:] == [
        ("dim", inspect.Parameter.empty),
        ("eps", 1e-6),
        ("elementwise_affine", True),
        ("device", None),
        ("dtype", None),
    ]
    assert issubclass(R.QuackRMSNorm, torch.nn.RMSNorm)
    assert issubclass(R.RMSNormFunction, torch.autograd.Function)
    fwd = inspect.signature(R.RMSNormFunction.forward).parameters
    assert list(fwd) == ["ctx", *(name for name, _ in QUACK_0_6_5["rmsnorm"])]


# --------------------------------------------------------------------------------------------
# rmsnorm_ref: QuACK's meaning, on the project's fp32 reference
# --------------------------------------------------------------------------------------------


def test_rmsnorm_ref_semantics():
    torch.manual_seed(0)
    x = torch.randn(5, 3, 64, dtype=torch.bfloat16)
    res = torch.randn(5, 3, 64, dtype=torch.float16)
    w, b = torch.randn(64), torch.randn(64, dtype=torch.bfloat16)

    out = R.rmsnorm_ref(x, w, b, eps=1e-5)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, ref32(x, w, b, eps=1e-5).to(torch.bfloat16))

    out, res_out = R.rmsnorm_ref(x, w, residual=res)
    assert (out.dtype, res_out.dtype) == (torch.bfloat16, torch.float16)
    exp_out, exp_res = ref32(x, w, residual=res)
    assert torch.equal(out, exp_out.to(torch.bfloat16))
    assert torch.equal(res_out, exp_res.to(torch.float16))

    # weight_offset (Gemma): out = x_hat * (w + offset), the sum in fp32
    w16 = torch.randn(64, dtype=torch.bfloat16)
    got = R.rmsnorm_ref(x.float(), w16, weight_offset=1.0)
    x_hat = x.float() * rstd_ref(x).unsqueeze(-1)
    torch.testing.assert_close(got, x_hat * (w16.float() + 1.0))

    # per-head: weight (H, D) scales each head of (..., H, D)
    wh = torch.randn(3, 64)
    torch.testing.assert_close(R.rmsnorm_ref(x.float(), wh), x_hat * wh)
    assert torch.equal(R.rmsnorm_ref(x), ref32(x).to(x.dtype))  # no weight


# --------------------------------------------------------------------------------------------
# Argument errors: each names the argument and the fix. No GPU needed to see them.
# --------------------------------------------------------------------------------------------

X = torch.randn(4, 64, dtype=torch.bfloat16)
W = torch.randn(64)

ERRORS = [
    ("not a tensor", dict(x=[[1.0]]), TypeError, "x must be a torch.Tensor"),
    ("0-d x", dict(x=torch.tensor(1.0)), ValueError, "at least one dimension"),
    ("int x", dict(x=torch.ones(4, 64, dtype=torch.int32)), TypeError, "torch.float16, torch"),
    ("fp64 x", dict(x=X.double()), TypeError, "x has dtype torch.float64; supported"),
    ("fp8 x", dict(x=X.to(torch.float8_e4m3fn)), TypeError, "supported: torch.float16"),
    ("N = 0", dict(x=torch.empty(4, 0)), ValueError, "N = 0"),
    ("N too big", dict(x=torch.empty(1, 262145)), ValueError, "at most 262144"),
    ("last stride", dict(x=torch.randn(64, 4).t()), ValueError, "pass x.contiguous()"),
    ("weight list", dict(weight=[1.0] * 64), TypeError, "weight must be a torch.Tensor"),
    ("fp64 weight", dict(weight=W.double()), TypeError, "weight has dtype torch.float64"),
    ("weight shape", dict(weight=torch.randn(32)), ValueError, "weight must have shape (64,)"),
    ("weight 3-D", dict(weight=torch.randn(1, 1, 64)), ValueError, "1-D (N,) or 2-D (H, D)"),
    ("head shape", dict(weight=torch.randn(3, 64)), ValueError, "(H, D) = x.shape[-2:]"),
    ("weight stride", dict(weight=torch.randn(128)[::2]), ValueError, "weight.contiguous()"),
    ("bias shape", dict(bias=torch.randn(63)), ValueError, "bias must have weight's shape"),
    ("bias alone", dict(weight=None, bias=torch.randn(8)), ValueError, "bias must have shape"),
    ("int bias", dict(bias=torch.ones(64, dtype=torch.int64)), TypeError, "bias has dtype"),
    ("residual shape", dict(residual=torch.randn(4, 63)), ValueError, "residual must have x's"),
    ("residual dtype", dict(residual=X.double()), TypeError, "residual has dtype torch.float64"),
    ("out_dtype", dict(out_dtype=torch.float64), TypeError, "out_dtype must be None or one of"),
    ("residual_dtype", dict(residual_dtype=torch.int8), TypeError, "residual_dtype must be"),
    ("offset, no w", dict(weight=None, weight_offset=1.0), ValueError, "needs a weight"),
    ("CPU tensors", dict(), ValueError, "the kernel runs on a CUDA GPU"),
]


@pytest.mark.parametrize("fn", ["rmsnorm_fwd", "rmsnorm_fwd_tuned", "rmsnorm"])
@pytest.mark.parametrize(("case", "kwargs", "exc", "match"), ERRORS, ids=[e[0] for e in ERRORS])
def test_bad_arguments_name_the_problem(fn, case, kwargs, exc, match):
    if fn == "rmsnorm" and case == "last stride":
        pytest.skip("rmsnorm accepts any strides (it copies, as QuACK's does)")
    args = dict(x=X, weight=W, bias=None, residual=None)
    args.update(kwargs)
    with pytest.raises(exc) as info:
        getattr(R, fn)(**args)
    assert match in str(info.value)


def test_rmsnorm_copies_a_strided_last_dim_rather_than_failing(fake_kernel):
    x = torch.randn(64, 4).t()
    torch.testing.assert_close(R.rmsnorm(x), ref32(x))
    assert fake_kernel.calls[0]["x"].stride(-1) == 1


# --------------------------------------------------------------------------------------------
# Plumbing: the launcher is replaced by the fp32 reference
# --------------------------------------------------------------------------------------------


def _reference_launch(calls):
    def launch_fwd(x, weight, bias, residual, out, residual_out, rstd, eps, weight_offset=0.0,
                   config=None):  # fmt: skip
        calls.append(dict(x=x, weight=weight, out=out, rstd=rstd, eps=eps, config=config))
        p = weight if weight is not None else bias  # a per-head weight or bias: (M, H, D)
        assert x.dim() == 3 or p is None or p.dim() == 1  # else rows (M, N) or (M, H, N)
        for t in (x, out, residual, residual_out):
            assert t is None or (t.dim() == x.dim() in (2, 3) and t.stride(-1) == 1)
        assert rstd is None or rstd.shape == x.shape[:-1]
        w = None if weight is None else weight.float() + weight_offset
        got = ref32(x, w, bias, residual, eps)
        xs = x.float()
        if residual is not None:
            got, xs = got
        out.copy_(got)
        if residual_out is not None:
            residual_out.copy_(xs)
        if rstd is not None:
            rstd.copy_(rstd_ref(xs, eps))

    return launch_fwd


def _reference_launch_bwd(calls):
    def launch_bwd(x, weight, dout, dres_out, rstd, dx, dres, db, weight_offset=0.0, config=None):
        calls.append(dict(x=x, weight=weight, dout=dout, rstd=rstd, dx=dx, config=config))
        for t in (x, dout, dres_out, dx, dres):  # rows (M, N), or (M, H, N) (two row modes)
            assert t is None or (t.dim() == x.dim() in (2, 3) and t.stride(-1) == 1)
        assert rstd.shape == x.shape[:-1] and rstd.is_contiguous()
        gx, gw, gb = bwd_ref32(x, weight, dout, rstd, dres_out, db, weight_offset=weight_offset)
        dx.copy_(gx)
        if dres is not None:
            dres.copy_(gx)
        # partial sums as the kernel leaves them: (P, N) fp32, here P = 2
        return tuple(
            None if g is None else torch.stack([g, torch.zeros_like(g)]).float() for g in (gw, gb)
        )

    return launch_bwd


def _reference_sum(partial, dtype, out=None):
    """``final_bwd.sum_partials`` as torch says it: the fp32 sum over rows, in ``dtype``."""
    got = partial.sum(dim=0).to(dtype)
    return got if out is None else out.copy_(got)


def _reference_sum_fn(dtype, P):
    """``final_bwd.partial_sum_fn``: the sum's call ``fn(partial, out)``, as torch says it."""
    return lambda partial, out: _reference_sum(partial, dtype, out)


def _reference_kernel_for(launch_fwd):
    """``final.kernel_for`` over the reference launcher: what a launch plan keeps and calls."""

    def kernel_for(x, weight, bias, residual, out, residual_out, rstd, weight_offset=0.0,
                   config=None):  # fmt: skip
        def call(x, w, b, res, out, res_out, rstd, eps):
            launch_fwd(x, w, b, res, out, res_out, rstd, eps, weight_offset, config)

        return types.SimpleNamespace(call=call)

    return kernel_for


#: the fake backward kernel's rows a CTA and most CTAs (the plan's P = min(ceil(M / 4), 3))
FAKE_BWD_ROWS, FAKE_BWD_CTAS = 4, 3


def _reference_bwd_kernel_for(launch_bwd):
    """``final_bwd.kernel_for`` over the reference launcher: (kernel, fn) as a plan uses them;
    fn writes the partial sums into the (P, N) buffers it is given (row 0, zeros below)."""

    def kernel_for(x, weight, dout, dres_out, dx, dres, db, weight_offset=0.0, config=None):
        def fn(x, w, dout, dres_out, rstd, dx, dres, dw_p, db_p, P):
            assert P == min(-(-(x.numel() // x.shape[-1]) // FAKE_BWD_ROWS), FAKE_BWD_CTAS)
            parts = launch_bwd(x, w, dout, dres_out, rstd, dx, dres, db_p is not None,
                               weight_offset, config)  # fmt: skip
            for got, buf in zip(parts, (dw_p, db_p), strict=True):
                if buf is not None:
                    buf.zero_()
                    buf[0].copy_(got.sum(0))

        def grid_x(M, sm_count, resident):
            return min(-(-M // FAKE_BWD_ROWS), FAKE_BWD_CTAS)

        kernel = types.SimpleNamespace(
            grid_x=grid_x, grid_on=lambda M, dev: grid_x(M, None, None),
            tiling=types.SimpleNamespace(rows_per_cta=FAKE_BWD_ROWS),
        )  # fmt: skip
        return kernel, fn

    return kernel_for


@pytest.fixture
def fake_kernel(monkeypatch):
    """PLUMBING ONLY: the kernels replaced by the references, and the device check off. The
    launch plans are emptied before and after: a plan holds the fake kernel."""
    calls = []
    launch_fwd = _reference_launch(calls)
    stub = types.SimpleNamespace(
        launch_fwd=launch_fwd, kernel_for=_reference_kernel_for(launch_fwd), max_N=R.MAX_N,
        calls=calls,
    )  # fmt: skip
    monkeypatch.setattr(F, "_final_mod", stub)
    launch_bwd = _reference_launch_bwd(calls)
    bwd = types.SimpleNamespace(
        launch_bwd=launch_bwd, sum_partials=_reference_sum, partial_sum_fn=_reference_sum_fn,
        sm_count=lambda dev: 2,
        kernel_for=_reference_bwd_kernel_for(launch_bwd),
    )  # fmt: skip
    monkeypatch.setattr(B, "_final_bwd", lambda: bwd)
    for module in (F, B):  # where the device check is called
        monkeypatch.setattr(module, "check_device", lambda *args: None)
    F._FWD_PLANS.clear()
    B._BWD_PLANS.clear()
    yield stub
    F._FWD_PLANS.clear()
    B._BWD_PLANS.clear()


DTYPES = [torch.float16, torch.bfloat16, torch.float32]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("wdtype", [None, *DTYPES])
def test_plumbing_outputs_match_quack_allocation_rules(fake_kernel, dtype, wdtype):
    x = torch.randn(2, 3, 40, dtype=dtype)
    w = None if wdtype is None else torch.randn(40, dtype=wdtype)
    out, res_out, rstd = R.rmsnorm_fwd(x, w)
    assert out.dtype == dtype and out.shape == x.shape and rstd is None
    assert res_out is x  # no residual, no residual_dtype: x itself, as in QuACK
    assert torch.equal(out, R.rmsnorm_ref(x, w))

    out, res_out, rstd = R.rmsnorm_fwd(x, w, out_dtype=torch.float32, store_rstd=True)
    assert out.dtype == torch.float32 and rstd.dtype == torch.float32 and rstd.shape == (2, 3)
    torch.testing.assert_close(rstd, rstd_ref(x))

    other = torch.float32 if dtype != torch.float32 else torch.bfloat16
    _, res_out, _ = R.rmsnorm_fwd(x, w, residual_dtype=other)
    assert res_out is not x and res_out.dtype == other and torch.equal(res_out, x.to(other))
    _, res_out, _ = R.rmsnorm_fwd(x, w, residual_dtype=dtype)
    assert res_out is x


def test_plumbing_residual_bias_offset_and_per_head(fake_kernel):
    x = torch.randn(3, 4, 2, 16, dtype=torch.bfloat16)
    res = torch.randn_like(x, dtype=torch.float16)
    w, b = torch.randn(2, 16), torch.randn(2, 16, dtype=torch.bfloat16)
    out, res_out, rstd = R.rmsnorm_fwd(x, w, b, res, eps=1e-5, store_rstd=True, weight_offset=1.0)
    assert res_out.dtype == torch.float16 and rstd.shape == (3, 4, 2)
    exp_out, exp_res = R.rmsnorm_ref(x, w, b, res, eps=1e-5, weight_offset=1.0)
    assert torch.equal(out, exp_out) and torch.equal(res_out, exp_res)
    call = fake_kernel.calls[-1]
    assert call["x"].shape == (12, 2, 16) and call["rstd"].shape == (12, 2)
    assert call["eps"] == 1e-5 and call["config"] is None

    _, res_out, _ = R.rmsnorm_fwd(x, w, residual=res, residual_dtype=torch.float32)
    assert res_out.dtype == torch.float32


def test_plumbing_strided_rows_and_empty_batches(fake_kernel):
    base = torch.randn(7, 576, dtype=torch.bfloat16)
    x = base[:, :512]
    out, _, _ = R.rmsnorm_fwd(x, torch.randn(512))
    assert out.is_contiguous() and fake_kernel.calls[-1]["x"].data_ptr() == x.data_ptr()
    for shape in [(0, 64), (2, 0, 64)]:
        n = len(fake_kernel.calls)
        out, res_out, rstd = R.rmsnorm_fwd(torch.empty(shape), W, store_rstd=True)
        assert out.shape == shape and rstd.shape == shape[:-1]
        assert len(fake_kernel.calls) == n  # nothing to launch
    out = R.rmsnorm_fwd(torch.randn(64), W)[0]  # a single row, 1-D
    assert out.shape == (64,)


def test_plumbing_rmsnorm_prenorm_and_grad_mode(fake_kernel):
    x, res = torch.randn(4, 64), torch.randn(4, 64)
    out, res_out = R.rmsnorm(x, W, residual=res, prenorm=True)
    assert torch.equal(res_out, x + res)
    out2, same = R.rmsnorm(x, W, prenorm=True)
    assert torch.equal(same, x) and torch.equal(out, R.rmsnorm(x, W, residual=res))

    w = W.clone().requires_grad_()
    y = R.rmsnorm(x, w)
    assert y.requires_grad
    with torch.no_grad():
        assert not R.rmsnorm(x, w).requires_grad
    with torch.inference_mode():
        assert R.rmsnorm(x, w).shape == x.shape


# --------------------------------------------------------------------------------------------
# QuackRMSNorm is an nn.RMSNorm
# --------------------------------------------------------------------------------------------


def test_state_dicts_load_both_ways():
    ours, theirs = R.QuackRMSNorm(64), torch.nn.RMSNorm(64)
    with torch.no_grad():
        theirs.weight.uniform_()
    ours.load_state_dict(theirs.state_dict())
    assert torch.equal(ours.weight, theirs.weight)
    theirs2 = torch.nn.RMSNorm(64)
    theirs2.load_state_dict(ours.state_dict())
    assert torch.equal(theirs2.weight, ours.weight)
    assert list(ours.state_dict()) == ["weight"]
    assert R.QuackRMSNorm((4, 16), elementwise_affine=False).state_dict() == {}
    m = R.QuackRMSNorm([4, 16], eps=None, dtype=torch.bfloat16)
    assert m.weight.shape == (4, 16) and m.weight.dtype == torch.bfloat16 and m.eps is None


@pytest.mark.parametrize(
    ("shape", "kw", "wdtype"),
    [
        (64, {}, torch.float32),
        (64, dict(eps=None), torch.bfloat16),
        ((4, 16), {}, torch.float32),
        ([4, 16], dict(eps=1e-3), torch.float16),
        (64, dict(elementwise_affine=False), None),
    ],
)
def test_plumbing_module_matches_nn_rmsnorm(fake_kernel, shape, kw, wdtype):
    ours = R.QuackRMSNorm(shape, **kw, dtype=wdtype)
    theirs = torch.nn.RMSNorm(shape, **{"eps": 1e-6, **kw}, dtype=wdtype)
    if wdtype is not None:
        with torch.no_grad():
            theirs.weight.normal_()
        ours.load_state_dict(theirs.state_dict())
    x = torch.randn(3, 5, 64, dtype=torch.bfloat16).view(3, 5, *([4, 16] if shape != 64 else [64]))
    with torch.no_grad():
        got, expected = ours(x), theirs(x)
    # torch 2.13: F.rms_norm returns x.dtype whatever the weight's dtype; so do we
    assert got.dtype == expected.dtype == x.dtype and got.shape == x.shape
    torch.testing.assert_close(got.float(), expected.float(), atol=2e-2, rtol=2e-2)
    if kw.get("eps", 0) is None:
        assert fake_kernel.calls[-1]["eps"] == torch.finfo(torch.bfloat16).eps


def test_module_rejects_the_wrong_trailing_shape():
    with pytest.raises(ValueError, match=r"expects x of shape \(\.\.\., \*\(4, 16\)\)"):
        R.QuackRMSNorm((4, 16))(torch.randn(2, 64))
    # eps=None (nn.RMSNorm's "x's machine epsilon") with an integer x: the dtype's error, not
    # torch.finfo's
    with pytest.raises(TypeError, match=r"x has dtype torch\.int32; supported"):
        R.QuackRMSNorm(64, eps=None)(torch.ones(2, 64, dtype=torch.int32))


# --------------------------------------------------------------------------------------------
# torch.library: the fake implementation, opcheck, torch.compile
# --------------------------------------------------------------------------------------------


def test_fake_outputs_under_fake_tensor_mode():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(2, 5, 3, 128, device="cuda", dtype=torch.bfloat16)
        res = torch.empty(2, 5, 3, 128, device="cuda", dtype=torch.float16)
        wh = torch.empty(3, 128, device="cuda")
        op = torch.ops.quack_edu.rmsnorm_fwd.default
        outs = op(x, wh, None, res, torch.float32, torch.float32, 1e-6, True, 0.0)
        assert [(t.shape, t.dtype, t.device.type) for t in outs] == [
            ((2, 5, 3, 128), torch.float32, "cuda"),
            ((2, 5, 3, 128), torch.float32, "cuda"),
            ((2, 5, 3), torch.float32, "cuda"),
        ]
        assert len(op(x, None, None, None, torch.bfloat16, None, 1e-6, False, 0.0)) == 1
        # the public wrappers route through the op under a dispatch mode
        out, res_out, rstd = R.rmsnorm_fwd(x, wh, store_rstd=True)
        assert res_out is x and rstd.shape == (2, 5, 3) and out.dtype == torch.bfloat16
        out, res_out, rstd = R.rmsnorm_fwd_tuned(x, residual=res, out_dtype=torch.float16)
        assert res_out.dtype == torch.float16 and out.dtype == torch.float16 and rstd is None
        with torch.no_grad():  # autograd metadata on a fake CUDA tensor aborts a CPU build
            assert R.QuackRMSNorm(128, device="cuda")(x).shape == x.shape


def test_op_schemas():
    for name in ("rmsnorm_fwd", "rmsnorm_fwd_tuned"):
        schema = str(getattr(torch.ops.quack_edu, name).default._schema)
        assert schema == (
            f"quack_edu::{name}(Tensor x, Tensor? weight, Tensor? bias, Tensor? residual, "
            "ScalarType out_dtype, ScalarType? residual_out_dtype, float eps, bool store_rstd, "
            "float weight_offset) -> Tensor[]"
        )


def test_plumbing_opcheck(fake_kernel):
    x = torch.randn(6, 48, dtype=torch.bfloat16)
    res, w = torch.randn(6, 48), torch.randn(48, dtype=torch.bfloat16)
    op = torch.ops.quack_edu.rmsnorm_fwd.default
    for args in [
        (x, w, None, res, torch.float32, torch.float32, 1e-6, True, 0.5),
        (x, None, None, None, torch.bfloat16, None, 1e-5, False, 0.0),
    ]:
        torch.library.opcheck(op, args)


def test_plumbing_compile_fullgraph_no_graph_break(fake_kernel):
    torch._dynamo.reset()

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = R.QuackRMSNorm(32)
            self.proj = torch.nn.Linear(32, 32)

        def forward(self, x, res):
            out, res = R.rmsnorm(x, self.norm.weight, residual=res, prenorm=True)
            return self.norm(self.proj(out)), res

    model = Block()
    x, res = torch.randn(2, 8, 32), torch.randn(2, 8, 32)
    expected = model(x, res)
    # aot_eager: dynamo + the fake implementation + AOT autograd, no inductor codegen
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    got = compiled(x, res)  # the weights require grad: the backward is traced too
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x, res)[0], expected[0])


def test_the_tuning_key_buckets_the_rows(monkeypatch):
    # one key per power of two of M: 8 and 5 rows share one, 8 and 32768 do not
    monkeypatch.setitem(OPS._gpu_names, -1, "Fake H200")

    def key(*shape):
        x = torch.zeros(*shape, dtype=torch.bfloat16)
        w = torch.ones(shape[-1], dtype=torch.bfloat16)
        return dict(F._tune_key(x, w, None, None, torch.bfloat16, None, False, 0.0))

    assert key(8, 1024)["M"] == key(5, 1024)["M"] == 8
    assert key(2, 4, 1024)["M"] == 8  # rows of a 3-D x
    assert key(32768, 1024)["M"] == 32768 != key(8, 1024)["M"]
    assert key(8, 1024)["N"] == 1024 and key(8, 1024)["gpu"] == "Fake H200"


def test_plumbing_autograd_forward_takes_the_plain_path(fake_kernel, monkeypatch):
    """A forward that saves rstd (autograd's, in every training step) is a plain call: after
    its key's first call it runs no check and goes through no other path (issue 47)."""
    x, w = torch.randn(3, 5, 64, dtype=torch.bfloat16), torch.randn(64)
    R.rmsnorm_fwd(x, w, store_rstd=True)

    def full_key(*args):
        raise AssertionError("the plain call took the checked path")

    monkeypatch.setattr(F, "_planned", full_key)
    monkeypatch.setattr(F, "check_args", full_key)
    out, res_out, rstd = R.rmsnorm_fwd(x, w, store_rstd=True)
    assert res_out is x and rstd.shape == (3, 5) and rstd.dtype == torch.float32
    assert torch.equal(out, R.rmsnorm_ref(x, w))
    torch.testing.assert_close(rstd, rstd_ref(x))
