"""Property-based tests of the library on a Hopper GPU (marked `gpu`): hypothesis draws the
rows, the dtypes, the features and the values of ``rmsnorm_fwd`` and ``rmsnorm_bwd`` calls, and
every output is checked against the float64 reference (``quack_edu.reference``).

What is drawn. M in 0..300 (0 and 1 among them); rows of values of five kinds, cycled over
the rows: unit normal, zeros, tiny (fp16 subnormals, 1e-30 in bf16/fp32), huge (2e4 in fp16,
whose square overflows fp16 though the kernels sum squares in fp32; 1e15 in bf16/fp32, as
large as the fp32 sum of squares of a 262144 row allows) and a spike (one element 30 times
the rest); eps; rows a wider tensor's slices or contiguous; one NaN or +-Inf element now and
then (it must propagate as in the reference: NaN exactly where the reference has NaN).

Compile keys. Every (N, dtypes, features) is a kernel of its own, compiled on first use (~0.3
to 1 s on the H200); drawn freely they would be hundreds. So the kernel is drawn from a fixed
menu, ``FWD_KEYS`` (28) and ``BWD_KEYS`` (25): 12 row lengths (1, 2, 7, 128, 1000, 1001,
4104, 8191, 32768, 65544, 100001, 262144: odd ones, one-CTA rows, cluster rows), each in two
or three x dtypes, every weight dtype (and none), every feature several times. Everything else
(M, eps, values, strides, NaN/Inf, has_residual) does not change the kernel and is drawn
freely. 53 kernels in all; the file prints how many it compiled.

Every element written. Outputs are allocated inside the library (``torch.empty_like``,
``Tensor.new_empty``); during a call both are wrapped to fill what they return with all-ones
bits (a NaN), and an output element that still holds that pattern where the reference has a
number fails ("never written"). This reaches the backward's per-CTA partial sums too, and
outputs of every size (poisoning the caching allocator, as tests/test_rmsnorm_gpu.py does,
reaches only the blocks of one pool and size).

Replay: the seed is fixed (``QUACK_EDU_FUZZ_SEED``, default below) and printed; the example
database is off, so a run is the same every time. A failure prints the falsifying case and
hypothesis's ``@reproduce_failure`` blob.

    source .gpu/env.sh; python -m pytest -q -s -p no:cacheprovider tests/test_fuzz_gpu.py
"""

from __future__ import annotations

import contextlib
import importlib
import math
import os
from dataclasses import dataclass
from typing import NamedTuple
from unittest import mock

import pytest

pytest.importorskip("hypothesis", reason="the fuzz tests need hypothesis (pip install hypothesis)")

import torch  # noqa: E402
from hypothesis import HealthCheck, example, given, seed, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from quack_edu.reference import TOLERANCES, rmsnorm_bwd_ref, rmsnorm_ref, rstd_ref  # noqa: E402

R = importlib.import_module("quack_edu.rmsnorm")  # quack_edu.rmsnorm is the function

pytestmark = pytest.mark.gpu

SEED = int(os.environ.get("QUACK_EDU_FUZZ_SEED", "20261201"))
#: examples per direction: >= 500 must run (the count is asserted)
EXAMPLES = int(os.environ.get("QUACK_EDU_FUZZ_EXAMPLES", "560"))
MIN_CASES = 500
DEVICE = "cuda"

bf, h, f, _ = torch.bfloat16, torch.float16, torch.float32, None


class FwdKey(NamedTuple):
    """What picks the forward's kernel: N, x, weight, bias, residual, residual_dtype,
    out_dtype, store_rstd, weight_offset."""

    N: int
    x: torch.dtype
    w: torch.dtype | None
    bias: torch.dtype | None
    res: torch.dtype | None
    res_dtype: torch.dtype | None
    out: torch.dtype | None
    rstd: bool
    offset: float


