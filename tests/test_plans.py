"""The library's host path on the CPU: launch plans, the module's residual form, and the compile
policy (which path a norm takes inside a compiled graph).

No kernel runs here: ``fake_kernel`` (tests/test_rmsnorm_api.py) replaces the kernels by the
fp32 reference and switches off the device check, so these tests see what the Python layer
caches, checks, passes and returns. tests/test_rmsnorm_gpu.py checks the same paths' values
with the real kernels.
"""

import importlib
import re

import pytest
import test_rmsnorm_api
import torch

from quack_edu.reference import rmsnorm_bwd_ref as bwd_ref32
from quack_edu.reference import rmsnorm_ref as ref32
from quack_edu.reference import rstd_ref

R = importlib.import_module("quack_edu.rmsnorm")
F = importlib.import_module("quack_edu.host.forward")
B = importlib.import_module("quack_edu.host.backward")
P = importlib.import_module("quack_edu.host.policy")
fake_kernel = test_rmsnorm_api.fake_kernel
BF16 = torch.bfloat16


@pytest.fixture
def counted_checks(monkeypatch):
    """How many times the argument checks ran (a plan's hit runs none)."""
    seen = {"fwd": 0, "bwd": 0}
    fwd, bwd = F.check_args, B.check_bwd_args

    def check_fwd(*a):
        seen["fwd"] += 1
        return fwd(*a)

    def check_bwd(*a):
        seen["bwd"] += 1
        return bwd(*a)

    for module in (F, P):  # where the checks are called
        monkeypatch.setattr(module, "check_args", check_fwd)
    monkeypatch.setattr(B, "check_bwd_args", check_bwd)
    return seen


# --------------------------------------------------------------------------------------------
# Forward plans
# --------------------------------------------------------------------------------------------


def test_one_forward_plan_per_key_shared_by_every_path(fake_kernel, counted_checks):
    torch.manual_seed(0)
    w = torch.randn(40, dtype=torch.float32)
    x = torch.randn(37, 40, dtype=BF16)
    first = R.rmsnorm_fwd(x, w)[0]
    assert torch.equal(first, ref32(x, w).to(BF16)) and len(F._FWD_PLANS) == 1
    counted_checks["fwd"] = 0
    launches = len(fake_kernel.calls)
    param = torch.nn.Parameter(w.clone())
    module = R.QuackRMSNorm(40, eps=1e-6)
    with torch.no_grad():
        module.weight.copy_(w)
    op = torch.ops.quack_edu.rmsnorm_fwd.default
    for shape in [(199, 40), (1, 40), (3, 5, 40)]:  # another M: the same key, rows viewed
        x = torch.randn(shape, dtype=BF16)
        want = ref32(x, w).to(BF16)
        out = R.rmsnorm_fwd(x, w)[0]
        assert torch.equal(out, want) and out.shape == shape
        assert torch.equal(R.rmsnorm_fwd(x, param)[0], want)  # a Parameter is a tensor
        with torch.no_grad():
            assert torch.equal(module(x), want)  # the module's inference call
        assert torch.equal(op(x, w, None, None, BF16, None, 1e-6, False, 0.0)[0], want)
        assert torch.equal(R.rmsnorm(x, w), want)
    assert len(F._FWD_PLANS) == 1
    assert counted_checks["fwd"] == 0  # every call above was a hit: no check ran again
    assert len(fake_kernel.calls) == launches + 15  # and each launched the kernel once
    empty = R.rmsnorm_fwd(torch.empty(0, 40, dtype=BF16), w)[0]
    assert empty.shape == (0, 40)


