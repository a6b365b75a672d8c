"""Rows read in place (issue 47): a view of a fused projection's heads is normalised without a
copy, forward and backward, its rows in one or two modes (``quack_edu.host.rows``).

The layout finder is checked on its own; the library's path through it with the kernels
replaced by the fp32 reference (``fake_kernel``, as in tests/test_rmsnorm_api.py): what the
kernel is handed (a view of the caller's memory, in the rank the kernel takes), the values
against the reference, gradients through autograd, and the launch plan a strided call makes.
The kernels' own values on such rows: tests/test_rmsnorm_gpu.py.
"""

import importlib

import pytest
import torch
from test_rmsnorm_api import fake_kernel  # noqa: F401  (the fixture)
from torch._prims_common import is_non_overlapping_and_dense_or_false as is_dense

from quack_edu.host.rows import layout
from quack_edu.reference import rmsnorm_ref as ref32

R = importlib.import_module("quack_edu.rmsnorm")
F = importlib.import_module("quack_edu.host.forward")
B = importlib.import_module("quack_edu.host.backward")

B_, S, H, D = 2, 5, 4, 8


def unbind_view(dtype=torch.float32, requires_grad=False):
    """q and k of a fused projection: (B, S, H, D) views whose rows are not evenly strided."""
    qkv = torch.randn(B_, S, 3 * H * D, dtype=dtype, requires_grad=requires_grad)
    q, k, _ = qkv.view(B_, S, 3, H, D).unbind(2)
    return qkv, q, k


def same_memory(a, b) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


VIEWS = {
    # name: (make x of a dtype, the rows the kernel is handed)
    "unbind": (lambda dt: unbind_view(dt)[1], (B_ * S, H, D)),
    "transposed heads": (
        lambda dt: torch.randn(B_, S, H, D, dtype=dt).transpose(1, 2),
        (B_ * S * H, D),
    ),
    "unbind, transposed": (lambda dt: unbind_view(dt)[2].transpose(1, 2), (B_ * S, H, D)),
    "sliced last dim": (lambda dt: torch.randn(3, S, 96, dtype=dt)[:, :, :64], (3 * S, 64)),
    "every other batch": (lambda dt: torch.randn(6, 7, D, dtype=dt)[::2], (3, 7, D)),
}


@pytest.mark.parametrize("name", VIEWS)
def test_layout_reads_the_rows_in_place(name):
    make, rows = VIEWS[name]
    x = make(torch.float32)
    lay = layout(x)
    v = lay.view(x)
    assert tuple(v.shape) == rows and same_memory(v, x) and v.stride(-1) == 1
    # the same rows: every row of x is a row of the view, once
    assert torch.equal(
        v.reshape(-1, x.shape[-1]).sort(0).values, x.reshape(-1, x.shape[-1]).sort(0).values
    )
    out = lay.empty(x)
    assert out.shape == x.shape and lay.view(out).is_contiguous()
    # unview undoes view: x itself (shape, strides, memory), and rstd's rows to x.shape[:-1]
    back = lay.unview(v, x.shape)
    assert back.shape == x.shape and back.stride() == x.stride() and same_memory(back, x)
    assert torch.equal(back, x)
    r = torch.randn(v.shape[:-1])
    r_x = lay.unview(r, x.shape[:-1])
    assert r_x.shape == x.shape[:-1] and torch.equal(lay.view_rows(r_x), r)
    if is_dense(x):
        assert out.stride() == torch.empty_like(x).stride()  # torch's own choice for x


@pytest.mark.parametrize(
    "x",
    [
        torch.randn(4, 6, 8, 10)[::2, ::2, ::2],  # three row modes
        torch.randn(1, 16).expand(4, 16),  # rows that overlap
        torch.randn(4, 16)[:, ::2],  # a strided last dim
    ],
    ids=["three modes", "overlapping rows", "last stride 2"],
)
def test_layout_refuses_what_no_view_reaches(x):
    assert layout(x) is None


@pytest.mark.parametrize("name", VIEWS)
@pytest.mark.parametrize("store_rstd", [False, True])
def test_forward_hands_the_kernel_a_view(fake_kernel, name, store_rstd):  # noqa: F811
    make, rows = VIEWS[name]
    x = make(torch.bfloat16)
    w = torch.randn(x.shape[-1])
    for _ in range(2):  # the first call makes the plan, the second runs it
        out, _, rstd = R.rmsnorm_fwd(x, w, store_rstd=store_rstd)
        call = fake_kernel.calls[-1]
        assert tuple(call["x"].shape) == rows and same_memory(call["x"], x)
        torch.testing.assert_close(out, ref32(x, w).to(x.dtype), atol=0, rtol=0)
        assert out.shape == x.shape and (rstd is not None) == store_rstd


