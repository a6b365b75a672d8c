"""quack_edu.rmsnorm's backward on the CPU: QuACK 0.6.5's ``rmsnorm_bwd`` API (signatures,
return values and dtypes, argument errors), autograd through ``rmsnorm`` and ``QuackRMSNorm``,
the custom op ``quack_edu::rmsnorm_bwd`` (fake implementation, schema, opcheck) and
``torch.compile``, and QuACK's ``rmsnorm_bwd_ref``.

No kernel runs here. The plumbing tests use ``fake_kernel`` (tests/test_rmsnorm_api.py): the
forward and backward launchers are replaced by the fp32 references, and the device check is
off. They test what the Python layer hands the kernels and what it makes of their outputs
(reshapes, per-head launches, summing the partial dw/db, dtypes, aliases, autograd), not the
kernels' numbers: tests/test_rmsnorm_gpu.py compares those.
"""

import importlib
import inspect

import pytest
import test_rmsnorm_api
import torch

import quack_edu
from quack_edu.reference import TOLERANCES, assert_close, rstd_ref
from quack_edu.reference import rmsnorm_bwd_ref as bwd_ref32

R = importlib.import_module("quack_edu.rmsnorm")  # quack_edu.rmsnorm is the function
F32 = TOLERANCES[torch.float32]
# the plumbing fixture: kernels replaced by the references (pytest finds it by its name here)
fake_kernel = test_rmsnorm_api.fake_kernel
DTYPES = [torch.float16, torch.bfloat16, torch.float32]

# --------------------------------------------------------------------------------------------
# The API is QuACK 0.6.5's
# --------------------------------------------------------------------------------------------

EMPTY = inspect.Parameter.empty
BWD_NAMES = "x weight dout rstd dresidual_out has_bias has_residual weight_offset".split()
BWD_PARAMS = list(zip(BWD_NAMES, [EMPTY] * 4 + [None, False, False, 0.0], strict=True))
REF_NAMES = "x w dout rstd eps weight_offset".split()
SIGNATURES = {
    "rmsnorm_bwd": BWD_PARAMS,
    "rmsnorm_bwd_tuned": BWD_PARAMS,
    "rmsnorm_bwd_ref": list(zip(REF_NAMES, [EMPTY] * 4 + [1e-6, 0.0], strict=True)),
}


@pytest.mark.parametrize("name", sorted(SIGNATURES))
def test_bwd_signature_matches_quack_0_6_5(name):
    params = inspect.signature(getattr(R, name)).parameters.values()
    assert [(p.name, p.default) for p in params] == SIGNATURES[name]
    assert getattr(quack_edu, name) is getattr(R, name) and name in quack_edu.__all__


# --------------------------------------------------------------------------------------------
# rmsnorm_bwd's return values (QuACK's rules), through the fake kernel
# --------------------------------------------------------------------------------------------


def _inputs(shape, dtype=torch.float32, wshape=None, wdtype=torch.float32):
    x = torch.randn(shape, dtype=dtype)
    w = None if wshape is None else torch.randn(wshape, dtype=wdtype)
    return x, w, torch.randn(shape, dtype=dtype), rstd_ref(x)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("wdtype", [None, torch.float32, torch.bfloat16], ids=str)
def test_bwd_outputs_dtypes_and_values(fake_kernel, dtype, wdtype):
    x, w, dout, rstd = _inputs((2, 3, 40), dtype, None if wdtype is None else 40, wdtype)
    dx, dw, db, dres = R.rmsnorm_bwd(x, w, dout, rstd)
    assert dx.dtype == dtype and dx.shape == x.shape and db is None and dres is None
    gx, gw, gb = bwd_ref32(x, w, dout, rstd, has_bias=True)
    assert_close(dx, gx, what="dx")
    if w is None:
        assert dw is None
    else:
        assert dw.dtype == wdtype and dw.shape == (40,)
        assert_close(dw, gw, what="dw")
    _, dw, db, _ = R.rmsnorm_bwd(x, w, dout, rstd, has_bias=True)
    assert db.dtype == (wdtype or torch.float32) and db.shape == (40,)
    assert_close(db, gb, what="db")
    assert fake_kernel.calls[-1]["x"].shape == (6, 40)  # rows flattened for the kernel