def test_module_call_takes_the_short_way_only_without_hooks(fake_kernel, counted_checks):
    """The module's inference call skips nn.Module's call only when that would do nothing:
    hooks (its own or global), autograd and a compiled module go the whole way."""
    torch.manual_seed(2)
    module = R.QuackRMSNorm(48)
    x = torch.randn(37, 48, dtype=BF16)
    want = ref32(x, module.weight.detach()).to(BF16)
    with torch.no_grad():
        assert torch.equal(module(x), want)  # the first call: checks, then the plan
    whole = []
    real = R._module_call
    R_call = lambda *a, **k: whole.append(1) or real(*a, **k)  # noqa: E731
    R._module_call, restore = R_call, real
    try:
        with torch.no_grad():
            counted_checks["fwd"] = 0
            assert torch.equal(module(x), want) and not whole  # the short way
            seen = []
            handle = module.register_forward_hook(lambda m, args, out: seen.append(out) or out * 2)
            assert torch.equal(module(x), want * 2) and seen and len(whole) == 1
            handle.remove()
            handle = module.register_forward_pre_hook(lambda m, args: (args[0] * 0,))
            assert torch.equal(module(x), torch.zeros_like(x)) and len(whole) == 2
            handle.remove()
            handle = torch.nn.modules.module.register_module_forward_hook(
                lambda m, args, out: out + 1
            )
            try:
                assert torch.equal(module(x), want + 1) and len(whole) == 3
            finally:
                handle.remove()
            assert torch.equal(module(x), want) and len(whole) == 3  # short again
            assert torch.equal(module(x=x), want) and len(whole) == 4  # a keyword: whole way
        assert counted_checks["fwd"] == 0  # every call above was the plan's
        y = module(x)  # autograd on, a first call with rstd saved: the whole way, and its plan
        assert y.requires_grad and len(whole) == 5
        y = module(x)  # then the short way, under autograd too
        assert len(whole) == 5 and type(y.grad_fn).__name__ == "_PlainRMSNormBackward"
        handle = module.register_forward_hook(lambda m, args, out: out * 2)
        try:
            assert torch.equal(module(x), want * 2) and len(whole) == 6
        finally:
            handle.remove()
    finally:
        R._module_call = restore
    with torch.no_grad():  # no weight: the plan does not know the module's N, the call checks it
        x = torch.randn(5, 48, dtype=BF16)
        assert torch.equal(R.QuackRMSNorm(48, elementwise_affine=False)(x), ref32(x, None).to(BF16))
        with pytest.raises(ValueError, match="expects x of shape"):
            R.QuackRMSNorm(40, elementwise_affine=False)(x)


def test_the_modules_plans_follow_its_weight(fake_kernel, counted_checks):
    """The module keeps the plans its inference calls used; a new weight, new weight data
    (``.data =``, ``.to``), another dtype or N of x, and copies of the module all get the
    right answer, and a copy (deepcopy, pickle) starts with no plans of its own."""
    import copy
    import pickle

    torch.manual_seed(3)
    module = R.QuackRMSNorm(48)
    with torch.no_grad():
        module.weight.copy_(torch.randn(48))
    x = torch.randn(37, 48, dtype=BF16)
    seen = []  # the calls whose plan the module kept

    def want(m, x):
        """The reference, once the plan the module keeps for x is checked to be the one its
        key names now (a fake kernel computes the right values with any plan)."""
        kept = m._plans.get((x.dtype, x.shape[-1], x.get_device(), x.data_ptr() & 15, False, None))
        if kept is not None:
            seen.append(1)
            key = F.fwd_key(x, m.weight, None, None, x.dtype, None, False, 0.0)
            assert kept[2] is F._FWD_PLANS[key]
        return ref32(x, m.weight.detach()).to(x.dtype)

    with torch.no_grad():
        assert torch.equal(module(x), want(module, x))  # the first call: checks, then a plan
        counted_checks["fwd"] = 0
        assert torch.equal(module(x), want(module, x)) and counted_checks["fwd"] == 0
        assert len(module._plans) == 1  # the module's own, from the second call
        module.weight.mul_(2)  # in place: the same weight, new values
        assert torch.equal(module(x), want(module, x)) and counted_checks["fwd"] == 0
        module.weight.data = torch.randn(48)  # new storage under the same Parameter
        assert torch.equal(module(x), want(module, x))
        module.weight = torch.nn.Parameter(torch.randn(48, dtype=BF16))  # another weight
        assert torch.equal(module(x), want(module, x)) and not module._plans  # the old's gone
        assert torch.equal(module(x), want(module, x)) and len(module._plans) == 1
        module.to(torch.float16)  # .to: new weight data, another dtype
        assert torch.equal(module(x), want(module, x))
        assert torch.equal(module(x), want(module, x))
        x16 = x.to(torch.float16)
        assert torch.equal(module(x16), want(module, x16))
        with pytest.raises(ValueError, match="expects x of shape"):
            module(torch.randn(5, 40, dtype=BF16))  # another N never takes a plan
        assert len(seen) >= 5  # the kept plans were checked
        for other in (copy.deepcopy(module), pickle.loads(pickle.dumps(module))):
            assert other._plans == {}
            other.weight.add_(1)
            assert torch.equal(other(x16), want(other, x16))
            assert not torch.equal(other(x16), module(x16))


