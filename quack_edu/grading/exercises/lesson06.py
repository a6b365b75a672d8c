"""Lesson 06, the final kernel and the library: one hole in the kernel, one in the torch op.

06.epilogue   the per-vector epilogue of the final kernel, in fp32: x_hat * (w + offset) + b
06.fake_impl  the fake (meta) implementation of the op ``quack_edu::rmsnorm_fwd``: empty
              outputs of the right shapes, dtypes and devices, so torch.compile can trace it

The epilogue's compile tier reads the PTX of the final kernel built around the answer with
every operand of the epilogue in its own dtype (x fp32, weight bf16, bias fp16), so that each
one is recognisable by its conversion: the weight is what ``cvt.f32.bf16`` makes, the bias what
``cvt.f32.f16`` makes, and the offset the fp32 constant. Following the registers from the
output stores back says which of them reach the output and whether the offset was added before
or after the multiply by rstd. The gpu tier runs the learner's kernel class through
``final.launch_fwd(..., kernel_cls=...)`` with a bias, an offset and both weight dtypes.

The fake's compile tier runs the answer under ``FakeTensorMode`` (no GPU, no data) on a table
of cases and compares what it returns with the library's own fake (the op called under the
same mode). Its gpu tier registers the answer as the fake of a scratch custom op around the
real kernel and runs ``torch.library.opcheck`` and ``torch.compile(fullgraph=True)`` through it.
"""

from __future__ import annotations

import itertools
import os

from ..checks import (
    CheckFailed,
    KernelHole,
    Ptx,
    _shared_get,
    _shared_put,
    f32_hex,
    gpu_values,
    is_not_implemented,
)  # fmt: skip
from ..registry import COMPILE, GPU, TIERS, Check, Exercise, mutants, register

LESSON = "06_final_kernel"

# ---- 06.epilogue -----------------------------------------------------------------------------
EPILOGUE_HOLE = KernelHole(
    stage="final",
    piece="scale",
    adapt=lambda answer: lambda self, x_hat, w, b: answer(x_hat, w, b, self.features.weight_offset),
)

#: Gemma's offset: the weight is stored as w, the layer multiplies by (1 + w)
OFFSET = 1.0
#: the compile tier's dtypes: each operand of the epilogue recognisable by its conversion
X_DTYPE, W_DTYPE, B_DTYPE = "fp32", "bf16", "fp16"

OFFSET_AFTER = (
    "weight_offset is added after the multiply (x_hat * w + offset): the offset belongs to the "
    "weight, the layer's factor is (w + weight_offset), e.g. Gemma's (1 + w); add it to w first, "
    "then multiply x_hat by the sum"
)
NO_OFFSET = (
    "weight_offset never reaches the output: the weight the layer multiplies by is "
    "(w + weight_offset), in fp32 (the kernel passes the offset as a Python float)"
)
NO_BIAS = (
    "the bias never reaches the output: when b is not None it is added last, "
    "y = x_hat * (w + weight_offset) + b"
)
NO_WEIGHT_WITH_BIAS = (
    "the weight never reaches the output when there is a bias: the bias comes on top of the "
    "weight, not instead of it; handle w and b independently (either may be None)"
)
BIAS_SCALED = (
    "the bias is multiplied (by x_hat or the weight): it is added after the multiply, "
    "y = x_hat * (w + weight_offset) + b"
)


def _features(bias: bool = True, offset: float = OFFSET):
    import torch

    from ...stages.final import Features

    return Features(bias_dtype=torch.float16 if bias else None, weight_offset=offset)


def _epilogue_report(ctx, N: int):
    """The final kernel with the learner's ``scale``, compiled for x fp32, weight bf16, bias fp16
    and weight_offset=1.0 at ``N`` (cached for the answer, like ``ctx.report``)."""
    from ...runtime import torch_dtype
    from ...tools.inspect import kernel_report
    from ..checks import _shared_get, _shared_put, shortcut_failure, shortcut_guard

    key = ("epilogue report", N)
    if key not in ctx.cache:
        rep = _shared_get(ctx.answer, key)
        if rep is None:
            cls = EPILOGUE_HOLE.build(ctx.answer)
            kernel = cls(torch_dtype(X_DTYPE), N, None, torch_dtype(W_DTYPE), features=_features())
            with shortcut_guard() as seen:
                rep = kernel_report(kernel, stage=f"final+{ctx.exercise.id}")
            if seen:
                raise shortcut_failure(seen[0])
            _shared_put(ctx.answer, key, rep)
        ctx.cache[key] = rep
    return ctx.cache[key]


def _epilogue_compiles(hidden: bool) -> Check:
    def fn(ctx):
        N = ctx.hidden_N(EPILOGUE_HOLE, X_DTYPE) if hidden else 1000
        try:
            rep = _epilogue_report(ctx, N)
        except (CheckFailed, NotImplementedError):
            raise
        except Exception as e:
            if is_not_implemented(e):
                raise
            from .. import hints

            raise CheckFailed(
                f"the final kernel with your scale does not compile (x {X_DTYPE}, weight "
                f"{W_DTYPE}, bias {B_DTYPE}, N={N}): {hints.short_error(e, 400)}",
                hint=hints.diagnose_compile_error(e),
            ) from None
        return f"N={N}: {rep.registers} regs"

    name = "compiles with a bias and weight_offset=1.0" + (" at a random N" if hidden else "")
    return Check(name, COMPILE, fn, hidden)


def epilogue_flow(ptx_text: str) -> dict:
    """What reaches the output stores of a final kernel compiled with x fp32, weight bf16, bias
    fp16: {"weight", "bias", "offset": bool, "offset_after": bool, "bias_scaled": bool}."""
    ptx = Ptx(ptx_text)
    stores = [i for i in ptx.instrs if i.opcode.startswith("st.global")]
    anc: dict[int, object] = {}
    for st in stores:
        for a in ptx.ancestors(st):
            anc[a.index] = a
    k = f32_hex(OFFSET)
    weight = [a for a in anc.values() if a.opcode.startswith("cvt.f32.bf16")]
    bias = [a for a in anc.values() if a.opcode.startswith("cvt.f32.f16")]
    offsets = [a for a in anc.values() if any(k in o for o in a.operands)]

    def after_rstd(ins):
        return any(a.opcode.startswith("rsqrt") for a in ptx.ancestors(ins))

    bias_regs = {d for b in bias for d in b.dests}
    scaled = False
    for a in anc.values():  # a bias value as a multiplicand
        if a.opcode.startswith("mul.") and bias_regs & set(a.srcs):
            scaled = True
        if a.opcode.startswith("fma.") and bias_regs & {
            r for o in a.operands[1:3] for r in _regs(o)
        }:
            scaled = True
    return {
        "weight": bool(weight),
        "bias": bool(bias),
        "offset": bool(offsets),
        "offset_after": any(after_rstd(o) for o in offsets),
        "bias_scaled": scaled,
    }


def _regs(operand: str) -> list[str]:
    import re

    return re.findall(r"%[A-Za-z_]+\d*", operand)


