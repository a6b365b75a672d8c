"""The element types the kernels take, and their names: torch's, CuTe DSL's, the short ones.

The one home of these facts (``runtime``, ``config`` and the library's checks, ``host.checks``,
read them here; ``quack_edu.rmsnorm.SUPPORTED_DTYPES`` is ``SUPPORTED``).
"""

from __future__ import annotations

import functools

import torch

#: the dtypes of every tensor the kernels take: x, weight, bias, residual, the outputs
SUPPORTED = (torch.float16, torch.bfloat16, torch.float32)
DTYPE_NAMES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
#: SUPPORTED in the library's words: "torch.float16, torch.bfloat16 or torch.float32"
SUPPORTED_WORDS = f"{', '.join(map(str, SUPPORTED[:-1]))} or {SUPPORTED[-1]}"


def unsupported_dtype(name: str, dtype, listed: str = SUPPORTED_WORDS) -> TypeError:
    """The error for a tensor ``name`` of a dtype not in SUPPORTED (``listed``: SUPPORTED, in
    the words of the message)."""
    return TypeError(f"{name} has dtype {dtype}; supported: {listed}")


def torch_dtype(dtype) -> torch.dtype:
    """Accept torch dtypes and the short names bf16/fp16/fp32 (as the CLI and lessons use)."""
    if isinstance(dtype, str):
        key = dtype.lower().replace("float", "fp").replace("bfloat", "bf")
        if key not in DTYPE_NAMES:
            raise ValueError(f"unknown dtype {dtype!r}; use one of {', '.join(DTYPE_NAMES)}")
        return DTYPE_NAMES[key]
    if dtype not in SUPPORTED:
        raise TypeError(f"dtype {dtype} is not supported; use torch.bfloat16, float16 or float32")
    return dtype


@functools.cache
def torch_to_cute() -> dict:
    """torch dtype -> CuTe DSL type. The DSL is imported here, on first use, not with the
    package: ``import quack_edu`` (and ``quack-edu doctor``) work where it is broken."""
    import cutlass  # (quack_edu/__init__ has set the DSL's target: quack_edu._env)

    return {
        torch.float16: cutlass.Float16,
        torch.bfloat16: cutlass.BFloat16,
        torch.float32: cutlass.Float32,
    }


def cute_dtype(dtype):
    """The CuTe DSL type of a torch dtype, a short name (bf16) or a DSL type."""
    table = torch_to_cute()
    if dtype in table.values():
        return dtype
    return table[torch_dtype(dtype)]


def __getattr__(name: str):
    if name == "TORCH_TO_CUTE":  # the table, built on first use (see torch_to_cute)
        return torch_to_cute()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
