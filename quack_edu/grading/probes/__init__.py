"""Questions a check asks of the learner's answer, answered with plain data (``Context.probe``).

A probe is ``fn(answer, *args) -> data``: it runs where the answer lives (in a graded run, the
learner's locked-down worker) and returns only numbers, strings, lists, dicts and tensors; the
check that asked decides, from that data, in the grader's process. A probe holds no reference
answer and no verdict: this package imports no exercise. Here: the compiled kernel of any
hole; a lesson's own probes are in ``probes.lessonNN``.
"""

from __future__ import annotations

#: what a compiled kernel's report sends back (``tools.inspect.CompileReport``'s fields)
REPORT_FIELDS = (
    "ptx",
    "sass",
    "registers",
    "stack_bytes",
    "spill_store_bytes",
    "spill_load_bytes",
    "ptxas_log",
)


def compiled(answer, hole: str, N: int, x_dtype, w_dtype=None, config=None, sass=False) -> dict:
    """The stage kernel with ``answer`` in the hole named ``hole`` (a name in ``holes``),
    compiled for x of ``x_dtype`` and a weight of ``w_dtype`` (default: x's): its PTX, SASS,
    registers and spills."""
    from ...runtime import torch_dtype
    from ...tools.inspect import kernel_report
    from .. import holes

    h = getattr(holes, hole)
    xdt = torch_dtype(x_dtype)
    wdt = torch_dtype(w_dtype) if w_dtype is not None else xdt
    kernel = h.build(answer)(xdt, N, config, wdt)
    rep = kernel_report(kernel, stage=f"{h.stage}+learner", sass=sass)
    return {k: getattr(rep, k) for k in REPORT_FIELDS}


def report_of(kernel, stage: str, data: dict):
    """A ``CompileReport`` of ``kernel`` (built in the grader's process, for its config and
    launch shape) from what ``compiled`` sent back."""
    from ...tools.inspect import CompileReport, torch_of

    if not isinstance(data, dict) or not isinstance(data.get("ptx"), str):
        from ..registry import CheckFailed

        raise CheckFailed("the learner's process sent no PTX back")
    return CompileReport(
        stage=stage,
        N=kernel.N,
        dtype=torch_of(kernel.dtype),
        config=kernel.config,
        M=4096,
        ptx=data["ptx"],
        sass=data.get("sass"),
        registers=int(data["registers"]),
        stack_bytes=int(data["stack_bytes"]),
        spill_store_bytes=int(data["spill_store_bytes"]),
        spill_load_bytes=int(data["spill_load_bytes"]),
        launch=kernel.launch_shape(4096),
        ptxas_log=str(data.get("ptxas_log") or ""),
    )


def hole_name(hole) -> str:
    """The name ``holes`` gives ``hole`` (a probe names its hole: a hole's adapt function does
    not cross between processes)."""
    from .. import holes

    for k, v in vars(holes).items():
        if v is hole:
            return k
    raise ValueError(f"{hole!r} is not one of grading.holes'")