def _probe_epilogue(rep) -> str:
    flow = epilogue_flow(rep.ptx)
    seen = ", ".join(k for k in ("weight", "bias", "offset") if flow[k]) or "x_hat alone"
    expected = "x_hat * (w + 1.0) + b: the weight, the offset (added to w) and the bias"
    if not flow["weight"]:
        raise CheckFailed(
            "the weight does not reach the output",
            expected=expected,
            seen=f"the output depends on {seen}",
            hint=NO_WEIGHT_WITH_BIAS if flow["bias"] else None,
        )
    if not flow["bias"]:
        raise CheckFailed(
            "the bias does not reach the output", expected=expected, seen=seen, hint=NO_BIAS
        )
    if not flow["offset"]:
        raise CheckFailed(
            "weight_offset=1.0 does not reach the output",
            expected=f"an add of {f32_hex(OFFSET)} (1.0) to the weight",
            seen=f"no {f32_hex(OFFSET)} among the output's inputs",
            hint=NO_OFFSET,
        )
    if flow["offset_after"]:
        raise CheckFailed(
            "the offset is added to a value that already depends on rstd",
            expected=f"add.f32 w, {f32_hex(OFFSET)} before the multiply by x_hat",
            seen=f"{f32_hex(OFFSET)} added after the multiply",
            hint=OFFSET_AFTER,
        )
    if flow["bias_scaled"]:
        raise CheckFailed(
            "the bias is a factor of a multiply",
            expected="the bias as the addend (fma's third operand, or an add.f32)",
            seen="the bias in a mul/fma multiplicand",
            hint=BIAS_SCALED,
        )
    return "w + 1.0 (before the multiply), then + b: all three reach the output"


def _epilogue_probe(hidden: bool) -> Check:
    def fn(ctx):
        N = ctx.hidden_N(EPILOGUE_HOLE, X_DTYPE) if hidden else 1000
        return _probe_epilogue(_epilogue_report(ctx, N))

    name = "the PTX: x_hat * (w + 1.0) + b, with the weight, the offset and the bias" + (
        " at a random N" if hidden else ""
    )
    needs = ("compiles with a bias and weight_offset=1.0" + (" at a random N" if hidden else ""),)
    return Check(name, COMPILE, fn, hidden, needs)


# the gpu tier: values, and the known wrong epilogues as functions of (x_hat, w, b, offset)
def _ep_right(xh, w, b, off):
    y = xh if w is None else xh * (w + off)
    return y if b is None else y + b


_EP_VARIANTS = (
    (
        "offset after the multiply",
        lambda xh, w, b, off: (xh if w is None else xh * w + off) + (0 if b is None else b),
        OFFSET_AFTER,
    ),
    (
        "no offset",
        lambda xh, w, b, off: (xh if w is None else xh * w) + (0 if b is None else b),
        NO_OFFSET,
    ),
    ("no bias", lambda xh, w, b, off: xh if w is None else xh * (w + off), NO_BIAS),
    (
        "no weight with a bias",
        lambda xh, w, b, off: _ep_right(xh, None if b is not None else w, b, off),
        NO_WEIGHT_WITH_BIAS,
    ),
)

#: (x dtypes, weight dtype or None, bias?, offset) of the gpu value cases
_EP_CASES = (
    ("fp32", True, OFFSET),
    ("bf16", True, OFFSET),
    ("fp32", False, OFFSET),
    ("bf16", True, 0.0),
    (None, True, 0.0),
)


def _epilogue_values(hidden: bool) -> Check:
    def fn(ctx):
        import torch

        from ...reference import TOLERANCES, rmsnorm_ref
        from ...runtime import torch_dtype
        from ...stages import final
        from ..checks import EPS, HIDDEN_M, VISIBLE_M, rmsnorm_inputs

        cls = EPILOGUE_HOLE.build(ctx.answer)
        gen = ctx.torch_generator(salt="epilogue" + ("h" if hidden else ""))
        Ms = HIDDEN_M if hidden else VISIBLE_M
        n = 0
        for dt in ("bf16", "fp16", "fp32"):
            dtype = torch_dtype(dt)
            tol = TOLERANCES[dtype]
            N = ctx.hidden_N(EPILOGUE_HOLE, dt) if hidden else 1000
            for wdt, has_bias, off in _EP_CASES:
                for M in Ms:
                    x, _ = rmsnorm_inputs(M, N, dtype, gen)
                    w = b = None
                    if wdt is not None:
                        # small weights: (1 + w) rounded to bf16 would lose them
                        w = (1e-2 * torch.randn(N, generator=gen)).to("cuda", torch_dtype(wdt))
                    if has_bias:
                        b = torch.randn(N, generator=gen).to("cuda", torch_dtype(wdt or "bf16"))
                    out = torch.full_like(x, float("nan"))
                    final.launch_fwd(x, w, b, None, out, None, None, EPS, off, kernel_cls=cls)
                    torch.cuda.synchronize()
                    ref = rmsnorm_ref(x, w, b, eps=EPS, weight_offset=off)
                    o, r = out.float().cpu(), ref.float().cpu()
                    if bool(torch.isclose(o, r, **tol).all()):
                        n += 1
                        continue
                    hint = _diagnose_epilogue(o, x, w, b, off, tol)
                    bad = ~torch.isclose(o, r, **tol)
                    idx = int(bad.flatten().nonzero()[0])
                    row, col = divmod(idx, N)
                    raise CheckFailed(
                        f"{dt} M={M} N={N}, weight {wdt or 'None'}, bias "
                        f"{'yes' if has_bias else 'no'}, weight_offset={off} (seed {ctx.seed}): "
                        f"{int(bad.sum())} of {M * N} outputs differ from rmsnorm_ref",
                        expected=f"{r[row, col].item():.6g} at row {row}, column {col}",
                        seen=f"{o[row, col].item():.6g}",
                        hint=hint,
                    )
        return f"{n} cases match rmsnorm_ref (bias, offset, weight bf16/fp32/None)"

    name = "values vs rmsnorm_ref with bias and weight_offset " + (
        "at more shapes, grading seed" if hidden else "(M in 1/37/199, N=1000, 3 dtypes)"
    )
    return Check(name, GPU, fn, hidden, ("compiles with a bias and weight_offset=1.0",))


def _diagnose_epilogue(o, x, w, b, off, tol):
    import torch

    from ...reference import rstd_ref

    xf = x.float().cpu()
    xh = xf * rstd_ref(xf, 1e-6).unsqueeze(-1)
    wf = None if w is None else w.float().cpu()
    bf = None if b is None else b.float().cpu()
    for _, fn, hint in _EP_VARIANTS:
        cand = fn(xh, wf, bf, off)
        if not torch.is_tensor(cand):
            continue
        cand = cand.to(x.dtype).float()
        if torch.isclose(o, cand, **tol).float().mean().item() >= 0.999:
            right = _ep_right(xh, wf, bf, off).to(x.dtype).float()
            if not torch.isclose(cand, right, **tol).all():
                return hint
    if torch.isnan(o).any():
        from .. import hints

        return hints.NOT_WRITTEN.replace("poison value", "NaN")
    return None


# fmt: off
EPILOGUE_MUTANTS = mutants(TIERS,
    ("offset added after the multiply", "added after the multiply",
     "y * (w + weight_offset)", "y * w + weight_offset"),
    ("offset forgotten", "weight_offset never reaches the output",
     "y * (w + weight_offset)", "y * w"),
    ("bias forgotten", "the bias never reaches the output", "y = y + b", "y = y"),
    ("weight ignored when there is a bias",
     "the weight never reaches the output when there is a bias",
     "if w is not None:", "if w is not None and b is None:"),
)
# fmt: on