def test_every_feature_is_its_own_plan_and_right(fake_kernel):
    torch.manual_seed(1)
    x = torch.randn(3, 7, 2, 48, dtype=BF16)
    res = torch.randn_like(x, dtype=torch.float16)
    w, b = torch.randn(48, dtype=BF16), torch.randn(48)
    wh = torch.randn(2, 48)
    calls = [
        lambda x, r: R.rmsnorm_fwd(x, w, b, r, store_rstd=True),
        lambda x, r: R.rmsnorm_fwd(x, w, residual=r, out_dtype=torch.float32),
        lambda x, r: R.rmsnorm_fwd(x, wh, weight_offset=1.0, residual_dtype=torch.float32),
        lambda x, r: R.rmsnorm_fwd(x, None, b, eps=1e-5),
    ]
    for round_ in range(2):  # the second round through the plans the first made
        for k, call in enumerate(calls):
            xr = x if round_ == 0 else x[:2]
            rr = res if round_ == 0 else res[:2]
            got = call(xr, rr)
            if k == 0:
                want, h = ref32(xr, w, b, rr)
                assert torch.equal(got[0], want.to(BF16)) and torch.equal(got[1], h.half())
                torch.testing.assert_close(got[2], rstd_ref(h))
            elif k == 1:
                assert got[0].dtype == torch.float32 and got[2] is None
                assert torch.equal(got[0], ref32(xr, w, None, rr)[0])
            elif k == 2:
                assert torch.equal(got[0], ref32(xr, wh, weight_offset=1.0).to(BF16))
                assert got[1].dtype == torch.float32 and torch.equal(got[1], xr.float())
            else:
                assert torch.equal(got[0], ref32(xr, None, b, eps=1e-5).to(BF16))
                assert got[1] is xr
        assert len(F._FWD_PLANS) == len(calls)


def test_a_plan_does_not_skip_what_its_key_cannot_hold(fake_kernel):
    w = torch.randn(40)
    x = torch.randn(8, 40, dtype=BF16)
    R.rmsnorm_fwd(x, w, residual=torch.randn(8, 40))
    R.rmsnorm_fwd(x, w)
    assert len(F._FWD_PLANS) == 2
    with pytest.raises(ValueError, match="residual must have x's shape"):
        R.rmsnorm_fwd(x, w, residual=torch.randn(4, 40))
    with pytest.raises(ValueError, match=r"weight must have shape \(41,\)"):
        R.rmsnorm_fwd(torch.randn(8, 41, dtype=BF16), w)
    with pytest.raises(TypeError, match="eps must be a real number"):
        R.rmsnorm_fwd(x, w, eps="1e-6")
    with pytest.raises(TypeError, match="out_dtype must be None or one of"):
        R.rmsnorm_fwd(x, w, out_dtype=torch.int8)
    # a strided x has no plan: checked and copied every call, still right
    xt = torch.randn(40, 8, dtype=BF16).t()
    assert torch.equal(R.rmsnorm(xt, w), ref32(xt, w).to(BF16))
    assert len(F._FWD_PLANS) == 2


# --------------------------------------------------------------------------------------------
# Backward plans
# --------------------------------------------------------------------------------------------


def _bwd_inputs(M, N, dtype=BF16, wdtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, N, generator=g).to(dtype)
    return x, torch.randn(N, generator=g).to(wdtype), torch.randn(M, N, generator=g).to(dtype)


@pytest.mark.parametrize("has_bias", [False, True])
def test_one_backward_plan_per_key(fake_kernel, counted_checks, has_bias):
    for k, M in enumerate([37, 199, 1, 8]):  # P = 3, 3, 1, 2 partial rows (fake: 4 rows a CTA)
        x, w, dout = _bwd_inputs(M, 48, seed=k)
        rstd = rstd_ref(x)
        dx, dw, db, dres = R.rmsnorm_bwd(x, w, dout, rstd, has_bias=has_bias)
        ex, ew, eb = bwd_ref32(x, w, dout, rstd, has_bias=has_bias)
        assert torch.equal(dx, ex.to(BF16)) and dres is None
        torch.testing.assert_close(dw, ew)
        assert (db is None) != has_bias
        if has_bias:
            torch.testing.assert_close(db, eb)
        if k == 0:
            counted_checks["bwd"] = 0
    assert len(B._BWD_PLANS) == 1 and counted_checks["bwd"] == 0
    # dresidual_out of its own dtype: another key, dresidual its own tensor
    x, w, dout = _bwd_inputs(37, 48)
    dro = torch.randn(37, 48)
    dx, dw, _, dres = R.rmsnorm_bwd(x, w, dout, rstd_ref(x), dro, has_bias, True)
    ex = bwd_ref32(x, w, dout, rstd_ref(x), dro)[0]
    assert dres.dtype == torch.float32 and torch.equal(dres, ex)
    assert len(B._BWD_PLANS) == 2
    with pytest.raises(ValueError, match="rstd must be float32 of shape"):
        R.rmsnorm_bwd(x, w, dout, rstd_ref(x)[:5])


