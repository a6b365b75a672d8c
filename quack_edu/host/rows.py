"""How the kernels read a tensor's rows in place: one row mode (M, N), or two (M, H, N).

A row's elements are contiguous (last stride 1); the rows themselves may sit anywhere. The
kernels take rows with one stride, ``(M, N)``, or with two, ``(M, H, N)`` (one grid z a head):
a view of a fused projection's heads, ``qkv.view(B, S, 3, H, D).unbind(2)``, has rows (b, s, h)
at ``b * S*3*H*D + s * 3*H*D + h * D``: b and s merge into one mode, h is the second. Row
order does not matter to a norm, so dims are taken by decreasing stride first: a transposed
head view ``(B, H, S, D)`` of a contiguous ``(B, S, H, D)`` is one mode again.

``layout(x)`` says how (None: more than two modes, or rows that overlap; the caller copies).
Outputs are made dense in x's own order (``RowLayout.empty``), so they take the same view:
what ``torch.empty_like`` gives a dense x, and for a view with gaps (the unbind's) the
contiguous tensor in x's dim order.
"""

from __future__ import annotations

import torch

#: (shape, strides) -> RowLayout or None: a model calls a few shapes, each many times
_LAYOUTS: dict = {}


class RowLayout:
    """x's rows as a view: ``view(t)`` is ``t.permute(perm).view(rows)`` for x and for every
    tensor made by ``empty`` (or laid out as x), ``view_rows(t)`` the same for a tensor of
    x.shape[:-1] (rstd)."""

    __slots__ = ("perm", "rows", "strides", "row_strides")

    def __init__(self, perm, rows, strides, row_strides):
        #: the dims in x's stride order (None: as they are); rows: (M, N) or (M, H, N)
        self.perm, self.rows = perm, rows
        #: the strides of a dense tensor of x's shape in that order, and of x.shape[:-1]'s
        self.strides, self.row_strides = strides, row_strides

    def view(self, t):
        if self.perm is not None:
            t = t.permute(self.perm)
        return t.view(self.rows)

    def view_rows(self, t):
        if self.perm is not None:
            t = t.permute(self.perm[:-1])
        return t.view(self.rows[:-1])

    def unview(self, t, shape):
        """The inverse of ``view`` (of ``view_rows`` where ``shape`` is x.shape[:-1]): ``t``
        as a tensor of ``shape`` in x's dim order."""
        if self.perm is None:
            return t.view(shape)
        perm = self.perm if len(shape) == len(self.perm) else self.perm[:-1]
        inverse = [0] * len(perm)
        for i, d in enumerate(perm):
            inverse[d] = i
        return t.view([shape[d] for d in perm]).permute(inverse)

    def empty(self, x, dtype=None):
        """A tensor of x's shape, dense in x's dim order (so ``view`` takes it)."""
        return torch.empty_strided(x.shape, self.strides, dtype=dtype or x.dtype, device=x.device)

    def empty_rows(self, x):
        """rstd's tensor: fp32, x.shape[:-1], dense in x's dim order."""
        return torch.empty_strided(
            x.shape[:-1], self.row_strides, dtype=torch.float32, device=x.device
        )

    def like(self, t, x):
        """``view(t)`` of ``t`` (x's shape), or of its copy dense in x's order where its
        strides do not allow it (a gradient laid out otherwise)."""
        try:
            return self.view(t)
        except RuntimeError:
            return self.view(self.empty(x, t.dtype).copy_(t))

    def like_rows(self, t, x):
        """``view_rows(t)`` of ``t`` (x.shape[:-1]: rstd), or of its dense copy."""
        if t.stride() != self.row_strides:
            t = self.empty_rows(x).copy_(t)
        return self.view_rows(t)


def _dense_strides(shape, order) -> tuple:
    """Strides of a dense tensor of ``shape`` whose dims, outermost first, are ``order``."""
    strides = [0] * len(shape)
    step = 1
    for d in reversed(order):
        strides[d] = step
        step *= max(1, shape[d])
    return tuple(strides)


def in_place(x, *params) -> RowLayout | None:
    """``layout(x)`` where a strided x's rows are read in place by the library's forward and
    backward: None for a contiguous x (its plain rows), or one with a per-head parameter
    (``params``: the weight, the bias; (H, D) ones keep their own (M, H, D) view), or rows no
    view reaches (then flattened, a copy)."""
    if x.dim() < 2 or x.is_contiguous():
        return None
    if any(p is not None and p.dim() == 2 for p in params):
        return None
    return layout(x)


def layout(x) -> RowLayout | None:
    """How x's rows are read in place (x: ``(..., N)``, last stride 1), or None."""
    key = (x.shape, x.stride())
    got = _LAYOUTS.get(key, False)
    if got is False:
        got = _LAYOUTS[key] = _find(x.shape, x.stride())
    return got


def _find(shape, stride) -> RowLayout | None:
    nd = len(shape)
    if nd == 0 or stride[-1] != 1 and shape[-1] > 1:
        return None
    N = shape[-1]
    # row dims by decreasing stride (ties: as they are); dims of one element do not count
    order = sorted(range(nd - 1), key=lambda d: -stride[d])
    modes: list[list[int]] = []  # [size, stride] of each merged mode, outermost first
    for d in order:
        if shape[d] == 1:
            continue
        if modes and modes[-1][1] == shape[d] * stride[d]:
            modes[-1] = [modes[-1][0] * shape[d], stride[d]]
        else:
            modes.append([shape[d], stride[d]])
    if len(modes) > 2:
        return None
    # overlapping rows (a stride under the row's length, or a mode inside the next's span)
    # are not rows a kernel may write
    if modes and modes[-1][1] < N:
        return None
    if len(modes) == 2 and modes[0][1] < modes[1][0] * modes[1][1]:
        return None
    perm = (*order, nd - 1)
    if perm == tuple(range(nd)):
        perm = None
    rows = (-1, N) if len(modes) < 2 else (-1, modes[1][0], N)
    strides = _dense_strides(shape, (*order, nd - 1))
    row_strides = _dense_strides(shape[:-1], order)
    return RowLayout(perm, rows, strides, row_strides)
