"""What each PTX instruction does, over the threads of a CTA (``executor.CTA``).

A handler is ``handler(cta, ins, mask)``: ``mask`` holds the threads that execute ``ins`` (at its
address, guard predicate true). ``HANDLERS`` maps the opcode's first word to its handler; a form
a handler does not implement (a rounding mode, a type) raises ``UnsupportedInstruction`` naming
the PTX line.

Arithmetic. Integers wrap as PTX's do (NumPy's fixed-width arrays). fp32 is computed in
``float32``, so ``add``/``sub``/``mul``/``div.rn``/``sqrt.rn`` round exactly as the GPU does.
``fma`` is computed in float64 and rounded once to float32: the product is exact there, the
sum rounds twice (off by one ulp in rare ties). The approximate instructions are computed
exactly then rounded (``rsqrt.approx`` = 1/sqrt in float32, ``div.approx``/``div.full``,
``rcp.approx``, ``ex2.approx``, ``lg2.approx``): the GPU's results differ from these by at most
2 ulp (PTX ISA: rsqrt.approx.f32 max relative error 2^-22.9), far below a bf16/fp16 output's
rounding and about 1e-7 relative in fp32. ``.ftz`` flushes subnormal inputs and results to
zero. Only round-to-nearest (``.rn``, the default) float arithmetic is implemented. The half
types (``.f16``, ``.bf16`` and the pairs ``.f16x2``, ``.bf16x2``, which NVVM emits for a product
of two 16-bit values rounded to 16 bits) have add, sub, mul, fma, min, max, neg, abs and scalar
setp, each half computed exactly in float64 and rounded to nearest even; any other instruction
on them is refused, never computed on their bits as integers.
"""

from __future__ import annotations

import numpy as np

from .parser import Address
from .values import (
    FLOAT_TYPES,
    SINT,
    TYPED,
    UINT,
    WARP,
    DivergentShuffle,
    SimError,
    UnsupportedInstruction,
    width_of,
)

#: qualifiers of ld/st that change nothing here (caching, ordering, scope)
_MEMORY_HINTS = {"nc", "ca", "cg", "cs", "lu", "cv", "wb", "wt", "volatile", "weak", "relaxed"}
_MEMORY_HINTS |= {"acquire", "release", "cta", "gpu", "sys", "cluster"}


def unsupported(ins, what: str = "") -> UnsupportedInstruction:
    detail = f" ({what})" if what else ""
    return UnsupportedInstruction(f"ptxsim does not support `{ins.opcode}`{detail}: {ins.where()}")


# ---- operands ------------------------------------------------------------------------------------
def _type(ins) -> str:
    """The instruction's operand type: its last opcode word."""
    typ = ins.parts[-1]
    if typ not in TYPED:
        raise unsupported(ins, f"type .{typ}")
    return typ


def _flush(x):
    """.ftz: subnormal floats become zero of the same sign."""
    tiny = np.finfo(x.dtype).tiny
    return np.where(np.abs(x) < tiny, np.copysign(np.zeros_like(x), x), x)


def _float_mods(ins, typ: str, allowed=("rn",)):
    """Check a float instruction's modifiers; return (ftz, sat)."""
    mods = set(ins.parts[1:-1])
    rounding = mods & {"rn", "rz", "rm", "rp"}
    if rounding - set(allowed):
        raise unsupported(ins, f"rounding .{rounding.pop()}")
    if typ not in ("f32", "f64"):
        raise unsupported(ins, f"float arithmetic on .{typ}")
    return "ftz" in mods, "sat" in mods


def _finish_float(value, typ, ftz, sat):
    value = np.asarray(value, TYPED[typ])
    if ftz:
        value = _flush(value)
    if sat:
        value = np.clip(np.nan_to_num(value, nan=0.0), 0, 1).astype(TYPED[typ])
    return value


