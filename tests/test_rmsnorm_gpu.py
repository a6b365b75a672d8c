"""quack_edu.rmsnorm on a Hopper GPU (marked `gpu`): values against float64, every feature,
and the torch integrations (opcheck, torch.compile, CUDA graphs, streams, the autotuner).

Compiles are shared: the value sweep reuses a few (N, dtype) keys across M, so the file stays
near a minute on an H200. Before each call the caching allocator is handed a block full of NaN
and freed, so outputs allocated inside the call start as NaN: an unwritten element fails.
"""

import importlib
import json

import pytest
import torch

from quack_edu.reference import TOLERANCES
from quack_edu.reference import rmsnorm_ref as ref

R = importlib.import_module("quack_edu.rmsnorm")  # quack_edu.rmsnorm is the function
F = importlib.import_module("quack_edu.host.forward")

pytestmark = pytest.mark.gpu

DTYPES = [torch.bfloat16, torch.float16, torch.float32]
MS = [1, 37, 199]
NS = [1, 7, 100, 1000, 4096, 4104, 65536 + 8, 100001, 262144]  # 100001: odd and long


def _poison_allocator(nbytes=64 << 20):
    torch.empty(nbytes, dtype=torch.uint8, device="cuda").fill_(0xFF)  # 0xFFFF.. is NaN


def _expect(x, w, b=None, res=None, eps=1e-6, offset=0.0):
    """float64 reference: (out, residual_out)."""
    got = ref(x, w, b, res, eps, compute_dtype=torch.float64, weight_offset=offset)
    return got if res is not None else (got, x.double())


def _close(got, expected, what):
    assert torch.isfinite(got).all(), f"{what}: not every element was written"
    torch.testing.assert_close(got.double(), expected, **TOLERANCES[got.dtype], msg=what)


def _run(x, w=None, b=None, res=None, **kw):
    _poison_allocator()
    out, res_out, rstd = R.rmsnorm_fwd(x, w, b, res, **kw)
    exp_out, exp_res = _expect(x, w, b, res, kw.get("eps", 1e-6), kw.get("weight_offset", 0.0))
    _close(out, exp_out, f"out {tuple(x.shape)} {x.dtype} w={None if w is None else w.dtype}")
    if res is not None or kw.get("residual_dtype") not in (None, x.dtype):
        _close(res_out, exp_res, "residual_out")
    else:
        assert res_out is x
    if kw.get("store_rstd"):
        expected = torch.rsqrt(exp_res.square().mean(-1) + kw.get("eps", 1e-6))
        torch.testing.assert_close(rstd.double(), expected, rtol=1e-4, atol=0)
    return out, res_out, rstd


WDTYPES = [None, torch.float16, torch.bfloat16, torch.float32]
# every (N, dtype) with one weight dtype, all four weight dtypes across the sweep: 24 compiles
SWEEP = [
    (N, dtype, WDTYPES[(i + j) % 4]) for i, N in enumerate(NS) for j, dtype in enumerate(DTYPES)
]


@pytest.mark.parametrize(("N", "dtype", "wdtype"), SWEEP)
def test_values_at_ragged_shapes(N, dtype, wdtype):
    w = None if wdtype is None else torch.randn(N, device="cuda", dtype=wdtype)
    for M in MS:  # one compile for all three: M is symbolic
        _run(torch.randn(M, N, device="cuda", dtype=dtype), w)


@pytest.mark.parametrize(
    ("dtype", "N"), [(torch.bfloat16, 100), (torch.float16, 4104), (torch.float32, 65536 + 8)]
)
def test_every_feature(dtype, N):
    x = torch.randn(37, N, device="cuda", dtype=dtype)
    w = torch.randn(N, device="cuda", dtype=torch.float32)
    b = torch.randn(N, device="cuda", dtype=torch.bfloat16)
    res = torch.randn(37, N, device="cuda", dtype=torch.float16)
    _run(x, w, b, eps=1e-5)
    _run(x, w, res=res, store_rstd=True)
    _run(x, w, res=res, residual_dtype=torch.float32)
    _run(x, w, residual_dtype=torch.float32 if dtype != torch.float32 else torch.bfloat16)
    _run(x, w, out_dtype=torch.float32)
    _run(x, w.bfloat16() * 0.1, weight_offset=1.0)
    _run(x, w, b, res, out_dtype=torch.float16, store_rstd=True, weight_offset=0.5)


