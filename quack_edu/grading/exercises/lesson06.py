"""Lesson 06, the final kernel and the library: the fake implementation of its torch op.

06.fake_impl  the fake (meta) implementation of the op ``quack_edu::rmsnorm_fwd``: empty
              outputs of the right shapes, dtypes and devices, so torch.compile can trace it

(06.row_loop, the loop over a CTA's row blocks, is checked in ``lesson06_row_loop``;
06.persistent_kernel, lesson 03's block kernel made persistent, in ``lesson06_persistent``.)

The fake's compile tier runs the answer under ``FakeTensorMode`` (no GPU, no data) on a table
of cases and compares what it returns (count, dtypes, shapes, strides, devices, aliasing, as
data) with the library's own fake (the op called under the same mode, here). Its gpu tier
registers the answer as the fake of a scratch custom op around the real kernel and runs
``torch.library.opcheck`` and ``torch.compile(fullgraph=True)`` through it; what failed, and the
compiled graph's outputs, come back as data.

Where the answer lives (in a graded run, the learner's locked-down worker) each check asks one
question of ``probes.lesson06`` (``Context.probe``) and decides from the data it returns.
"""

from __future__ import annotations

# scratch_op: the GPU check's op, which probes.lesson06 builds where the answer lives
from ...lessons.evidence import scratch_op  # noqa: F401
from ..checks import CheckFailed
from ..probes.lesson06 import (
    compiled_through,
    fake_inputs,
    fake_outputs,
    opcheck,
    outputs_of,
)
from ..registry import COMPILE, GPU, TIERS, Check, Exercise, mutants, register

LESSON = "06_final_kernel"


# ---- 06.fake_impl ----------------------------------------------------------------------------
FAKE_ALIAS = (
    "an output is one of the inputs (or a view of it): a custom op declared with "
    "mutates_args=() returns fresh tensors, never an input or an alias of one (the library makes "
    "the 'residual_out is x' case outside the op); allocate it with x.new_empty"
)
FAKE_RSTD_DTYPE = "rstd is float32 whatever the input dtypes: yours is another dtype"
FAKE_RSTD_SHAPE = "rstd has one value per row (every dim of x but the last): yours has x's shape"
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


def _outputs(data) -> dict:
    """``data`` (what ``probes.lesson06.outputs_of`` sends back) checked to be of its form."""
    import torch

    def bad():
        return CheckFailed("the learner's process sent back malformed outputs")

    if not isinstance(data, dict) or not isinstance(data.get("type"), str):
        raise bad()
    outs = data.get("outputs")
    if outs is None:
        return data
    if not isinstance(outs, list):
        raise bad()
    for o in outs:
        if not isinstance(o, dict) or not isinstance(o.get("type"), str):
            raise bad()
        if "dtype" in o and not (
            isinstance(o["dtype"], torch.dtype)
            and all(isinstance(o.get(k), list) for k in ("shape", "stride"))
            and all(type(v) is int for v in (*o["shape"], *o["stride"], o.get("numel")))
            and isinstance(o.get("device"), str)
            and type(o.get("alias")) is bool
        ):
            raise bad()
    return data


def _describe(outs: dict) -> str:
    """``outputs_of``'s data as the messages show it: ``[bfloat16[4, 64], float32[4]]``."""
    if "outputs" not in outs:
        return outs["type"]
    return "[" + ", ".join(
        f"{str(o['dtype']).removeprefix('torch.')}{list(o['shape'])}" if "dtype" in o else
        o["type"]
        for o in outs["outputs"]
    ) + "]"  # fmt: skip


def _compare_fake(args, got: dict, want: dict) -> tuple[str, str | None] | None:
    """None if ``got`` (the answer's outputs, ``outputs_of``'s data) matches ``want`` (the
    library fake's), else (what differs, hint)."""
    x = args[0]
    if "outputs" not in got:
        return f"returned a {got['type']}, not a list of tensors", FAKE_COUNT
    outs, wants = got["outputs"], want["outputs"]
    for i, o in enumerate(outs):
        if "dtype" not in o:
            return f"output {i} is a {o['type']}", FAKE_COUNT
        if o["alias"]:
            return f"output {i} is an input (or a view of one)", FAKE_ALIAS
    if len(outs) != len(wants):
        return f"{len(outs)} outputs for {len(wants)}", FAKE_COUNT
    names = (
        ["out"] + (["residual_out"] if args[5] is not None else []) + (["rstd"] if args[7] else [])
    )
    for name, o, w in zip(names, outs, wants, strict=True):
        if o["dtype"] != w["dtype"]:
            if name == "rstd":
                hint = FAKE_RSTD_DTYPE
            elif name == "out":
                hint = FAKE_OUT_DTYPE if o["dtype"] == x.dtype else None
            else:
                hint = FAKE_RES_DTYPE
            return f"{name} is {o['dtype']}, the op's is {w['dtype']}", hint
        shape, want_shape = tuple(o["shape"]), tuple(w["shape"])
        if shape != want_shape:
            hint = FAKE_RSTD_SHAPE if name == "rstd" and shape == tuple(x.shape) else None
            return f"{name} has shape {shape}, the op's {want_shape}", hint
        if o["device"] != w["device"]:
            return f"{name} is on {o['device']}, the op's on {w['device']}", FAKE_DEVICE
        if o["numel"] > 1 and tuple(o["stride"]) != tuple(w["stride"]):
            return f"{name} has strides {tuple(o['stride'])}, the op's {tuple(w['stride'])}", (
                FAKE_STRIDES
            )
    return None