@pytest.mark.parametrize("wdtype", [torch.float32, BF16])
def test_one_partial_row_is_dw_itself(fake_kernel, wdtype):
    """With one partial row (M up to a CTA's rows) and an fp32 weight, the kernel's row is dw
    (and db): no PartialSum launch; a bf16 weight's is summed (cast) as ever. dw is a tensor of
    its own (N,), not a view of the partial buffer, on every path."""
    sums = []
    fb = B._final_bwd()
    fn = fb.partial_sum_fn

    def counted(dtype, P):  # the compiled sum's call, counted
        call = fn(dtype, P)
        return lambda partial, out: (sums.append(partial.shape[0]), call(partial, out))[1]

    fb.partial_sum_fn = counted
    norm = R.QuackRMSNorm(48, dtype=wdtype)
    for M, P in [(4, 1), (1, 1), (5, 2), (3, 1)]:
        x, w, dout = _bwd_inputs(M, 48, BF16, wdtype, seed=M)
        rstd = rstd_ref(x)
        ex, ew, eb = bwd_ref32(x, w, dout, rstd, has_bias=True)
        for _ in range(2):  # a first call, then its plan
            sums.clear()
            dx, dw, db, _ = R.rmsnorm_bwd(x, w, dout, rstd, has_bias=True)
            torch.testing.assert_close(dw, ew.to(wdtype))
            torch.testing.assert_close(db, eb.to(wdtype))
            for g in (dw, db):
                assert g._base is None and g.shape == (48,) and g.dtype == wdtype
        assert sums == ([] if P == 1 and wdtype == torch.float32 else [P, P])
        with torch.no_grad():
            norm.weight.copy_(w)
        norm.weight.grad = None
        xg = x.detach().requires_grad_()
        for _ in range(2):  # the plain training call's plans
            sums.clear()
            norm.weight.grad = xg.grad = None
            norm(xg).backward(dout)
        torch.testing.assert_close(xg.grad, ex.to(BF16))
        torch.testing.assert_close(norm.weight.grad, ew.to(wdtype))
        assert norm.weight.grad._base is None
        assert sums == ([] if P == 1 and wdtype == torch.float32 else [P])


def test_training_through_plans_matches_nn_rmsnorm(fake_kernel, counted_checks):
    torch.manual_seed(2)
    ours, theirs = R.QuackRMSNorm(64), torch.nn.RMSNorm(64, eps=1e-6)
    with torch.no_grad():
        theirs.weight.normal_()
    ours.load_state_dict(theirs.state_dict())
    for step in range(3):
        x = torch.randn(5, 9, 64, requires_grad=True)
        dy = torch.randn(5, 9, 64)
        for m in (ours, theirs):
            m.zero_grad()
        (ours(x) * dy).sum().backward()
        gx = x.grad.clone()
        x.grad = None
        (theirs(x) * dy).sum().backward()
        torch.testing.assert_close(gx, x.grad)
        torch.testing.assert_close(ours.weight.grad, theirs.weight.grad)
        if step == 0:
            counted_checks.update(fwd=0, bwd=0)
    assert len(F._FWD_PLANS) == 1 and len(B._BWD_PLANS) == 1
    assert counted_checks == {"fwd": 0, "bwd": 0}


def test_the_plain_training_call_goes_through_its_plans(fake_kernel, counted_checks):
    """``norm(x)`` and ``rmsnorm(x, w)`` under autograd, once their plans exist, are
    ``_PlainRMSNorm``: the forward's plan keeps the backward's; every gradient asked for (x's,
    the weight's, either alone, no weight) is nn.RMSNorm's, for gradients of any layout (the
    expanded one of a sum, one at a misaligned address: the checked way) and empty batches."""
    torch.manual_seed(4)
    ours, theirs = R.QuackRMSNorm(64), torch.nn.RMSNorm(64, eps=1e-6)
    bare = R.QuackRMSNorm(64, elementwise_affine=False)
    with torch.no_grad():
        theirs.weight.normal_()
    ours.load_state_dict(theirs.state_dict())

    def grads(norm, x, dy, x_grad=True, w_grad=True):
        x = x.detach().requires_grad_(x_grad)
        w = getattr(norm, "weight", None)
        if w is not None:
            w.requires_grad_(w_grad)
            w.grad = None
        y = norm(x)
        y.backward(dy) if dy is not None else y.sum().backward()
        return type(y.grad_fn).__name__, x.grad, None if w is None else w.grad

    class Functional:  # rmsnorm(x, w), with the weight where grads() looks for it
        weight = ours.weight

        def __call__(self, x):
            return R.rmsnorm(x, self.weight)

    functional = Functional()

    for shape in [(5, 9, 64), (64,), (1, 64)]:
        x = torch.randn(shape)
        dy = torch.randn(shape)
        late = torch.randn(x.numel() + 1)[1:].view(shape)  # a gradient 4 bytes off 16
        for norm in (ours, bare, functional):
            ref = theirs if norm is not bare else torch.nn.RMSNorm(64, 1e-6, False)
            for dout in (dy, None, late):
                for x_grad, w_grad in [(True, True), (True, False), (False, True)]:
                    if norm is bare and not x_grad:
                        continue
                    for _ in range(3):  # plans made, the backward's found by the forward's, used
                        got = grads(norm, x, dout, x_grad, w_grad)
                    assert got[0] == "_PlainRMSNormBackward"
                    want = grads(ref, x, dout, x_grad, w_grad)
                    for g, w in zip(got[1:], want[1:], strict=True):
                        assert (g is None) == (w is None)
                        if g is not None:
                            torch.testing.assert_close(g, w)
    counted_checks.update(fwd=0, bwd=0)
    for norm in (ours, bare, functional):
        grads(norm, torch.randn(5, 9, 64), torch.randn(5, 9, 64))
    assert counted_checks == {"fwd": 0, "bwd": 0}
    plans = [p for p in F._FWD_PLANS.values() if p.store_rstd]
    assert len(plans) == 2 and all(p.bwd is not None for p in plans)  # with a weight, without
    x = torch.empty(0, 3, 64, requires_grad=True)  # no rows: nothing launched, zero dw
    ours.weight.grad = None
    ours(x).sum().backward()
    assert x.grad.shape == x.shape and torch.equal(ours.weight.grad, torch.zeros(64))