# fmt: off
FWD_KEYS = [FwdKey(*k) for k in (
    #  N       x   w   bias res res_dt out  rstd   offset
    (1,       bf, f,  _,   _,  _,     _,   False, 0.0),  # the plain call (x, weight)
    (1,       h,  _,  h,   f,  _,     _,   True,  0.0),
    (2,       f,  bf, _,   _,  _,     _,   False, 0.0),
    (2,       bf, h,  bf,  bf, f,     h,   True,  1.0),
    (7,       h,  h,  _,   _,  _,     _,   False, 0.0),
    (7,       f,  _,  _,   h,  _,     bf,  True,  0.0),
    (128,     bf, bf, bf,  _,  _,     _,   True,  0.0),
    (128,     h,  f,  _,   _,  f,     _,   False, 1.0),  # residual_out: a converted copy of x
    (1000,    f,  f,  f,   f,  _,     _,   True,  0.0),
    (1000,    bf, _,  _,   _,  _,     f,   False, 0.0),
    (1001,    h,  bf, h,   _,  _,     _,   False, 0.5),
    (1001,    bf, f,  _,   bf, _,     _,   True,  0.0),
    (4104,    bf, f,  _,   _,  _,     _,   False, 0.0),
    (4104,    h,  h,  f,   f,  _,     bf,  True,  1.0),
    (4104,    f,  bf, _,   _,  bf,    _,   True,  0.0),
    (8191,    f,  h,  _,   _,  _,     _,   False, 0.0),
    (8191,    bf, bf, bf,  h,  _,     _,   False, 0.0),
    (32768,   h,  f,  _,   _,  _,     _,   False, 0.0),
    (32768,   bf, f,  f,   f,  _,     _,   True,  0.0),
    (32768,   f,  _,  _,   f,  _,     h,   False, 0.0),
    (65544,   bf, bf, _,   _,  _,     _,   False, 0.0),
    (65544,   f,  f,  _,   bf, f,     _,   True,  0.0),
    (65544,   h,  _,  _,   h,  _,     _,   True,  0.0),
    (100001,  h,  f,  h,   _,  _,     _,   True,  0.0),
    (100001,  f,  bf, _,   _,  _,     _,   False, 1.0),
    (262144,  bf, f,  _,   _,  _,     _,   False, 0.0),
    (262144,  h,  h,  h,   f,  _,     _,   True,  0.0),
    (262144,  f,  f,  _,   _,  _,     bf,  True,  0.0),
)]
# fmt: on


class BwdKey(NamedTuple):
    """What picks the backward's kernel: N, x, weight, dout (None: x's dtype),
    dresidual_out, has_bias, weight_offset."""

    N: int
    x: torch.dtype
    w: torch.dtype | None
    dout: torch.dtype | None
    dres: torch.dtype | None
    bias: bool
    offset: float


# fmt: off
BWD_KEYS = [BwdKey(*k) for k in (
    #  N       x   w   dout dres bias   offset
    (1,       bf, f,  _,   _,   False, 0.0),
    (1,       h,  _,  f,   h,   True,  0.0),  # no weight: db in fp32
    (2,       f,  h,  _,   f,   True,  0.0),
    (2,       bf, h,  _,   _,   False, 0.0),
    (7,       bf, bf, _,   f,   False, 1.0),  # fp32 dresidual_out: a dresidual of its own
    (7,       h,  f,  bf,  _,   True,  0.0),
    (128,     f,  bf, _,   _,   True,  0.5),
    (128,     bf, h,  _,   _,   False, 0.0),
    (1000,    bf, f,  _,   bf,  True,  0.0),
    (1000,    h,  h,  _,   _,   False, 0.0),
    (1001,    f,  f,  h,   _,   False, 0.0),
    (1001,    bf, _,  _,   f,   True,  0.0),
    (4104,    h,  f,  _,   f,   True,  1.0),
    (4104,    bf, bf, f,   _,   False, 0.0),
    (8191,    bf, f,  _,   _,   True,  0.0),
    (8191,    f,  h,  _,   bf,  False, 0.0),
    (32768,   h,  bf, _,   h,   True,  0.0),
    (32768,   f,  f,  _,   _,   False, 0.0),
    (65544,   bf, f,  _,   f,   True,  0.0),
    (65544,   h,  h,  f,   _,   False, 1.0),
    (100001,  f,  bf, _,   _,   True,  0.0),
    (100001,  bf, f,  h,   bf,  False, 0.0),
    (262144,  bf, f,  _,   _,   True,  0.0),
    (262144,  h,  _,  _,   f,   True,  0.0),
    (262144,  f,  f,  bf,  _,   False, 0.0),
)]
# fmt: on