@pytest.mark.parametrize("N", [60000, 65536])
def test_prenorm_long_rows(N):
    # a bf16 residual next to rows of 4K-8K vectors takes its own plan (clusters of 4, 4 row
    # blocks a CTA, 2 buffers): M ragged, and more rows than one wave of CTAs (1000 / 4)
    w = torch.randn(N, device="cuda", dtype=torch.bfloat16)
    for M in (1, 37, 1000):
        x = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
        _run(x, w, res=torch.randn_like(x), store_rstd=True)


@pytest.mark.parametrize("dtype", DTYPES)
def test_per_head_weight(dtype):
    x = torch.randn(3, 37, 4, 128, device="cuda", dtype=dtype)
    w = torch.randn(4, 128, device="cuda", dtype=torch.float32)
    b = torch.randn(4, 128, device="cuda", dtype=dtype)
    out, _, rstd = _run(x, w, b, store_rstd=True)
    assert out.shape == x.shape and rstd.shape == (3, 37, 4)
    _run(x, w, res=torch.randn_like(x))


def test_strided_rows_empty_batches_and_leading_shapes():
    base = torch.randn(199, 576, device="cuda", dtype=torch.bfloat16)
    x = base[:, :512]  # rows 1152 bytes apart: not contiguous
    _run(x, torch.randn(512, device="cuda"))
    _run(base[:, 1:513], torch.randn(512, device="cuda"))  # 2-byte aligned: narrow vectors
    _run(torch.randn(2, 3, 37, 1000, device="cuda", dtype=torch.float16), None)
    for shape in [(0, 4096), (2, 0, 4096)]:
        out, res_out, rstd = R.rmsnorm_fwd(
            torch.empty(shape, device="cuda"), torch.randn(4096, device="cuda"), store_rstd=True
        )
        assert out.shape == shape and rstd.shape == shape[:-1]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("D", [128, 72])
def test_rows_in_two_modes_are_read_in_place(dtype, D):
    """q and k of a fused projection (``.view(B, S, 3, H, D).unbind(2)``), a transposed head
    view of one and rows of every other batch: the kernel reads them in place (rows (M, H, D)
    or one strided mode), its values the float64 reference's and, row for row, the bits of the
    same rows made contiguous."""
    B, S, H = 3, 37, 5
    qkv = torch.randn(B, S, 3 * H * D, device="cuda", dtype=dtype)
    q, k, _ = qkv.view(B, S, 3, H, D).unbind(2)
    w = torch.randn(D, device="cuda", dtype=torch.float32)
    for x in (q, k, k.transpose(1, 2), torch.randn(6, 7, D, device="cuda", dtype=dtype)[::2]):
        out, _, rstd = _run(x, w, store_rstd=True)
        assert out.shape == x.shape and rstd.shape == x.shape[:-1]
        flat, _, flat_rstd = R.rmsnorm_fwd(x.contiguous(), w, store_rstd=True)
        assert torch.equal(out, flat) and torch.equal(rstd, flat_rstd)


def test_plain_call_fast_path_matches_and_still_checks():
    """The plain call (x, weight) goes through the checked path once, then through the cached
    fast path (a dictionary hit and the TVM-FFI function called directly): the same values at
    other M, leading shapes and no rows, a fresh output, and a bad call still gets the error."""
    F._FWD_PLANS.clear()
    w = torch.randn(1000, device="cuda", dtype=torch.float32)
    first = _run(torch.randn(37, 1000, device="cuda", dtype=torch.bfloat16), w)[0]
    assert len(F._FWD_PLANS) == 1
    for shape in [(199, 1000), (1, 1000), (3, 5, 1000)]:
        x = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
        out = _run(x, w)[0]
        assert out.data_ptr() != first.data_ptr()
        assert torch.equal(out, R.rmsnorm_fwd(x, w)[0])  # twice through the hit: the same bits
    assert len(F._FWD_PLANS) == 1  # M and leading dims are not part of the key: rows are viewed
    empty = R.rmsnorm_fwd(torch.empty(0, 1000, device="cuda", dtype=torch.bfloat16), w)[0]
    assert empty.shape == (0, 1000)
    with pytest.raises(ValueError, match="weight"):
        R.rmsnorm_fwd(torch.randn(4, 999, device="cuda", dtype=torch.bfloat16), w)


def test_device_errors():
    x = torch.randn(4, 64, device="cuda")
    with pytest.raises(ValueError, match="weight is on cpu but x is on cuda"):
        R.rmsnorm_fwd(x, torch.randn(64))
    with pytest.raises(ValueError, match="residual is on cpu"):
        R.rmsnorm_fwd(x, residual=torch.randn(4, 64))


