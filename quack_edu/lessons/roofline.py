"""Numbers for the roofline of an H200, and a byte counter for eager PyTorch.

The datasheet and measured figures the lessons use, in one place (with where they come from),
``traffic(fn, *args)`` that lists the kernels an eager PyTorch function launches and the bytes
each one reads and writes (run it on ``device="meta"`` tensors: shapes only, no memory, any
machine), and ``plot_roofline``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class GPUSpec:
    name: str
    sms: int
    hbm_gbps: float  # datasheet
    copy_gbps: float  # measured device-to-device copy (read + write bytes per second)
    l2_mb: float
    smem_kb_per_sm: int  # configurable shared memory per SM
    regs_per_sm: int
    bf16_tensor_tflops: float  # dense
    fp32_tflops: float  # CUDA cores, no tensor cores
    source: str


H200 = GPUSpec(
    name="NVIDIA H200 SXM",
    sms=132,
    hbm_gbps=4800.0,
    copy_gbps=4221.0,
    l2_mb=60.0,
    smem_kb_per_sm=228,
    regs_per_sm=65536,
    bf16_tensor_tflops=989.0,
    fp32_tflops=67.0,
    source=(
        "NVIDIA H200 datasheet (4.8 TB/s HBM3e, 989 TFLOPS dense BF16, 67 TFLOPS FP32); "
        "Hopper tuning guide (228 KB shared memory per SM, 64K registers); L2: 60 MB as "
        "torch.cuda.get_device_properties reported on an H200 here on 2026-10-28 (an H100 SXM "
        "enables 50 MB of the GH100 die's 60); copy: the D2D torch copy measured first in the run "
        "of benchmarks/results/ladder.json (2026-12-01; other runs that day: 4221-4251 GB/s)"
    ),
)


@dataclass(frozen=True)
class InFlight:
    """Little's law, with the two figures the lessons measured: the bytes that must be requested
    at every moment for DRAM to run at the copy's bandwidth."""

    copy_gbps: float  # the copy of ladder.json's run (H200.copy_gbps)
    latency_ns: float  # one load from HBM on an idle H200: latency.json (dram, random order)
    sms: int

    @property
    def gpu_bytes(self) -> float:
        return self.copy_gbps * 1e9 * self.latency_ns * 1e-9

    @property
    def per_sm_kb(self) -> float:
        return self.gpu_bytes / self.sms / 1024

    def text(self) -> str:
        return (
            f"Little's law: {self.copy_gbps / 1e3:.2f} TB/s x {self.latency_ns:.0f} ns = "
            f"{self.gpu_bytes / 1e6:.1f} MB in flight on the GPU, {self.per_sm_kb:.0f} KB per SM "
            "(an idle load's latency: under load loads queue and take longer, so this is the "
            "least)"
        )


def littles_law(spec: GPUSpec = H200) -> InFlight:
    """The one Little's-law figure of lessons 01-05: the measured copy bandwidth times the
    latency of one idle load from HBM, recorded in ``benchmarks/results/latency.json``."""
    from . import results

    (ns,) = [
        r["ns_per_load"]
        for r in results.load("latency")["rows"]
        if (r["level"], r["order"]) == ("dram", "random")
    ]
    return InFlight(copy_gbps=spec.copy_gbps, latency_ns=ns, sms=spec.sms)


def ridge(spec: GPUSpec = H200, tflops: float | None = None, gbps: float | None = None) -> float:
    """Arithmetic intensity (FLOP/byte) where memory time equals compute time."""
    tflops = spec.bf16_tensor_tflops if tflops is None else tflops
    gbps = spec.hbm_gbps if gbps is None else gbps
    return tflops * 1e12 / (gbps * 1e9)


@dataclass(frozen=True)
class OpTraffic:
    op: str
    read: int
    written: int

    @property
    def total(self) -> int:
        return self.read + self.written


def _nbytes(t) -> int:
    return t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0


def traffic(fn, *args, **kwargs) -> list[OpTraffic]:
    """The kernels ``fn(*args)`` launches in eager PyTorch and the bytes each reads and writes.

    Every aten operator that is not a view is one kernel that reads its tensor inputs and writes
    its outputs in full (what eager mode does: nothing is fused). Views (reshape, expand, ...)
    and no-op casts (``x.float()`` of an fp32 tensor) launch nothing and do not appear.
    """
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    rows: list[OpTraffic] = []

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, a=(), kw=None):
            out = func(*a, **(kw or {}))
            if not getattr(func, "is_view", False):
                ins, _ = tree_flatten((a, kw or {}))
                outs, _ = tree_flatten(out)
                rows.append(
                    OpTraffic(
                        func.overloadpacket.__name__,
                        sum(_nbytes(t) for t in ins),
                        sum(_nbytes(t) for t in outs),
                    )
                )
            return out

    with Count():
        fn(*args, **kwargs)
    return rows


def plot_roofline(points=(), spec: GPUSpec = H200, ax=None):
    """Attainable TFLOP/s against arithmetic intensity, with the bf16 tensor-core and fp32
    ceilings, the datasheet and measured bandwidth slopes, and ``points`` = [(label, AI)]."""
    import matplotlib.pyplot as plt
    import numpy as np

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4.5))
    ai = np.logspace(-2, 4, 200)
    for gbps, style, label in (
        (spec.hbm_gbps, "-", "HBM3e datasheet"),
        (spec.copy_gbps, "--", "copy, measured"),
    ):
        ax.loglog(
            ai,
            np.minimum(ai * gbps / 1e3, spec.bf16_tensor_tflops),
            style,
            label=f"{label} ({gbps / 1e3:.2f} TB/s)",
        )
    ax.axhline(spec.fp32_tflops, color="gray", lw=0.8, ls=":")
    ax.text(
        2e3,
        spec.fp32_tflops * 1.15,
        f"fp32 CUDA cores {spec.fp32_tflops:.0f} TFLOP/s",
        fontsize=8,
        ha="right",
    )
    ax.text(
        2e3,
        spec.bf16_tensor_tflops * 1.15,
        f"bf16 tensor cores {spec.bf16_tensor_tflops:.0f} TFLOP/s",
        fontsize=8,
        ha="right",
    )
    for label, x in points:
        y = min(x * spec.copy_gbps / 1e3, spec.bf16_tensor_tflops)
        ax.plot([x], [y], "o")
        ax.annotate(label, (x, y), textcoords="offset points", xytext=(6, -12), fontsize=8)
    for r, lab in ((ridge(spec), "bf16 ridge"), (ridge(spec, spec.fp32_tflops), "fp32 ridge")):
        ax.axvline(r, color="gray", lw=0.5)
        ax.text(r * 1.1, 1e-1, f"{lab} {r:.0f} FLOP/B", rotation=90, fontsize=8)
    ax.set_xlabel("arithmetic intensity (FLOP per byte moved)")
    ax.set_ylabel("attainable TFLOP/s")
    ax.set_ylim(1e-2, 3e3)
    ax.legend(loc="upper left", fontsize=8)
    ax.set_title(f"Roofline of the {spec.name}")
    return ax
