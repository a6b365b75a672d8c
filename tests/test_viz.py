import matplotlib
import numpy as np
import pytest

from quack_edu.lessons import viz

matplotlib.use("Agg")


def test_butterfly_model_sums_every_lane():
    vals = np.random.default_rng().normal(size=32)
    hist = viz.butterfly_rounds(vals)
    assert len(hist) == 6
    np.testing.assert_allclose(hist[-1], np.full(32, vals.sum()))


def test_butterfly_with_a_missing_round_is_wrong_by_the_missing_factor():
    ones = np.ones(32)
    assert viz.butterfly_rounds(ones)[-1][0] == 32
    # skip the xor-1 round: each lane holds the sum of 16 lanes, half the total
    assert viz.butterfly_rounds(ones, offsets=[16, 8, 4, 2])[-1][0] == 16


def test_tv_layout_is_coalesced_and_covers_the_tile():
    owner = viz.row_tv_owner(threads_per_row=4, rows=2, vec=8, cols=64)
    assert owner.min() == 0 and owner.max() == 7
    # a thread's 8 elements are one 16-byte vector; the next thread owns the next vector
    assert list(owner[0, :16]) == [0] * 8 + [1] * 8
    assert list(owner[1, :8]) == [4] * 8
    assert all((owner == t).sum() == 16 for t in range(8))


def test_timeline_overlap_beats_serial():
    rows, total = viz.pipeline_timeline(4, 1.0, 0.3)
    assert total == pytest.approx(4.3)
    assert len(rows) == 4
    assert viz.littles_law_bytes(4000, 700) == pytest.approx(2.8e6)


def test_figures_draw():
    for fn in (viz.plot_butterfly, viz.plot_tv_layout, viz.plot_timeline):
        ax = fn()
        assert ax.figure is not None
        matplotlib.pyplot.close(ax.figure)


def test_shuffle_down_leaves_the_total_in_lane_0_only():
    vals = np.arange(1, 33, dtype=float)
    last = viz.shuffle_down_rounds(vals)[-1]
    assert last[0] == vals.sum()
    assert all(last[1:] != vals.sum())


def test_block_model_gives_every_warp_its_row_total():
    totals = np.array([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]])
    buffer, result = viz.block_reduce_model(totals)
    np.testing.assert_array_equal(buffer, totals)
    np.testing.assert_array_equal(result, [[10.0] * 4, [26.0] * 4])


def test_block_reduction_figure_draws():
    ax = viz.plot_block_reduction(rows=2, warps_per_row=4)
    assert ax.figure is not None
    matplotlib.pyplot.close(ax.figure)