epilogue = register(
    Exercise(
        id="06.epilogue",
        lesson=LESSON,
        answer="scale",
        title="the epilogue of the final kernel: x_hat * (w + weight_offset) + b, in fp32",
        points={COMPILE: 1, GPU: 1},
        mutants=EPILOGUE_MUTANTS,
    )
)
epilogue.add(
    _epilogue_compiles(hidden=False),
    _epilogue_probe(hidden=False),
    _epilogue_compiles(hidden=True),
    _epilogue_probe(hidden=True),
    _epilogue_values(hidden=False),
    _epilogue_values(hidden=True),
)


# ---- 06.fake_impl ----------------------------------------------------------------------------
FAKE_ALIAS = (
    "an output is one of the inputs (or a view of it): a custom op declared with "
    "mutates_args=() returns fresh tensors, never an input or an alias of one (the library makes "
    "the 'residual_out is x' case outside the op); allocate it with x.new_empty"
)
FAKE_RSTD_DTYPE = "rstd is float32 whatever the input dtypes: x.new_empty(..., dtype=torch.float32)"
FAKE_RSTD_SHAPE = "rstd has one value per row: x.shape[:-1] (every dim but the last), not x's shape"
FAKE_OUT_DTYPE = (
    "out is in out_dtype (the op always receives it, e.g. fp32 out of bf16 x), not x.dtype"
)
FAKE_COUNT = (
    "the op returns a list: [out], then residual_out only if residual_out_dtype is not None, "
    "then rstd only if store_rstd"
)
FAKE_DEVICE = (
    "the fake outputs must be on x's device (x.new_empty keeps it; torch.empty without "
    "device= makes CPU tensors)"
)
FAKE_STRIDES = (
    "the real op returns dense (contiguous) outputs whatever x's strides; torch.empty_like(x) "
    "copies x's strides: use x.new_empty(shape, dtype=...)"
)
FAKE_RES_DTYPE = "residual_out is in residual_out_dtype"


def _fake_cases(ctx, hidden: bool):
    """(description, x shape, x stride slice?, weight shape or None, dtypes..., kwargs)."""
    import torch

    bf, h, f = torch.bfloat16, torch.float16, torch.float32
    # (what, x shape, x dtype, weight, bias, residual dtype, out, res out, rstd, non-dense x)
    cases = [
        ("plain bf16", (4, 64), bf, bf, False, None, bf, None, False, False),
        ("fp32 out and rstd, 3-D x", (2, 3, 64), h, f, False, None, f, None, True, False),
        ("residual, fp32 residual_out", (5, 64), bf, f, True, bf, bf, f, True, False),
        ("residual_out_dtype without residual", (6, 64), bf, bf, False, None, bf, f, False, False),
        ("per-head weight (H, D), 4-D x", (2, 7, 4, 32), bf, bf, True, None, bf, None, True, False),
        ("a 1-D x (one row)", (64,), f, f, False, f, h, f, True, False),
        ("x with its leading dims' strides swapped", (3, 2, 64), bf, f, False, None, f, bf, True,
         True),
    ]  # fmt: skip
    if hidden:
        rng = ctx.rng("fake cases")
        dts = (bf, h, f)
        for i in range(6):
            lead = tuple(rng.randint(1, 9) for _ in range(rng.randint(1, 3)))
            res = rng.choice((None, *dts))
            cases.append(
                (
                    f"random case {i}",
                    (*lead, rng.choice((8, 96, 1000))),
                    rng.choice(dts),
                    rng.choice((None, *dts)),
                    rng.random() < 0.5,
                    res,
                    rng.choice(dts),
                    rng.choice(dts) if res is not None or rng.random() < 0.3 else None,
                    rng.random() < 0.5,
                    rng.random() < 0.3,
                )
            )
    return cases


def _fake_inputs(case, device):
    import torch

    what, shape, xdt, wdt, bias, resdt, outdt, resodt, rstd, strided = case
    if strided and len(shape) >= 3:  # dense, the first two dims' strides swapped
        swapped = (shape[1], shape[0], *shape[2:])
        st = torch.empty(swapped, device="meta").stride()
        x = torch.empty_strided(shape, (st[1], st[0], *st[2:]), device=device, dtype=xdt)
    elif strided and len(shape) == 2:  # rows of a wider tensor
        x = torch.empty_strided(shape, (2 * shape[1], 1), device=device, dtype=xdt)
    else:
        x = torch.empty(shape, device=device, dtype=xdt)
    per_head = "per-head" in what
    pshape = tuple(shape[-2:]) if per_head else (shape[-1],)
    w = None if wdt is None else torch.empty(pshape, device=device, dtype=wdt)
    b = torch.empty(pshape, device=device, dtype=wdt or torch.bfloat16) if bias else None
    res = None if resdt is None else torch.empty(shape, device=device, dtype=resdt)
    return (x, w, b, res, outdt, resodt, 1e-6, rstd, 0.0)


def _describe(outs) -> str:
    if not isinstance(outs, list | tuple):
        return type(outs).__name__
    return "[" + ", ".join(
        f"{str(o.dtype).removeprefix('torch.')}{list(o.shape)}" if hasattr(o, "dtype") else
        type(o).__name__
        for o in outs
    ) + "]"  # fmt: skip


def _compare_fake(args, got, want) -> tuple[str, str | None] | None:
    """None if ``got`` (the answer's outputs) matches ``want`` (the library fake's), else
    (what differs, hint)."""
    import torch

    x = args[0]
    if not isinstance(got, list | tuple):
        return f"returned a {type(got).__name__}, not a list of tensors", FAKE_COUNT
    inputs = [t for t in args[:4] if torch.is_tensor(t)]
    for i, o in enumerate(got):
        if not torch.is_tensor(o):
            return f"output {i} is a {type(o).__name__}", FAKE_COUNT
        if any(o is t or o._base is t or (t._base is not None and o._base is t._base) for t in
               inputs):  # fmt: skip
            return f"output {i} is an input (or a view of one)", FAKE_ALIAS
    if len(got) != len(want):
        return f"{len(got)} outputs for {len(want)}", FAKE_COUNT
    names = (
        ["out"] + (["residual_out"] if args[5] is not None else []) + (["rstd"] if args[7] else [])
    )
    for name, o, w in zip(names, got, want, strict=True):
        if o.dtype != w.dtype:
            if name == "rstd":
                hint = FAKE_RSTD_DTYPE
            elif name == "out":
                hint = FAKE_OUT_DTYPE if o.dtype == x.dtype else None
            else:
                hint = FAKE_RES_DTYPE
            return f"{name} is {o.dtype}, the op's is {w.dtype}", hint
        if tuple(o.shape) != tuple(w.shape):
            hint = FAKE_RSTD_SHAPE if name == "rstd" and tuple(o.shape) == tuple(x.shape) else None
            return f"{name} has shape {tuple(o.shape)}, the op's {tuple(w.shape)}", hint
        if o.device != w.device:
            return f"{name} is on {o.device}, the op's on {w.device}", FAKE_DEVICE
        if o.numel() > 1 and tuple(o.stride()) != tuple(w.stride()):
            return f"{name} has strides {tuple(o.stride())}, the op's {tuple(w.stride())}", (
                FAKE_STRIDES
            )
    return None


