"""The gpu-tier hints of lessons 02 and 03, checked on a CPU.

The gpu tier compares a learner's kernel with ``rmsnorm_ref`` and, when it is wrong, looks for a
known wrong variant (``hints.Variant``) whose output matches. Those variants are formulas; here a
mutant kernel is *simulated* independently (which thread owns which element is read off the real
tiled copy's TV layout with ``inspect.tv_coords``, the warp's shuffles come from the NumPy model
in ``viz``), and the grader's diagnosis of the simulated output must give the mutant's hint.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from quack_edu.config import RowConfig, block_config, vector_elems
from quack_edu.grading import hints
from quack_edu.grading.checks import EPS, POISON, rmsnorm_inputs
from quack_edu.grading.exercises import lesson02, lesson03
from quack_edu.lessons import viz
from quack_edu.primitives.copy import row_tiled_copy
from quack_edu.reference import TOLERANCES, rmsnorm_ref
from quack_edu.runtime import cute_dtype
from quack_edu.tools.inspect import tv_coords

DT = torch.bfloat16


def _inputs(M=37, N=1000, seed=0):
    g = torch.Generator().manual_seed(seed)
    return rmsnorm_inputs(M, N, DT, g, device="cpu")


def _owner(cfg: RowConfig, N: int):
    """(row in the CTA, thread of the CTA) that loads column c, from the traced tiled copy."""
    vec = vector_elems(DT)
    m = tv_coords(lambda: row_tiled_copy(cute_dtype(DT), cfg.threads_per_row, cfg.num_threads, vec))
    tile_cols = m["tile"][1]
    col_thread = {}
    for t, coords in m["coords"].items():
        for r, c in coords:
            if r == 0:
                col_thread[c] = t
    return np.array([col_thread[c % tile_cols] for c in range(N)])  # thread of row 0 of a CTA


def _simulate(x, w, cfg: RowConfig, combine):
    """Per-thread partial sums of squares laid out as the kernel does, then ``combine(partials)``
    -> the value each thread uses as the row sum; returns the output in x's dtype."""
    xf = x.float().numpy().astype(np.float64)
    M, N = xf.shape
    rows = cfg.rows_per_cta
    ctas = -(-M // rows)
    thread0 = _owner(cfg, N)  # threads of row 0 of a CTA: 0..tpr-1
    partial = np.zeros((ctas, cfg.num_threads))
    for r in range(M):
        b, rr = divmod(r, rows)
        np.add.at(partial[b], thread0 + rr * cfg.threads_per_row, xf[r] ** 2)
    used = combine(partial)  # (ctas, num_threads)
    out = np.empty_like(xf)
    for r in range(M):
        b, rr = divmod(r, rows)
        s = used[b][thread0 + rr * cfg.threads_per_row]
        out[r] = xf[r] / np.sqrt(s / N + EPS) * w.float().numpy()
    return torch.from_numpy(out).to(x.dtype)


def _butterfly(offsets):
    def combine(partial):
        out = np.empty_like(partial)
        for b in range(partial.shape[0]):
            for wp in range(partial.shape[1] // 32):
                lanes = partial[b, 32 * wp : 32 * wp + 32]
                out[b, 32 * wp : 32 * wp + 32] = viz.butterfly_rounds(lanes, offsets=offsets)[-1]
        return out

    return combine


def _diagnose(out, x, w, variants=()):
    ref = rmsnorm_ref(x, w, eps=EPS)
    return hints.diagnose_rmsnorm(
        out, ref, x, w, EPS, tol=TOLERANCES[DT], poison=POISON, variants=variants
    )


def test_the_simulation_of_the_right_kernels_matches_the_reference():
    x, w = _inputs()
    ref = rmsnorm_ref(x, w, eps=EPS).float()
    narrow = RowConfig(threads_per_row=8, num_threads=128)
    for cfg, combine in [
        (narrow, _butterfly([1, 2, 4])),
        (RowConfig(threads_per_row=32, num_threads=128), _butterfly([1, 2, 4, 8, 16])),
    ]:
        torch.testing.assert_close(_simulate(x, w, cfg, combine).float(), ref, **TOLERANCES[DT])


def test_five_rounds_on_8_lane_rows_gives_the_width_hint():
    x, w = _inputs()
    cfg = lesson02.NARROW_CFG
    out = _simulate(x, w, cfg, _butterfly([1, 2, 4, 8, 16]))
    assert _diagnose(out, x, w, (lesson02.ROWS_MIXED_V,)) == lesson02.WIDTH


@pytest.mark.parametrize("tpr", [8, 32])
def test_one_round_short_gives_the_missing_shuffle_hint(tpr):
    x, w = _inputs()
    cfg = RowConfig(threads_per_row=tpr, num_threads=128)
    offsets = [1 << i for i in range(tpr.bit_length() - 2)]  # the last round is missing
    hint = _diagnose(_simulate(x, w, cfg, _butterfly(offsets)), x, w, (lesson02.ROWS_MIXED_V,))
    assert hint and hint.startswith(hints.MISSING_SHUFFLE)


def _block(mode: str, cfg: RowConfig):
    wpr = cfg.warps_per_row

    def combine(partial):
        ctas, nt = partial.shape
        warp_sum = partial.reshape(ctas, nt // 32, 32).sum(-1)  # level 1: the butterfly
        buffer = warp_sum.reshape(ctas, cfg.rows_per_cta, wpr)  # level 2: one slot per warp
        if mode == "right":
            row_sum = buffer.sum(-1)
        elif mode == "row 0":
            row_sum = np.repeat(buffer[:, :1].sum(-1), cfg.rows_per_cta, axis=1)
        if mode == "own warp":
            per_warp = warp_sum
        else:
            per_warp = np.repeat(row_sum, wpr, axis=1)
        return np.repeat(per_warp, 32, axis=1)

    return combine


@pytest.mark.parametrize("N", [1000, 4096])
def test_block_mutants_give_their_hints(N):
    x, w = _inputs(N=N)
    cfg = block_config(N, DT)
    variants = (lesson03.own_warp_variant(), lesson03.first_row_variant())
    ref = rmsnorm_ref(x, w, eps=EPS).float()
    right = _simulate(x, w, cfg, _block("right", cfg))
    torch.testing.assert_close(right.float(), ref, **TOLERANCES[DT])
    own = _simulate(x, w, cfg, _block("own warp", cfg))
    assert _diagnose(own, x, w, variants) == lesson03.OWN_PARTIAL
    if cfg.rows_per_cta > 1:
        row0 = _simulate(x, w, cfg, _block("row 0", cfg))
        assert _diagnose(row0, x, w, variants) == lesson03.BUFFER_ROW


def test_own_warp_variant_with_eight_warps_per_row():
    x, w = _inputs(N=4096)
    cfg = lesson03.WIDE_CFG
    own = _simulate(x, w, cfg, _block("own warp", cfg))
    variant = lesson03.own_warp_variant(lambda N, dtype: cfg)
    assert _diagnose(own, x, w, (variant,)) == lesson03.OWN_PARTIAL


# ---- lesson 07: 07.dx_row's tolerance and known wrong formulas, on a CPU -------------------------


def test_dx_row_tolerance_passes_fp32_orders_and_fails_every_variant():
    """DX_RTOL (1e-4 of the row's scale): the formula in fp32 in two orders of evaluation passes
    against float64 autograd; every known wrong formula fails, and is the one diagnosed."""
    from quack_edu.grading.exercises import lesson07 as L
    from quack_edu.lessons.bwd_strategies import autograd_bwd

    g = torch.Generator().manual_seed(0)
    results = []
    for M, N, xdt, wdt, off in L.DX_CASES:
        x, w, dout, rstd = L.row_inputs(M, N, xdt, wdt, off, g)
        ref = autograd_bwd(x, w, dout, EPS, off)[0]
        scale = L.dx_scale(x, w, dout, rstd, off)
        right = L._dx(x, rstd, L._g(dout, w, off))
        r = rstd.unsqueeze(-1)  # another order: rstd * g - rstd * x_hat * c, c as sum / N
        gg = L._g(dout, w, off)
        other = r * gg - (x.float() * r) * ((x.float() * r * gg).sum(-1, keepdim=True) / N) * r
        assert L.dx_within(right, ref, scale).all() and L.dx_within(other, ref, scale).all()
        results.append((x, w, dout, rstd, off, scale))
    for name, fn, hint in L.DX_VARIANTS:
        outs = [(fn(x, w, d, r, o), x, w, d, r, o, s) for x, w, d, r, o, s in results]
        if name in ("no offset", "offset after", "no weight", "g in bf16"):
            # the same as the right answer where there is no offset / no weight / fp32 inputs
            assert not all(L.dx_within(o[0], L._dx(o[1], o[4], L._g(o[3], o[2], o[5])), o[6]).all()
                           for o in outs), name  # fmt: skip
        assert L._diagnose_dx(outs) == hint, name