# --------------------------------------------------------------------------------------------
# The module's residual form
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dim", [64, (2, 32)])
def test_module_residual_form_is_add_then_norm(fake_kernel, dim):
    torch.manual_seed(3)
    ours, theirs = R.QuackRMSNorm(dim), torch.nn.RMSNorm(dim, eps=1e-6)
    with torch.no_grad():
        theirs.weight.normal_()
    ours.load_state_dict(theirs.state_dict())
    shape = (3, 7, *((dim,) if isinstance(dim, int) else dim))
    x = torch.randn(shape, dtype=BF16, requires_grad=True)
    res = torch.randn(shape, requires_grad=True)
    out, res_out = ours(x, res)
    h = x + res  # what a model writes without the fused form: fp32, as x + res promotes
    want = theirs(h)
    assert out.dtype == res_out.dtype == torch.float32
    torch.testing.assert_close(res_out, h)
    torch.testing.assert_close(out, want)
    dy, dh = torch.randn_like(want), torch.randn_like(want)
    grads = torch.autograd.grad((out * dy).sum() + (res_out * dh).sum(), (x, res, ours.weight))
    want_g = torch.autograd.grad((want * dy).sum() + (h * dh).sum(), (x, res, theirs.weight))
    for g, e in zip(grads, want_g, strict=True):
        torch.testing.assert_close(g.float(), e.float(), rtol=2e-2, atol=2e-2)
    with pytest.raises(ValueError, match="residual must be a tensor of x's shape"):
        ours(x, res[:1])


@pytest.mark.parametrize("x_dtype,res_dtype", [(BF16, torch.float32), (torch.float32,) * 2,
                                               (BF16, BF16)])  # fmt: skip
def test_the_prenorm_training_call_goes_through_its_plans(fake_kernel, counted_checks, x_dtype,
                                                          res_dtype):  # fmt: skip
    """``norm(x, residual)`` under autograd (and without), once its plans exist, is
    ``_PrenormRMSNorm``: out and residual_out are add-then-nn.RMSNorm's, and every gradient
    asked for (x's, the residual's, the weight's, any alone) is theirs, for gradients of any
    layout (the expanded one of a sum, one at a misaligned address: the checked way), with
    residual_out's gradient or without it (zeros), ragged rows and one row."""
    torch.manual_seed(5)
    ours, theirs = R.QuackRMSNorm(40), torch.nn.RMSNorm(40, eps=1e-6)
    with torch.no_grad():
        theirs.weight.normal_()
    ours.load_state_dict(theirs.state_dict())
    tol = {"rtol": 2e-2, "atol": 2e-2} if BF16 in (x_dtype, res_dtype) else {}

    def run(norm, x, r, dy, dh, grads):
        x, r = x.detach().requires_grad_(grads[0]), r.detach().requires_grad_(grads[1])
        norm.weight.requires_grad_(grads[2])
        norm.weight.grad = None
        if norm is ours:
            out, res = ours(x, r)
        else:
            res = x + r
            out = theirs(res)
        loss = (out.float() * dy).sum() if dy is not None else out.float().sum()
        if dh is not None:
            loss = loss + (res.float() * dh).sum()
        loss.backward()
        return type(out.grad_fn).__name__, out, res, x.grad, r.grad, norm.weight.grad

    for shape in [(5, 9, 40), (1, 40), (37, 40)]:
        x, r = torch.randn(shape, dtype=x_dtype), torch.randn(shape, dtype=res_dtype)
        late = torch.randn(x.numel() + 1)[1:].view(shape)  # 4 bytes off 16
        for dy, dh in [(torch.randn(shape), torch.randn(shape)), (None, None), (late, late),
                       (torch.randn(shape), None)]:  # fmt: skip
            for grads in [(True, True, True), (True, False, False), (False, True, False),
                          (False, False, True)]:  # fmt: skip
                for _ in range(3):  # plans made, the backward's found by the forward's, used
                    got = run(ours, x, r, dy, dh, grads)
                assert got[0] == "_PrenormRMSNormBackward"
                want = run(theirs, x, r, dy, dh, grads)
                for g, w in zip(got[1:], want[1:], strict=True):
                    assert (g is None) == (w is None)
                    if g is not None:
                        assert g.dtype == w.dtype and g.shape == w.shape
                        torch.testing.assert_close(g, w, **tol)
        with torch.no_grad():  # inference: the plan without rstd
            for _ in range(2):
                out, res = ours(x, r)
            torch.testing.assert_close(res, x + r)
            torch.testing.assert_close(out, theirs(x + r), **tol)
    counted_checks.update(fwd=0, bwd=0)
    x = torch.randn(5, 9, 40, dtype=x_dtype, requires_grad=True)
    out, res = ours(x, torch.randn(5, 9, 40, dtype=res_dtype, requires_grad=True))
    (out.sum() + res.sum()).backward()
    assert counted_checks == {"fwd": 0, "bwd": 0}
    plans = [p for p in F._FWD_PLANS.values() if p.store_rstd and p.res_out_dtype is not None]
    assert plans and all(p.bwd is not None for p in plans)
    with pytest.raises(ValueError, match="residual must be a tensor of x's shape"):
        ours(x, res[:1])  # (not the short way)