# ---- integer and float arithmetic ----------------------------------------------------------------
def _binary(int_op, float_op=None):
    def handler(cta, ins, mask):
        typ = _type(ins)
        d, a, b = ins.operands
        x, y = cta.read(a, typ, ins), cta.read(b, typ, ins)
        if typ in FLOAT_TYPES:
            if float_op is None:
                raise unsupported(ins)
            ftz, sat = _float_mods(ins, typ)
            if ftz:
                x, y = _flush(np.asarray(x)), _flush(np.asarray(y))
            cta.write(d, _finish_float(float_op(x, y), typ, ftz, sat), typ, mask, ins)
        else:
            if len(ins.parts) > 2 and ins.parts[1] not in ("lo",):
                raise unsupported(ins)
            cta.write(d, int_op(x, y), typ, mask, ins)

    return handler


def _logic(op):
    def handler(cta, ins, mask):
        typ = _type(ins)
        d, a, b = ins.operands
        cta.write(d, op(cta.read(a, typ, ins), cta.read(b, typ, ins)), typ, mask, ins)

    return handler


def op_mul(cta, ins, mask):
    typ = _type(ins)
    mode = ins.parts[1] if len(ins.parts) == 3 and typ not in FLOAT_TYPES else "lo"
    d, a, b = ins.operands
    x, y = cta.read(a, typ, ins), cta.read(b, typ, ins)
    if typ in FLOAT_TYPES:
        ftz, sat = _float_mods(ins, typ)
        cta.write(d, _finish_float(np.multiply(x, y), typ, ftz, sat), typ, mask, ins)
    elif mode == "lo":
        cta.write(d, np.multiply(x, y), typ, mask, ins)
    elif mode in ("wide", "hi") and width_of(typ) <= 32:
        wide = (SINT if typ.startswith("s") else UINT)[2 * width_of(typ)]
        product = np.multiply(np.asarray(x).astype(wide), np.asarray(y).astype(wide))
        wide_typ = typ[0] + str(2 * width_of(typ))
        if mode == "wide":
            cta.write(d, product, wide_typ, mask, ins)
        else:
            cta.write(d, (product >> width_of(typ)).astype(TYPED[typ]), typ, mask, ins)
    else:
        raise unsupported(ins)


def op_mad(cta, ins, mask):
    typ = _type(ins)
    d, a, b, c = ins.operands
    if typ in FLOAT_TYPES:
        return op_fma(cta, ins, mask)
    mode = ins.parts[1]
    x, y = cta.read(a, typ, ins), cta.read(b, typ, ins)
    if mode == "lo":
        cta.write(d, np.multiply(x, y) + cta.read(c, typ, ins), typ, mask, ins)
    elif mode == "wide" and width_of(typ) <= 32:
        wide_typ = typ[0] + str(2 * width_of(typ))
        wide = TYPED[wide_typ]
        product = np.multiply(np.asarray(x).astype(wide), np.asarray(y).astype(wide))
        cta.write(d, product + cta.read(c, wide_typ, ins), wide_typ, mask, ins)
    else:
        raise unsupported(ins)


def op_fma(cta, ins, mask):
    typ = _type(ins)
    ftz, sat = _float_mods(ins, typ)
    d, a, b, c = ins.operands
    x, y, z = (np.asarray(cta.read(o, typ, ins)) for o in (a, b, c))
    if ftz:
        x, y, z = _flush(x), _flush(y), _flush(z)
    if typ == "f32":  # exact product in float64, one rounding of the sum (see the docstring)
        value = (x.astype(np.float64) * y.astype(np.float64) + z.astype(np.float64)).astype(
            np.float32
        )
    else:
        value = x * y + z
    cta.write(d, _finish_float(value, typ, ftz, sat), typ, mask, ins)


def op_div(cta, ins, mask):
    typ = _type(ins)
    d, a, b = ins.operands
    x, y = cta.read(a, typ, ins), cta.read(b, typ, ins)
    if typ in FLOAT_TYPES:
        ftz, sat = _float_mods(ins, typ, allowed=("rn",))
        cta.write(d, _finish_float(np.divide(x, y), typ, ftz, sat), typ, mask, ins)
        return
    cta.write(d, _int_divide(x, y)[0], typ, mask, ins)


def op_rem(cta, ins, mask):
    typ = _type(ins)
    d, a, b = ins.operands
    x, y = cta.read(a, typ, ins), cta.read(b, typ, ins)
    cta.write(d, _int_divide(x, y)[1], typ, mask, ins)


