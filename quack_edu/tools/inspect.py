"""Compile-only reports: what a kernel compiles to, on any machine (no GPU needed).

    >>> r = compile_report("naive", 4096, torch.bfloat16)
    >>> r.count("ld.global"), r.registers, r.spill_bytes, r.block
    (...)

The report holds the PTX, the SASS (when the ``nvidia-cuda-nvdisasm`` wheel is installed), the
register count, stack frame and spill bytes that ptxas reported, and the launch shape. The launch
shape comes from the kernel's own ``launch_shape`` (the same config the jit ``__call__`` uses);
``.reqntid`` in the PTX confirms the block size.
"""

from __future__ import annotations

import functools
import re
import tempfile
from dataclasses import dataclass, field
from inspect import signature as _signature
from pathlib import Path

import torch

from .. import runtime
from ..runtime import LaunchShape, compile_kernel, torch_dtype
from ..stages import get_stage

_PTXAS_RE = re.compile(
    r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads.*?"
    r"Used (\d+) registers",
    re.S,
)


@dataclass(frozen=True)
class CompileReport:
    stage: str
    N: int
    dtype: torch.dtype
    config: object
    M: int
    ptx: str
    sass: str | None
    registers: int
    stack_bytes: int
    spill_store_bytes: int
    spill_load_bytes: int
    launch: LaunchShape
    ptxas_log: str = field(repr=False, default="")

    @property
    def spill_bytes(self) -> int:
        return self.spill_store_bytes + self.spill_load_bytes

    @property
    def grid(self):
        return self.launch.grid

    @property
    def block(self):
        return self.launch.block

    @property
    def cluster(self):
        return self.launch.cluster

    @property
    def smem_bytes(self) -> int:
        """The stage class's count of its shared memory (``smem_bytes()``, on the host); the
        launch takes what the compiled kernel allocates."""
        return self.launch.smem_bytes

    @property
    def target(self) -> str | None:
        m = re.search(r"^\.target\s+(\S+)", self.ptx, re.M)
        return m.group(1) if m else None

    def instructions(self) -> list[str]:
        """The PTX instruction lines (no directives, labels or comments): those ``Ptx`` reads."""
        from ..grading.ptx import instruction_lines  # a leaf module of the grader: no circle

        return [s for _, s in instruction_lines(self.ptx)]

    def count(self, pattern: str, regex: bool = False) -> int:
        """How many PTX instructions contain ``pattern`` (a plain substring unless regex=True)."""
        if regex:
            rx = re.compile(pattern)
            return sum(1 for s in self.instructions() if rx.search(s))
        return sum(1 for s in self.instructions() if pattern in s)

    def lines(self, pattern: str, regex: bool = False) -> list[str]:
        """The PTX instructions that match ``pattern``, for showing in a lesson."""
        rx = re.compile(pattern if regex else re.escape(pattern))
        return [s for s in self.instructions() if rx.search(s)]

    def sass_count(self, pattern: str) -> int | None:
        if self.sass is None:
            return None
        return sum(1 for line in self.sass.splitlines() if pattern in line)

    def summary(self) -> str:
        cfg = self.config
        return (
            f"stage={self.stage} N={self.N} dtype={str(self.dtype).replace('torch.', '')} "
            f"config={cfg}\n"
            f"  target {self.target}, {self.registers} registers, stack {self.stack_bytes} B, "
            f"spills {self.spill_bytes} B\n"
            f"  launch for M={self.M}: grid={self.grid} block={self.block} "
            f"cluster={self.cluster}\n"
            # the stage class's count, which sizes its plans; the DSL's launch takes what the
            # kernel allocates, which a subclass's kernel may change (lesson 06's persistent one)
            f"  shared memory {self.smem_bytes} B: the stage class's count (smem_bytes()), made "
            "on the host, not read from the kernel"
        )


@functools.cache
def nvdisasm_path() -> str | None:
    """nvdisasm from the ``nvidia-cuda-nvdisasm`` wheel (or the PATH), or None."""
    import shutil
    import sys

    for entry in sys.path:
        for hit in sorted(Path(entry).glob("nvidia/*/bin/nvdisasm")) if entry else []:
            return str(hit)
    return shutil.which("nvdisasm")


def disassemble(cubin_path: str) -> str:
    import subprocess

    tool = nvdisasm_path()
    if tool is None:
        raise RuntimeError("nvdisasm not found: pip install 'nvidia-cuda-nvdisasm>=13.4,<14'")
    done = subprocess.run([tool, "-c", "-g", cubin_path], capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"nvdisasm failed: {done.stderr.strip()}")
    return done.stdout


