"""PTX types as NumPy dtypes, literal operands, and the simulator's errors.

A register holds raw bits (an unsigned integer array of its declared width, ``bool`` for a
predicate); ``as_type`` views them as the type an instruction names.
"""

from __future__ import annotations

import re

import numpy as np

UINT = {8: np.uint8, 16: np.uint16, 32: np.uint32, 64: np.uint64}
SINT = {8: np.int8, 16: np.int16, 32: np.int32, 64: np.int64}
#: the NumPy dtype a PTX type is computed in (bf16 has none: its bits, converted by hand)
TYPED = {
    "pred": np.bool_,
    "b8": np.uint8,
    "u8": np.uint8,
    "s8": np.int8,
    "b16": np.uint16,
    "u16": np.uint16,
    "s16": np.int16,
    "f16": np.float16,
    "bf16": np.uint16,
    "b32": np.uint32,
    "u32": np.uint32,
    "s32": np.int32,
    "f32": np.float32,
    "f16x2": np.uint32,
    "bf16x2": np.uint32,
    "b64": np.uint64,
    "u64": np.uint64,
    "s64": np.int64,
    "f64": np.float64,
}
WARP = 32
FLOAT_TYPES = {"f16", "f32", "f64"}


class SimError(RuntimeError):
    """The kernel did something the simulator refuses: an access out of bounds, a shuffle
    between lanes at different instructions, a branch to nowhere."""


class UnsupportedInstruction(SimError):
    """An instruction (or a form of it) the simulator does not implement."""


class MemoryFault(SimError):
    """An access outside every buffer of its memory (global: the launch's tensors; shared: the
    CTA's static and dynamic shared memory), or misaligned for its width: on a GPU, an illegal
    address or another tensor's bytes."""


class OrderingError(SimError):
    """What the ordering checks find (``order``): a kernel that may compute right values in
    the order simulated, and wrong ones (or none) in another a GPU may choose."""


class Race(OrderingError):
    """A read of shared or distributed shared memory that no barrier orders after the write it
    reads (or a read of bytes a ``cp.async`` is still writing): names both instructions."""


class Hang(OrderingError):
    """No thread can go on: every thread not finished waits (a bar.sync, a cluster barrier, an
    mbarrier phase that never completes); names the instructions they wait at."""


class PartialBarrier(OrderingError):
    """A ``bar.sync`` released with only part of the CTA at it: the others exited or wait at
    another barrier (a barrier under a branch that depends on the row or the thread)."""


class DivergentShuffle(OrderingError):
    """A ``shfl.sync`` that a lane its member mask names does not reach with the others (it took
    the other side of a branch, exited, or waits elsewhere): on a GPU, undefined values or a
    hang. Names the lane, its warp and the instruction."""


class StepLimit(SimError):
    """The launch ran out of its step budget (``launch(max_steps=...)``): an endless loop, or
    more work than the budget allows."""


def width_of(typ: str) -> int:
    """Bits of a PTX type ("f32" -> 32, "pred" -> 1)."""
    return 1 if typ == "pred" else np.dtype(TYPED[typ]).itemsize * 8


def as_type(value, typ: str):
    """Raw bits (or a special register's uint32) viewed as ``typ``: reinterpreted when the
    widths match, zero-extended or truncated first when they do not."""
    dtype = TYPED[typ]
    value = np.asarray(value)
    if value.dtype == np.bool_ or typ == "pred":
        return value.astype(dtype)
    width = width_of(typ)
    if value.dtype.itemsize * 8 != width:
        value = value.astype(UINT[value.dtype.itemsize * 8]).astype(UINT[width])
    return value.view(dtype)


_INT = re.compile(r"^-?(0[xX][0-9a-fA-F]+|0[0-7]*|[1-9]\d*)U?$")


def immediate(text: str, typ: str, ins):
    """A literal operand as a NumPy scalar of ``typ``: 12, -1, 0x1F, 0f3F800000 (f32 bits),
    0d3FF0000000000000 (f64 bits)."""
    if text[:2] in ("0f", "0F") and len(text) == 10:
        value = np.array(int(text[2:], 16), np.uint32).view(np.float32)[()]
    elif text[:2] in ("0d", "0D") and len(text) == 18:
        value = np.array(int(text[2:], 16), np.uint64).view(np.float64)[()]
    elif _INT.match(text):
        digits = text.rstrip("U")
        neg = digits.startswith("-")
        digits = digits.lstrip("-")
        base = 16 if digits[:2].lower() == "0x" else 8 if digits[:1] == "0" else 10
        value = int(digits, base) * (-1 if neg else 1)
        if typ == "pred":
            return np.bool_(value != 0)
        if typ in FLOAT_TYPES:
            return TYPED[typ](value)
        width = width_of(typ)
        return np.array(value & ((1 << width) - 1), UINT[width]).view(TYPED[typ])[()]
    else:
        raise SimError(f"cannot read the operand {text!r} ({ins.where()})")
    if typ in FLOAT_TYPES:
        return TYPED[typ](value)
    return np.asarray(value).view(UINT[np.asarray(value).itemsize * 8]).astype(TYPED[typ])[()]