def _int_divide(x, y):
    """Quotient truncated toward zero and its remainder (C's), as PTX's div/rem; a divisor of
    zero (undefined in PTX) gives 0 here rather than a NumPy warning."""
    x, y = np.asarray(x), np.asarray(y)
    safe = np.where(y == 0, 1, y).astype(y.dtype)
    q = np.abs(x) // np.abs(safe) if x.dtype.kind == "i" else x // safe
    if x.dtype.kind == "i":
        q = np.where((x < 0) != (safe < 0), -q, q).astype(x.dtype)
    q = np.where(y == 0, 0, q).astype(x.dtype)
    return q, (x - q * safe).astype(x.dtype)


def _unary_float(fn):
    def handler(cta, ins, mask):
        typ = _type(ins)
        ftz, sat = _float_mods(ins, typ, allowed=("rn",))
        d, a = ins.operands
        x = np.asarray(cta.read(a, typ, ins))
        if ftz:
            x = _flush(x)
        cta.write(d, _finish_float(fn(x).astype(x.dtype), typ, ftz, sat), typ, mask, ins)

    return handler


def _neg_or_abs(fn):
    def handler(cta, ins, mask):
        typ = _type(ins)
        d, a = ins.operands
        x = np.asarray(cta.read(a, typ, ins))
        if typ in FLOAT_TYPES and "ftz" in ins.parts:
            x = _flush(x)
        cta.write(d, fn(x), typ, mask, ins)

    return handler


def op_not(cta, ins, mask):
    typ = _type(ins)
    d, a = ins.operands
    value = cta.read(a, typ, ins)
    cta.write(d, ~value if typ == "pred" else np.invert(value), typ, mask, ins)


def op_shift(cta, ins, mask):
    typ = _type(ins)
    d, a, b = ins.operands
    x = np.asarray(cta.read(a, typ, ins))
    if ins.parts[0] == "shr" and typ.startswith("b"):
        x = x.view(UINT[width_of(typ)])  # shr.b is a logical shift
    width = width_of(typ)
    n = np.asarray(cta.read(b, "u32", ins)).astype(np.int64)
    clamped = np.minimum(n, width - 1).astype(x.dtype)
    if ins.parts[0] == "shl":
        value = np.where(n >= width, 0, x << clamped)
    elif x.dtype.kind == "i":  # arithmetic: shifting by >= width fills with the sign
        value = x >> clamped
    else:
        value = np.where(n >= width, 0, x >> clamped)
    cta.write(d, value.astype(x.dtype), typ if x.dtype.kind == "i" else f"u{width}", mask, ins)


def op_minmax(cta, ins, mask):
    typ = _type(ins)
    d, a, b = ins.operands
    x, y = cta.read(a, typ, ins), cta.read(b, typ, ins)
    bigger = ins.parts[0] == "max"
    if typ in FLOAT_TYPES:  # PTX's min/max return the other operand when one is NaN
        ftz, _ = _float_mods(ins, typ)
        value = np.fmax(x, y) if bigger else np.fmin(x, y)
        cta.write(d, _finish_float(value, typ, ftz, False), typ, mask, ins)
    else:
        cta.write(d, np.maximum(x, y) if bigger else np.minimum(x, y), typ, mask, ins)


# ---- comparisons and selection -------------------------------------------------------------------
def compare(cmp: str, x, y, typ: str):
    x, y = np.asarray(x), np.asarray(y)
    if typ in FLOAT_TYPES:
        nan = np.isnan(x) | np.isnan(y)
        if cmp == "num":
            return ~nan
        if cmp == "nan":
            return nan
        unordered = cmp.endswith("u")
        base = _ORDERED[cmp[:-1] if unordered else cmp](x, y)
        return (base | nan) if unordered else (base & ~nan)
    if cmp in ("lo", "ls", "hi", "hs"):
        x, y = (v.view(UINT[v.dtype.itemsize * 8]) for v in (x, y))
        cmp = {"lo": "lt", "ls": "le", "hi": "gt", "hs": "ge"}[cmp]
    if cmp not in _ORDERED:
        raise SimError(f"unknown comparison {cmp}")
    return _ORDERED[cmp](x, y)


