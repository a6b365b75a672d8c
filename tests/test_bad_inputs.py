"""Bad input, for every public entry point: one table of cases, applied to each.

Entry points: every stage's ``rmsnorm_fwd`` (``STAGE_ORDER``); the library's ``rmsnorm_fwd``,
``rmsnorm_fwd_tuned``, ``rmsnorm`` and ``QuackRMSNorm(...)(x)``; the grader's ``check``, which
takes the learner's answer (a function), not tensors: its cases are bad answers.

Each case says what must happen: a Python error whose message names the argument and the fix
(``Raises``), a result equal to the fp32 reference, NaN where the reference has NaN
(``DEFINED``), or, for the grader, a reported failure naming the error (``REPORTED``). Never a
crash, an illegal memory access, a hang or a silent wrong answer.

Argument checks come before the device check, so every ``Raises`` case runs on a machine
without a GPU (its tensors are then CPU tensors, and the error must still be the argument's,
not the device's). Cases that need a GPU (a result to compare, mixed devices) carry the ``gpu``
marker and are skipped here. A case that does not apply to an entry point (``out`` for the
library, ``bias`` for a stage, N beyond a limit a stage does not have) is not generated.

The backward's entry points (``rmsnorm_bwd``: dout, rstd, dresidual_out) have their argument
checks in tests/test_rmsnorm_bwd_api.py.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch

from quack_edu._env import MODE
from quack_edu.grading import all_exercises, check
from quack_edu.reference import TOLERANCES, rmsnorm_ref
from quack_edu.stages import STAGE_ORDER, get_stage

R = importlib.import_module("quack_edu.rmsnorm")  # quack_edu.rmsnorm is the function

#: where a case's tensors live: the GPU when the GPU tests run, else the CPU (argument errors
#: must come first either way)
DEV = "cuda" if MODE.gpu else "cpu"
N = 256
BF16 = torch.bfloat16

# --------------------------------------------------------------------------------------------
# Entry points
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Entry:
    name: str
    kind: str  # "stage", "library", "module" or "grader"
    call: Callable[[dict], object]
    #: row alignment in elements its vector loads need (1: any), and its longest row
    row_align: Callable[[torch.dtype], int] = lambda dtype: 1
    max_N: Callable[[torch.dtype], int | None] = lambda dtype: None


def _stage_entry(name: str) -> Entry:
    mod = get_stage(name)
    kernel = mod.KERNEL
    vector = not hasattr(kernel, "run")  # the final stage picks narrower vectors itself

    def call(a):
        return mod.rmsnorm_fwd(a["x"], a["weight"], **({"out": a["out"]} if "out" in a else {}))

    return Entry(
        f"stage:{name}",
        "stage",
        call,
        row_align=kernel.row_align_for if vector else (lambda dtype: 1),
        max_N=kernel.max_N_for,
    )


def _library_entry(fn_name: str) -> Entry:
    fn = getattr(R, fn_name)

    def call(a):
        got = fn(**a)
        return got[0] if isinstance(got, tuple) else got

    return Entry(f"rmsnorm.{fn_name}", "library", call, max_N=lambda d: R.MAX_N)


def _module_call(a):
    x, w = a["x"], a["weight"]
    dim = x.shape[-1] if isinstance(x, torch.Tensor) and x.dim() else N
    module = R.QuackRMSNorm(dim, device=DEV)
    module.weight = torch.nn.Parameter(w, requires_grad=False)
    return module(x)


def _grader_entry(exercise_id: str) -> Entry:
    return Entry(
        f"check:{exercise_id}", "grader", lambda a: check(exercise_id, a["answer"], quiet=True)
    )


ENTRIES = [
    *(_stage_entry(s) for s in STAGE_ORDER),
    *(_library_entry(f) for f in ("rmsnorm_fwd", "rmsnorm_fwd_tuned", "rmsnorm")),
    Entry("QuackRMSNorm", "module", _module_call, max_N=lambda d: R.MAX_N),
    *(_grader_entry(ex.id) for ex in all_exercises()),
]

# --------------------------------------------------------------------------------------------
# What must happen
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Raises:
    exc: type[BaseException]
    match: str  # a regex the message must contain: the argument's name and the fix
    gpu: bool = False  # the case needs a GPU to be built (mixed devices)


@dataclass(frozen=True)
class Defined:
    """The result equals the fp32 reference on the same inputs; NaN where it has NaN."""

    gpu: bool = True


@dataclass(frozen=True)
class Reported:
    """The grader returns a failed result whose messages match ``match``; it does not raise."""

    match: str
    gpu: bool = False


DEFINED = Defined()

# --------------------------------------------------------------------------------------------
# Building blocks
# --------------------------------------------------------------------------------------------


def x_(M=4, n=N, dtype=BF16, device=None):
    return torch.randn(M, n, device=device or DEV).to(dtype)


def w_(n=N, dtype=BF16, device=None):
    return (1 + 0.1 * torch.randn(n, device=device or DEV)).to(dtype)


def misaligned(t: torch.Tensor) -> torch.Tensor:
    """``t``'s values in a tensor whose data starts 2 bytes past a 16-byte boundary."""
    buf = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)
    out = buf[1:].view(t.shape)
    out.copy_(t)
    return out


