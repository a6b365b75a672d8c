"""Row reductions, in the order of the memory hierarchy: warp -> block -> cluster -> row.

Every level starts from a value that each thread already reduced over its own registers
(``TensorSSA.reduce``) and hands back the row's total to *every* thread of the row, so the
epilogue needs no broadcast. Reductions run in fp32.

Who shares a row is fixed by the thread layout of the vectorized stages: a row is
``threads_per_row`` consecutive threads of a CTA (``tidx // threads_per_row`` is the row
inside the CTA), and with a cluster the same row continues in the ``cluster_n`` CTAs of the
cluster. ``threads_per_row`` is a power of two; below 32 a warp holds several rows.

Shared-memory buffer contract (Float32, one slot per (row, warp of the row, CTA of the cluster)):

    block_reduce:    (rows_per_cta, warps_per_row)
    cluster_reduce:  (rows_per_cta, (warps_per_row, cluster_n))    plus one mbarrier (Int64)

with ``rows_per_cta = num_threads // threads_per_row`` and
``warps_per_row = max(1, threads_per_row // 32)``. Each slot is written exactly once (block:
lane 0 of each warp; cluster: one remote store from each CTA), which is what makes the cluster's
transaction-byte count exact: ``cute.cosize(buffer.layout) * 4`` bytes land in every CTA.
"""

from __future__ import annotations

import operator
from collections.abc import Callable

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int32
from cutlass._mlir.dialects import llvm
from cutlass.cutlass_dsl import dsl_user_op

WARP = 32


def warp_reduce(val, op: Callable, width: int = WARP):
    """Butterfly reduction over aligned groups of ``width`` lanes (a power of two, <= 32).

    Round ``i`` adds the value of the lane whose index differs in bit ``i``; after log2(width)
    rounds every lane of the group holds the group's total (``shfl.sync.bfly``: registers to
    registers, no shared memory). The per-lane result is bit-identical across the group because
    each round combines the same two partial sums, only in swapped order.
    """
    for i in range(int(width).bit_length() - 1):
        val = op(val, cute.arch.shuffle_sync_bfly(val, offset=1 << i))
    return val


@dsl_user_op
def f32_bits(val, *, loc=None, ip=None) -> Int32:
    """The bits of a Float32 as an Int32 (``st.async`` stores 32-bit integers)."""
    return Int32(
        llvm.bitcast(Int32.mlir_type, Float32(val).ir_value(loc=loc, ip=ip), loc=loc, ip=ip)
    )


def _row_lane(threads_per_row: int):
    """(row of this thread inside the CTA, warp of the row it sits in, lane inside its group)."""
    tidx, _, _ = cute.arch.thread_idx()
    group = min(threads_per_row, WARP)
    return tidx // threads_per_row, (tidx % threads_per_row) // WARP, tidx % group