KINDS = ("unit", "zeros", "tiny", "huge", "spike")
#: a row's scale by kind and dtype: tiny and huge as far as the dtype (and, for huge, the fp32
#: sum of squares of the longest row: 262144 * (5.5 * 1e15)**2 < 3.4e38) allows
SCALE = {
    "unit": {bf: 1.0, h: 1.0, f: 1.0},
    "zeros": {bf: 0.0, h: 0.0, f: 0.0},
    "tiny": {bf: 1e-30, h: 1e-6, f: 1e-30},
    "huge": {bf: 1e15, h: 2e4, f: 1e15},
    "spike": {bf: 1.0, h: 1.0, f: 1.0},
}
_FINITE_MAX = {bf: 3.0e38, h: 65000.0, f: 3.0e38}


@dataclass(frozen=True)
class FwdCase:
    key: FwdKey
    M: int
    kinds: tuple[str, ...]
    eps: float
    strided: bool
    special: str | None  # "nan", "inf", "-inf" or None
    special_in_residual: bool
    where: int
    seed: int


@dataclass(frozen=True)
class BwdCase:
    key: BwdKey
    M: int
    kinds: tuple[str, ...]
    eps: float
    strided: bool
    has_residual: bool
    special: str | None
    special_in_dout: bool
    where: int
    seed: int


_common = dict(
    M=st.integers(0, 300),
    kinds=st.lists(st.sampled_from(KINDS), min_size=1, max_size=4).map(tuple),
    strided=st.booleans(),
    special=st.sampled_from((None, None, None, None, "nan", "inf", "-inf")),
    where=st.integers(0, 2**40),
    seed=st.integers(0, 2**32 - 1),
)
FWD_CASES = st.builds(
    FwdCase,
    key=st.sampled_from(FWD_KEYS),
    eps=st.sampled_from((1e-6, 1e-5, 1e-12)),
    special_in_residual=st.booleans(),
    **_common,
)
# eps >= 1e-6 in the backward: rstd <= 1000 keeps dx = rstd * (...) within fp16's range
BWD_CASES = st.builds(
    BwdCase,
    key=st.sampled_from(BWD_KEYS),
    eps=st.sampled_from((1e-6, 1e-5)),
    has_residual=st.booleans(),
    special_in_dout=st.booleans(),
    **_common,
)
SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    print_blob=True,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.large_base_example,
    ],
)


# -- inputs -----------------------------------------------------------------------------------


def _rows(M, N, dtype, kinds, gen, strided, unit_only=False):
    """(M, N) of ``dtype``, row i of kind ``kinds[i % len(kinds)]`` (``unit_only``: all unit);
    a slice of a wider tensor (rows 16 or 32 bytes apart more than N) when ``strided``."""
    v = torch.randn(M, N, device=DEVICE, generator=gen)
    if not unit_only and M:
        row_kinds = [kinds[i % len(kinds)] for i in range(M)]
        scale = torch.tensor([SCALE[k][dtype] for k in row_kinds], device=DEVICE)
        spikes = torch.tensor([k == "spike" for k in row_kinds], device=DEVICE)
        v = v * scale[:, None]
        cols = torch.arange(M, device=DEVICE) % N
        v[spikes, cols[spikes]] *= 30.0
        v = v.clamp(-_FINITE_MAX[dtype], _FINITE_MAX[dtype])
    if strided:
        pad = 16 // torch.empty(0, dtype=dtype).element_size() * (1 + M % 2)
        wide = torch.zeros(M, N + pad, device=DEVICE, dtype=dtype)
        wide[:, :N] = v.to(dtype)
        return wide[:, :N]
    return v.to(dtype)