def _run_fake_cases(ctx, hidden: bool, device="cuda"):
    """Each case under FakeTensorMode: the answer's outputs against the library's fake.
    Returns [(case, args, got, want, problem)] with problem None where they agree."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from ...rmsnorm import _fwd_op  # noqa: F401  (importing it registers the op and its fake)

    op = torch.ops.quack_edu.rmsnorm_fwd.default
    out = []
    for case in _fake_cases(ctx, hidden):
        with FakeTensorMode():
            args = _fake_inputs(case, device)
            want = list(op(*args))
            got = ctx.call(*args)
            out.append((case, args, got, want, _compare_fake(args, got, want)))
    return out


def _fake_value_check(hidden: bool) -> Check:
    def fn(ctx):
        for case, args, got, want, problem in _run_fake_cases(ctx, hidden):
            if problem is not None:
                what, hint = problem
                x = args[0]
                raise CheckFailed(
                    f"{case[0]}: {what} (x {str(x.dtype).removeprefix('torch.')}"
                    f"{list(x.shape)}, out_dtype={args[4]}, residual_out_dtype={args[5]}, "
                    f"store_rstd={args[7]})",
                    expected=_describe(want),
                    seen=_describe(got),
                    hint=hint,
                )
        n = len(_fake_cases(ctx, hidden))
        return f"{n} cases match the library's fake under FakeTensorMode"

    name = (
        "random cases under FakeTensorMode (grading seed)"
        if hidden
        else "shapes, dtypes, devices and strides under FakeTensorMode vs the library's fake"
    )
    return Check(name, COMPILE, fn, hidden)


_op_counter = itertools.count()


def scratch_op(fake):
    """A fresh custom op ``quack_edu_grading::fwd_<pid>_<k>`` with the schema of
    ``quack_edu::rmsnorm_fwd``, the real kernel as its body and ``fake`` as its fake."""
    import torch

    from ...rmsnorm import _fwd_body

    schema = str(torch.ops.quack_edu.rmsnorm_fwd.default._schema)
    schema = schema[schema.index("(") :]
    name = f"quack_edu_grading::fwd_{os.getpid()}_{next(_op_counter)}"
    op = torch.library.custom_op(name, _fwd_body, mutates_args=(), schema=schema)

    def fake_fn(x, weight, bias, residual, out_dtype, res_dtype, eps, store_rstd, offset):
        return fake(x, weight, bias, residual, out_dtype, res_dtype, eps, store_rstd, offset)

    op.register_fake(fake_fn)
    return op


def _fake_gpu_check(hidden: bool) -> Check:
    def fn(ctx):
        import torch

        from ...reference import TOLERANCES, rmsnorm_ref

        def hint_from_cpu():
            for *_, problem in _run_fake_cases(ctx, hidden):
                if problem is not None:
                    return problem[1]
            return None

        op = scratch_op(ctx.answer)
        gen = ctx.torch_generator(device="cuda", salt="fake" + ("h" if hidden else ""))
        Ms = (3, 131) if hidden else (37,)
        bf = torch.bfloat16
        n = 0
        for M in Ms:
            x = torch.randn(M, 1000, device="cuda", dtype=bf, generator=gen)
            res = torch.randn(M, 1000, device="cuda", dtype=torch.float32, generator=gen)
            w = torch.randn(1000, device="cuda", generator=gen)
            samples = [
                (x, w, None, res, torch.float32, torch.float32, 1e-6, True, 0.5),
                (x, None, None, None, bf, None, 1e-6, False, 0.0),
                (x, w.to(bf), None, None, bf, None, 1e-6, True, 0.0),
            ]
            for args in samples:
                try:
                    torch.library.opcheck(op, args)
                except Exception as e:
                    raise CheckFailed(
                        f"torch.library.opcheck of an op with your fake failed (M={M}): "
                        f"{type(e).__name__}: {str(e)[:400]}",
                        hint=hint_from_cpu(),
                    ) from None
                n += 1

            def f(x, w):
                out, rstd = op(x, w, None, None, torch.float32, None, 1e-6, True, 0.0)
                return out * 2.0, rstd

            torch._dynamo.reset()
            try:
                out, rstd = torch.compile(f, fullgraph=True)(x, w)
                torch.cuda.synchronize()
            except Exception as e:
                raise CheckFailed(
                    f"torch.compile(fullgraph=True) through an op with your fake failed "
                    f"(M={M}): {type(e).__name__}: {str(e)[:400]}",
                    hint=hint_from_cpu(),
                ) from None
            ref = 2.0 * rmsnorm_ref(x, w, eps=1e-6).float()
            if (
                out.dtype != torch.float32
                or rstd.dtype != torch.float32
                or not bool(torch.isclose(out.cpu(), ref.cpu(), **TOLERANCES[bf]).all())
            ):
                raise CheckFailed(
                    f"torch.compile through an op with your fake gave wrong outputs (M={M})",
                    expected="out (fp32) = 2 * rmsnorm_ref(x, w), rstd fp32",
                    seen=f"out {out.dtype}, rstd {rstd.dtype}",
                    hint=hint_from_cpu(),
                )
            n += 1
        return f"{n} opchecks and compiled graphs passed"

    name = (
        "opcheck and torch.compile through a scratch op, grading seed"
        if hidden
        else "torch.library.opcheck and torch.compile(fullgraph=True) with your fake (GPU)"
    )
    return Check(name, GPU, fn, hidden)


# fmt: off
FAKE_IMPL_MUTANTS = mutants(TIERS,
    ("rstd in bf16", "rstd is float32",
     "x.shape[:-1], dtype=torch.float32", "x.shape[:-1], dtype=torch.bfloat16"),
    ("rstd of x's shape", "one value per row", "x.new_empty(x.shape[:-1]", "x.new_empty(x.shape"),
    ("residual_out is x itself", "never an input or an alias",
     "outs.append(x.new_empty(x.shape, dtype=residual_out_dtype))", "outs.append(x)"),
    ("out in x's dtype", "out is in out_dtype",
     "[x.new_empty(x.shape, dtype=out_dtype)]", "[x.new_empty(x.shape, dtype=x.dtype)]"),
)
# fmt: on

fake_impl = register(
    Exercise(
        id="06.fake_impl",
        lesson=LESSON,
        answer="rmsnorm_fwd_fake",
        title="the fake implementation of quack_edu::rmsnorm_fwd: outputs without data",
        points={COMPILE: 1, GPU: 1},
        mutants=FAKE_IMPL_MUTANTS,
    )
)
fake_impl.add(
    _fake_value_check(hidden=False),
    _fake_value_check(hidden=True),
    _fake_gpu_check(hidden=False),
    _fake_gpu_check(hidden=True),
)


# ---- 06.row_loop -------------------------------------------------------------------------------
def loop_config(N, dtype):
    """The plan the exercise's loop is for: a cluster of 2 CTAs a row, two buffers of x, 4 row
    blocks a CTA (2 rows a block), the weight slice in shared memory."""
    from ...config import FinalConfig

    return FinalConfig(64, 128, cluster_n=2, buffers=2, blocks_per_cta=4)


#: the helpers in row_blocks's order, by the names the replay records their calls under
HELPER_KINDS = ("issue", "first", "send", "wait", "combine", "rearm", "second")
HELPER_ARGS = {
    "issue": ("blk", "b"),
    "first": ("it", "blk", "b"),
    "send": ("val", "p"),
    "wait": ("p", "phase"),
    "combine": ("p",),
    "rearm": ("p",),
    "second": ("it", "blk", "b", "total"),
}
#: the helper calls of the latest compile of a learner's loop, in the order traced: (kind,
#: {argument index: value} of the arguments that were Python constants, not values of the kernel)
_TRACE: list[tuple[str, dict]] = []


def _recording(kind, helper):
    def call(*args):
        consts = {i: a for i, a in enumerate(args) if isinstance(a, int)}
        _TRACE.append((kind, consts))
        return helper(*args)

    return call


def _traced(answer):
    """The kernel's ``row_blocks``: the learner's loop, each helper call recorded while the
    kernel is traced (one pass over the loop's body, each branch of a runtime ``if`` once)."""

    def method(self, n_iter, blk0, tidx, *helpers):
        _TRACE.clear()
        rec = [_recording(k, h) for k, h in zip(HELPER_KINDS, helpers, strict=True)]
        return answer(n_iter, blk0, tidx, *rec)

    return method


LOOP_HOLE = KernelHole(stage="final", piece="row_blocks", adapt=_traced)
REPLAY = "the loop replayed on the CPU: buffers, exchange parity, mbarrier phases, re-arms"
LOOP_COMPILES = "compiles (cluster of 2, two buffers, 4 row blocks a CTA)"

L_BLOCK = (
    "iteration it works on row block blk0 + it (the CTA's blocks are consecutive): pass that "
    "block to first_pass and second_pass"
)
L_BUFFER = (
    "the block read is not the one in that buffer: block blk0 was copied into buffer 0 before "
    "the loop, and each iteration copies the next block into the other buffer, so block it is "
    "in buffer it % 2"
)
L_OVERWRITE = (
    "the next block's copies go into the buffer this iteration still reads: with two buffers, "
    "block it + 1 goes into 1 - (it % 2) while block it is summed and stored from it % 2"
)
L_NO_OVERLAP = (
    "the next block is issued only after this block's first pass: issue(blk + 1, ...) first, so "
    "that its copies are in flight while this block is summed (that is what two buffers are for)"
)
L_PARITY = (
    "the exchange of block it must use buffer and mbarrier it % 2: with one of each, a fast peer's "
    "partials for the next block could land while this CTA still reads this block's (the two "
    "alternate, so that a buffer is reused only two blocks later)"
)
L_SEND = "send this block's own sum of squares, the value first_pass returned, to the peers"
L_PHASE = (
    "wrong mbarrier phase: barrier p = it % 2 serves blocks p, p + 2, p + 4, ...; its k-th use "
    "(k = it // 2) completes phase k, and mbarrier_wait takes that phase's parity, (it // 2) % 2. "
    "A wrong parity returns at once (garbage) or never (a hang)"
)
L_NOT_ARMED = (
    "a wait on a barrier that was not armed again after its last phase: its peers' bytes can "
    "never complete it, a hang. After the wait, re-arm barrier it % 2 for block it + 2"
)
L_REARM_EARLY = (
    "the barrier is re-armed before this block's wait on it completed: the arm belongs to its "
    "next phase (block it + 2), so it comes after wait_peers"
)
L_REARM_EXTRA = (
    "the barrier is re-armed for a block that does not exist (it + 2 >= n_iter): it would wait "
    "for bytes no peer sends, and the CTA may exit with it armed. Re-arm only if it + 2 < n_iter"
)
L_REARM_ONE = (
    "more than one thread re-arms: the mbarrier counts one arrival (the arming thread's), so "
    "only thread 0 (tidx == 0) arms it"
)
L_COMBINE = "combine(p) reads the peers' partials: only after wait_peers(p, ...) has returned"
L_SECOND = "second_pass gets the row's total, the value combine returned for this block"
L_MISSING = (
    "iterations are missing: the loop runs it = 0, 1, ..., n_iter - 1 "
    "(cutlass.range(n_iter, unroll=1)), and every iteration calls first_pass and second_pass "
    "for its block blk0 + it; a block left out is never normalized"
)
L_ITERS = (
    "first_pass and second_pass take the loop's own counter: it, blk0 + it, in order, once each "
    "an iteration"
)
L_LAST_ISSUE = (
    "the last iteration issues no next block: issue it anyway. issue(blk, b) copies nothing "
    "past the CTA's last block, but it still commits the copy groups that first_pass counts on "
    "(first_pass lets one block's groups stay in flight, the next block's: without them, it "
    "would read this block before it lands)"
)
L_NO_WAIT = (
    "no wait: the compiled loop never calls wait_peers, so combine reads the exchange buffer "
    "before the peers' partials have landed. Every iteration waits on barrier it % 2 for phase "
    "parity (it // 2) % 2 before combine"
)
L_COMPILED = (
    "the compiled loop does not make the calls the replayed one makes. The kernel runs the "
    "loop as compiled, and the replay judges the protocol only if both are the same code: one "
    "loop body, each helper called once in it (rearm under its condition), with arguments "
    "computed from it, not a branch on how the loop is being run"
)
L_HELPERS = (
    "the loop calls something other than its helpers (or fails in plain Python): write it with "
    "the helpers given, plain arithmetic on it, and cutlass.range for the loop"
)


class _Tok:
    def __init__(self, what):
        self.what = what

    def __repr__(self):
        return self.what


def _shim():
    import types as _types

    return _types.SimpleNamespace(
        range=lambda *a, **k: range(*a),
        range_constexpr=range,
        const_expr=lambda x: x,
        Int32=int,
        Float32=float,
        Boolean=bool,
    )


def replay_loop(answer, n_iter: int, tidx: int, blk0: int = 10) -> list[tuple]:
    """Run the learner's loop in plain Python with recording helpers: the events, in order."""
    import inspect as _inspect
    import textwrap

    if not callable(answer):  # Python's own words for it, as for any other answer
        raise TypeError(f"'{type(answer).__name__}' object is not callable")
    raw = _inspect.unwrap(answer)
    # the loop's own source, run as plain Python (the DSL may keep a rewritten copy of it)
    lines = textwrap.dedent(_inspect.getsource(raw)).splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.lstrip().startswith("def "))
    g = dict(getattr(raw, "__globals__", {}))
    g["cutlass"] = _shim()
    exec(compile("\n".join(lines[start:]), f"<replay of {raw.__name__}>", "exec"), g)
    fn = g[raw.__name__]
    ev: list[tuple] = []

    def first_pass(it, blk, b):
        tok = _Tok(f"sum_sq of iteration {it}")
        ev.append(("first", it, blk, b, tok))
        return tok

    def combine(p):
        tok = _Tok(f"combine({p})#{len(ev)}")
        ev.append(("combine", p, tok))
        return tok

    fn(
        n_iter,
        blk0,
        tidx,
        lambda blk, b: ev.append(("issue", blk, b)),
        first_pass,
        lambda val, p: ev.append(("send", val, p)),
        lambda p, phase: ev.append(("wait", p, phase)),
        combine,
        lambda p: ev.append(("rearm", p)),
        lambda it, blk, b, val: ev.append(("second", it, blk, b, val)),
    )
    return ev