def test_module_matches_nn_rmsnorm():
    x = torch.randn(4, 37, 8, 128, device="cuda", dtype=torch.bfloat16)
    for shape, eps in [(128, 1e-6), ((8, 128), None)]:
        theirs = torch.nn.RMSNorm(shape, eps=eps, device="cuda")
        with torch.no_grad():
            theirs.weight.normal_()
        ours = R.QuackRMSNorm(shape, eps=eps, device="cuda")
        ours.load_state_dict(theirs.state_dict())
        with torch.no_grad():
            got, expected = ours(x), theirs(x)
        assert got.dtype == expected.dtype == x.dtype
        torch.testing.assert_close(got, expected, **TOLERANCES[torch.bfloat16])


def test_opcheck():
    x = torch.randn(37, 1000, device="cuda", dtype=torch.bfloat16)
    res = torch.randn(37, 1000, device="cuda", dtype=torch.float32)
    w = torch.randn(1000, device="cuda")
    op = torch.ops.quack_edu.rmsnorm_fwd.default
    torch.library.opcheck(op, (x, w, None, res, torch.float32, torch.float32, 1e-6, True, 0.5))
    torch.library.opcheck(op, (x, None, None, None, torch.bfloat16, None, 1e-6, False, 0.0))


def test_torch_compile_fullgraph():
    torch._dynamo.reset()
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 256, device="cuda", dtype=torch.bfloat16),
        R.QuackRMSNorm(256, device="cuda", dtype=torch.bfloat16),
    )
    x = torch.randn(37, 256, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        expected = model(x)
        explanation = torch._dynamo.explain(model)(x)
        assert explanation.graph_break_count == 0, explanation.break_reasons
        got = torch.compile(model, fullgraph=True)(x)
    torch.testing.assert_close(got, expected, **TOLERANCES[torch.bfloat16])
    got = torch.compile(model, fullgraph=True)(x)  # grad mode on: the backward is traced too
    torch.testing.assert_close(got.detach(), expected, **TOLERANCES[torch.bfloat16])


def test_cuda_graph_capture_and_replay():
    x = torch.randn(199, 4096, device="cuda", dtype=torch.bfloat16)
    res = torch.randn_like(x)
    w = torch.randn(4096, device="cuda")
    R.rmsnorm_fwd(x, w, residual=res)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, res_out, _ = R.rmsnorm_fwd(x, w, residual=res)
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    exp_out, exp_res = _expect(x, w, res=res)
    _close(out, exp_out, "out after replay")
    _close(res_out, exp_res, "residual_out after replay")


def test_side_stream():
    x = torch.randn(199, 4104, device="cuda", dtype=torch.float16)
    w = torch.randn(4104, device="cuda", dtype=torch.float16)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        out = R.rmsnorm_fwd(x, w)[0]
        twice = R.rmsnorm_fwd(out, None)[0]  # ordered after the first on the same stream
    torch.cuda.current_stream().wait_stream(stream)
    _close(out, _expect(x, w)[0], "out on a side stream")
    _close(twice, _expect(out, None)[0], "second launch on the side stream")


def test_rmsnorm_fwd_tuned(tmp_path, monkeypatch):
    path = tmp_path / "autotune.json"
    monkeypatch.setenv("QUACK_EDU_AUTOTUNE_CACHE", str(path))
    monkeypatch.setattr(importlib.import_module("quack_edu.host.ops"), "_tuner", None)
    final = F._final()
    every = final.configs
    monkeypatch.setattr(
        final, "configs", lambda *a, **kw: every(*a, **kw)[:3]
    )  # time, not compiles
    x = torch.randn(199, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(4096, device="cuda")
    res = torch.randn_like(x)
    for kw in [dict(), dict(residual=res, store_rstd=True)]:
        tuned = R.rmsnorm_fwd_tuned(x, w, **kw)
        plain = R.rmsnorm_fwd(x, w, **kw)
        for t, p in zip(tuned, plain, strict=True):
            if p is not None and p is not x:
                torch.testing.assert_close(t, p, **TOLERANCES[p.dtype])
    entries = json.loads(path.read_text())["entries"]
    assert len(entries) == 2
    assert all(torch.cuda.get_device_name() in key for key in entries)
    before = path.stat().st_mtime_ns
    R.rmsnorm_fwd_tuned(x, w)  # cached: no tuning, no write
    assert path.stat().st_mtime_ns == before