@cute.jit
def combine_buffer(
    buffer: cute.Tensor, op: Callable, threads_per_row: cutlass.Constexpr[int]
) -> Float32:
    """Reduce this thread's row of ``buffer`` (rows, entries) and give the result to every lane.

    Each lane folds the entries ``lane, lane + 32, ...`` of its row; when a row has fewer than 32
    entries, the lanes of a group read them modulo the entry count so every aligned sub-group
    holds a full copy, and the butterfly only needs log2(entries) rounds.
    """
    row, _, lane = _row_lane(threads_per_row)
    entries = cute.size(buffer, mode=[1])
    group = min(threads_per_row, WARP)
    if cutlass.const_expr(entries <= group):
        val = buffer[row, lane % entries]
        return warp_reduce(val, op, width=entries)
    val = buffer[row, lane]
    for i in cutlass.range_constexpr(1, entries // WARP):
        val = op(val, buffer[row, lane + i * WARP])
    return warp_reduce(val, op, width=WARP)


@cute.jit
def block_reduce(val: Float32, op: Callable, buffer: cute.Tensor) -> Float32:
    """Second level: the warps of a row meet through shared memory.

    ``buffer``: Float32, shape (rows_per_cta, warps_per_row) with warps_per_row >= 2, i.e. a row
    spans whole warps (threads_per_row = 32 * warps_per_row). ``val`` must already be the warp's
    total (``warp_reduce``). Lane 0 of each warp writes its slot, one ``bar.sync`` makes the
    slots visible, then every warp of the row re-reduces the row's slots itself (no second
    barrier, no broadcast step).
    """
    warps_per_row = cute.size(buffer, mode=[1])
    threads_per_row = warps_per_row * WARP
    row, warp_in_row, lane = _row_lane(threads_per_row)
    if lane == 0:
        buffer[row, warp_in_row] = val
    cute.arch.barrier()
    return combine_buffer(buffer, op, threads_per_row)


@cute.jit
def cluster_send(
    val: Float32,
    buffer: cute.Tensor,
    mbar_ptr: cute.Pointer,
    threads_per_row: cutlass.Constexpr[int],
):
    """Send this row group's partial to every CTA of the cluster (the DSMEM step).

    ``buffer``: Float32, (rows_per_cta, (warps_per_row, cluster_n)); the same slot in each CTA,
    ``[row, (warp_in_row, my_rank)]``, receives this warp's value. Lane ``p`` of the group stores
    into CTA ``p`` (``mapa`` + ``st.async ... mbarrier::complete_tx::bytes``): cluster_n lanes,
    one instruction, and each store credits 4 bytes to the *receiving* CTA's mbarrier.
    Every group sends, whether or not its row is inside M, so the byte count always adds up.
    """
    cluster_n = cute.size(buffer, mode=[1, 1])
    rank = cute.arch.block_idx_in_cluster()
    row, warp_in_row, lane = _row_lane(threads_per_row)
    if lane < cluster_n:
        slot = buffer.iterator + cute.crd2idx((row, (warp_in_row, rank)), buffer.layout)
        cute.arch.store_async_dsmem(slot, f32_bits(val), mbar_ptr, lane)


@cute.jit
def cluster_reduce(
    val: Float32,
    op: Callable,
    buffer: cute.Tensor,
    mbar_ptr: cute.Pointer,
    threads_per_row: cutlass.Constexpr[int] = 0,
    send: cutlass.Constexpr = None,
) -> Float32:
    """Third level: the CTAs of a cluster meet through distributed shared memory.

    ``buffer``: Float32, (rows_per_cta, (warps_per_row, cluster_n)). ``mbar_ptr``: this CTA's
    mbarrier, initialised with arrival count 1, armed (``mbarrier_arrive_and_expect_tx``) with
    the bytes that will land in ``buffer`` (``rows_per_cta * warps_per_row * cluster_n * 4``),
    and followed by a cluster barrier (a peer must never store into an uninitialised
    mbarrier). ``val``: the warp's total. ``threads_per_row`` (default 32 * warps_per_row)
    places rows narrower than a warp. ``send(val, buffer, mbar_ptr)`` replaces
    ``cluster_send`` (a stage passes its own, overridable, exchange).

    Returns the row total in every thread. The caller still owes a cluster arrive/wait before
    it exits (see the cluster stage): that is what keeps a CTA's shared memory alive while a
    peer may still address it.
    """
    warps_per_row = cute.size(buffer, mode=[1, 0])
    tpr = threads_per_row if cutlass.const_expr(threads_per_row > 0) else warps_per_row * WARP
    if cutlass.const_expr(send is None):
        cluster_send(val, buffer, mbar_ptr, tpr)
    else:
        send(val, buffer, mbar_ptr)
    cute.arch.mbarrier_wait(mbar_ptr, phase=0)
    return combine_buffer(buffer, op, tpr)


@cute.jit
def row_reduce(
    val: Float32,
    op: Callable,
    threads_per_row: cutlass.Constexpr[int],
    buffer: cute.Tensor | None = None,
    mbar_ptr: cute.Pointer | None = None,
    send: cutlass.Constexpr = None,
    hook_fn: cutlass.Constexpr = None,
) -> Float32:
    """Reduce a per-thread value over its whole row, using only the levels the layout needs.

    warp always (width ``min(threads_per_row, 32)``); then the cluster level if ``mbar_ptr`` is
    given (it also combines the warps of the CTA), else the block level if a row spans several
    warps. ``buffer`` follows the contract in the module docstring: (rows_per_cta,
    (warps_per_row, cluster_n)), or (rows_per_cta, warps_per_row) without a cluster; None
    when threads_per_row <= 32 and there is no cluster. ``hook_fn()`` runs between the warp
    level and the rest: the cluster stages put their ``cluster_wait`` there, so the wait for
    the peers' barriers overlaps the loads and the shuffles. ``send``: see ``cluster_reduce``.
    """
    val = warp_reduce(val, op, width=min(threads_per_row, WARP))
    if cutlass.const_expr(hook_fn is not None):
        hook_fn()
    if cutlass.const_expr(mbar_ptr is not None):
        val = cluster_reduce(val, op, buffer, mbar_ptr, threads_per_row, send)
    elif cutlass.const_expr(threads_per_row > WARP):
        val = block_reduce(val, op, buffer)
    return val


#: the reduction op of a sum of squares, named for readability at call sites
ADD = operator.add

__all__ = [
    "warp_reduce",
    "block_reduce",
    "cluster_send",
    "cluster_reduce",
    "combine_buffer",
    "row_reduce",
    "f32_bits",
    "ADD",
]