def test_a_strided_call_runs_its_plan_without_checks(fake_kernel, monkeypatch):  # noqa: F811
    _, q, _ = unbind_view(torch.bfloat16)
    w = torch.randn(D)
    R.rmsnorm_fwd(q, w, store_rstd=True)

    def checked(*args):
        raise AssertionError("a planned call ran the checks")

    monkeypatch.setattr(F, "check_args", checked)
    out, _, _ = R.rmsnorm_fwd(q, w, store_rstd=True)
    torch.testing.assert_close(out, ref32(q, w).to(q.dtype), atol=0, rtol=0)


@pytest.mark.parametrize("module", [False, True])
def test_gradients_through_a_fused_projection(fake_kernel, module):  # noqa: F811
    """q and k normalised as a Qwen3 decoder does: the gradients of the projection's output
    and of the weights are the fp32 reference's, and no row is copied on the way."""
    torch.manual_seed(0)
    qkv, q, k = unbind_view(torch.float32, requires_grad=True)
    if module:
        qn, kn = R.QuackRMSNorm(D), R.QuackRMSNorm(D)
        with torch.no_grad():
            qn.weight.normal_()
            kn.weight.normal_()
        yq, yk = qn(q), kn(k)
        wq, wk = qn.weight, kn.weight
    else:
        wq, wk = (torch.randn(D, requires_grad=True) for _ in range(2))
        yq, yk = R.rmsnorm(q, wq), R.rmsnorm(k, wk)
    gq, gk = torch.randn_like(yq), torch.randn_like(yk)
    ((yq * gq).sum() + (yk * gk).sum()).backward()
    for call in fake_kernel.calls:
        assert same_memory(call["x"], qkv)  # forward and backward read the projection itself

    qkv2 = qkv.detach().clone().requires_grad_()
    wq2, wk2 = (w.detach().clone().requires_grad_() for w in (wq, wk))
    q2, k2, _ = qkv2.view(B_, S, 3, H, D).unbind(2)
    ((ref32(q2, wq2, eps=1e-6) * gq).sum() + (ref32(k2, wk2, eps=1e-6) * gk).sum()).backward()
    torch.testing.assert_close(qkv.grad, qkv2.grad)
    torch.testing.assert_close(wq.grad, wq2.grad)
    torch.testing.assert_close(wk.grad, wk2.grad)


@pytest.mark.parametrize("name", VIEWS)
def test_the_plain_training_call_reads_strided_rows_through_its_plans(fake_kernel, name):  # noqa: F811
    """``norm(x)`` and ``rmsnorm(x, w)`` of a view, under autograd, from their second call on:
    ``_PlainRMSNorm`` reading x in place, forward and backward, with the reference's
    gradients, for a dense gradient and one laid out otherwise (the checked way)."""
    torch.manual_seed(1)
    make, _ = VIEWS[name]
    norm = R.QuackRMSNorm(D if name != "sliced last dim" else 64)
    with torch.no_grad():
        norm.weight.normal_()
    for call in (norm, lambda x: R.rmsnorm(x, norm.weight)):
        for layout_of_dy in ("dense", "transposed"):
            for _ in range(3):  # plans made, the backward's found by the forward's, used
                x = make(torch.float32).detach().requires_grad_()
                norm.weight.grad = None
                y = call(x)
                dy = torch.randn_like(y, memory_format=torch.contiguous_format)
                if layout_of_dy == "transposed":
                    dy = dy.transpose(0, 1).contiguous().transpose(0, 1)
                fake_kernel.calls.clear()
                y.backward(dy)
            assert type(y.grad_fn).__name__ == "_PlainRMSNormBackward"
            assert all(same_memory(c["x"], x) for c in fake_kernel.calls)  # read in place
            x2 = x.detach().clone().requires_grad_()
            w2 = norm.weight.detach().clone().requires_grad_()
            ref32(x2, w2, eps=1e-6).backward(dy)
            torch.testing.assert_close(x.grad, x2.grad)
            torch.testing.assert_close(norm.weight.grad, w2.grad)
