"""Lesson 06's probes: what 06.fake_impl's checks learn from the answer.

Each runs where the answer lives and returns plain data; the check decides from it in the
grader's process (``Context.probe``). Nothing here is a reference answer or a verdict.

``fake_inputs``        one 06.fake_impl case as fake arguments (the grader makes the same ones
                       for the library's fake)
``fake_outputs``       what the learner's fake returns for each case, under ``FakeTensorMode``:
                       count, dtypes, shapes, strides, devices, and whether an output is an input
``opcheck``            ``torch.library.opcheck`` of a scratch op with the learner's fake
``compiled_through``   ``torch.compile(fullgraph=True)`` of a function through that op
"""

from __future__ import annotations


# ---- 06.fake_impl ----------------------------------------------------------------------------
def fake_inputs(case, device):
    """The arguments of ``quack_edu::rmsnorm_fwd`` for a case ``(what, x shape, x dtype, weight
    dtype, bias?, residual dtype, out dtype, residual_out dtype, store_rstd, non-dense x?)``,
    on ``device`` (call it under ``FakeTensorMode``: no data)."""
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


def outputs_of(args, outs) -> dict:
    """What an implementation of the op returned for ``args``, as data: ``{"type": name}``
    for anything but a list or tuple, else ``{"type": name, "outputs": [...]}``, each output
    ``{"type": name}``, and for a tensor also its dtype, shape, stride, device, numel and
    ``alias`` (it is one of the tensor inputs, or a view of one's base)."""
    import torch

    if not isinstance(outs, list | tuple):
        return {"type": type(outs).__name__}
    inputs = [t for t in args[:4] if torch.is_tensor(t)]
    items = []
    for o in outs:
        if not torch.is_tensor(o):
            items.append({"type": type(o).__name__})
            continue
        alias = any(
            o is t or o._base is t or (t._base is not None and o._base is t._base) for t in inputs
        )
        items.append(
            {
                "type": type(o).__name__,
                "dtype": o.dtype,
                "shape": list(o.shape),
                "stride": list(o.stride()),
                "device": str(o.device),
                "numel": int(o.numel()),
                "alias": bool(alias),
            }
        )
    return {"type": type(outs).__name__, "outputs": items}


def fake_outputs(answer, cases, device="cuda") -> list:
    """For each case (``fake_inputs``), ``outputs_of`` what ``answer`` returns under
    ``FakeTensorMode``."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    seen = []
    for case in cases:
        with FakeTensorMode():
            args = fake_inputs(case, device)
            seen.append(outputs_of(args, answer(*args)))
    return seen


def _scratch_op(answer):
    """A custom op around the real kernel with ``answer`` as its fake (one per answer)."""
    from ...lessons.evidence import scratch_op
    from ..context import shared

    return shared(answer, ("06.fake_impl scratch op",), lambda: scratch_op(answer))


def _error(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e)[:400]}"


def opcheck(answer, args) -> str | None:
    """``torch.library.opcheck`` of a scratch op whose fake is ``answer``, on ``args``: None
    when it passes, else the error it raised (its type and first 400 characters)."""
    import torch

    try:
        torch.library.opcheck(_scratch_op(answer), args)
    except Exception as e:  # noqa: BLE001 (what failed is the data)
        return _error(e)
    return None


def compiled_through(answer, x, w) -> dict:
    """``torch.compile(fullgraph=True)`` of ``(2 * out, rstd)`` of the scratch op (fp32 out,
    rstd stored) on x and w: ``{"out", "rstd"}``, or ``{"error"}`` with what it raised.

    The backend is ``aot_eager``: Dynamo and AOTAutograd trace the graph on fake tensors, which
    is where the learner's fake is used, and nothing is generated after that (Inductor's Triton
    kernels would need a C compiler run in the learner's process, which the sandbox refuses)."""
    import torch

    op = _scratch_op(answer)

    def f(x, w):
        out, rstd = op(x, w, None, None, torch.float32, None, 1e-6, True, 0.0)
        return out * 2.0, rstd

    torch._dynamo.reset()
    try:
        out, rstd = torch.compile(f, fullgraph=True, backend="aot_eager")(x, w)
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 (what failed is the data)
        return {"error": _error(e)}
    return {"out": out, "rstd": rstd}