def with_nonfinite(value: float):
    def build(e):
        x = x_()
        x[1, 7] = value
        return dict(x=x, weight=w_())

    return build


def raising_answer(*args, **kwargs):
    raise RuntimeError("boom from the answer")


def answer_without_args():
    return 0


# --------------------------------------------------------------------------------------------
# The table
# --------------------------------------------------------------------------------------------

_ON_CPU = r"x is on cpu: the kernels? runs? on a CUDA GPU.*\.cuda\(\)"
_ALL = ("stage", "library", "module")


@dataclass(frozen=True)
class Case:
    id: str
    build: Callable[[Entry], dict]
    #: what must happen: one for every entry in ``kinds``, or a dict by entry name
    #: ("rmsnorm.rmsnorm"), kind ("stage", "library", "module", "grader") or "vector"/"other"
    #: (a stage with 16-byte vector loads, or any other entry), first match wins
    expect: object
    kinds: tuple = _ALL
    #: whether it applies to this entry (beyond its kind)
    applies: Callable[[Entry], bool] = lambda e: True

    def expected(self, e: Entry):
        if not isinstance(self.expect, dict):
            return self.expect
        for key in (e.name, e.kind, "vector" if _vector(e) else "other"):
            if key in self.expect:
                return self.expect[key]
        raise KeyError(f"case {self.id}: no expectation for {e.name}")


def _vector(e: Entry) -> bool:
    return e.row_align(BF16) > 1


def _by_alignment(match: str) -> dict:
    """A vector stage rejects the layout with ``match``; every other entry handles it."""
    return {"vector": Raises(ValueError, match), "other": DEFINED}


