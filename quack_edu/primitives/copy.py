"""Moving rows between global memory, shared memory and registers in 16-byte vectors.

The vectorized stages all place a CTA's tile of rows on threads the same way (a TV layout):

    thread layout (rows_per_cta, threads_per_row), row-major: thread t -> row t // tpr
    value layout  (1, vec): each thread moves ``vec`` contiguous elements (16 bytes of x)

so one copy instruction of a warp covers 32 x 16 = 512 contiguous bytes of a row (four full
128-byte lines), and a thread's next vector of the same row sits ``threads_per_row * vec``
elements further on. Tiling a CTA tile of (rows_per_cta, tpr * vec * vecs) with that TV layout
gives each thread a partition of shape ``((vec, 1), 1, vecs)``: (values of one access, rows,
vectors along the row).

Nothing here reads out of bounds: the column predicate (``predicate_cols``) switches off whole
vectors past N (N is a multiple of the vector, so a vector is all in or all out), and the
kernels skip rows past M with an ``if``.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Boolean, Int64
from cutlass.cute.nvgpu import cpasync

#: bits per access: LDG.128 / STG.128 / LDGSTS.128, the widest a thread can issue
COPY_BITS = 128


def row_thread_layout(threads_per_row: int, num_threads: int) -> cute.Layout:
    """(rows_per_cta, threads_per_row) -> thread index, row-major: a row's threads are adjacent."""
    return cute.make_ordered_layout((num_threads // threads_per_row, threads_per_row), order=(1, 0))


def row_tiled_copy(
    dtype, threads_per_row: int, num_threads: int, vec: int, op=None, **atom_attrs
) -> cute.TiledCopy:
    """The tiled copy of the TV layout above for ``dtype``.

    ``vec`` counts elements of x per access. A tensor of a wider type on the same columns (an
    fp32 weight next to a bf16 x) moves the same ``vec`` elements in several 128-bit atoms,
    so its partition keeps the same coordinates as x's: ((atom_vals, atoms), 1, vecs).
    ``op`` defaults to a plain vectorized load/store (``CopyUniversalOp``); ``atom_attrs``
    go to the atom (e.g. ``invariant=True`` with ``CopyG2ROp``).
    """
    bits = min(COPY_BITS, vec * dtype.width)
    atom = cute.make_copy_atom(
        op if op is not None else cute.nvgpu.CopyUniversalOp(),
        dtype,
        num_bits_per_copy=bits,
        **atom_attrs,
    )
    return cute.make_tiled_copy_tv(
        atom, row_thread_layout(threads_per_row, num_threads), cute.make_layout((1, vec))
    )


def tiled_copy_from_atom(atom: cute.CopyAtom, threads_per_row: int, num_threads: int, vec: int):
    """The same TV layout as ``row_tiled_copy``, around a given atom (e.g. a cp.async one)."""
    return cute.make_tiled_copy_tv(
        atom, row_thread_layout(threads_per_row, num_threads), cute.make_layout((1, vec))
    )


def g2s_atom(dtype, cache_mode=cpasync.LoadCacheMode.GLOBAL, bits: int = COPY_BITS):
    """A ``cp.async`` of ``bits`` (global -> shared, no register round trip).

    ``LoadCacheMode.GLOBAL`` is ``.cg``: cache in L2 only. A row is read once, so keeping it
    out of L1 loses nothing, and 16 bytes is the only size ``.cg`` accepts; narrower copies
    (4 or 8 bytes) need ``.ca`` (``LoadCacheMode.ALWAYS``).
    """
    if bits < COPY_BITS:
        cache_mode = cpasync.LoadCacheMode.ALWAYS
    op = cpasync.CopyG2SOp(cache_mode=cache_mode)
    return cute.make_copy_atom(op, dtype, num_bits_per_copy=bits)


def broadcast_rows(mW: cute.Tensor, rows: int) -> cute.Tensor:
    """View the (N,) weight as (rows, N) with row stride 0, so it tiles like a block of x."""
    return cute.make_tensor(
        mW.iterator, cute.prepend(mW.layout, cute.make_layout((rows,), stride=(0,)))
    )


@cute.jit
def predicate_cols(tAcA: cute.Tensor, limit: cutlass.Constexpr[int]) -> cute.Tensor:
    """One Boolean per atom of a thread's partition: is the atom's first column < ``limit``?

    ``tAcA``: the thread's partition of an identity (coordinate) tensor, ((atom_vals, atoms),
    rows, vecs). Returns shape (atoms, rows, vecs), the profile ``cute.copy`` wants for ``pred``;
    the row mode has stride 0 (a thread works on a single row; rows are guarded by an ``if``).
    """
    tApA = cute.make_rmem_tensor(
        cute.make_layout(
            (cute.size(tAcA, mode=[0, 1]), cute.size(tAcA, mode=[1]), cute.size(tAcA, mode=[2])),
            stride=(cute.size(tAcA, mode=[2]), 0, 1),
        ),
        Boolean,
    )
    for a in cutlass.range_constexpr(cute.size(tApA, mode=[0])):
        for k in cutlass.range_constexpr(cute.size(tApA, mode=[2])):
            tApA[a, 0, k] = cute.elem_less(tAcA[(0, a), 0, k][1], limit)
    return tApA


__all__ = [
    "COPY_BITS",
    "row_thread_layout",
    "row_tiled_copy",
    "tiled_copy_from_atom",
    "g2s_atom",
    "broadcast_rows",
    "predicate_cols",
]


@cute.jit
def opaque_registers(t: cute.Tensor):
    """Pass every 32-bit register of the register tensor ``t`` through an opaque ``mov``.

    The values do not change; what changes is what the compiler can prove. A kernel that
    widens x to fp32 for the sum of squares and widens it again for the scaling pass wrote two
    identical conversions, and the compiler merges them: the fp32 copy (8 registers per
    16-byte vector of bf16) then stays alive across everything in between. After this call
    the second widening reads values the compiler cannot match with the first, so only the
    packed x (4 registers per vector) is held, and it is widened again where it is used.
    """
    regs = cute.recast_tensor(t, cutlass.Uint32)
    for i in cutlass.range_constexpr(cute.size(regs)):
        regs[i] = cute.arch.inline_ptx(
            "mov.b32 {$w0}, {$r0};", write_only_types=[cutlass.Uint32], read_only_args=[regs[i]]
        )


def l2_evict_last() -> Int64:
    """An L2 cache policy (``createpolicy``) that marks every line an access with it brings in
    evict_last: such lines go after the others when L2 needs room."""
    return cute.arch.inline_ptx(
        "createpolicy.fractional.L2::evict_last.b64 {$w0}, 1.0;", write_only_types=[Int64]
    )


def cp_async_16(dst: cute.Tensor, src: cute.Tensor, policy: Int64) -> None:
    """One 16-byte ``cp.async.cg`` from ``src`` (global) to ``dst`` (shared) under the L2 cache
    policy ``policy`` (the DSL's cp.async atom takes no cache hint)."""
    cute.arch.inline_ptx(
        "cp.async.cg.shared.global.L2::cache_hint [{$r0}], [{$r1}], 16, {$r2};",
        read_only_args=[dst.iterator, src.iterator, policy],
    )


def store_as(tiled: cute.TiledCopy, value, like: cute.Tensor, dst: cute.Tensor) -> None:
    """Store one fp32 vector ``value`` to ``dst`` (global) in dst's dtype: converted into a
    register tensor of x's vector shape (``like``), then copied in dst's atoms."""
    r = cute.make_rmem_tensor_like(like, dst.element_type)
    r.store(value.to(dst.element_type))
    cute.copy(tiled, _like(r, dst), dst)


def _like(r: cute.Tensor, dst: cute.Tensor) -> cute.Tensor:
    """Register vector ``r`` (x's shape, ((vec, 1), 1)) viewed in the shape of ``dst``'s
    partition, e.g. ((4, 2), 1) for an fp32 vector: two 16-byte atoms, elements in order."""
    return cute.make_tensor(r.iterator, cute.make_layout(dst.shape))