def test_bwd_dresidual_is_a_tensor_of_its_own_or_dx_or_none(fake_kernel):
    x, w, dout, rstd = _inputs((37, 72), torch.bfloat16, 72)
    same, other = torch.randn_like(x), torch.randn_like(x, dtype=torch.float32)
    assert R.rmsnorm_bwd(x, w, dout, rstd)[3] is None
    dx, _, _, dres = R.rmsnorm_bwd(x, w, dout, rstd, has_residual=True)
    assert dres is dx
    dx, _, _, dres = R.rmsnorm_bwd(x, w, dout, rstd, same, has_residual=True)
    assert dres is dx  # same dtype: QuACK returns dx itself
    assert_close(dx, bwd_ref32(x, w, dout, rstd, same)[0], what="dx + dresidual_out")
    dx, _, _, dres = R.rmsnorm_bwd(x, w, dout, rstd, same)
    assert dres is None  # no residual: dresidual_out only flows into dx
    assert_close(dx, bwd_ref32(x, w, dout, rstd, same)[0], what="dx + dresidual_out")
    for has_residual in (True, False):
        dx, _, _, dres = R.rmsnorm_bwd(x, w, dout, rstd, other, has_residual=has_residual)
        assert dres is not dx and dres.dtype == torch.float32 and dres.shape == x.shape
        expected = bwd_ref32(x, w, dout, rstd, other)[0]
        assert_close(dres, expected, what="dresidual")
        assert_close(dx, expected, what="dx")


def test_bwd_per_head_weight(fake_kernel):
    x, w, dout, rstd = _inputs((37, 3, 40), torch.float32, (3, 40), torch.bfloat16)
    dx, dw, db, _ = R.rmsnorm_bwd(x, w, dout, rstd, has_bias=True, weight_offset=0.5)
    gx, gw, gb = bwd_ref32(
        x, w, dout, rstd, has_bias=True, compute_dtype=torch.float64, weight_offset=0.5
    )
    assert (dw.shape, dw.dtype, db.shape, db.dtype) == ((3, 40), w.dtype, (3, 40), w.dtype)
    assert_close(dx, gx, what="dx")
    assert_close(dw, gw, what="dw")
    assert_close(db, gb, what="db")
    assert len(fake_kernel.calls) == 3  # one launch a head
    x4 = torch.randn(2, 5, 3, 40)  # more leading dims
    dx, dw, _, _ = R.rmsnorm_bwd(x4, w, x4.cos(), rstd_ref(x4))
    gx, gw, _ = bwd_ref32(x4, w, x4.cos(), rstd_ref(x4), compute_dtype=torch.float64)
    assert dx.shape == x4.shape and dw.shape == (3, 40)
    assert_close(dx, gx, what="dx")
    assert_close(dw, gw, what="dw")


def test_bwd_weight_offset_moves_dx_not_dw(fake_kernel):
    x, w, dout, rstd = _inputs((37, 40), torch.float32, 40)
    dx0, dw0, _, _ = R.rmsnorm_bwd(x, w, dout, rstd)
    dx1, dw1, _, _ = R.rmsnorm_bwd(x, w, dout, rstd, weight_offset=1.0)
    assert_close(dx1, bwd_ref32(x, w, dout, rstd, weight_offset=1.0)[0], what="dx")
    assert (dx1 - dx0).abs().max() > 0.1
    torch.testing.assert_close(dw1, dw0)


@pytest.mark.parametrize(
    ("shape", "wshape"), [((0, 40), 40), ((2, 0, 72), 72), ((0, 3, 40), (3, 40))]
)
def test_bwd_no_rows_gives_zero_dw(fake_kernel, shape, wshape):
    x, w, dout, rstd = _inputs(shape, torch.bfloat16, wshape)
    dx, dw, db, _ = R.rmsnorm_bwd(x, w, dout, rstd, has_bias=True)
    assert dx.shape == shape and dw.dtype == w.dtype
    assert torch.equal(dw, torch.zeros_like(w)) and torch.equal(db, torch.zeros_like(w))


# --------------------------------------------------------------------------------------------
# Argument errors name the argument; they come before the device check, so no GPU is needed
# --------------------------------------------------------------------------------------------