CASES = [
    # --- types
    Case(
        "x not a tensor",
        lambda e: dict(x=[[1.0] * N], weight=w_()),
        Raises(TypeError, r"x must be a torch\.Tensor"),
    ),
    Case(
        "weight not a tensor",
        lambda e: dict(x=x_(), weight=[1.0] * N),
        Raises(TypeError, r"weight must be a torch\.Tensor"),
        kinds=("stage", "library"),
    ),
    Case(
        "bias not a tensor",
        lambda e: dict(x=x_(), weight=w_(), bias=[1.0] * N),
        Raises(TypeError, r"bias must be a torch\.Tensor"),
        kinds=("library",),
    ),
    Case(
        "residual not a tensor",
        lambda e: dict(x=x_(), weight=w_(), residual=3.0),
        Raises(TypeError, r"residual must be a torch\.Tensor"),
        kinds=("library",),
    ),
    Case(
        "out not a tensor",
        lambda e: dict(x=x_(), weight=w_(), out="out"),
        Raises(TypeError, r"out must be a torch\.Tensor"),
        kinds=("stage",),
    ),
    # --- dtypes
    *(
        Case(
            f"{arg} {dtype}".replace("torch.", ""),
            (
                lambda e, arg=arg, dtype=dtype: (
                    dict(x=x_(), weight=w_()) | {arg: (x_() if arg == "x" else w_()).to(dtype)}
                )
            ),
            Raises(TypeError, rf"{arg} has dtype {re.escape(str(dtype))}; supported: .*float16"),
        )
        for arg in ("x", "weight")
        for dtype in (torch.int32, torch.float64, torch.float8_e4m3fn)
    ),
    Case(
        "bias int64",
        lambda e: dict(x=x_(), weight=w_(), bias=torch.ones(N, dtype=torch.int64)),
        Raises(TypeError, r"bias has dtype torch\.int64; supported"),
        kinds=("library",),
    ),
    Case(
        "residual float64",
        lambda e: dict(x=x_(), weight=w_(), residual=x_(dtype=torch.float64)),
        Raises(TypeError, r"residual has dtype torch\.float64; supported"),
        kinds=("library",),
    ),
    Case(
        "out_dtype int32",
        lambda e: dict(x=x_(), weight=w_(), out_dtype=torch.int32),
        Raises(TypeError, r"out_dtype must be None or one of torch\.float16"),
        kinds=("library",),
    ),
    Case(
        "residual_dtype float8",
        lambda e: dict(x=x_(), weight=w_(), residual_dtype=torch.float8_e5m2),
        Raises(TypeError, r"residual_dtype must be None or one of"),
        kinds=("library",),
    ),
    Case(
        "out float32 for bf16 x",
        lambda e: dict(x=x_(), weight=w_(), out=torch.empty(4, N, device=DEV)),
        Raises(TypeError, r"out must have x's dtype torch\.bfloat16"),
        kinds=("stage",),
    ),
    # --- scalars
    Case(
        "eps a string",
        lambda e: dict(x=x_(), weight=w_(), eps="1e-6"),
        Raises(TypeError, r"eps must be a real number \(a Python float such as 1e-6\), got str"),
        kinds=("library",),
    ),
    Case(
        "weight_offset None",
        lambda e: dict(x=x_(), weight=w_(), weight_offset=None),
        Raises(TypeError, r"weight_offset must be a real number"),
        kinds=("library",),
    ),
    # --- shapes
    Case(
        "x 0-d",
        lambda e: dict(x=torch.tensor(1.0, device=DEV), weight=w_()),
        {
            "stage": Raises(ValueError, r"x must be 2-D \(M, N\).*x\.reshape"),
            "library": Raises(ValueError, r"x must have at least one dimension"),
            "module": Raises(ValueError, r"QuackRMSNorm\(256,\) expects x of shape"),
        },
    ),
    Case(
        "x 3-D",
        lambda e: dict(x=x_().view(2, 2, N), weight=w_()),
        Raises(ValueError, r"x must be 2-D \(M, N\).*x\.reshape\(-1, x\.shape\[-1\]\)"),
        kinds=("stage",),
    ),
    Case(
        "weight shorter than N",
        lambda e: dict(x=x_(), weight=w_(N // 2)),
        Raises(ValueError, r"weight must have shape \(256,\)"),
    ),
    Case(
        "weight 2-D (1, N)",
        lambda e: dict(x=x_(), weight=w_().view(1, N)),
        Raises(ValueError, r"weight must have shape"),
    ),
    Case(
        "bias shape",
        lambda e: dict(x=x_(), weight=w_(), bias=w_(N - 8)),
        Raises(ValueError, r"bias must have weight's shape \(256,\)"),
        kinds=("library",),
    ),
    Case(
        "residual shape",
        lambda e: dict(x=x_(), weight=w_(), residual=x_(M=3)),
        Raises(ValueError, r"residual must have x's shape \(4, 256\)"),
        kinds=("library",),
    ),
    Case(
        "out shape",
        lambda e: dict(x=x_(), weight=w_(), out=x_(M=3)),
        Raises(ValueError, r"out must have x's shape \(4, 256\)"),
        kinds=("stage",),
    ),
    Case(
        "N = 0",
        lambda e: dict(x=torch.empty(4, 0, dtype=BF16, device=DEV), weight=w_(0)),
        Raises(ValueError, r"x has .*N ?= ?0"),
    ),
    Case(
        "N beyond the kernel's",
        lambda e: dict(x=x_(M=1, n=e.max_N(BF16) + 8), weight=w_(e.max_N(BF16) + 8)),
        Raises(ValueError, r"N ?= ?262152 .*at most 262144"),
        applies=lambda e: e.max_N(BF16) is not None,
    ),
    Case(
        "N not a multiple of the vector",
        lambda e: dict(x=x_(n=250), weight=w_(250)),
        _by_alignment(r"N must be a multiple of 8; got N=250"),
    ),
    Case("M = 0", lambda e: dict(x=x_(M=0), weight=w_()), DEFINED),
    # --- strides and pointers
    Case(
        "x last dim strided",
        lambda e: dict(x=x_(M=N, n=4).t(), weight=w_()),
        {
            "stage": Raises(ValueError, r"x's rows must be contiguous.*x\.contiguous\(\)"),
            "rmsnorm.rmsnorm_fwd": Raises(
                ValueError, r"x must have a last-dim stride of 1.*x\.contiguous\(\)"
            ),
            "rmsnorm.rmsnorm_fwd_tuned": Raises(
                ValueError, r"x must have a last-dim stride of 1.*x\.contiguous\(\)"
            ),
            "library": DEFINED,
            "module": DEFINED,
        },
    ),
    Case(
        "weight strided",
        lambda e: dict(x=x_(), weight=w_(2 * N)[::2]),
        Raises(ValueError, r"weight must .*weight\.contiguous\(\)"),
    ),
    Case(
        "residual last dim strided",
        lambda e: dict(x=x_(), weight=w_(), residual=x_(M=N, n=4).t()),
        {
            "rmsnorm.rmsnorm": DEFINED,
            "library": Raises(
                ValueError, r"residual must have a last-dim stride of 1.*residual\.contiguous\(\)"
            ),
        },
        kinds=("library",),
    ),
    Case(
        "out last dim strided",
        lambda e: dict(x=x_(), weight=w_(), out=x_(M=N, n=4).t()),
        Raises(ValueError, r"out's rows must be contiguous.*out=None"),
        kinds=("stage",),
    ),
    Case(
        "out rows overlap",
        lambda e: dict(x=x_(), weight=w_(), out=x_(M=1).expand(4, N)),
        Raises(ValueError, r"out's rows must .*not overlap.*out=None"),
        kinds=("stage",),
    ),
    Case("x rows overlap (stride 0)", lambda e: dict(x=x_(M=1).expand(4, N), weight=w_()), DEFINED),
    Case(
        "x row stride not 16 bytes",
        lambda e: dict(x=x_(n=N + 4)[:, :N], weight=w_()),
        _by_alignment(r"x's row stride must be a multiple of 8.*x\.contiguous\(\)"),
    ),
    Case(
        "x misaligned pointer",
        lambda e: dict(x=misaligned(x_()), weight=w_()),
        _by_alignment(r"x must start on a 16-byte boundary.*x\.clone\(\)"),
    ),
    Case(
        "weight misaligned pointer",
        lambda e: dict(x=x_(), weight=misaligned(w_())),
        _by_alignment(r"weight must start on a 16-byte boundary.*weight\.clone\(\)"),
    ),
    Case(
        "out misaligned pointer",
        lambda e: dict(x=x_(), weight=w_(), out=misaligned(x_())),
        _by_alignment(r"out must start on a 16-byte boundary.*out=None"),
        kinds=("stage",),
    ),
    # --- devices
    Case(
        "CPU tensors",
        lambda e: dict(x=x_(device="cpu"), weight=w_(device="cpu")),
        Raises(ValueError, _ON_CPU),
    ),
    Case(
        "meta tensors",
        lambda e: dict(x=x_(device="meta"), weight=w_(device="meta")),
        Raises(ValueError, r"x is on meta: the kernels? runs? on a CUDA GPU"),
    ),
    Case(
        "weight on the CPU, x on the GPU",
        lambda e: dict(x=x_(), weight=w_(device="cpu")),
        Raises(ValueError, r"weight is on cpu but x is on cuda.*same GPU", gpu=True),
        kinds=("stage", "library"),
    ),
    Case(
        "residual on the CPU, x on the GPU",
        lambda e: dict(x=x_(), weight=w_(), residual=x_(device="cpu")),
        Raises(ValueError, r"residual is on cpu but x is on cuda.*same GPU", gpu=True),
        kinds=("library",),
    ),
    Case(
        "out on the CPU, x on the GPU",
        lambda e: dict(x=x_(), weight=w_(), out=x_(device="cpu")),
        Raises(ValueError, r"out is on cpu but x is on cuda.*same GPU", gpu=True),
        kinds=("stage",),
    ),
    # --- values: NaN and Inf propagate as in the reference (that row only)
    Case("NaN in x", with_nonfinite(float("nan")), DEFINED),
    Case("Inf in x", with_nonfinite(float("inf")), DEFINED),
    # --- the grader: bad answers are reported failures, never a crash
    Case(
        "answer not callable",
        lambda e: dict(answer=42),
        Reported(r"not callable"),
        kinds=("grader",),
    ),
    Case(
        "answer with the wrong signature",
        lambda e: dict(answer=answer_without_args),
        Reported(r"takes 0 positional arguments"),
        kinds=("grader",),
    ),
    Case(
        "answer that raises",
        lambda e: dict(answer=raising_answer),
        Reported(r"RuntimeError: boom from the answer"),
        kinds=("grader",),
    ),
]


def _params():
    for case in CASES:
        for e in ENTRIES:
            if e.kind not in case.kinds or not case.applies(e):
                continue
            exp = case.expected(e)
            marks = [pytest.mark.gpu] if exp.gpu else []
            yield pytest.param(case, e, exp, id=f"{case.id}-{e.name}", marks=marks)


PARAMS = list(_params())


@pytest.mark.parametrize(("case", "entry", "expect"), PARAMS)
def test_bad_input(case: Case, entry: Entry, expect, monkeypatch):
    monkeypatch.setenv("QUACK_EDU_AUTOTUNE_CACHE", "0")  # rmsnorm_fwd_tuned: no on-disk winners
    args = case.build(entry)
    if isinstance(expect, Raises):
        with pytest.raises(expect.exc) as info:
            entry.call(args)
        assert re.search(expect.match, str(info.value)), (
            f"{entry.name}: the message {str(info.value)!r} does not match {expect.match!r}"
        )
    elif isinstance(expect, Reported):
        res = entry.call(args)
        messages = " | ".join(c.message or "" for c in res.checks)
        assert res.status == "fail", f"{entry.name}: status {res.status}: {messages}"
        assert re.search(expect.match, messages), messages
    else:
        out = entry.call(args)
        x = args["x"]
        ref = rmsnorm_ref(x, args.get("weight"), args.get("bias"), args.get("residual"))
        if isinstance(ref, tuple):
            ref = ref[0]
        assert out.shape == x.shape and out.dtype == x.dtype
        torch.testing.assert_close(
            out.float(), ref.to(x.dtype).float(), **TOLERANCES[x.dtype], equal_nan=True
        )


def test_table_covers_every_entry_point():
    """Every entry point gets cases, and every case runs on at least one entry point."""
    names = {p.values[1].name for p in PARAMS}
    assert names == {e.name for e in ENTRIES}
    assert {p.values[0].id for p in PARAMS} == {c.id for c in CASES}
    assert len({p.id for p in PARAMS}) == len(PARAMS)