def _fail(what, expected, seen, hint):
    raise CheckFailed(what, expected=expected, seen=seen, hint=hint)


def judge_loop(ev: list[tuple], n_iter: int, tidx: int, blk0: int, arms: dict | None) -> None:
    """The protocol, on one thread's events. ``arms``: thread 0's re-arms {iteration: [p]}
    (the barriers are shared by the CTA); None when judging thread 0 itself."""
    where = f"n_iter={n_iter}, thread {tidx}"
    content = {0: blk0, 1: None}
    uses = {0: 0, 1: 0}
    armed = {0: 1, 1: 1}  # both armed once at the start, for their first phase
    if arms is None:
        arms = {}
    it, done = -1, 0
    state: dict = {}
    firsts = [e[1] for e in ev if e[0] == "first"]
    seconds = [e[1] for e in ev if e[0] == "second"]
    want = list(range(n_iter))
    if firsts != want or seconds != want:
        seen = f"first_pass in iterations {firsts}, second_pass in {seconds}"
        miss = [
            f"iterations {[i for i in want if i not in calls]} never ran {name}"
            for name, calls in (("first_pass", firsts), ("second_pass", seconds))
            if any(i not in calls for i in want)
        ]
        if miss and set(firsts) <= set(want) and set(seconds) <= set(want):
            _fail(
                f"{where}: " + "; ".join(miss), f"both in each of 0..{n_iter - 1}", seen, L_MISSING
            )
        _fail(
            f"{where}: {seen}", f"each once in iterations 0..{n_iter - 1}, in order", seen, L_ITERS
        )
    # which exchange buffer and mbarrier each block uses, before the order of the rest
    cur = -1
    for e in ev:
        if e[0] == "first":
            cur = e[1]
        elif e[0] in ("send", "wait") and cur >= 0:
            p = e[2] if e[0] == "send" else e[1]
            if p != cur % 2:
                used = {x[2] if x[0] == "send" else x[1] for x in ev if x[0] in ("send", "wait")}
                one = (
                    " (one exchange buffer and mbarrier for every block)" if len(used) == 1 else ""
                )
                _fail(
                    f"{where}, iteration {cur}: {e[0]} on {p}{one}",
                    f"exchange buffer and mbarrier {cur % 2}",
                    str(p),
                    L_PARITY,
                )
    for e in ev:
        kind = e[0]
        if kind == "issue":
            _, blk, b = e
            if b not in (0, 1):
                _fail(f"{where}: issue into buffer {b}", "buffer 0 or 1", str(b), L_OVERWRITE)
            pending = blk0 + done  # the first block whose second pass has not run yet
            if content.get(b) == pending and blk != pending:
                _fail(
                    f"{where}, iteration {done}: block {blk} issued into buffer {b}, which holds "
                    f"block {pending}, not read yet",
                    f"buffer {1 - (done % 2)}",
                    f"buffer {b}",
                    L_OVERWRITE,
                )
            content[b] = blk
        elif kind == "first":
            _, it, blk, b, tok = e
            state = {"first": tok}
            if blk != blk0 + it:
                _fail(
                    f"{where}, iteration {it}: block {blk}", f"block {blk0 + it}", str(blk), L_BLOCK
                )
            if content.get(b) != blk:
                _fail(
                    f"{where}, iteration {it}: block {blk} read from buffer {b}",
                    f"buffer {it % 2}, where block {blk} was copied",
                    f"buffer {b} holds block {content.get(b)}",
                    L_BUFFER,
                )
            prior = [x for x in ev[: ev.index(e)] if x[0] == "issue" and x[1] == blk + 1]
            if not prior:
                last = it + 1 == n_iter and not any(x[0] == "issue" and x[1] == blk + 1 for x in ev)
                _fail(
                    f"{where}, iteration {it}: block {blk + 1} not issued before block {blk}'s "
                    "first pass" + (" (the last iteration)" if last else ""),
                    "issue(blk + 1, 1 - buf) at the top of every iteration",
                    "issued later, or never",
                    L_LAST_ISSUE if last else L_NO_OVERLAP,
                )
        elif kind == "send":
            _, val, p = e
            if p != it % 2:
                _fail(
                    f"{where}, iteration {it}: send into {p}", f"parity {it % 2}", str(p), L_PARITY
                )
            if val is not state.get("first"):
                _fail(
                    f"{where}, iteration {it}: sent {val!r}",
                    "first_pass's value",
                    repr(val),
                    L_SEND,
                )
            state["send"] = True
        elif kind == "wait":
            _, p, phase = e
            if p != it % 2:
                _fail(
                    f"{where}, iteration {it}: wait on {p}", f"barrier {it % 2}", str(p), L_PARITY
                )
            k = uses[p]
            if phase != k % 2:
                _fail(
                    f"{where}, iteration {it}: wait_peers({p}, {phase})",
                    f"phase parity {k % 2} (use {k} of barrier {p})",
                    str(phase),
                    L_PHASE,
                )
            if armed[p] < k + 1:
                _fail(
                    f"{where}, iteration {it}: barrier {p} waited for a {k + 1}th time, armed "
                    f"{armed[p]} times",
                    "armed again after each phase that another follows",
                    f"{armed[p]} arms",
                    L_NOT_ARMED,
                )
            uses[p] += 1
            state["wait"] = p
        elif kind == "combine":
            _, p, tok = e
            if state.get("wait") != p:
                none = "wait" not in state
                _fail(
                    f"{where}, iteration {it}: combine({p}) "
                    + ("with no wait in this iteration" if none else "before its wait"),
                    "after wait_peers",
                    "no wait" if none else "before",
                    L_NO_WAIT if none else L_COMBINE,
                )
            state["combine"] = tok
        elif kind == "rearm":
            _, p = e
            if tidx != 0:
                _fail(
                    f"{where}: thread {tidx} re-arms barrier {p}",
                    "only thread 0",
                    "it does",
                    L_REARM_ONE,
                )
            if state.get("wait") != p:
                _fail(
                    f"{where}, iteration {it}: re-arm of {p} before its wait",
                    "after",
                    "before",
                    L_REARM_EARLY,
                )
            if it + 2 >= n_iter:
                _fail(
                    f"{where}, iteration {it}: barrier {p} re-armed for block {it + 2}",
                    f"no re-arm: the CTA has {n_iter} blocks",
                    "re-armed",
                    L_REARM_EXTRA,
                )
            armed[p] += 1
        elif kind == "second":
            _, it2, blk, b, val = e
            if val is not state.get("combine"):
                _fail(
                    f"{where}, iteration {it}: second_pass got {val!r}",
                    "combine's value",
                    repr(val),
                    L_SECOND,
                )
            if blk != blk0 + it2 or content.get(b) != blk:
                _fail(
                    f"{where}, iteration {it2}: second_pass of block {blk} from buffer {b}",
                    f"block {blk0 + it2} from buffer {it2 % 2}",
                    f"buffer {b} holds block {content.get(b)}",
                    L_BUFFER if blk == blk0 + it2 else L_BLOCK,
                )
            state["second"] = True
            done += 1
        # the other threads see thread 0's arms at the same point of the same iteration
        if kind == "wait" and tidx != 0:
            for p in arms.get(it, []):
                armed[p] += 1
    for p in (0, 1):
        need = sum(1 for i in range(n_iter) if i % 2 == p)
        if uses[p] != need:
            _fail(
                f"{where}: barrier {p} waited on {uses[p]} times", f"{need}", str(uses[p]), L_PARITY
            )