X, BIG = torch.randn(4, 40, dtype=torch.bfloat16), torch.empty(1, R.MAX_N + 1)
BWD_ERRORS = [
    ("dout shape", dict(dout=torch.randn(4, 41)), ValueError, "dout must have x's shape"),
    ("dout int", dict(dout=torch.ones(4, 40, dtype=torch.int32)), TypeError, "dout has dtype"),
    ("dout None", dict(dout=None), TypeError, "dout must be a torch.Tensor"),
    ("rstd fp16", dict(rstd=torch.ones(4, dtype=torch.float16)), ValueError, "rstd must be"),
    ("rstd shape", dict(rstd=torch.ones(4, 1)), ValueError, r"rstd must be float32 of shape"),
    ("rstd list", dict(rstd=[1.0] * 4), TypeError, "rstd must be a torch.Tensor"),
    ("dres shape", dict(dresidual_out=torch.randn(40)), ValueError, "dresidual_out must have"),
    ("weight shape", dict(weight=torch.randn(39)), ValueError, r"weight must have shape \(40,\)"),
    ("offset, no w", dict(weight=None, weight_offset=1.0), ValueError, "weight_offset=1.0 needs"),
    ("N > MAX_N", dict(x=BIG, dout=BIG, rstd=torch.ones(1)), ValueError, "x has N = 262145"),
    ("CPU tensors", dict(), ValueError, "the kernel runs on a CUDA GPU"),
]


@pytest.mark.parametrize("fn", ["rmsnorm_bwd", "rmsnorm_bwd_tuned"])
@pytest.mark.parametrize(("case", "kw", "exc", "match"), BWD_ERRORS, ids=[e[0] for e in BWD_ERRORS])
def test_bwd_bad_arguments_name_the_argument(fn, case, kw, exc, match):
    args = dict(x=X, weight=torch.randn(40), dout=torch.randn_like(X), rstd=torch.ones(4))
    with pytest.raises(exc, match=match):
        getattr(R, fn)(**{**args, **kw})


# --------------------------------------------------------------------------------------------
# Autograd through rmsnorm and QuackRMSNorm, against torch autograd of a float64 reference
# --------------------------------------------------------------------------------------------


def _torch_rmsnorm64(x, w, b, res, eps, offset):
    xs = x.double() if res is None else x.double() + res.double()
    out = xs * torch.rsqrt(xs.square().mean(-1, keepdim=True) + eps)
    if w is not None:
        out = out * (w.double() + offset)
    return (out if b is None else out + b.double()), xs


AUTOGRAD_CASES = {
    "weight": dict(shape=(37, 72), w=(72,)),
    "everything": dict(shape=(2, 3, 40), w=(40,), b=True, res=True, prenorm=True, offset=0.5),
    "residual": dict(shape=(37, 40), w=(40,), res=True),
    "prenorm_no_residual": dict(shape=(1, 72), w=(72,), prenorm=True),
    "prenorm_res_dtype": dict(shape=(37, 40), w=(40,), prenorm=True, res_dtype=torch.bfloat16),
    "bias_only": dict(shape=(37, 40), b=True),
    "no_params": dict(shape=(5, 72)),
    "per_head": dict(shape=(4, 3, 40), w=(3, 40), b=True, offset=1.0),
    # db per head, summed by the autograd layer (rmsnorm_bwd only knows has_bias)
    "per_head_bias_only": dict(shape=(5, 3, 40), b=True, bshape=(3, 40)),
    "dout_bf16": dict(shape=(37, 72), w=(72,), b=True, res=True, out_dtype=torch.bfloat16),
    # dout wider than x: read as fp32 (dw, fp32, would miss the fp32 bound after a bf16 cast)
    "dout_fp32": dict(shape=(37, 72), w=(72,), dtype=torch.bfloat16, out_dtype=torch.float32),
    "only_weight_grad": dict(shape=(37, 40), w=(40,), b=True, grad=("w",)),
    "only_x_grad": dict(shape=(37, 40), w=(40,), res=True, prenorm=True, grad=("x",)),
}


