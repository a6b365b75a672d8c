"""Lesson 08's probes: the block kernel with the learner's griddepcontrol lines and launch flag
(``holes.PDL_KERNEL_HOLE``), asked where the answer lives; what comes back is data.

08.pdl_kernel  ``launch_flag``: the ``use_pdl`` the kernel's class launches with;
               ``pdl_time_us``: microseconds a launch of many back to back on one stream, with
               the cell's flag and with PDL off

No reference, no tolerance, no verdict: the checks (``grading.exercises.lesson08``) judge.
"""

from __future__ import annotations

from ..context import shared
from ..holes import PDL_KERNEL_HOLE


def _pdl_class(answer):
    """The block kernel class with ``answer`` as its kernel and the cell's flag as its ``pdl``
    (one per answer object)."""
    return shared(answer, ("08.pdl_kernel class",), lambda: PDL_KERNEL_HOLE.build(answer))


def launch_flag(answer) -> bool:
    """Whether the kernel's host side launches it with ``use_pdl=True``."""
    return _pdl_class(answer).pdl is True


def pdl_time_us(answer, M: int, N: int, launches: int, seed: int = 1) -> dict:
    """{"flag": microseconds a launch with the cell's flag, "off": the same kernel with PDL
    off}: ``launches`` launches back to back on the current stream, each on the same bf16
    rows (made here from ``seed``), timed with CUDA events (``tools.timing.cuda_time_us``)."""
    import torch

    from ...runtime import compile_kernel
    from ...stages.block import block_config
    from ...tools.timing import cuda_time_us

    cls = _pdl_class(answer)
    off = type(f"{cls.__name__}NoPdl", (cls,), {"pdl": False, "__module__": cls.__module__})
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(M, N, generator=gen).to("cuda", torch.bfloat16)
    w = (1.0 + 0.5 * torch.randn(N, generator=gen)).to("cuda", torch.bfloat16)
    out = torch.empty_like(x)
    cfg = block_config(N, torch.bfloat16)
    out_us = {}
    for name, klass in (("flag", cls), ("off", off)):
        run = compile_kernel(klass(torch.bfloat16, N, cfg, torch.bfloat16))

        def many(run=run):
            for _ in range(launches):
                run(x, w, out, 1e-6)

        out_us[name] = float(cuda_time_us(many)) / launches
    return out_us
