"""The fp32 reference is itself checked against autograd in float64 on fresh random inputs."""

import pytest
import torch

from quack_edu.reference import TOLERANCES, assert_close, rmsnorm_bwd_ref, rmsnorm_ref, rstd_ref


def _rand(*shape, dtype=torch.float64, seed=None):
    g = torch.Generator().manual_seed(seed if seed is not None else torch.seed() % 2**31)
    return torch.randn(*shape, generator=g, dtype=dtype)


@pytest.mark.parametrize("M,N", [(1, 7), (37, 760), (199, 100)])
def test_forward_matches_definition(M, N):
    x, w, b = _rand(M, N), _rand(N), _rand(N)
    expect = x / torch.sqrt((x * x).sum(-1, keepdim=True) / N + 1e-6) * w + b
    got = rmsnorm_ref(x, w, b, eps=1e-6, compute_dtype=torch.float64)
    torch.testing.assert_close(got, expect)
    # against torch's own RMSNorm too
    torch.testing.assert_close(
        rmsnorm_ref(x, w, compute_dtype=torch.float64),
        torch.nn.functional.rms_norm(x, (N,), w, 1e-6),
    )


def test_residual_is_added_before_the_norm():
    x, r, w = _rand(37, 64), _rand(37, 64), _rand(64)
    out, res_out = rmsnorm_ref(x, w, residual=r, compute_dtype=torch.float64)
    torch.testing.assert_close(res_out, x + r)
    torch.testing.assert_close(out, rmsnorm_ref(x + r, w, compute_dtype=torch.float64))


@pytest.mark.parametrize("with_bias,with_residual", [(False, False), (True, False), (True, True)])
def test_backward_matches_autograd(with_bias, with_residual):
    M, N = 37, 200
    x = _rand(M, N).requires_grad_()
    w = _rand(N).requires_grad_()
    b = _rand(N).requires_grad_() if with_bias else None
    r = _rand(M, N).requires_grad_() if with_residual else None
    res = rmsnorm_ref(x, w, b, residual=r, compute_dtype=torch.float64)
    out, res_out = res if with_residual else (res, None)
    dout = _rand(M, N)
    dres = _rand(M, N) if with_residual else None
    loss = (out * dout).sum() + ((res_out * dres).sum() if with_residual else 0)
    loss.backward()

    h = (x + r if with_residual else x).detach()
    dx, dw, db = rmsnorm_bwd_ref(
        h,
        w.detach(),
        dout,
        rstd_ref(h, compute_dtype=torch.float64),
        dresidual_out=dres,
        has_bias=with_bias,
        compute_dtype=torch.float64,
    )
    torch.testing.assert_close(dx, x.grad)
    torch.testing.assert_close(dw, w.grad)
    if with_bias:
        torch.testing.assert_close(db, b.grad)
    else:
        assert db is None
    if with_residual:
        torch.testing.assert_close(dx, r.grad)


def test_low_precision_inputs_are_upcast():
    x = _rand(4, 256, dtype=torch.float32).bfloat16()
    out = rmsnorm_ref(x)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, rmsnorm_ref(x.double(), compute_dtype=torch.float64).float())


def test_assert_close_rejects_unwritten_and_wrong_outputs():
    ref = _rand(8, 16, dtype=torch.float32)
    poisoned = ref.clone()
    poisoned[3, 5] = float("nan")
    with pytest.raises(AssertionError, match="not finite"):
        assert_close(poisoned, ref, torch.float32)
    with pytest.raises(AssertionError):
        assert_close(ref * 1.05, ref, torch.bfloat16)  # 5% off fails even the bf16 bound
    assert_close(ref.bfloat16(), ref, torch.bfloat16)  # rounding to bf16 passes it
    assert set(TOLERANCES) == {torch.float32, torch.float16, torch.bfloat16}