def _replay_check() -> Check:
    def fn(ctx):
        n = 0
        for n_iter in (1, 2, 3, 4, 5):
            try:
                ev0 = replay_loop(ctx.answer, n_iter, 0)
                ev1 = replay_loop(ctx.answer, n_iter, 1)
            except (CheckFailed, NotImplementedError):
                raise
            except Exception as e:
                if is_not_implemented(e):
                    raise
                raise CheckFailed(
                    f"the loop fails when replayed in plain Python: {type(e).__name__}: {e}",
                    hint=L_HELPERS,
                ) from None
            judge_loop(ev0, n_iter, 0, 10, None)
            arms: dict = {}
            cur = -1
            for e in ev0:
                if e[0] == "first":
                    cur = e[1]
                elif e[0] == "rearm":
                    arms.setdefault(cur, []).append(e[1])
            judge_loop(ev1, n_iter, 1, 10, arms)
            n += 1
        return f"{n} CTA lengths (1-5 blocks), threads 0 and 1: the protocol holds"

    return Check(REPLAY, COMPILE, fn)


def _trace_of(ctx, dt) -> list | None:
    """The helper calls traced when the kernel around ``ctx.answer`` was compiled for ``dt``:
    recorded by this compile, or kept from the one that made the cached report."""
    key = ("row_blocks trace", dt)
    if _TRACE:
        _shared_put(ctx.answer, key, list(_TRACE))
    return _shared_get(ctx.answer, key)