_ORDERED = {
    "eq": np.equal,
    "ne": np.not_equal,
    "lt": np.less,
    "le": np.less_equal,
    "gt": np.greater,
    "ge": np.greater_equal,
}
_BOOL_OPS = {"and": np.logical_and, "or": np.logical_or, "xor": np.logical_xor}


def op_setp(cta, ins, mask):
    typ = _type(ins)
    cmp = ins.parts[1]
    combine = next((p for p in ins.parts[2:-1] if p in _BOOL_OPS), None)
    dest, a, b, *rest = ins.operands
    try:
        p = compare(cmp, cta.read(a, typ, ins), cta.read(b, typ, ins), typ)
    except SimError as err:
        raise unsupported(ins, str(err)) from None
    q = ~p
    if combine:
        c = cta.read(rest[0], "pred", ins)
        p, q = _BOOL_OPS[combine](p, c), _BOOL_OPS[combine](q, c)
    p_name, _, q_name = dest.partition("|")
    cta.write(p_name, p, "pred", mask, ins)
    if q_name:
        cta.write(q_name, q, "pred", mask, ins)


def op_selp(cta, ins, mask):
    typ = _type(ins)
    d, a, b, c = ins.operands
    value = np.where(cta.read(c, "pred", ins), cta.read(a, typ, ins), cta.read(b, typ, ins))
    cta.write(d, value.astype(TYPED[typ]), typ, mask, ins)


# ---- moves and conversions -----------------------------------------------------------------------
def op_mov(cta, ins, mask):
    typ = _type(ins)
    d, a = ins.operands
    width = width_of(typ)
    if isinstance(d, tuple):  # unpack: mov.b32 {lo, hi}, %r1
        part = width // len(d)
        bits = np.asarray(cta.read(a, f"b{width}", ins)).astype(np.uint64)
        for i, name in enumerate(d):
            piece = (bits >> np.uint64(i * part)) & np.uint64((1 << part) - 1)
            cta.write(name, piece.astype(UINT[part]), f"b{part}", mask, ins)
    elif isinstance(a, tuple):  # pack: mov.b32 %r1, {lo, hi}
        part = width // len(a)
        bits = np.zeros(cta.n, np.uint64)
        for i, name in enumerate(a):
            piece = np.asarray(cta.read(name, f"b{part}", ins)).astype(np.uint64)
            bits = bits | (piece << np.uint64(i * part))
        cta.write(d, bits.astype(UINT[width]), f"b{width}", mask, ins)
    else:
        cta.write(d, cta.read(a, typ, ins), typ, mask, ins)


_FLOAT_TO_INT = {"rzi": np.trunc, "rni": np.rint, "rmi": np.floor, "rpi": np.ceil}