def _inject(t, special, where):
    """One NaN or +-Inf element in ``t`` (in place), at a place drawn by ``where``."""
    if special is None or t.numel() == 0:
        return
    M, N = t.shape
    t[where % M, (where // M) % N] = float(special)


_INT_OF_SIZE = {2: torch.int16, 4: torch.int32, 8: torch.int64}


@contextlib.contextmanager
def _poisoned_outputs():
    """Every floating tensor ``torch.empty_like`` / ``Tensor.new_empty`` return is filled with
    all-ones bits, for as long as the block lasts (see the module docstring)."""
    real_like, real_new = torch.empty_like, torch.Tensor.new_empty

    def poison(t):
        if t.is_floating_point() and t.numel():
            t.view(_INT_OF_SIZE[t.element_size()]).fill_(-1)
        return t

    def empty_like(*args, **kwargs):
        return poison(real_like(*args, **kwargs))

    def new_empty(self, *args, **kwargs):
        return poison(real_new(self, *args, **kwargs))

    with (
        mock.patch.object(torch, "empty_like", empty_like),
        mock.patch.object(torch.Tensor, "new_empty", new_empty),
    ):
        yield


# -- the comparison ---------------------------------------------------------------------------


def _check(got, expected, what, atol_scale=1.0, tol=None):
    """``got`` (the kernel's) against ``expected`` (float64): every element written; NaN
    exactly where the reference is NaN; where the reference rounds to +-Inf in ``got``'s dtype,
    that Inf; elsewhere within the tolerance table (atol times ``atol_scale``, a number or a
    tensor that broadcasts)."""
    assert got is not None, f"{what}: missing"
    assert got.shape == expected.shape, f"{what}: shape {tuple(got.shape)} != {expected.shape}"
    if got.numel() == 0:
        return
    a, e = got.double(), expected.double()
    nan_a, nan_e = torch.isnan(a), torch.isnan(e)
    # the poison where a value was due; where the reference is NaN any NaN will do (a NaN
    # computed on the host can have every bit set too: torch's CPU cast to bf16 does)
    unwritten = (got.view(_INT_OF_SIZE[got.element_size()]) == -1) & ~nan_e
    if unwritten.any():
        first = unwritten.nonzero()[0].tolist()
        raise AssertionError(
            f"{what}: {int(unwritten.sum())} of {got.numel()} elements never written "
            f"(first at {first})"
        )
    if not torch.equal(nan_a, nan_e):
        differ = nan_a != nan_e
        first = differ.nonzero()[0].tolist()
        raise AssertionError(
            f"{what}: NaN where the reference has none or the reverse: {int(differ.sum())} "
            f"elements, first at {first}: got {a[tuple(first)].item()}, expected "
            f"{e[tuple(first)].item()}"
        )
    rounded = e.to(got.dtype).double()
    inf_e = torch.isinf(rounded)
    if not torch.equal(a[inf_e], rounded[inf_e]):
        raise AssertionError(f"{what}: the reference overflows {got.dtype}; the kernel differs")
    tol = dict(tol or TOLERANCES[got.dtype])
    bound = tol["atol"] * atol_scale + tol["rtol"] * e.abs()
    bad = ~(nan_e | inf_e) & ~((a - e).abs() <= bound)
    if bad.any():
        first = tuple(bad.nonzero()[0].tolist())
        err = ((a - e).abs() - bound).masked_fill(~bad, 0)
        raise AssertionError(
            f"{what}: {int(bad.sum())} of {got.numel()} elements beyond atol={tol['atol']} "
            f"(x {atol_scale if isinstance(atol_scale, float) else 'per row'}), "
            f"rtol={tol['rtol']}; first at {list(first)}: got {a[first].item()!r}, expected "
            f"{e[first].item()!r}; largest excess {err.max().item():.3g}"
        )


# -- forward ------------------------------------------------------------------------------------

_COUNT = {"fwd": 0, "bwd": 0}


def _fwd_case(case: FwdCase):
    k = case.key
    N, M = k.N, case.M
    gen = torch.Generator(device=DEVICE).manual_seed(case.seed)
    x = _rows(M, N, k.x, case.kinds, gen, case.strided)
    w = None if k.w is None else torch.randn(N, device=DEVICE, generator=gen).to(k.w)
    b = None if k.bias is None else torch.randn(N, device=DEVICE, generator=gen).to(k.bias)
    res = None if k.res is None else _rows(M, N, k.res, case.kinds, gen, case.strided)
    target = res if res is not None and case.special_in_residual else x
    _inject(target, case.special, case.where)
    with _poisoned_outputs():
        out, res_out, rstd = R.rmsnorm_fwd(
            x, w, b, res, out_dtype=k.out, residual_dtype=k.res_dtype, eps=case.eps,
            store_rstd=k.rstd, weight_offset=k.offset,
        )  # fmt: skip
    expected = rmsnorm_ref(x, w, b, res, case.eps, torch.float64, k.offset)
    exp_out, exp_h = expected if res is not None else (expected, x.double())
    what = f"forward {case}"
    assert out.dtype == (k.out or k.x), f"{what}: out dtype {out.dtype}"
    _check(out, exp_out, f"out of {what}")
    res_dtype = k.res_dtype or (k.res if res is not None else None)
    if res is not None or (res_dtype is not None and res_dtype != k.x):
        assert res_out.dtype == res_dtype, f"{what}: residual_out dtype {res_out.dtype}"
        _check(res_out, exp_h, f"residual_out of {what}")
    else:
        assert res_out is x, f"{what}: residual_out is not x itself"
    if k.rstd:
        # fp32 rstd from an fp32 sum and a fast rsqrt: a few ulps of rstd
        _check(rstd, rstd_ref(exp_h, case.eps, torch.float64), f"rstd of {what}",
               tol=dict(atol=0.0, rtol=1e-4))  # fmt: skip
    else:
        assert rstd is None
    _COUNT["fwd"] += 1


@SETTINGS
@seed(SEED)
@example(case=FwdCase(FWD_KEYS[4], 1, ("unit",), 1e-6, False, None, False, 0, 0))  # one row
@example(case=FwdCase(FWD_KEYS[0], 0, ("unit",), 1e-6, False, None, False, 0, 0))  # no row
@given(case=FWD_CASES)
def _fuzz_forward(case):
    _fwd_case(case)


# -- backward -----------------------------------------------------------------------------------


def _bwd_case(case: BwdCase):
    k = case.key
    N, M = k.N, case.M
    gen = torch.Generator(device=DEVICE).manual_seed(case.seed)
    x = _rows(M, N, k.x, case.kinds, gen, case.strided)
    w = None if k.w is None else torch.randn(N, device=DEVICE, generator=gen).to(k.w)
    dout = _rows(M, N, k.dout or k.x, case.kinds, gen, case.strided, unit_only=True)
    dres_out = None
    if k.dres is not None:
        dres_out = _rows(M, N, k.dres, case.kinds, gen, case.strided, unit_only=True)
    # a NaN in dout makes its row of dx and its column of dw, db NaN whatever the order of
    # operations; an Inf in dout would leave NaN or Inf depending on it: Inf goes into x only
    in_dout = case.special_in_dout and case.special == "nan"
    _inject(dout if in_dout else x, case.special, case.where)
    rstd = rstd_ref(x, case.eps, torch.float64).float()  # what the forward stores
    with _poisoned_outputs():
        dx, dw, db, dres = R.rmsnorm_bwd(
            x, w, dout, rstd, dres_out, k.bias, case.has_residual, k.offset
        )
    ex, ew, eb = rmsnorm_bwd_ref(
        x, w, dout, rstd, dres_out, k.bias, compute_dtype=torch.float64, weight_offset=k.offset
    )
    what = f"backward {case}"
    assert dx.dtype == k.x, f"{what}: dx dtype {dx.dtype}"
    # dx = rstd * (...): its rounding error is that of unit-size terms times rstd, up to
    # 1/sqrt(eps) = 1000 for rows of zeros or tiny values; the table's atol is for unit scale
    row_scale = rstd.double().nan_to_num(1.0).clamp(min=1.0)[:, None]
    _check(dx, ex, f"dx of {what}", row_scale)
    # dw, db are sums over the M rows of products of size ~1 with random signs: they grow like
    # sqrt(M), and so does the fp32 error of summing them in another order than float64 does
    rows = math.sqrt(max(M, 1))
    if w is None:
        assert dw is None, f"{what}: dw without a weight"
    else:
        assert dw.dtype == k.w, f"{what}: dw dtype {dw.dtype}"
        _check(dw, ew, f"dw of {what}", rows)
    if k.bias:
        assert db.dtype == (k.w or torch.float32), f"{what}: db dtype {db.dtype}"
        _check(db, eb, f"db of {what}", rows)
    else:
        assert db is None, f"{what}: db without has_bias"
    if dres_out is not None and dres_out.dtype != k.x:
        assert dres.dtype == dres_out.dtype, f"{what}: dresidual dtype {dres.dtype}"
        _check(dres, ex, f"dresidual of {what}", row_scale)
    elif case.has_residual:
        assert dres is dx, f"{what}: dresidual is not dx itself"
    else:
        assert dres is None, f"{what}: dresidual without a residual"
    _COUNT["bwd"] += 1


@SETTINGS
@seed(SEED)
@example(case=BwdCase(BWD_KEYS[3], 1, ("unit",), 1e-6, False, True, None, False, 0, 0))
@example(case=BwdCase(BWD_KEYS[0], 0, ("unit",), 1e-6, False, False, None, False, 0, 0))
@given(case=BWD_CASES)
def _fuzz_backward(case):
    _bwd_case(case)


# -- the tests --------------------------------------------------------------------------------


def _compiled():
    from quack_edu.stages import final, final_bwd

    return len(final._COMPILED), len(final_bwd._COMPILED)


def _run(direction, fuzz, keys, record_property):
    print(
        f"\n{direction}: hypothesis seed {SEED} (replay: QUACK_EDU_FUZZ_SEED={SEED}), "
        f"max_examples {EXAMPLES}, {len(keys)} kernels in the menu",
        flush=True,
    )
    record_property("hypothesis_seed", SEED)
    before = _compiled()
    _COUNT[direction] = 0
    fuzz()
    n = _COUNT[direction]
    compiled = [a - b for a, b in zip(_compiled(), before, strict=True)]
    print(
        f"{direction}: {n} cases checked against float64, seed {SEED}, kernels compiled: "
        f"{compiled[0]} forward, {compiled[1]} backward",
        flush=True,
    )
    record_property(f"{direction}_cases", n)
    assert n >= MIN_CASES, f"only {n} {direction} cases ran (seed {SEED}); raise EXAMPLES"


def test_fuzz_forward_against_float64(record_property):
    _run("fwd", _fuzz_forward, FWD_KEYS, record_property)


def test_fuzz_backward_against_float64(record_property):
    _run("bwd", _fuzz_backward, BWD_KEYS, record_property)