@pytest.mark.parametrize("case", list(AUTOGRAD_CASES))
def test_rmsnorm_grads_match_torch_autograd(fake_kernel, case):
    c = AUTOGRAD_CASES[case]
    shape, grad, offset = c["shape"], c.get("grad", ("x", "w", "b", "res")), c.get("offset", 0.0)
    wshape = c.get("w")
    dtype = c.get("dtype", torch.float32)
    ins = {
        "x": torch.randn(shape, dtype=dtype),
        "w": None if wshape is None else torch.randn(wshape),
        "b": torch.randn(c.get("bshape") or wshape or shape[-1]) if c.get("b") else None,
        "res": torch.randn(shape, dtype=dtype) if c.get("res") else None,
    }
    for k, t in ins.items():
        if t is not None:
            t.requires_grad_(k in grad)
    ref_ins = {k: None if t is None else t.detach().clone().requires_grad_(t.requires_grad)
               for k, t in ins.items()}  # fmt: skip
    prenorm = c.get("prenorm", False)
    got = R.rmsnorm(
        ins["x"], ins["w"], ins["b"], ins["res"], out_dtype=c.get("out_dtype"),
        residual_dtype=c.get("res_dtype"), prenorm=prenorm, weight_offset=offset,
    )  # fmt: skip
    out, res_out = got if prenorm else (got, None)
    g = torch.randn(shape, dtype=out.dtype)  # dout: bf16 when out_dtype is
    loss = (out * g).sum()
    out64, res64 = _torch_rmsnorm64(*ref_ins.values(), 1e-6, offset)
    loss64 = (out64 * g.double()).sum()
    if prenorm:
        g2 = torch.randn(shape, dtype=res_out.dtype)
        loss, loss64 = loss + (res_out * g2).sum(), loss64 + (res64 * g2.double()).sum()
    loss.backward()
    loss64.backward()
    for k, t in ins.items():
        if t is None:
            continue
        if k not in grad:
            assert t.grad is None, k
            continue
        assert t.grad.dtype == t.dtype, k
        expected = ref_ins[k].grad.to(t.dtype)
        torch.testing.assert_close(t.grad, expected, **TOLERANCES[t.dtype], msg=k)


