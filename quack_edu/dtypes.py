"""The element types the kernels take, and their names: torch's, CuTe DSL's, the short ones.

The one home of these facts (``runtime``, ``config`` and the library's checks, ``host.checks``,
read them here; ``quack_edu.rmsnorm.SUPPORTED_DTYPES`` is ``SUPPORTED``).
"""

from __future__ import annotations

import cutlass  # (quack_edu/__init__ has set the DSL's target: quack_edu._env)
import torch

TORCH_TO_CUTE = {
    torch.float16: cutlass.Float16,
    torch.bfloat16: cutlass.BFloat16,
    torch.float32: cutlass.Float32,
}
DTYPE_NAMES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
#: the dtypes of every tensor the kernels take: x, weight, bias, residual, the outputs
SUPPORTED = tuple(TORCH_TO_CUTE)
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
    if dtype not in TORCH_TO_CUTE:
        raise TypeError(f"dtype {dtype} is not supported; use torch.bfloat16, float16 or float32")
    return dtype


def cute_dtype(dtype) -> type[cutlass.Numeric]:
    if dtype in TORCH_TO_CUTE.values():
        return dtype
    return TORCH_TO_CUTE[torch_dtype(dtype)]