# --------------------------------------------------------------------------------------------
# The compile policy: which path a norm takes in the compiled graph
# --------------------------------------------------------------------------------------------


def test_policy_rule_and_its_errors():
    P = R.CompilePolicy
    big = torch.empty(4096, 32768, device="meta")
    assert P().path(big) == "kernel"  # long rows: the kernels
    assert P().path(torch.empty(4096, 4096, device="meta")) == "inductor"  # a hidden size
    qk = torch.empty(8192, 16, 128, device="meta")  # a QK-norm's heads
    assert P().path(qk) == "inductor"  # (inference)
    assert P().path(qk, grad=True) == "kernel"  # (a training step)
    assert P(grad_kernel_max_n=64).path(qk, grad=True) == "inductor"
    assert P().path(torch.empty(4096, 4096, device="meta"), grad=True) == "inductor"
    assert P().path(torch.empty(8, 16, 128, device="meta"), grad=True) == "inductor"  # small
    assert P().path(torch.empty(32, 65536, device="meta")) == "kernel"
    assert P(inductor_max_n=256).path(torch.empty(16, 4096, device="meta")) == "inductor"
    assert P(inductor_max_n=256).path(torch.empty(4096, 4096, device="meta")) == "kernel"
    assert P("kernel").path(torch.empty(1, 128, device="meta")) == "kernel"
    assert P("inductor").path(big) == "inductor"
    assert P(inductor_max_elems=0, inductor_max_n=0).path(torch.empty(1, 8, device="meta")) == (
        "kernel"
    )
    with pytest.raises(ValueError, match="'auto', 'kernel' or 'inductor'"):
        P("triton")
    with pytest.raises(ValueError, match="inductor_max_n must be an int"):
        P(inductor_max_n=-1)
    with pytest.raises(ValueError, match="grad_kernel_max_n must be an int"):
        P(grad_kernel_max_n=1.5)
    old = R.set_compile_policy("kernel", inductor_max_n=8, grad_kernel_max_n=0)
    try:
        assert R.compile_policy() == P("kernel", 8, old.inductor_max_elems, 0)
    finally:
        R.set_compile_policy(old.mode, inductor_max_n=old.inductor_max_n,
                             grad_kernel_max_n=old.grad_kernel_max_n)  # fmt: skip
    assert R.compile_policy() == old


def test_policy_from_the_environment(monkeypatch):
    monkeypatch.setenv("QUACK_EDU_COMPILE_POLICY", "Inductor")
    monkeypatch.setenv("QUACK_EDU_INDUCTOR_MAX_N", "512")
    assert P._policy_from_env() == R.CompilePolicy("inductor", 512)
    monkeypatch.setenv("QUACK_EDU_GRAD_KERNEL_MAX_N", "64")
    assert P._policy_from_env() == R.CompilePolicy("inductor", 512, grad_kernel_max_n=64)
    monkeypatch.setenv("QUACK_EDU_INDUCTOR_MAX_N", "lots")
    with pytest.raises(ValueError, match="QUACK_EDU_INDUCTOR_MAX"):
        P._policy_from_env()