def _replayed_body(answer) -> list[str]:
    """The helper calls of one middle iteration (1 of 5, thread 0) of the replayed loop: the
    calls its compiled body must make, each once."""
    ev = replay_loop(answer, 5, 0)
    ends = [i for i, e in enumerate(ev) if e[0] == "second"]
    return [e[0] for e in ev[ends[0] + 1 : ends[1] + 1]]


def judge_trace(trace: list | None, body: list[str]) -> None:
    """The compiled loop makes the replayed iteration's calls (the same number of each, in the
    same order, none with a constant for an argument that changes with the iteration)."""
    if trace is None:  # no record of this compile (not expected): the PTX checks still run
        return
    kinds = [k for k, _ in trace]
    for kind in HELPER_KINDS:
        got, want = kinds.count(kind), body.count(kind)
        if got == want:
            continue
        what = (
            f"compiled, the loop calls {kind} {got} times an iteration; replayed, {want} "
            f"(compiled: {', '.join(kinds) or 'no calls'}; replayed: {', '.join(body)})"
        )
        hint = L_COMPILED
        if got < want and kind == "wait":
            hint = L_NO_WAIT
        elif got < want and kind == "rearm":
            hint = L_NOT_ARMED
        raise CheckFailed(what, expected=f"{want} {kind}", seen=f"{got}", hint=hint)
    if kinds != body:  # the same calls, each once: a straight pass makes them in the same order
        raise CheckFailed(
            "compiled, the loop makes its calls in another order than replayed",
            expected=", ".join(body),
            seen=", ".join(kinds),
            hint=L_COMPILED,
        )
    for kind, consts in trace:
        for i, v in consts.items():
            arg = HELPER_ARGS[kind][i] if i < len(HELPER_ARGS[kind]) else f"#{i}"
            raise CheckFailed(
                f"compiled, {kind}'s argument {arg} is the constant {v}, the same in every "
                "iteration",
                expected=f"{arg} computed from it",
                seen=str(v),
                hint=L_PHASE if (kind, arg) == ("wait", "phase") else L_COMPILED,
            )


def _loop_region(ptx: str) -> list[str]:
    """The lines of the learner's loop in the PTX: from the label before its ``nounroll`` pragma
    (``cutlass.range(..., unroll=1)``) to the branch back to it; all lines if there is none."""
    import re

    lines = ptx.splitlines()
    for i, ln in enumerate(lines):
        if '.pragma "nounroll"' not in ln:
            continue
        head = next(
            (lines[j].strip()[:-1] for j in range(i, -1, -1) if lines[j].strip().endswith(":")),
            None,
        )
        if head is None:
            break
        back = [
            j
            for j in range(i, len(lines))
            if re.search(rf"\bbra(\.uni)?\s+{re.escape(head)};", lines[j])
        ]
        region = lines[i : back[-1] + 1] if back else []
        if any("mbarrier" in x for x in region):
            return region
    return lines


def loop_protocol(ptx: str, commits: int) -> None:
    """The compiled loop, read from its PTX: a wait whose parity is a register the loop
    updates, a re-arm that a branch skips (thread 0 only, not for the last blocks), and one
    block's ``commits`` copy groups issued an iteration."""
    import re

    region = _loop_region(ptx)
    waits = [ln for ln in region if "mbarrier.try_wait.parity" in ln]
    if not waits:
        raise CheckFailed(
            "compiled, the loop has no mbarrier wait",
            expected="mbarrier.try_wait.parity (wait_peers) in the loop",
            seen="none",
            hint=L_NO_WAIT,
        )
    for ln in waits:
        ops = [o.strip() for o in ln.split(",")]
        parity = ops[2] if len(ops) > 2 else ""
        written = any(re.match(rf"\s*[a-z][\w.]*\s+{re.escape(parity)},", x) for x in region)
        if not parity.startswith("%") or not written:
            raise CheckFailed(
                f"compiled, the wait's phase parity is {parity}, the same in every iteration",
                expected="a parity that changes with the iteration, (it // 2) % 2",
                seen=f"{parity}" + ("" if parity.startswith("%") else " (the constant)"),
                hint=L_PHASE,
            )
    arms = [i for i, ln in enumerate(region) if "mbarrier.arrive" in ln]
    if not arms:
        raise CheckFailed(
            "compiled, the loop never re-arms a barrier",
            expected="mbarrier.arrive.expect_tx (rearm) in the loop",
            seen="none",
            hint=L_NOT_ARMED,
        )
    for i in arms:
        skipped = False
        for j in range(i - 1, -1, -1):
            m = re.match(r"\s*@!?%p\w*\s+bra(\.uni)?\s+(\S+);", region[j])
            if m:
                label = m.group(2)
                skipped = any(x.strip() == f"{label}:" for x in region[i + 1 :])
                break
            if region[j].strip().endswith(":"):
                break
        if not skipped:
            raise CheckFailed(
                "compiled, every thread re-arms the barrier in every iteration",
                expected="the re-arm under a condition (tidx == 0 and it + 2 < n_iter)",
                seen="unconditional",
                hint=L_REARM_ONE,
            )
    n = sum(1 for ln in region if "cp.async.commit_group" in ln)
    if n != commits:
        raise CheckFailed(
            f"compiled, the loop issues {n} copy groups an iteration",
            expected=f"{commits}: one block's (issue once an iteration)",
            seen=str(n),
            hint=L_COMPILED,
        )


