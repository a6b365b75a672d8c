import matplotlib
import numpy as np
import pytest
from matplotlib.text import Annotation

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


def _labels(ax) -> dict:
    """{(x, y): text} of the texts a figure writes (its arrows, texts with no words, left out)."""
    return {t.get_position(): t.get_text() for t in ax.texts if not isinstance(t, Annotation)}


def _arrows(ax) -> set:
    return {(tuple(a.xyann), tuple(a.xy)) for a in ax.texts if isinstance(a, Annotation)}


def test_butterfly_figure_draws_the_models_rounds():
    ax = viz.plot_butterfly(width=8)
    hist = viz.butterfly_rounds(np.arange(1, 9), 8, [4, 2, 1])
    want = {(r, lane): f"{v[lane]:g}" for r, v in enumerate(hist) for lane in range(8)}
    assert _labels(ax) == want and {want[(3, lane)] for lane in range(8)} == {"36"}
    # round r's arrow into lane i comes from its partner lane i ^ offset
    partners = {((r, i ^ off), (r + 1, i)) for r, off in enumerate([4, 2, 1]) for i in range(8)}
    assert _arrows(ax) == partners
    assert [t.get_text() for t in ax.get_xticklabels()] == ["start", "xor 4", "xor 2", "xor 1"]
    matplotlib.pyplot.close(ax.figure)


def test_tv_layout_figure_colours_each_element_by_its_owner():
    ax = viz.plot_tv_layout(threads_per_row=4, rows=2, vec=8, cols=64)
    np.testing.assert_array_equal(ax.images[0].get_array(), viz.row_tv_owner(4, 2, 8, 64))
    drawn = _labels(ax)
    # column 8 of row 0: thread 1's first value; column 32 of row 1: thread 4's ninth (its
    # second vector, one span of 4 x 8 columns on)
    assert drawn[(8, 0)] == "T1\n0" and drawn[(32, 1)] == "T4\n8" and drawn[(63, 1)] == "T7\n15"
    matplotlib.pyplot.close(ax.figure)


def test_timeline_figure_draws_the_models_bars():
    ax = viz.plot_timeline(stages=4, load_us=1.0, reduce_us=0.3)
    rows, total = viz.pipeline_timeline(4, 1.0, 0.3)
    bars = [[p.get_x(), p.get_width()] for p in ax.patches]  # a load, then its reduce
    want = [b for _, ls, le, rs, re in rows for b in ([ls, le - ls], [rs, re - rs])]
    np.testing.assert_allclose(bars, want)
    assert "4.3 us vs 5.2 us" in ax.get_title()
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


def test_block_reduction_figure_shows_each_warps_slot_and_row_total():
    ax = viz.plot_block_reduction(rows=2, warps_per_row=4)
    texts = list(_labels(ax).values())
    totals = [float(t.rsplit("-> ", 1)[1]) for t in texts if "butterfly ->" in t]
    slots = [float(t) for t in texts if t.replace(".", "").isdigit()]
    results = [float(t.rsplit("= ", 1)[1]) for t in texts if "sum of row" in t]
    assert len(totals) == 8 and slots == totals  # each warp's total in its own slot
    rows = np.reshape(totals, (2, 4)).sum(axis=1)
    assert results == [rows[0]] * 4 + [rows[1]] * 4  # every warp ends with its row's sum
    assert "(2 rows_per_cta, 4 warps_per_row)" in " ".join(texts)
    matplotlib.pyplot.close(ax.figure)