class _Block(torch.nn.Module):
    """A pre-norm block as the model benchmark's: a QK-norm on (B, S, H, D) heads, a hidden
    norm in the residual form, a final norm."""

    def __init__(self, hidden=320, heads=2, head_dim=32):
        super().__init__()
        self.heads, self.head_dim = heads, head_dim
        self.norm1 = R.QuackRMSNorm(hidden)
        self.q = torch.nn.Linear(hidden, heads * head_dim)
        self.q_norm = R.QuackRMSNorm(head_dim)
        self.o = torch.nn.Linear(heads * head_dim, hidden)
        self.norm2 = R.QuackRMSNorm(hidden)

    def forward(self, x, residual):
        h, residual = self.norm1(x, residual)
        q = self.q(h).view(*h.shape[:-1], self.heads, self.head_dim)
        q = self.q_norm(q).flatten(-2)
        return self.norm2(self.o(q), residual)


def _graphs_of(model, *args, train):
    """The forward (and backward) graphs AOT autograd hands to the compiler."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    graphs = []

    def keep(gm, _):
        graphs.append(str(gm.graph))
        return make_boxed_func(gm.forward)

    torch._dynamo.reset()
    compiled = torch.compile(
        model, fullgraph=True, backend=aot_autograd(fw_compiler=keep, bw_compiler=keep)
    )
    with torch.set_grad_enabled(train):
        out, res = compiled(*args)
    if train:
        (out.float().sum() + res.float().sum()).backward()
    return graphs, (out, res)


@pytest.mark.parametrize(
    ("mode", "max_n", "grad_max_n", "fwd_ops"),
    [
        ("kernel", 32, 0, 3),
        ("inductor", 32, 32, 0),
        ("auto", 32, 0, 2),  # the QK-norm (N = 32) to inductor, the hidden norms (320) not
        ("auto", 320, 32, 1),  # as the defaults do in a model: the QK-norm on the kernels
    ],
)
def test_compiled_graph_says_which_path_each_norm_took(fake_kernel, mode, max_n, grad_max_n,
                                                       fwd_ops):  # fmt: skip
    torch.manual_seed(4)
    model = _Block()
    x, res = torch.randn(2, 8, 320, dtype=BF16), torch.randn(2, 8, 320)
    with torch.no_grad():
        want = model(x, res)
    old = R.set_compile_policy(
        mode, inductor_max_n=max_n, inductor_max_elems=500, grad_kernel_max_n=grad_max_n
    )
    try:
        graphs, got = _graphs_of(model, x, res, train=True)
        (inference,), _ = _graphs_of(model, x, res, train=False)
    finally:
        R.set_compile_policy(old.mode, inductor_max_n=old.inductor_max_n,
                             inductor_max_elems=old.inductor_max_elems,
                             grad_kernel_max_n=old.grad_kernel_max_n)  # fmt: skip
        torch._dynamo.reset()
    fwd, bwd = graphs
    assert fwd.count("quack_edu.rmsnorm_fwd.default") == fwd_ops
    assert bwd.count("quack_edu.rmsnorm_bwd.default") == fwd_ops
    # traced without a gradient, only the rows longer than inductor_max_n take the kernels
    assert inference.count("quack_edu.rmsnorm_fwd.default") == {"kernel": 3, "inductor": 0}.get(
        mode, 2 * (max_n < 320)
    )
    for g, e in zip(got, want, strict=True):
        torch.testing.assert_close(g.float(), e.float(), rtol=2e-2, atol=2e-2)


class _TorchBlock(_Block):
    """``_Block`` as its nn.RMSNorm twin: the same parameters, add-then-norm."""

    def __init__(self, hidden=320, heads=2, head_dim=32):
        super().__init__(hidden, heads, head_dim)
        for name, dim in (("norm1", hidden), ("q_norm", head_dim), ("norm2", hidden)):
            setattr(self, name, torch.nn.RMSNorm(dim, eps=1e-6))

    def forward(self, x, residual):
        residual = x + residual
        h = self.norm1(residual)
        q = self.q(h).view(*h.shape[:-1], self.heads, self.head_dim)
        q = self.q_norm(q).flatten(-2)
        residual = self.o(q) + residual
        return self.norm2(residual), residual


def _ops(graph: str) -> list[str]:
    return re.findall(r"call_function\[target=([^\]]+)\]", graph)


def test_a_norm_handed_to_inductor_compiles_to_nn_rmsnorms_graph():
    """Under the inductor path the compiled forward and backward are nn.RMSNorm's, op for op
    (so inductor makes the same kernels of them), and the values bitwise the same."""
    torch.manual_seed(5)
    ours, theirs = _Block(), _TorchBlock()
    theirs.load_state_dict(ours.state_dict())
    x, res = torch.randn(2, 8, 320, dtype=BF16), torch.randn(2, 8, 320)
    old = R.set_compile_policy("inductor")
    try:
        got = [_graphs_of(model, x, res, train=True) for model in (ours, theirs)]
    finally:
        R.set_compile_policy(old.mode, inductor_max_n=old.inductor_max_n,
                             inductor_max_elems=old.inductor_max_elems)  # fmt: skip
        torch._dynamo.reset()
    (our_graphs, our_out), (their_graphs, their_out) = got
    assert len(our_graphs) == len(their_graphs) == 2
    for a, b in zip(our_graphs, their_graphs, strict=True):
        assert _ops(a) == _ops(b)
    assert "aten.rsqrt" in " ".join(_ops(our_graphs[0]))  # the norms are in the graph
    for a, b in zip(our_out, their_out, strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b)
    for (name, p), q in zip(ours.named_parameters(), theirs.parameters(), strict=True):
        assert torch.equal(p.grad, q.grad), name


def test_keys_name_their_facts():
    """One builder a key, its facts by name: the plain call's key is the full key of that call
    (so every path finds the plans every other path makes), misaligned pointers, per-head
    weights and strided rows are facts of it, and what cannot have a plan has no key."""
    x, w = torch.randn(8, 64, dtype=BF16), torch.randn(64)
    key = F.fwd_key(x, w, None, None, BF16, None, False, 0.0)
    assert isinstance(key, tuple) and key._fields[:2] == ("x_dtype", "N")
    assert (key.N, key.heads, key.weight, key.align, key.strided) == (
        64,
        0,
        (w.dtype, w.shape, -1),
        0,
        None,
    )
    assert F.fwd_key(x, torch.nn.Parameter(w), None, None, BF16, None, False, 0.0) == key
    late = torch.randn(5 * 48 + 1)[1:].view(5, 48)  # 4 bytes past 16
    assert F.fwd_key(late, None, None, None, late.dtype, None, False, 0.0).align == 4
    heads = F.fwd_key(torch.randn(3, 2, 64), torch.randn(2, 64), None, None, torch.float32,
                      None, True, 0.0)  # fmt: skip
    assert heads.heads == 2 and heads.store_rstd
    q = torch.randn(2, 4, 3 * 8 * 64).view(2, 4, 3, 8, 64).unbind(2)[0]  # rows read in place
    assert F.fwd_key(q, w, None, None, q.dtype, None, False, 0.0).strided == (q.shape, q.stride())
    assert F.fwd_key(torch.randn(64, 8).t(), None, None, None, BF16, None, False, 0.0) is None
    x, w, dout = _bwd_inputs(8, 64)
    rstd = rstd_ref(x)
    key = B.bwd_key(x, w, dout, rstd, None, False, None, 0.0)
    assert (key.N, key.weight, key.dout, key.strided) == (64, (w.dtype, 64, -1), (BF16, -1), None)
    assert B.bwd_key(x, torch.nn.Parameter(w), dout, rstd, None, False, None, 0.0) == key
    sliced = B.bwd_key(x[:, :32], w[:32], dout[:, :32], rstd, None, False, None, 0.0)
    assert sliced.strided == (x[:, :32].shape, (64, 1), (64, 1), (1,))  # rows read in place
    xt = x.t().contiguous().t()  # columns of unit stride: no rows to read in place
    assert B.bwd_key(xt, w, dout, rstd, None, False, None, 0.0) is None


def test_tuned_entries_have_a_plan_per_power_of_two_of_rows(fake_kernel, monkeypatch):
    tuned = []

    def tune(x, *args):
        tuned.append(x.shape[0])
        return None  # the heuristic's config

    monkeypatch.setattr(F, "_tuned_config", tune)
    w = torch.randn(40)
    for M in (37, 50, 199, 37):  # 37 and 50 share 64 rows' plan; 199 has 256's
        x = torch.randn(M, 40, dtype=BF16)
        assert torch.equal(R.rmsnorm_fwd_tuned(x, w)[0], ref32(x, w).to(BF16))
    assert tuned == [37, 199] and len(F._FWD_PLANS) == 2


def test_backward_features_of_a_call():
    fb = pytest.importorskip("quack_edu.stages.final_bwd")
    x, w, dout = _bwd_inputs(4, 64)
    f = fb.features_for(x, w, dout.float(), x.half(), torch.float32, True, 1.0)
    assert f == fb.BwdFeatures(
        weight=True, dout_dtype=torch.float32, dres_out_dtype=torch.float16, dw=True, db=True,
        weight_offset=1.0, dres_dtype=torch.float32,
    )  # fmt: skip
    plain = fb.features_for(x, None, dout, None, None, False)
    assert plain == fb.BwdFeatures(weight=False, dw=False, db=False)


def test_host_cost_says_it_needs_a_gpu(capsys):
    from quack_edu.tools import host_cost

    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the tool would run")
    assert host_cost.main([]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
