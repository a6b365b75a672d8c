"""Failure signatures -> hints a learner can act on.

Three kinds of evidence, three kinds of classifier:

* values of a kernel (gpu tier): ``diagnose_rmsnorm`` first tries *known wrong variants* (an
  RMSNorm without eps, with sum instead of mean, ...; an exercise passes the ones that fit it):
  when the learner's output matches one of them, its hint is exact. Then generic signatures:
  outputs never written (the poison value is still there), errors only in the tail columns
  (missing predication), every element off by the same factor, a row at eps's scale included
  (the output scaled: the weight or y), every row off by one factor (a power of two: a
  reduction that combined only part of the lanes; sqrt(N): sum instead of mean).
* numbers from a host function (compile tier): ``diagnose_number`` looks at the ratio seen /
  expected (8: bits instead of bytes; 1000: a unit prefix; ...).
* a compile error (compile tier): ``diagnose_compile_error`` maps known DSL messages to the fix.

Hints say what the signature usually means, never the answer.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

# ---- generic hints, shared by every lesson -------------------------------------------------
NOT_SIMULATED = (
    "the CPU check could not run your kernel's PTX: it uses something the lesson's kernel does "
    "not need (an instruction the simulator does not know, read above); write it without, or "
    "have it judged by the gpu tier on a Hopper GPU"
)
NOT_WRITTEN = (
    "some outputs were never written (they still hold the poison value the grader filled the "
    "output with): a row or column is skipped by the grid or by a predicate"
)
TAIL_COLUMNS = (
    "only the tail columns (after the last full tile) are wrong: the tail is not predicated; "
    "guard the loads and stores of the last, partial tile with the column bound"
)
MISSING_SHUFFLE = (
    "the sum of squares is off by a power of two (32 = a whole warp): the reduction combined "
    "only part of the lanes; a butterfly shuffle step is missing (offsets 16, 8, 4, 2, 1)"
)
DOUBLE_COUNT = (
    "the sum of squares is too large by a power of two: some lanes or partial sums were added "
    "more than once (a shuffle offset or a block/cluster exchange counts a partial twice)"
)
CLUSTER_SYNC = (
    "a hang or wrong values only with cluster_n > 1: a CTA read its peers' partial sums before "
    "they arrived, or exited while peers still wrote to it; check the mbarrier arrive/expect_tx "
    "and the cluster_arrive/cluster_wait pair before exit"
)
SUM_NOT_MEAN = (
    "every row is off by a factor of about sqrt(N): the mean of squares is sum / N (you used the "
    "sum, or divided twice)"
)
NO_EPS = (
    "rows of zeros give inf/NaN (and tiny rows are too large): eps must be added to the mean of "
    "squares before the reciprocal square root"
)
EPS_OUTSIDE = "eps is added after the square root; it belongs inside: rsqrt(mean + eps)"
SQRT_NOT_RSQRT = (
    "you multiply by sqrt(mean + eps), the RMS itself; RMSNorm divides by it: multiply by "
    "rsqrt(mean + eps)"
)
WRONG_COUNT = "the mean divides by the wrong count: divide the sum of squares by N, the row length"
MISSING_COLUMN = (
    "the sum of squares misses a column (an off-by-one in the loop bound): loop over all N columns"
)
NOT_SQUARED = "you sum x, not x * x: the mean is of the squares"
NO_WEIGHT = "the output is not multiplied by the weight vector w"
NOT_NORMALISED = (
    "the output is x * w: the row is never normalised; multiply by rstd = rsqrt(mean of "
    "squares + eps), the row's own factor"
)
SCALED = (
    "every output is {k:.3g} times rmsnorm_ref's, by the same factor in every row (a row at "
    "eps's scale too, whose factor a wrong sum of squares would change differently): each "
    "row's rstd is right, and something scales every element (the weight or y itself)"
)
ALL_ZERO = (
    "every output is 0 where rmsnorm_ref is not: the kernel stores zeros (a product with 0, "
    "or the output fragment stored before anything was written into it)"
)
NOT_JIT = (
    "a device function with a loop over cutlass.range (or dynamic if/for) must be decorated with "
    "@cute.jit, so the DSL can turn the Python loop into a device loop"
)
TIMEOUT = (
    "the cell ran past the time limit: an infinite loop, or a kernel that never finishes (a "
    "barrier some threads never reach, a wait on a phase that never completes)"
)

DIED = (
    "the notebook's kernel process died: a crash in native code (an illegal memory access in "
    "a kernel, a segfault) or an exit call; the grader restarted it and went on"
)

STOPPED = (
    "each cell that crashes or hangs costs the grader a fresh process and a replay of the "
    "cells before it, and it spends only so many a notebook: run your notebook top to bottom "
    "and fix the cells that crash or hang"
)

SHORTCUT = (
    "the point of the exercise is to compute RMSNorm yourself; calling a library RMSNorm "
    "(torch's, QuACK's or quack_edu's own) scores 0"
)

MISSING_BARRIER = (
    "garbage or run-to-run different sums: a warp read the shared-memory buffer before the "
    "other warps' writes had landed; a barrier (cute.arch.barrier(), bar.sync in PTX) must sit "
    "between the writes and the reads"
)
NOT_GIVEN = (
    "your kernel calls a method of the stage that this exercise does not give you (the error "
    "names it): the library's own version of the part the exercise asks you to write, such as "
    "the shared-memory buffer and the reduction of a row. Write that part in your kernel with "
    "the pieces the exercise gives"
)
FULL_MASK = (
    "every lane of the warp executes this shuffle, so the member mask must name all 32 "
    "(0xFFFFFFFF); a lane missing from the mask makes the result undefined"
)


#: terminal colour codes (SGR), also as they read once their escape character is lost: "[91m"
_SGR = r"(?:\[(?:\d{1,3};)*\d{1,3}m)+"
_ANSI = re.compile(rf"\x1b\[[0-9;]*m|(?<![\w\]]){_SGR}|{_SGR}(?![\w\]])")


def ansi_free(s: str) -> str:
    """Without terminal colour codes (the DSL colours its errors; a report is not a terminal).
    A bare code is one not glued to code on both sides (``a[0m]`` is left alone)."""
    return _ANSI.sub("", s)


# ---- compile errors ---------------------------------------------------------------------------
_COMPILE_ERRORS: list[tuple[str, str]] = [
    (r"is not given in this exercise", NOT_GIVEN),
    (r"dynamic range should be always preprocessed", NOT_JIT),
    (
        r"must be Tensor, not (Float32|Int32|BFloat16|Float16)",
        "a torch function got a DSL value: inside a kernel use cute.math / cute.arch functions, "
        "not torch",
    ),
    (
        r"is not defined",
        "a name used in your function is not defined (a typo, or an import missing from the cell)",
    ),
    (r"mutually exclusive", "check the keyword arguments of the cute.math call"),
    (
        r"(unsupported|not supported) (on|for) (sm_?90|this arch)",
        "that instruction or type does not exist on Hopper (sm_90a)",
    ),
    (
        r"'NoneType'",
        "a value is None where it is used: an argument the exercise says may be None (a "
        "weight, a predicate) needs that case handled (in traced code, test it with "
        "cutlass.const_expr(v is None)); or your function returns nothing",
    ),
    (
        r"Expected size in shape to be strictly positive",
        "a layout or tensor shape got a size of 0: a count your code computed (a vector width "
        "such as vec, a number of threads or rows) came out 0; dtype.width is in bits, so "
        "16 // dtype.width is 0 for fp32 (16 bytes are 128 // dtype.width elements)",
    ),
    # an `if` on a run-time value (lane == 0) in a function the DSL did not rewrite
    (r"Cannot use a Runtime value", NOT_JIT),
    (
        r"expects pred to have compatible shape",
        "a copy's pred= holds one Boolean per atom of that copy's own partition: the "
        "partition's shape with its first mode, (values, atoms), cut to its atoms (((8, 1), 1), "
        "one 16-byte atom, takes a predicate of shape (1,); ((4, 2), 1), two 8-byte atoms, one "
        "of (2, 1)). A predicate shaped for another partition (another atom width, or another "
        "tensor's copy with another dtype) does not fit: build it from the partition of the "
        "copy that uses it",
    ),
    (
        r"cannot broadcast",
        "two TensorSSA values of different shapes meet in one expression: fragments cut by "
        "different copies do not line up (a copy of 4 fp32 values an atom beside one of 8 "
        "bf16). Values combined element by element come from partitions of the same copy "
        "(the same columns in the same order)",
    ),
    (
        r"'nvvm\.red' op operand #1 must be",
        "cute.arch.red was given a value it cannot add in one instruction: a red adds one "
        "scalar at one address (or, on sm_90, a vector of 2 or 4 fp32 at consecutive "
        "addresses: what the library's vector red does); add a fragment's elements one by one",
    ),
    (
        r"'cp_size' only supports \(32, 64, 128\)",
        "num_bits_per_copy is the bits one copy instruction moves, not an element's width: "
        "cp.async moves 4, 8 or 16 bytes at once (num_bits_per_copy 32, 64 or 128), several "
        "elements of x a copy",
    ),
    (
        r"restAtomVRank",
        "the two sides of a copy are split for different copy atoms: a register fragment made "
        "like x's partition (8 bf16 per access) copied with the weight's tiled copy (4 fp32 per "
        "access). Hand the copy the fragment as the weight's copy sees it: thr_W.retile(tXrW)",
    ),
]


def diagnose_compile_error(exc: BaseException) -> str | None:
    text = f"{type(exc).__name__}: {exc}"
    cause = exc.__cause__ or exc.__context__
    if cause is not None:
        text += f"\n{type(cause).__name__}: {cause}"
    return diagnose_compile_text(text)


def diagnose_compile_text(text: str) -> str | None:
    """The rule an error message shows was broken (its text, e.g. a notebook cell's error), or
    None when it matches no known mistake."""
    text = ansi_free(text)
    for pattern, hint in _COMPILE_ERRORS:
        if re.search(pattern, text):
            return hint
    return None


def short_text(text: str) -> str:
    """The gist of an error message: the DSL's messages are long and coloured; keep their
    ``error:`` lines (without the ``error[...]:`` tag), drop source excerpts, notes and
    suggestions. Empty when nothing is left."""
    lines: list[str] = []
    tagged = None  # the indent of the last line that opened with a tag ("error:", ...)
    for raw in ansi_free(text).strip().splitlines():
        ln = raw.strip()
        if not ln:
            continue
        indent = len(raw) - len(raw.lstrip())
        opens = re.match(r"(error|note|suggestion|warning)\b|[|=]|-->|\d+ \|", ln)
        if opens:
            tagged = indent if re.match(r"error|note|suggestion|warning", ln) else None
        elif tagged is not None and indent > tagged and lines:
            lines[-1] += " " + ln  # a tagged line's wrapped continuation
            continue
        lines.append(ln)
    keep = [
        ln
        for ln in lines
        if not ln.startswith(("|", "-->", "note:", "suggestion:", "= note"))
        and not re.match(r"^\d+ \|", ln)
    ]
    errors = [ln for ln in keep if ln.startswith("error")]
    chosen = errors[-1:] if errors else keep[:3]
    return re.sub(r"^error(\[\w+\])?:\s*", "", " ".join(chosen))


def short_error(exc: BaseException, limit: int = 300) -> str:
    """A one-paragraph description of an exception (see ``short_text``); of one that only wraps
    its cause (torch.testing's "Comparing ... resulted in the unexpected exception above"), the
    cause's."""
    cause = exc.__cause__
    if cause is not None and "unexpected exception above" in str(exc):
        return short_error(cause, limit)
    body = short_text(str(exc)) or type(exc).__name__
    body = f"{type(exc).__name__}: {body}" if not body.startswith(type(exc).__name__) else body
    return body if len(body) <= limit else body[: limit - 1] + "…"


# ---- numbers from host functions ------------------------------------------------------------
_RATIO_HINTS: list[tuple[float, str]] = [
    (8.0, "off by a factor of 8: bits where bytes are meant (bf16 is 2 bytes, fp32 4)"),
    (1 / 8, "off by a factor of 1/8: bytes where bits are meant, or elements counted as bytes"),
    (1e3, "off by a factor of 1000: a unit prefix (GB vs MB, us vs ns, TB/s vs GB/s)"),
    (1e-3, "off by a factor of 1/1000: a unit prefix (GB vs MB, us vs ms, TB/s vs GB/s)"),
    (1e6, "off by a factor of 10^6: a unit prefix (us vs s, or MB vs TB)"),
    (1e-6, "off by a factor of 10^-6: a unit prefix (s vs us, or TB vs MB)"),
    (1e9, "off by a factor of 10^9: GB/s means 10^9 bytes per second"),
    (1e-9, "off by a factor of 10^-9: GB/s means 10^9 bytes per second"),
    (2.0, "off by a factor of 2: count both the reads and the writes, once each"),
    (0.5, "off by a factor of 1/2: only one direction counted (reads and writes both move bytes)"),
]


def diagnose_number(seen, expected) -> str | None:
    try:
        seen, expected = float(seen), float(expected)
    except (TypeError, ValueError):
        return None
    if expected == 0 or seen == 0 or not math.isfinite(seen):
        return None
    ratio = seen / expected
    for r, hint in _RATIO_HINTS:
        if abs(ratio / r - 1) < 0.02:
            return hint
    return None


@dataclass(frozen=True)
class Variant:
    """A known wrong answer: ``fn`` computes what such an answer returns; ``hint`` says why."""

    name: str
    fn: Callable
    hint: str


# ---- RMSNorm outputs --------------------------------------------------------------------------
def _rms_variant(
    x,
    w,
    eps,
    *,
    count=None,
    eps_inside=True,
    squares=True,
    mean=True,
    cols=None,
    sqrt=False,
    weight=True,
):
    xf = x.float()
    N = xf.shape[-1]
    part = xf if cols is None else xf[:, cols]
    s = (part * part if squares else part).sum(-1, keepdim=True)
    if mean:
        s = s / (N if count is None else count)
    if sqrt:
        r = torch.sqrt(s + eps)
    elif eps_inside:
        r = torch.rsqrt(s + eps)
    else:
        r = torch.rsqrt(s) + eps
    y = xf * r
    return y * w.float() if weight else y


#: known wrong RMSNorms, as functions of (x, w, eps) in fp32
NO_EPS_V = Variant("no eps", lambda x, w, eps: _rms_variant(x, w, 0.0), NO_EPS)
EPS_OUTSIDE_V = Variant(
    "eps outside", lambda x, w, eps: _rms_variant(x, w, eps, eps_inside=False), EPS_OUTSIDE
)
SUM_NOT_MEAN_V = Variant(
    "sum, not mean", lambda x, w, eps: _rms_variant(x, w, eps, mean=False), SUM_NOT_MEAN
)
SQRT_V = Variant(
    "sqrt, not rsqrt", lambda x, w, eps: _rms_variant(x, w, eps, sqrt=True), SQRT_NOT_RSQRT
)
N_MINUS_1_V = Variant(
    "divides by N-1", lambda x, w, eps: _rms_variant(x, w, eps, count=x.shape[-1] - 1), WRONG_COUNT
)
N_PLUS_1_V = Variant(
    "divides by N+1", lambda x, w, eps: _rms_variant(x, w, eps, count=x.shape[-1] + 1), WRONG_COUNT
)
SKIPS_LAST_V = Variant(
    "skips the last column",
    lambda x, w, eps: _rms_variant(x, w, eps, cols=slice(0, x.shape[-1] - 1)),
    MISSING_COLUMN,
)
SKIPS_FIRST_V = Variant(
    "skips the first column",
    lambda x, w, eps: _rms_variant(x, w, eps, cols=slice(1, None)),
    MISSING_COLUMN,
)
NOT_SQUARED_V = Variant(
    "sums x", lambda x, w, eps: _rms_variant(x, w, eps, squares=False), NOT_SQUARED
)
NO_WEIGHT_V = Variant(
    "no weight", lambda x, w, eps: _rms_variant(x, w, eps, weight=False), NO_WEIGHT
)
NOT_NORMALISED_V = Variant(
    "not normalised", lambda x, w, eps: x.float() * w.float(), NOT_NORMALISED
)

# (eps added after the rsqrt is numerically the same as no eps: NO_EPS_V covers it)
RSTD_VARIANTS = (NO_EPS_V, SUM_NOT_MEAN_V, SQRT_V, N_MINUS_1_V, N_PLUS_1_V)
SUM_VARIANTS = (SKIPS_LAST_V, SKIPS_FIRST_V, NOT_SQUARED_V)


def _close(a, b, tol) -> torch.Tensor:
    a, b = a.float(), b.float()
    both_nan = torch.isnan(a) & torch.isnan(b)
    return both_nan | torch.isclose(a, b, **tol)


def diagnose_rmsnorm(
    out: torch.Tensor,
    ref: torch.Tensor,
    x: torch.Tensor,
    w: torch.Tensor,
    eps: float,
    *,
    tol: dict,
    poison: float | None = None,
    variants: Sequence[Variant] = (),
    tile_cols: int | None = None,
) -> str | None:
    """A hint for a wrong RMSNorm output ``out`` (reference ``ref``), or None if no known sign."""
    o = out.float().cpu()
    r = ref.float().cpu()
    for v in variants:
        try:
            cand = v.fn(x.cpu(), w.cpu(), eps)
        except Exception:
            continue
        # all but a few elements: a different summation order can move a row whose wrong
        # statistic sits near zero (a sum of x, say) just past the tolerance
        if cand.shape == o.shape and _close(o, cand, tol).float().mean().item() >= 0.999:
            return v.hint
    if poison is not None:
        unwritten = _unwritten(o, poison)
        if unwritten.any():
            rows = unwritten.all(1).nonzero().flatten().tolist()
            cols = unwritten.all(0).nonzero().flatten().tolist()
            where = ""
            if rows:
                where = f" ({_which('row', rows)})"
            elif cols:
                where = f" ({_which('column', cols)})"
            return NOT_WRITTEN + where
    if bool((o == 0).all()) and bool((r != 0).any()):
        return ALL_ZERO
    bad = ~_close(o, r, tol)
    if not bad.any():
        return None
    N = o.shape[-1]
    bad_cols = bad.any(0).nonzero().flatten()
    first_bad = int(bad_cols[0])
    tail_start = (N // tile_cols) * tile_cols if tile_cols else None
    if tail_start is not None and 0 < tail_start < N and first_bad >= tail_start:
        return TAIL_COLUMNS
    if tail_start is None and first_bad > 0 and N - first_bad <= max(1, N // 4):
        return TAIL_COLUMNS
    k = _uniform_factor(o, r, x, eps, tol)
    if k is not None:
        return SCALED.format(k=k)
    ss_ratio = _sum_of_squares_ratio(o, r, x, eps)
    if ss_ratio is not None:
        for k in range(1, 6):
            if abs(ss_ratio * 2**k - 1) < 0.15:
                return MISSING_SHUFFLE + f" (the sum seen is about 1/{2**k} of the true one)"
            if abs(ss_ratio / 2**k - 1) < 0.15:
                return DOUBLE_COUNT + f" (the sum seen is about {2**k}x the true one)"
        if abs(ss_ratio * N - 1) < 0.05 or abs(ss_ratio / N - 1) < 0.05:
            return SUM_NOT_MEAN
    return None


def _unwritten(o: torch.Tensor, poison: float) -> torch.Tensor:
    """The outputs of (M, N) that still hold ``poison`` as a store never written leaves them:
    next to another one in their row (stores move vectors), or in a column that is poison in
    every row (M > 1). A lone output equal to it is a computed value: wrong values at the
    poison's scale round to it now and then (bf16 steps by 32 near 4242)."""
    eq = o == poison
    near = torch.zeros_like(eq)
    near[:, 1:] |= eq[:, :-1]
    near[:, :-1] |= eq[:, 1:]
    column = eq.all(0, keepdim=True) & (eq.shape[0] > 1)
    return eq & (near | column)


def _which(kind: str, idx: list[int]) -> str:
    """Which rows (columns) were never written, in words: "row 6 not written at all", "3 rows
    not written at all: 6, 7 and 8", "40 rows not written at all: 6, 7, 8, ..."."""
    if len(idx) == 1:
        return f"{kind} {idx[0]} not written at all"
    head = f"{len(idx)} {kind}s not written at all"
    if len(idx) <= 3:
        return f"{head}: {', '.join(map(str, idx[:-1]))} and {idx[-1]}"
    return f"{head}: {', '.join(map(str, idx[:3]))}, ..."


def _uniform_factor(o, r, x, eps: float, tol: dict) -> float | None:
    """The factor k with out = k * ref in every element, when the rows include one at eps's
    scale (mean square at most 4 eps) and one far above it (over 100 eps), where a wrong row
    statistic would give two different factors; else None."""
    ms = x.float().cpu().pow(2).mean(-1)
    if not (bool(((ms > 0) & (ms <= 4 * eps)).any()) and bool((ms > 100 * eps).any())):
        return None
    nz = (r != 0) & torch.isfinite(o)
    if not bool(nz.any()):
        return None
    k = float((o[nz] / r[nz]).median().item())
    if k == 0 or not math.isfinite(k) or abs(k - 1) < 0.05:
        return None
    return k if bool(_close(o, k * r, tol).all()) else None


def _sum_of_squares_ratio(o, r, x, eps: float) -> float | None:
    """The one factor between the mean square the output implies and the true one, or None.

    A row's out / ref is rstd_seen / rstd_ref = q, so the kernel's mean square was
    (ms + eps) / q^2 - eps. The eps is taken out row by row: on a tiny row (ms near eps) a sum
    twice too large moves rstd far less than 1/sqrt(2), yet it is the same mistake. Rows whose
    mean square is well above eps say it best; they are used when there are any."""
    ms = x.float().cpu().pow(2).mean(-1)
    mask = (r.abs() > 1e-6 * r.abs().amax(-1, keepdim=True).clamp_min(1e-30)) & torch.isfinite(o)
    mask &= (o != 0) & (r != 0)
    q = torch.where(mask, o / r, torch.nan).nanmedian(dim=-1).values  # rstd_seen / rstd_ref
    ok = (ms > 0) & (q > 0) & torch.isfinite(q)
    ratio = (((ms + eps) / (q * q) - eps) / ms)[ok]  # the mean square seen / the true one
    strong = ratio[(ms > 4 * eps)[ok]]
    pick = strong if strong.numel() else ratio
    return float(pick.median().item()) if pick.numel() else None


# ---- appended: cp.async (lesson 05) -----------------------------------------------------------
CP_ASYNC_CG_SIZE = (
    "cp.async with the .cg cache mode (LoadCacheMode.GLOBAL) copies exactly 16 bytes: "
    "num_bits_per_copy=128; narrower copies exist only with .ca (LoadCacheMode.ALWAYS), which "
    "also allocates the line in L1"
)
_COMPILE_ERRORS.append((r"'cp_size' only supports \(128\)", CP_ASYNC_CG_SIZE))
