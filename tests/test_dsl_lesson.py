"""Lesson 01b's helpers and the references of its exercises, checked against the DSL (CPU)."""

import cutlass
import cutlass.cute as cute
import pytest

from quack_edu.grading.exercises import lesson01b as L
from quack_edu.lessons.dsl import layout_grid, layout_offsets
from quack_edu.tools.inspect import tv_coords

LAYOUTS = [
    ((4, 8), (8, 1)),
    ((4, 8), (1, 4)),
    ((4, (2, 4)), (2, (1, 8))),
    (((2, 2), 4), ((1, 8), 2)),
    ((3, 5), (0, 7)),
]


def _dsl_offsets_by_index(shape, stride) -> list[int]:
    out = []

    @cute.jit
    def trace():
        _collect(cute.make_layout(shape, stride=stride), out)

    cute.compile(trace)
    return out


def _collect(layout, out):
    out.extend(int(layout(i)) for i in range(cute.size(layout)))


@pytest.mark.parametrize("shape,stride", LAYOUTS)
def test_layout_reference_is_the_dsls(shape, stride):
    by_index = _dsl_offsets_by_index(shape, stride)
    assert by_index == [L.layout_offset_ref(shape, stride, i) for i in range(len(by_index))]
    if all(isinstance(s, int) for s in shape):
        for (r, c), off in layout_offsets(shape, stride).items():
            assert L.layout_offset_ref(shape, stride, (r, c)) == off


def test_layout_grid_prints_rows():
    grid = layout_grid((2, 4), (1, 2)).splitlines()
    assert grid[0] == "layout (2, 4):(1, 2)"
    assert grid[1].split() == ["0", "2", "4", "6"] and grid[2].split() == ["1", "3", "5", "7"]


@pytest.mark.parametrize(
    "thr_shape,thr_stride,vec",
    [((2, 4), (1, 2), 2), ((4, 8), (8, 1), 4), ((4, 2), (1, 4), 8), ((8, 4), (1, 8), 1)],
)
def test_thread_elements_reference_is_the_dsls(thr_shape, thr_stride, vec):
    def make():
        atom = cute.make_copy_atom(
            cute.nvgpu.CopyUniversalOp(), cutlass.BFloat16, num_bits_per_copy=16 * vec
        )
        return cute.make_tiled_copy_tv(
            atom, cute.make_layout(thr_shape, stride=thr_stride), cute.make_layout((1, vec))
        )

    tv = tv_coords(make)
    for t, coords in tv["coords"].items():
        assert coords == L.thread_elements_ref(t, thr_shape, thr_stride, vec)
    # the known wrong versions differ from it here (the hints are reachable)
    if thr_stride[0] == 1 and thr_shape[0] > 1:
        t = 1
        assert (
            L.thread_elements_ref(t, thr_shape, thr_stride, vec, thread_order="rm")
            != (tv["coords"][t])
        )