def op_cvt(cta, ins, mask):
    *mods, dtyp, atyp = ins.parts[1:]
    mods = set(mods)
    if dtyp not in TYPED or atyp not in TYPED:
        raise unsupported(ins)
    if dtyp in ("bf16x2", "f16x2"):  # cvt.rn.bf16x2.f32 d, hi, lo
        d, hi, lo = ins.operands
        half = dtyp[:-2]
        top = _to_half(np.asarray(cta.read(hi, atyp, ins), np.float32), half, mods, ins)
        bottom = _to_half(np.asarray(cta.read(lo, atyp, ins), np.float32), half, mods, ins)
        packed = (top.astype(np.uint32) << np.uint32(16)) | bottom.astype(np.uint32)
        cta.write(d, packed, "b32", mask, ins)
        return
    d, a = ins.operands
    x = cta.read(a, atyp, ins)
    if atyp == "bf16":  # bf16 -> f32 is exact: the bits, shifted
        x, atyp = (np.asarray(x).astype(np.uint32) << np.uint32(16)).view(np.float32), "f32"
    x = np.asarray(x)
    if "ftz" in mods and atyp in FLOAT_TYPES:
        x = _flush(x)
    if dtyp in ("bf16", "f16"):
        if atyp not in FLOAT_TYPES:
            raise unsupported(ins, "integer to half")
        value = _to_half(x.astype(np.float32), dtyp, mods, ins)
        cta.write(d, value, "b16", mask, ins)
    elif dtyp in FLOAT_TYPES:
        if mods & {"rz", "rm", "rp"}:
            raise unsupported(ins, "rounding other than .rn")
        value = x.astype(TYPED[dtyp])
        cta.write(d, _finish_float(value, dtyp, "ftz" in mods, "sat" in mods), dtyp, mask, ins)
    elif atyp in FLOAT_TYPES:  # float -> int: rounded as asked, clamped, NaN -> 0
        rounding = mods & set(_FLOAT_TO_INT)
        if len(rounding) != 1:
            raise unsupported(ins, "float to integer needs .rzi/.rni/.rmi/.rpi")
        value = _FLOAT_TO_INT[rounding.pop()](x.astype(np.float64))
        info = np.iinfo(TYPED[dtyp])
        value = np.clip(np.nan_to_num(value, nan=0.0), info.min, info.max)
        cta.write(d, value.astype(TYPED[dtyp]), dtyp, mask, ins)
    else:  # int -> int: sign- or zero-extend the source, wrap to the destination
        if "sat" in mods:
            raise unsupported(ins, ".sat")
        wide = np.int64 if atyp.startswith("s") else np.uint64
        cta.write(d, x.astype(wide).astype(TYPED[dtyp]), dtyp, mask, ins)


def _to_half(x: np.ndarray, half: str, mods: set, ins) -> np.ndarray:
    """float32 -> the 16 bits of a bf16 or fp16, rounded to nearest even (.rn)."""
    if mods & {"rz", "rm", "rp", "rna", "relu", "satfinite"}:
        raise unsupported(ins, "rounding other than .rn")
    if half == "f16":
        return x.astype(np.float16).view(np.uint16)
    bits = x.view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> np.uint64(16)) & np.uint64(1))) >> np.uint64(16)
    return np.where(np.isnan(x), 0x7FFF, rounded).astype(np.uint16)


# ---- memory --------------------------------------------------------------------------------------
def _memory_form(ins):
    """(space, vector length, element type) of an ld/st; space "shared" (this CTA's),
    "cluster" (``.shared::cluster``: any CTA's of the cluster), "global", "generic", "param"."""
    space, count = "generic", 1
    for part in ins.parts[1:-1]:
        if part in ("global", "shared", "param", "local", "const", "shared::cta"):
            space = "shared" if part == "shared::cta" else part
        elif part == "shared::cluster":
            space = "cluster"
        elif part in ("v2", "v4", "v8"):
            count = int(part[1:])
        elif part not in _MEMORY_HINTS and "::" not in part:
            raise unsupported(ins, f"qualifier .{part}")
    return space, count, _type(ins)


def _space(cta, space, ins):
    if space in ("global", "generic"):  # generic addresses: global tensors only, so far
        return cta.memory
    raise unsupported(ins, f"{space} memory")


def op_ld(cta, ins, mask):
    space, count, typ = _memory_form(ins)
    dest, addr = ins.operands[:2]  # a third: .L2::cache_hint's policy, which changes no value
    names = dest if isinstance(dest, tuple) else (dest,)
    elem = width_of(typ) // 8
    if space == "param":
        blob = cta.params.get(addr.base)
        if blob is None:
            raise SimError(f"no parameter {addr.base} ({ins.where()})")
        values = np.frombuffer(blob, UINT[elem * 8], count, addr.offset).view(TYPED[typ])
        for name, value in zip(names, values, strict=True):
            cta.write(name, value, typ, mask, ins)
        return
    threads = np.flatnonzero(mask)
    addresses = cta.address(addr, ins)[mask]
    if space in ("shared", "cluster"):
        loaded = cta.shared_load(space, addresses, elem, count, ins, mask)
    else:
        loaded = _space(cta, space, ins).load(addresses, elem, count, ins, threads)
    for i, name in enumerate(names):
        full = np.zeros(cta.n, UINT[elem * 8])
        full[mask] = loaded[:, i]
        cta.write(name, full.view(TYPED[typ]), typ, mask, ins)