def compile_report(
    stage: str,
    N: int,
    dtype=torch.bfloat16,
    *,
    M: int = 4096,
    weight_dtype=None,
    config=None,
    sass: bool | None = None,
    **config_fields,
) -> CompileReport:
    """Compile ``stage`` for rows of ``N`` elements and report what came out.

    ``stage`` is a stage name, or a kernel class: a subclass of a stage's ``KERNEL`` in which a
    learner rewrote one of its pieces (it keeps the stage's name, config and heuristic).
    ``config`` (the stage's config dataclass) or its fields as keywords override the stage's
    heuristic. ``M`` only sizes the reported grid: the compiled kernel takes any M.
    """
    dtype = torch_dtype(dtype)
    weight_dtype = torch_dtype(weight_dtype) if weight_dtype is not None else dtype
    kernel_cls = stage if isinstance(stage, type) else None
    if kernel_cls is not None:
        stage = kernel_cls.name
    module = get_stage(stage)
    kernel_cls = kernel_cls or module.KERNEL
    if config is None:
        # the final stage sizes its tile by the weight's dtype too (it lives in shared memory)
        takes_w = "weight_dtype" in _signature(module.default_config).parameters
        config = (
            module.default_config(N, dtype, weight_dtype)
            if takes_w
            else module.default_config(N, dtype)
        )
    if config_fields:
        from dataclasses import replace

        config = replace(config, **config_fields)
    if sass is None:
        sass = nvdisasm_path() is not None
    return _report(kernel_cls, int(N), dtype, weight_dtype, config, int(M), bool(sass))


@functools.lru_cache(maxsize=256)
def _report(kernel_cls, N, dtype, weight_dtype, config, M, want_sass) -> CompileReport:
    kernel = kernel_cls(dtype, N, config, weight_dtype)
    return kernel_report(kernel, stage=kernel_cls.name, M=M, sass=want_sass)


def kernel_report(kernel, *, stage: str | None = None, M: int = 4096, sass: bool = False):
    """Compile a kernel *object* and report, e.g. a learner's subclass of a stage kernel with one
    piece rewritten (the grader's compile tier). Not cached: the object may hold new code."""
    stage = stage or getattr(kernel, "name", "") or type(kernel).__name__
    with tempfile.TemporaryDirectory(prefix="quack_edu_") as tmp:
        opts = f"--keep-ptx --dump-dir {tmp} --ptxas-options=-v --remark-filter=ptxas "
        opts += f"--remark-output={tmp}/remarks.yaml"
        if sass:
            opts += " --keep-cubin"
        compiled = compile_kernel(kernel, opts)
        ptx = _read_artifact(compiled.__ptx__)
        sass_text = None
        if sass:
            cubin = compiled.__cubin__
            if isinstance(cubin, bytes):
                (Path(tmp) / "kernel.cubin").write_bytes(cubin)
                cubin = str(Path(tmp) / "kernel.cubin")
            sass_text = disassemble(cubin)
        remarks = Path(tmp) / "remarks.yaml"
        log = remarks.read_text() if remarks.exists() else ""
    m = _PTXAS_RE.search(log)
    if not m:
        raise RuntimeError(
            f"could not read ptxas's resource report for {stage} N={kernel.N}:\n{log[:2000]}"
        )
    stack, spill_st, spill_ld, regs = (int(g) for g in m.groups())
    return CompileReport(
        stage=stage,
        N=kernel.N,
        dtype=torch_of(kernel.dtype),
        config=kernel.config,
        M=M,
        ptx=ptx,
        sass=sass_text,
        registers=regs,
        stack_bytes=stack,
        spill_store_bytes=spill_st,
        spill_load_bytes=spill_ld,
        launch=kernel.launch_shape(M),
        ptxas_log=log,
    )


def torch_of(cute_dtype) -> torch.dtype:
    return next(t for t, c in runtime.TORCH_TO_CUTE.items() if c is cute_dtype)


def _read_artifact(value) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    path = Path(value)
    if len(value) < 4096 and path.exists():
        return path.read_text(errors="replace")
    return value


def tv_coords(make_tiled_copy) -> dict:
    """Which element of a tile each thread of a tiled copy addresses, on any machine.

    ``make_tiled_copy()`` builds a ``cute.TiledCopy`` (CuTe layouts exist only while a kernel
    is being traced, so it is called inside a traced function and nothing is launched). Returns
    ``{"threads": T, "vals": V, "tile": (rows, cols), "coords": {t: [(row, col), ...]}}``: the
    (row, column) of value ``v`` of thread ``t`` in one tile of the copy, read off its TV layout.
    """
    import cutlass.cute as cute

    out: dict = {}

    @cute.jit
    def trace():
        _tv_collect(make_tiled_copy(), out)

    cute.compile(trace)
    return out


def _tv_collect(tiled, out: dict) -> None:
    import cutlass.cute as cute

    tv = tiled.layout_src_tv_tiled  # (thread, value) -> index in the (rows, cols) tile
    rows, cols = cute.size(tiled.tiler_mn[0]), cute.size(tiled.tiler_mn[1])
    threads, vals = cute.size(tv, mode=[0]), cute.size(tv, mode=[1])
    coords = {}
    for t in range(threads):  # plain Python: static layouts evaluate to ints while tracing
        coords[t] = [(i % rows, i // rows) for i in (tv((t, v)) for v in range(vals))]
    out.update(threads=threads, vals=vals, tile=(rows, cols), coords=coords)


__all__ = ["CompileReport", "compile_report", "kernel_report", "tv_coords", "runtime"]