def _run_fake_cases(ctx, hidden: bool, device="cuda"):
    """Each case under FakeTensorMode: the answer's outputs (``probes.lesson06.fake_outputs``,
    run where the answer lives) against the library's fake (run here). Returns
    [(case, args, got, want, problem)] with problem None where they agree."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from ...rmsnorm import rmsnorm_fwd  # noqa: F401  (importing it registers the op and its fake)

    op = torch.ops.quack_edu.rmsnorm_fwd.default
    cases = _fake_cases(ctx, hidden)
    seen = ctx.probe(fake_outputs, cases, device)
    if not isinstance(seen, list) or len(seen) != len(cases):
        raise CheckFailed("the learner's process sent back no outputs for some cases")
    out = []
    for case, data in zip(cases, seen, strict=True):
        got = _outputs(data)
        with FakeTensorMode():
            args = fake_inputs(case, device)
            want = outputs_of(args, list(op(*args)))
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


def _fake_gpu_check(hidden: bool) -> Check:
    def fn(ctx):
        import torch

        from ...reference import TOLERANCES, rmsnorm_ref

        def hint_from_cpu():
            for *_, problem in _run_fake_cases(ctx, hidden):
                if problem is not None:
                    return problem[1]
            return None

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
                error = ctx.probe(opcheck, args)
                if error is not None:
                    raise CheckFailed(
                        f"torch.library.opcheck of an op with your fake failed (M={M}): "
                        f"{str(error)[:600]}",
                        hint=hint_from_cpu(),
                    )
                n += 1

            got = ctx.probe(compiled_through, x, w)
            if not isinstance(got, dict):
                raise CheckFailed("the learner's process sent back no compiled outputs")
            if "error" in got:
                raise CheckFailed(
                    f"torch.compile(fullgraph=True) through an op with your fake failed "
                    f"(M={M}): {str(got['error'])[:600]}",
                    hint=hint_from_cpu(),
                )
            out, rstd = got.get("out"), got.get("rstd")
            if not (torch.is_tensor(out) and torch.is_tensor(rstd)):
                raise CheckFailed("the learner's process sent back no compiled outputs")
            ref = 2.0 * rmsnorm_ref(x, w, eps=1e-6).float()
            if (
                tuple(out.shape) != tuple(ref.shape)
                or out.dtype != torch.float32
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


# BEGIN KEY
# fmt: off
FAKE_IMPL_MUTANTS = mutants(TIERS,
    ("rstd in bf16", "rstd is float32",
     "x.shape[:-1], dtype=torch.float32", "x.shape[:-1], dtype=torch.bfloat16"),
    ("rstd of x's shape", "one value per row", "x.new_empty(x.shape[:-1]", "x.new_empty(x.shape"),
    ("residual_out is x itself", "never an input or an alias",
     "outs.append(x.new_empty(x.shape, dtype=residual_out_dtype))", "outs.append(x)"),
    ("out in x's dtype", "out is in out_dtype",
     "[x.new_empty(x.shape, dtype=out_dtype)]", "[x.new_empty(x.shape, dtype=x.dtype)]"),
) + mutants(COMPILE,  # the source screen stops it at the first check: the gpu tier is blocked
    ("cheat: the op itself", "a fake never runs the op",
     "    return outs\n",
     "    return torch.ops.quack_edu.rmsnorm_fwd(x, weight, bias, residual, out_dtype,\n"
     "                                           residual_out_dtype, eps, store_rstd,\n"
     "                                           weight_offset)\n"),
)
# fmt: on
# END KEY

fake_impl = register(
    Exercise(
        id="06.fake_impl",
        finished=("quack_edu.host.forward._fwd_fake",),
        lesson=LESSON,
        answer="rmsnorm_fwd_fake",
        title="the fake implementation of quack_edu::rmsnorm_fwd: outputs without data",
        points={COMPILE: 1, GPU: 1},
        mutants=FAKE_IMPL_MUTANTS,
        shortcut=(
            "building the outputs a call would return",
            "a fake never runs the op, nor any RMSNorm: torch.compile calls it on tensors "
            "without data, and it answers from the arguments alone (shapes, dtypes, x's "
            "device) with empty tensors. Calling a library RMSNorm scores 0",
        ),
    )
)
fake_impl.add(
    _fake_value_check(hidden=False),
    _fake_value_check(hidden=True),
    _fake_gpu_check(hidden=False),
    _fake_gpu_check(hidden=True),
)
