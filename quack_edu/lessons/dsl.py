"""Small helpers for the CuTe DSL lesson (01b): compile a free-standing kernel on fake tensors and
read its PTX, and print a layout as the grid of offsets it maps to. Any machine, no GPU.

    ptx = ptx_of(launch, fake_tensor(cutlass.BFloat16, (4096,)), ...)
    print(layout_grid((4, 8), (8, 1)))
"""

from __future__ import annotations

import re
import tempfile

import cutlass.cute as cute


def fake_tensor(dtype, shape, align: int = 16):
    """A compile-only stand-in for a row-major tensor of ``shape`` (static sizes)."""
    return cute.runtime.make_fake_compact_tensor(dtype, tuple(shape), assumed_align=align)


def fake_stream():
    return cute.runtime.make_fake_stream()


def ptx_of(jit_fn, *args) -> str:
    """``cute.compile`` a ``@cute.jit`` launcher for sm_90a and return its PTX (kernels only)."""
    with tempfile.TemporaryDirectory(prefix="quack_edu_dsl_") as tmp:
        compiled = cute.compile(
            jit_fn, *args, options=f"--gpu-arch sm_90a --keep-ptx --dump-dir {tmp}"
        )
        ptx = compiled.__ptx__
        if isinstance(ptx, bytes):
            ptx = ptx.decode()
        if len(ptx) < 4096 and not ptx.lstrip().startswith("//"):
            with open(ptx) as f:  # a path to the dumped file
                ptx = f.read()
    return ptx


def ptx_lines(ptx: str, pattern: str) -> list[str]:
    """The PTX instruction lines that contain ``pattern`` (a regular expression)."""
    rx = re.compile(pattern)
    lines = (s.strip() for s in ptx.splitlines())
    return [s for s in lines if rx.search(s) and not s.startswith("//")]


def layout_offsets(shape, stride) -> dict:
    """{(row, col): offset} of a 2-D layout ``shape:stride``, evaluated by the DSL itself."""
    out: dict = {}

    @cute.jit
    def trace():
        _collect(cute.make_layout(shape, stride=stride), out)

    cute.compile(trace)
    return out


def _collect(layout, out: dict) -> None:
    # not traced (the DSL would turn a loop of a @cute.jit body into a device loop): plain
    # Python, where a static layout evaluates to ints
    rows, cols = cute.size(layout, mode=[0]), cute.size(layout, mode=[1])
    for r in range(rows):
        for c in range(cols):
            out[(r, c)] = int(layout((r, c)))


def layout_grid(shape, stride) -> str:
    """The grid of offsets a 2-D layout maps (row, col) to, one printed row per row."""
    off = layout_offsets(shape, stride)
    rows = 1 + max(r for r, _ in off)
    cols = 1 + max(c for _, c in off)
    width = max(len(str(v)) for v in off.values())
    lines = [f"layout {shape}:{stride}"]
    for r in range(rows):
        lines.append("  ".join(f"{off[(r, c)]:>{width}}" for c in range(cols)))
    return "\n".join(lines)
