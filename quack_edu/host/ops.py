"""What the library's ops share: their ``torch.library`` registration, the tensor types a
launch plan takes, when the registered op must be called, and the autotuner of the tuned ops."""

from __future__ import annotations

import functools

import torch
from torch import Tensor

#: outputs are dense whatever x's strides
DENSE = torch.contiguous_format

#: The tensor types a plan takes: a parameter is a tensor. Subclasses that must see the op
#: (DTensor, FakeTensor, FunctionalTensor) are not in it, and go through the op.
PLAIN_TYPES = (Tensor, torch.nn.Parameter)


#: One library for the package's ops. ``torch.library.custom_op`` would add ~25 µs of Python
#: layers to every call of an op (its autograd and aliasing wrappers), which is what inductor's
#: compiled code and CUDA-graph capture call; a plain ``Library`` registration costs the
#: dispatcher alone (~4 µs against ~28 µs a call on the project's CPU machine, 2026-12-02;
#: in a compiled graph on the H200: benchmarks/results/host_cost.json).
#: The ops have no autograd kernel: ``rmsnorm`` / ``RMSNormFunction`` make them differentiable,
#: as QuACK's ops are through its autograd.Function.
_LIB = torch.library.Library("quack_edu", "DEF")


def _define(name: str, body, schema: str, fake):
    """A functional op ``quack_edu::name`` (nothing mutated, every output new) with its fake.
    Returns the ``OpOverload`` that inductor and the wrappers call."""
    _LIB.define(name + schema)
    _LIB.impl(name, body, "CompositeExplicitAutograd")
    torch.library.register_fake(f"quack_edu::{name}", fake, lib=_LIB)
    return getattr(torch.ops.quack_edu, name).default


def define_pair(name: str, planned_body, schema: str, fake):
    """The op ``quack_edu::name`` and its tuned twin ``name_tuned``: one schema, one fake, one
    body ``planned_body(tuned, *op_args)``. Returns (the op, the tuned op, the op's body)."""
    body = functools.partial(planned_body, False)
    tuned_body = functools.partial(planned_body, True)
    op = _define(name, body, schema, fake)
    return op, _define(name + "_tuned", tuned_body, schema, fake), body


_is_compiling = torch.compiler.is_compiling
_dispatch_depth = torch._C._len_torch_dispatch_stack


def through_op(x) -> bool:
    """Call the registered op (not its body) when something has to see it: dynamo tracing,
    a dispatch mode (FakeTensorMode, make_fx, opcheck), or a tensor subclass. (The two torch
    functions are bound once: this runs on every call.)"""
    return _is_compiling() or _dispatch_depth() > 0 or type(x) not in PLAIN_TYPES


# --------------------------------------------------------------------------------------------
# The autotuner of the tuned ops
# --------------------------------------------------------------------------------------------

_tuner = None
_gpu_names: dict[int, str] = {}


def dtype_name(t) -> str:
    """A dtype (or None) as a tuning key names it: ``bfloat16``, ``-``."""
    return "-" if t is None else str(t).removeprefix("torch.")


def key_head(op: str, x) -> tuple:
    """The first fields of a tuning key: the op, the GPU, the rows to the next power of two (a
    config timed on 8 rows, launch-bound, one wave, says little about 32768, many waves; one
    key per M would tune every batch size), N and x's dtype."""
    index = x.get_device()
    gpu = _gpu_names.get(index)
    if gpu is None:
        gpu = _gpu_names[index] = torch.cuda.get_device_name(index)
    rows = x.numel() // max(1, x.shape[-1])
    return (
        ("op", op),
        ("gpu", gpu),
        ("M", 1 << max(0, rows - 1).bit_length()),
        ("N", x.shape[-1]),
        ("x", dtype_name(x.dtype)),
    )


def the_tuner():
    """The process's ``autotune.Autotuner``, made on first use."""
    global _tuner
    if _tuner is None:
        from ..autotune import Autotuner

        _tuner = Autotuner()
    return _tuner
