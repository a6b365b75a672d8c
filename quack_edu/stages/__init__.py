"""The ladder of kernels. Every stage module exposes the same entry point,

    rmsnorm_fwd(x, weight, eps=1e-6, config=None) -> Tensor

plus ``default_config(N, dtype)``, ``KERNEL`` (its kernel class) and ``CONFIG`` (its config
dataclass), so tests, benchmarks and lessons loop
over ``STAGES``.
"""

from __future__ import annotations

import importlib

#: stage name -> module name, in lesson order. Later lessons add to this list.
STAGE_ORDER = ("naive", "warp", "block", "cluster", "cpasync", "final")
#: stages with the backward's signature (not ``rmsnorm_fwd``): reachable by name, kept out of
#: the loops over STAGE_ORDER
BACKWARD_STAGES = ("final_bwd",)


def get_stage(name: str):
    if name not in STAGE_ORDER + BACKWARD_STAGES:
        known = ", ".join(STAGE_ORDER + BACKWARD_STAGES)
        raise ValueError(f"unknown stage {name!r}; available: {known}")
    return importlib.import_module(f"{__name__}.{name}")


def kernel_class(name: str):
    """The stage's kernel class (each stage module names it ``KERNEL``)."""
    return get_stage(name).KERNEL