@pytest.mark.parametrize("dim", [72, (4, 10)])
def test_module_grads_match_nn_rmsnorm(fake_kernel, dim):
    ours, theirs = R.QuackRMSNorm(dim), torch.nn.RMSNorm(dim, eps=1e-6)
    with torch.no_grad():
        theirs.weight.normal_()
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(37, *([dim] if isinstance(dim, int) else dim), requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    g = torch.randn_like(x)
    (ours(x) * g).sum().backward()
    (theirs(x2) * g).sum().backward()
    torch.testing.assert_close(x.grad, x2.grad, **F32)
    torch.testing.assert_close(ours.weight.grad, theirs.weight.grad, **F32)


# --------------------------------------------------------------------------------------------
# torch.library: the fake implementation, the schema, opcheck, torch.compile
# --------------------------------------------------------------------------------------------


def test_bwd_fake_outputs_under_fake_tensor_mode():
    from torch._subclasses.fake_tensor import FakeTensorMode

    bf16, f16, f32 = torch.bfloat16, torch.float16, torch.float32
    with FakeTensorMode():
        x = torch.empty(2, 5, 3, 128, device="cuda", dtype=bf16)
        dout, rstd = torch.empty_like(x), torch.empty(2, 5, 3, device="cuda")
        wh, dres_out = torch.empty(3, 128, device="cuda"), torch.empty_like(x, dtype=f16)
        for name in ("rmsnorm_bwd", "rmsnorm_bwd_tuned"):
            op = getattr(torch.ops.quack_edu, name).default
            outs = op(x, wh, dout, rstd, dres_out, True, f16, 0.5)
            assert [(tuple(t.shape), t.dtype, t.device.type) for t in outs] == [
                (tuple(x.shape), bf16, "cuda"),
                ((3, 128), f32, "cuda"),
                ((3, 128), f32, "cuda"),
                (tuple(x.shape), f16, "cuda"),
            ]
            outs = op(x, None, dout, rstd, None, True, None, 0.0)
            assert [(tuple(t.shape), t.dtype) for t in outs] == [(x.shape, bf16), ((128,), f32)]
            assert len(op(x, None, dout, rstd, None, False, None, 0.0)) == 1
        # the public wrappers route through the op under a dispatch mode
        for fn in (R.rmsnorm_bwd, R.rmsnorm_bwd_tuned):
            dx, dw, db, dres = fn(x, wh, dout, rstd, has_residual=True)
            assert dres is dx and dx.dtype == bf16 and dw.shape == (3, 128) and db is None
            dx, dw, db, dres = fn(x, None, dout, rstd, dres_out, has_bias=True)
            assert dres.dtype == f16 and dw is None and db.dtype == f32


def test_bwd_op_schemas():
    for name in ("rmsnorm_bwd", "rmsnorm_bwd_tuned"):
        assert str(getattr(torch.ops.quack_edu, name).default._schema) == (
            f"quack_edu::{name}(Tensor x, Tensor? weight, Tensor dout, Tensor rstd, "
            "Tensor? dresidual_out, bool has_bias, ScalarType? dres_dtype, float weight_offset) "
            "-> Tensor[]"
        )


def test_bwd_opcheck(fake_kernel):
    x, w, dout, rstd = _inputs((37, 72), torch.bfloat16, 72)
    op = torch.ops.quack_edu.rmsnorm_bwd.default
    for args in [
        (x, None, dout, rstd, None, False, None, 0.0),
        (x, w, dout.float(), rstd, None, True, None, 0.5),
        (x, w, dout, rstd, torch.randn(37, 72), True, torch.float32, 0.0),
        (x.view(37, 2, 36), w.view(2, 36), dout.view(37, 2, 36), rstd_ref(x.view(37, 2, 36)),
         None, False, None, 1.0),
    ]:  # fmt: skip
        torch.library.opcheck(op, args)


def test_compile_fullgraph_backward_matches_eager(fake_kernel):
    torch._dynamo.reset()

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = R.QuackRMSNorm(40)
            self.proj = torch.nn.Linear(40, 40)

        def forward(self, x, res):
            out, res = R.rmsnorm(x, self.norm.weight, residual=res, prenorm=True)
            return self.norm(self.proj(out)), res

    model = Block()
    with torch.no_grad():
        model.norm.weight.normal_()

    def grads(fn):
        model.zero_grad()
        x, res = (
            torch.randn(3, 37, 40, generator=torch.Generator().manual_seed(i)) for i in (1, 2)
        )
        x.requires_grad_(), res.requires_grad_()
        out, res_out = fn(x, res)
        (out * out.detach().sin() + res_out.cos()).sum().backward()
        return [out, res_out, x.grad, res.grad, *(p.grad for p in model.parameters())]

    expected = grads(model)
    got = grads(torch.compile(model, fullgraph=True, backend="aot_eager"))
    for i, (g, e) in enumerate(zip(got, expected, strict=True)):
        torch.testing.assert_close(g, e, msg=f"tensor {i}")


# --------------------------------------------------------------------------------------------
# rmsnorm_bwd_ref: QuACK's meaning, on the project's fp32 reference
# --------------------------------------------------------------------------------------------


def test_rmsnorm_bwd_ref_semantics():
    x, w, dout, rstd = _inputs((37, 72), torch.bfloat16, 72, torch.float16)
    dx, dw = R.rmsnorm_bwd_ref(x, w, dout, rstd)
    assert (dx.dtype, dw.dtype) == (torch.bfloat16, torch.float16)
    gx, gw, _ = bwd_ref32(x, w, dout, rstd)
    assert torch.equal(dx, gx.to(torch.bfloat16)) and torch.equal(dw, gw.to(torch.float16))

    x, w, dout, rstd = _inputs((37, 40), torch.float32, 40)
    dx, dw = R.rmsnorm_bwd_ref(x, w, dout, rstd, eps=1e-2, weight_offset=1.0)  # eps unused
    gx, gw, _ = bwd_ref32(x, w, dout, rstd, weight_offset=1.0)
    assert torch.equal(dx, gx) and torch.equal(dw, gw)
    dx, dw = R.rmsnorm_bwd_ref(x, None, dout, rstd)
    assert dw is None and torch.equal(dx, bwd_ref32(x, None, dout, rstd)[0])