def op_st(cta, ins, mask):
    space, count, typ = _memory_form(ins)
    addr, src = ins.operands[:2]  # a third: .L2::cache_hint's policy
    if not isinstance(addr, Address):
        raise unsupported(ins, "address operand")
    names = src if isinstance(src, tuple) else (src,)
    elem = width_of(typ) // 8
    values = np.stack(
        [
            np.broadcast_to(np.asarray(cta.read(n, f"b{elem * 8}", ins)), (cta.n,))[mask]
            for n in names
        ],
        axis=1,
    )
    threads = np.flatnonzero(mask)
    addresses = cta.address(addr, ins)[mask]
    if space in ("shared", "cluster"):
        cta.shared_store(space, addresses, values, elem, ins, mask)
    else:
        _space(cta, space, ins).store(addresses, values, elem, ins, threads)


# ---- warps, barriers, control flow ---------------------------------------------------------------
def op_shfl(cta, ins, mask):
    if ins.parts[1] != "sync" or _type(ins) != "b32":
        raise unsupported(ins)
    mode = ins.parts[2]
    dest, a, b, c, membermask = ins.operands
    lane = cta.special["%laneid"].astype(np.int64)
    warp = cta.special["%warpid"].astype(np.int64)
    members = np.asarray(cta.read(membermask, "u32", ins)).astype(np.int64)
    member = ((members >> lane) & 1).astype(bool)
    warps_here = np.zeros(warp.max() + 1, bool)
    warps_here[warp[mask]] = True
    missing = warps_here[warp] & member & ~mask
    if missing.any():
        t = int(np.argmax(missing))
        raise DivergentShuffle(
            f"shfl.sync: lane {lane[t]} of warp {warp[t]} is named in the member mask but is not "
            f"at this instruction (divergent, exited or waiting) ({ins.where()})"
        )
    bval = np.asarray(cta.read(b, "u32", ins)).astype(np.int64) & 31
    cval = np.asarray(cta.read(c, "u32", ins)).astype(np.int64)
    clamp, segmask = cval & 31, (cval >> 8) & 31
    max_lane = (lane & segmask) | (clamp & ~segmask)
    min_lane = lane & segmask
    if mode == "bfly":
        j = lane ^ bval
        ok = j <= max_lane
    elif mode == "down":
        j = lane + bval
        ok = j <= max_lane
    elif mode == "up":
        j = lane - bval
        ok = j >= max_lane
    elif mode == "idx":
        j = min_lane | (bval & ~segmask)
        ok = j <= max_lane
    else:
        raise unsupported(ins)
    j = np.where(ok, j, lane)
    source = warp * WARP + j
    if (source[mask] >= cta.n).any():
        raise SimError(f"shfl.sync reads a lane past the CTA's last thread ({ins.where()})")
    value = np.broadcast_to(np.asarray(cta.read(a, "b32", ins)), (cta.n,))
    d_name, _, p_name = dest.partition("|")
    cta.write(d_name, value[np.minimum(source, cta.n - 1)], "b32", mask, ins)
    if p_name:
        cta.write(p_name, np.broadcast_to(ok, (cta.n,)), "pred", mask, ins)


def op_griddepcontrol(cta, ins, mask):
    """Programmatic dependent launch: the simulator runs one grid at a time, the previous one
    finished, so ``wait`` returns at once and ``launch_dependents`` has no grid to release."""
    if ins.parts[1:2] not in (["wait"], ["launch_dependents"]):
        raise unsupported(ins)


def op_bra(cta, ins, mask):
    (label,) = ins.operands
    cta.jump(label, mask, ins)


def op_ret(cta, ins, mask):
    cta.exit(mask, ins)


# ---- half precision: .f16, .bf16 and their pairs .f16x2, .bf16x2 ---------------------------------
#: PTX type -> (the half type, halves per register)
HALF_TYPES = {"f16": ("f16", 1), "bf16": ("bf16", 1), "f16x2": ("f16", 2), "bf16x2": ("bf16", 2)}
_HALF_OPS = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "fma": lambda a, b, c: a * b + c,
    "min": np.fmin,
    "max": np.fmax,
    "neg": np.negative,
    "abs": np.abs,
}


