"""The probes of 01.scale_kernel and 02.tv_layout: what their checks learn from the answer by
tracing, compiling or launching it, as plain data (``Context.probe``).

01.scale_kernel  ``scale_kernel_ptx``  the answer's decorator and, for a kernel, the PTX of the
                                       exercise's launch (``lessons.evidence.scale_ptx``)
                 ``scale_kernel_run``  the kernel launched on the GPU: y after ``y[:N] = x[:N] *
                                       factor``
02.tv_layout     ``tv_layout_map``     the (row, col) each value of each thread addresses in one
                                       tile of the tiled copy built around the learner's layouts

What is right is decided by the checks, in the grader; here nothing is compared.
"""

from __future__ import annotations

from ...lessons.evidence import scale_dtype, scale_launch, scale_ptx  # the lesson's own cells'


# ---- 01.scale_kernel --------------------------------------------------------------------------
def scale_kernel_ptx(answer, N: int, dtype: str) -> dict:
    """``{"kind": the answer's decorator kind, "ptx": the PTX of its launch for a vector of N
    (None when the answer is no kernel), "call": what calling it as plain Python with 3 Nones
    raised ("" when it returned; None when it is a kernel)}``. A kernel's PTX is compiled once
    per (answer, N, dtype) (``checks.shared``: a check cell's visible and hidden runs)."""
    from ..context import plain_call, shared

    kind = str(getattr(answer, "_decorator_kind", "a plain function"))
    if "kernel" not in kind.lower():  # it cannot be launched: say what calling it does
        return {"kind": kind, "ptx": None, "call": plain_call(answer, 3)}
    ptx = shared(answer, ("scale_ptx", N, dtype), lambda: scale_ptx(answer, N, dtype))
    return {"kind": kind, "ptx": ptx, "call": None}


def scale_launcher(kernel, N: int, dtype="bf16"):
    """``kernel`` (a ``scale_kernel``) compiled for a Hopper GPU in the exercise's launch:
    ``fn(x, y, factor)`` on torch tensors of N."""
    import cutlass.cute as cute
    from cutlass import Float32

    from ...lessons.dsl import fake_tensor

    dt = scale_dtype(dtype)
    stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
    args = (fake_tensor(dt, (N,)), fake_tensor(dt, (N,)), Float32(2.0), stream)
    return cute.compile(scale_launch(kernel), *args, options="--enable-tvm-ffi")


def scale_kernel_run(answer, x, y, N: int, dtype: str, factor: float):
    """``y`` after the answer, compiled for (N, dtype) (once per answer: ``checks.shared``),
    ran on ``x[:N]``, ``y[:N]`` and ``factor`` on the GPU; ``y`` whole, what lies past N too."""
    import torch

    from ..context import shared

    launch = shared(answer, ("scale_launch", N, dtype), lambda: scale_launcher(answer, N, dtype))
    x, y = x.to("cuda"), y.to("cuda")
    launch(x[:N], y[:N], factor)
    torch.cuda.synchronize()
    return y


# ---- 02.tv_layout -----------------------------------------------------------------------------
def tv_layout_map(answer, threads_per_row: int, num_threads: int, dtype: str) -> dict:
    """The learner's layouts traced (no kernel is built), for x and the copy atom of ``dtype``
    ("bf16", "fp16", "fp32"): ``{"threads": T, "vals": V, "tile": [rows, cols], "coords":
    [[[row, col] of value v] of thread t]}`` (``tools.inspect.tv_coords``, with thread t's
    values at index t)."""
    from ...runtime import cute_dtype
    from ...tools.inspect import tv_coords
    from ..holes import tiled_copy_of

    dt = cute_dtype(dtype)
    m = tv_coords(lambda: tiled_copy_of(answer, threads_per_row, num_threads, dt, dt))
    threads = int(m["threads"])
    return {
        "threads": threads,
        "vals": int(m["vals"]),
        "tile": [int(s) for s in m["tile"]],
        "coords": [[[int(r), int(c)] for r, c in m["coords"][t]] for t in range(threads)],
    }