def _loop_compiles(dtypes=("bf16",), hidden: bool = False) -> Check:
    def fn(ctx):
        from .. import hints

        out = []
        for dt in dtypes:
            try:
                _TRACE.clear()
                rep = ctx.report(LOOP_HOLE, 1000, dt, loop_config(1000, dt))
            except (CheckFailed, NotImplementedError):
                raise
            except Exception as e:
                if is_not_implemented(e):
                    raise
                raise CheckFailed(
                    f"the final kernel with your row_blocks does not compile ({dt}, N=1000): "
                    f"{hints.short_error(e, 400)}",
                    hint=hints.diagnose_compile_error(e),
                ) from None
            judge_trace(_trace_of(ctx, dt), _replayed_body(ctx.answer))
            loop_protocol(rep.ptx, loop_config(1000, dt).stages)
            if "mbarrier.try_wait.parity" not in rep.ptx:
                raise CheckFailed(
                    "no mbarrier wait in the PTX",
                    expected="mbarrier.try_wait.parity (wait_peers)",
                    seen="none",
                    hint=L_NO_WAIT,
                )
            out.append(f"{dt}: {rep.registers} registers")
        return "; ".join(out)

    if hidden:
        return Check(LOOP_COMPILES + ", fp32 and fp16", COMPILE, fn, True, (LOOP_COMPILES,))
    return Check(LOOP_COMPILES, COMPILE, fn, needs=(REPLAY,))


def _loop_speed(fraction=0.8, M=8192, N=32768) -> Check:
    def fn(ctx):
        import torch

        from ...config import FinalConfig
        from ...tools.bench import copy_bandwidth, gbps, rmsnorm_bytes
        from ..checks import launch_time_us, rmsnorm_inputs

        cfg = FinalConfig(256, 256, cluster_n=4, buffers=2, blocks_per_cta=4)
        _, launch = ctx.launcher(LOOP_HOLE, N, "bf16", cfg)
        x, w = rmsnorm_inputs(M, N, torch.bfloat16, torch.Generator().manual_seed(1))
        out = torch.empty_like(x)
        us = launch_time_us(launch, x, w, out, 1e-6)
        got = gbps(rmsnorm_bytes(M, N, x.dtype, w.dtype), us)
        copy = copy_bandwidth()
        if got < fraction * copy:
            raise CheckFailed(
                f"{got:.0f} GB/s at {M}x{N} bf16 = {100 * got / copy:.0f}% of the copy now",
                expected=f">= {100 * fraction:.0f}%",
                seen=f"{got:.0f} GB/s ({us:.1f} us)",
            )
        return f"{got:.0f} GB/s = {100 * got / copy:.0f}% of copy"

    return Check(
        f"speed >= {100 * fraction:.0f}% of copy ({M}x{N} bf16, cluster of 4, two buffers)",
        GPU,
        fn,
        needs=(LOOP_COMPILES,),
    )


#: builtins that ask what a value is: the loop has no use for them, and they could tell the
#: replay's plain ints from the kernel's values (the compile tier checks the compiled loop too)
INTROSPECTION = (
    "isinstance",
    "issubclass",
    "type",
    "hasattr",
    "getattr",
    "vars",
    "dir",
    "callable",
    "id",
    "repr",
)
WHY_NOT_INTROSPECT = "the loop does not ask what its arguments are: one loop, run as it is written"

# fmt: off
ROW_LOOP_MUTANTS = mutants(COMPILE,
    ("one exchange buffer", "it % 2", "parity = it % 2", "parity = 0"),
    ("the phase from it % 2", "wrong mbarrier phase",
     "wait_peers(parity, (it // 2) % 2)", "wait_peers(parity, it % 2)"),
    ("re-armed for the last blocks too", "a block that does not exist",
     "if tidx == 0 and it + 2 < n_iter:", "if tidx == 0:"),
    ("every thread re-arms", "more than one thread re-arms",
     "if tidx == 0 and it + 2 < n_iter:", "if it + 2 < n_iter:"),
    ("the last block skipped", "never ran first_pass",
     "cutlass.range(n_iter, unroll=1)", "cutlass.range(n_iter - 1, unroll=1)"),
    ("an empty loop body", "never ran first_pass",
     "for it in cutlass.range(n_iter, unroll=1):",
     "for it in cutlass.range(n_iter, unroll=1):\n        pass\n    if False:"),
    ("one exchange buffer, re-armed for the next block",
     "one exchange buffer and mbarrier for every block", [
        ("parity = it % 2", "parity = 0"),
        ("it + 2 < n_iter", "it + 1 < n_iter"),
    ]),
    ("no issue in the last iteration", "the last iteration issues no next block",
     "issue(blk + 1, 1 - buf)", "if it + 1 < n_iter:\n            issue(blk + 1, 1 - buf)"),
    ("the next block into the buffer being read", "still reads",
     "issue(blk + 1, 1 - buf)", "issue(blk + 1, buf)"),
    # cheats that tell the replay (plain Python ints) from the compile, right replayed and
    # wrong compiled, by a test the screen lets through (it flags isinstance and the
    # like). The compiled trace's calls and the loop's PTX give them away: the compile
    # tier only (the gpu tier's checks need it, so they are blocked, not failed)
    ("compiled, never re-armed", "not armed again",
     "if tidx == 0 and", "if cutlass.Int32 is int and tidx == 0 and"),
    ("compiled, phase 0 always", "the constant 0",
     "wait_peers(parity, (it // 2) % 2)",
     "wait_peers(parity, (it // 2) % 2 if cutlass.Int32 is int else 0)"),
    ("compiled, the current block issued again", "calls issue 2 times",
     "issue(blk + 1, 1 - buf)",
     "issue(blk + 1, 1 - buf)\n        if cutlass.Int32 is not int:\n"
     "            issue(blk, buf)"),
    ("compiled, no wait", "no wait",
     "wait_peers(parity, (it // 2) % 2)",
     "if cutlass.Int32 is int:\n            wait_peers(parity, (it // 2) % 2)"),
)
# fmt: on

row_loop = register(
    Exercise(
        id="06.row_loop",
        lesson=LESSON,
        answer="row_blocks",
        title="the double-buffered loop over a CTA's row blocks: buffers, mbarrier phases, re-arms",
        forbidden=dict.fromkeys(INTROSPECTION, WHY_NOT_INTROSPECT),
        points={COMPILE: 2, GPU: 2},
        mutants=ROW_LOOP_MUTANTS,
    )
)
row_loop.add(
    _replay_check(),
    _loop_compiles(),
    _loop_compiles(("fp32", "fp16"), hidden=True),
    gpu_values(
        LOOP_HOLE,
        config=loop_config,
        needs=(LOOP_COMPILES,),
        name="values vs rmsnorm_ref, cluster of 2, two buffers, 4 blocks a CTA (M 1/37/199)",
    ),
    gpu_values(
        LOOP_HOLE,
        config=loop_config,
        hidden=True,
        needs=(LOOP_COMPILES,),
        name="values at more shapes, grading seed",
    ),
    _loop_speed(),
)
