"""The probes of 00.eager_rmsnorm, 00.eager_bytes and 06.row_loop: what their checks learn from
the answer by running, replaying or compiling it, as plain data (``Context.probe``).

00.eager_rmsnorm  ``eager_kernels``  the aten kernels the answer launches on meta tensors
00.eager_bytes    ``tensor_ops``     the torch operators the answer runs on tensors of more
                                     than one element
06.row_loop       ``loop_events``    the helper calls of the learner's loop replayed in plain
                                     Python, one list of events a thread
                  ``loop_compiled``  the final kernel around the loop, compiled: its PTX and
                                     registers, and the helper calls traced while compiling it

What is right is decided by the checks, in the grader; here nothing is compared.
"""

from __future__ import annotations

import numbers


# ---- 00.eager_rmsnorm -------------------------------------------------------------------------
def eager_kernels(answer, shape: tuple, dtype) -> list[str]:
    """The names of the aten kernels ``answer(x, w, 1e-6)`` launches for x of ``shape`` and a
    weight of its last dim, both of ``dtype``, on meta tensors (``lessons.roofline.traffic``:
    views and no-op casts launch nothing), in order."""
    import torch

    from ...lessons.roofline import traffic

    # the first dispatch-mode run imports torch's meta kernels: not counted as the answer's
    traffic(torch.add, torch.empty(1, device="meta"), 1)
    x = torch.empty(*shape, dtype=dtype, device="meta")
    w = torch.empty(shape[-1], dtype=dtype, device="meta")
    return [str(o.op) for o in traffic(lambda x, w: answer(x, w, 1e-6), x, w)]


# ---- 00.eager_bytes ---------------------------------------------------------------------------
def tensor_ops(answer, cases: list) -> list[str]:
    """The names of the torch operators ``answer(M, N, dtype)`` runs, for each case, that take
    or make a tensor of more than one element (a dtype's size from an empty tensor makes none;
    running the eager sequence on meta or fake tensors, traced or not, makes many)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    seen: list[str] = []
    numel = torch.Tensor.numel

    class Watch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            leaves = tree_leaves((args, kwargs, out))
            if any(  # (the base class's size: a subclass's own numel may say 1)
                isinstance(t, torch.Tensor) and (type(t) is not torch.Tensor or numel(t) > 1)
                for t in leaves
            ):
                seen.append(str(func.overloadpacket.__name__))
            return out

    for M, N, dtype in cases:
        with Watch():
            answer(M, N, dtype)
    return seen


# ---- 06.row_loop ------------------------------------------------------------------------------
class _Tok:
    """A value the replay's helpers return (a sum of squares, a row's total): what the loop
    passes on is followed by identity. ``n`` numbers it within one replay."""

    def __init__(self, what, n):
        self.what, self.n = what, n

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
    """Run the learner's loop in plain Python with recording helpers: the events, in order
    (``("issue", blk, b)``, ``("first", it, blk, b, tok)``, ``("send", val, p)``,
    ``("wait", p, phase)``, ``("combine", p, tok)``, ``("rearm", p)``,
    ``("second", it, blk, b, val)``; ``tok`` a ``_Tok``, the rest what the loop passed)."""
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
    toks: list[_Tok] = []

    def tok(what):
        toks.append(_Tok(what, len(toks)))
        return toks[-1]

    def first_pass(it, blk, b):
        t = tok(f"sum_sq of iteration {it}")
        ev.append(("first", it, blk, b, t))
        return t

    def combine(p):
        t = tok(f"combine({p})#{len(ev)}")
        ev.append(("combine", p, t))
        return t

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


def _plain(v):
    """An argument the loop passed, as data: a number as itself, a replay value as
    ``{"token": n, "what": its name}``, anything else as ``{"other": its repr, "str": its
    str}``."""
    if isinstance(v, _Tok):
        return {"token": v.n, "what": v.what}
    if v is None or isinstance(v, bool):
        return v
    if isinstance(v, numbers.Integral):
        return int(v)
    if isinstance(v, numbers.Real):
        return float(v)
    return {"other": repr(v), "str": str(v)}


def loop_events(answer, n_iter: int, tidxs=(0, 1), blk0: int = 10) -> list[list[list]]:
    """The replayed loop's events (``replay_loop``) for a CTA of ``n_iter`` row blocks, one
    list for each thread of ``tidxs``: each event ``[kind, *arguments]``, the arguments as
    data (``_plain``)."""
    return [
        [[e[0], *map(_plain, e[1:])] for e in replay_loop(answer, n_iter, t, blk0)] for t in tidxs
    ]


def loop_compiled(answer, N: int, dtype: str, config) -> dict:
    """The final kernel with the learner's loop (``holes.LOOP_HOLE``) compiled for ``dtype``
    and ``config`` (``probes.compiled``'s PTX, registers and spills), and ``"trace"``: the
    helper calls traced while compiling it (``holes._TRACE``), ``[kind, {argument index: the
    Python int passed}]`` each, in order. Compiled once per (answer, N, dtype, config)
    (``checks.shared``: a check cell's visible and hidden runs)."""
    from .. import holes
    from ..context import shared
    from . import compiled

    def make():
        holes._TRACE.clear()
        data = compiled(answer, "LOOP_HOLE", N, dtype, None, config)
        data["trace"] = [
            [str(kind), {str(i): int(v) for i, v in consts.items()}]
            for kind, consts in holes._TRACE
        ]
        return data

    return shared(answer, ("row_blocks compiled", N, dtype, config), make)