def _halves(bits, half: str, count: int) -> list[np.ndarray]:
    """The halves of 16- or 32-bit registers as float64 (exact), the low half first."""
    bits = np.asarray(bits).astype(np.uint32)
    out = []
    for i in range(count):
        h = ((bits >> np.uint32(16 * i)) & np.uint32(0xFFFF)).astype(np.uint16)
        f32 = (
            h.view(np.float16).astype(np.float32)
            if half == "f16"
            else (h.astype(np.uint32) << np.uint32(16)).view(np.float32)
        )
        out.append(f32.astype(np.float64))
    return out


def half_arithmetic(handler):
    """``handler`` for 32/64-bit types; for the half types, each half computed exactly in
    float64 and rounded to nearest even (through float32: off by one ulp of the half in rare
    ties, far below the tolerances its users compare with). Only the default rounding (.rn)."""

    def wrapped(cta, ins, mask):
        typ = ins.parts[-1]
        if typ not in HALF_TYPES:
            return handler(cta, ins, mask)
        half, count = HALF_TYPES[typ]
        op, mods = ins.parts[0], set(ins.parts[1:-1])
        if op not in _HALF_OPS or mods - {"rn"}:
            raise unsupported(ins, f"half-precision .{typ}")
        d, *srcs = ins.operands
        reg = "b16" if count == 1 else "b32"
        args = [_halves(cta.read(a, reg, ins), half, count) for a in srcs]
        bits = np.zeros(cta.n, np.uint32)
        for i in range(count):
            value = np.asarray(_HALF_OPS[op](*(a[i] for a in args)), np.float64)
            piece = _to_half(np.broadcast_to(value, (cta.n,)).astype(np.float32), half, set(), ins)
            bits |= piece.astype(np.uint32) << np.uint32(16 * i)
        cta.write(d, bits.astype(np.uint16) if count == 1 else bits, reg, mask, ins)

    return wrapped


def op_setp_half(cta, ins, mask):
    """setp on a scalar half: compared as float32 (exact); pairs are not simulated."""
    typ = ins.parts[-1]
    if typ not in HALF_TYPES:
        return op_setp(cta, ins, mask)
    half, count = HALF_TYPES[typ]
    if count != 1 or len(ins.operands) != 3:
        raise unsupported(ins, f"comparison of .{typ}")
    dest, a, b = ins.operands
    x, y = (_halves(cta.read(o, "b16", ins), half, 1)[0] for o in (a, b))
    cta.write(dest, compare(ins.parts[1], x, y, "f64"), "pred", mask, ins)


HANDLERS = {
    "add": half_arithmetic(_binary(np.add, np.add)),
    "sub": half_arithmetic(_binary(np.subtract, np.subtract)),
    "mul": half_arithmetic(op_mul),
    "mad": op_mad,
    "fma": half_arithmetic(op_fma),
    "div": op_div,
    "rem": op_rem,
    "min": half_arithmetic(op_minmax),
    "max": half_arithmetic(op_minmax),
    "neg": half_arithmetic(_neg_or_abs(np.negative)),
    "abs": half_arithmetic(_neg_or_abs(np.abs)),
    "and": _logic(np.bitwise_and),
    "or": _logic(np.bitwise_or),
    "xor": _logic(np.bitwise_xor),
    "not": op_not,
    "shl": op_shift,
    "shr": op_shift,
    "rcp": _unary_float(lambda x: 1 / x),
    "sqrt": _unary_float(np.sqrt),
    "rsqrt": _unary_float(lambda x: 1 / np.sqrt(x)),
    "ex2": _unary_float(np.exp2),
    "lg2": _unary_float(np.log2),
    "setp": op_setp_half,
    "selp": op_selp,
    "mov": op_mov,
    "cvt": op_cvt,
    "ld": op_ld,
    "st": op_st,
    "shfl": op_shfl,
    "griddepcontrol": op_griddepcontrol,
    "bra": op_bra,
    "ret": op_ret,
    "exit": op_ret,
}
