"""Host-side tile arithmetic shared by the vectorized stages (pure Python, no DSL).

Given N, the dtype of x and a ``RowConfig``, ``RowTiling`` says how many 16-byte vectors each
thread moves, how wide a CTA's tile is, how many chunks a row takes and how many bytes of
shared memory the kernel needs. Kernels read it at trace time (all of it is compile-time
constant) and ``launch_shape`` reports it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config import RowConfig, RowShape, vector_elems
from ..runtime import cute_dtype


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class RowTiling(RowShape):
    N: int
    elem_bytes: int  # bytes of one element of x
    vec: int  # elements of x in one 16-byte vector
    threads_per_row: int
    num_threads: int
    cluster_n: int
    vecs: int  # vectors one thread holds per pass (per chunk)
    chunks: int  # passes over the row per CTA (1: the row share fits at once)

    @classmethod
    def make(cls, N: int, dtype, config: RowConfig, vec: int | None = None) -> RowTiling:
        """``vec``: elements per access (default: a 16-byte vector of ``dtype``; the final
        stage narrows it where N, a stride or a pointer is not 16-byte aligned)."""
        vec = vec or vector_elems(dtype)
        row_vecs = ceil_div(N, vec)
        cta_vecs = ceil_div(row_vecs, config.cluster_n)  # this CTA's share of a row
        needed = ceil_div(cta_vecs, config.threads_per_row)  # per thread, in one pass
        vecs = min(needed, config.max_vecs)
        return cls(
            N=N,
            elem_bytes=cute_dtype(dtype).width // 8,
            vec=vec,
            threads_per_row=config.threads_per_row,
            num_threads=config.num_threads,
            cluster_n=config.cluster_n,
            vecs=vecs,
            chunks=ceil_div(needed, vecs),
        )

    @property
    def tile_cols(self) -> int:
        """Columns of one CTA tile (one chunk)."""
        return self.threads_per_row * self.vec * self.vecs

    @property
    def tiler(self) -> tuple[int, int]:
        return (self.rows_per_cta, self.tile_cols)

    @property
    def tiles_per_row(self) -> int:
        return ceil_div(self.N, self.tile_cols)

    @property
    def even_cols(self) -> bool:
        """True when the tiles cover exactly N columns: no column predicate needed."""
        return self.N == self.tile_cols * self.chunks * self.cluster_n

    @property
    def fits_in_one_pass(self) -> bool:
        return self.chunks == 1

    @property
    def busy_lanes(self) -> int:
        """Threads of a row that own at least one vector of the row (the rest idle)."""
        return min(self.threads_per_row, ceil_div(ceil_div(self.N, self.vec), self.cluster_n))

    # -- shared memory -------------------------------------------------------------------------
    def reduction_buffer_shape(self) -> tuple:
        """(rows_per_cta, (warps_per_row, cluster_n)): the contract of primitives.reduce."""
        return (self.rows_per_cta, (self.warps_per_row, self.cluster_n))

    def reduction_buffer_bytes(self) -> int:
        return self.rows_per_cta * self.warps_per_row * self.cluster_n * 4

    def x_tile_bytes(self) -> int:
        return self.rows_per_cta * self.tile_cols * self.elem_bytes


__all__ = ["RowTiling", "ceil_div"]
