"""What every bench record carries beside its timings, shared by the benches (``bench``,
``model_bench``, ``host_cost``): the GPU's clocks, package versions, errors as one line, plots
saved or shown, the garbage collector off while timing."""

from __future__ import annotations

import contextlib
import gc
import subprocess
import sys

import torch

#: what ``gpu_clocks`` asks nvidia-smi for, and the record's names for them
CLOCK_FIELDS = {
    "clocks.sm": "sm_mhz",
    "clocks.mem": "mem_mhz",
    "clocks.max.sm": "max_sm_mhz",
    "clocks.max.mem": "max_mem_mhz",
    "power.draw": "power_w",
    "power.limit": "power_limit_w",
    "temperature.gpu": "temperature_c",
}


def gpu_clocks(device: int = 0, smi: str = "nvidia-smi") -> dict:
    """The GPU's clocks, power and temperature now, for the record (a run keeps them from
    before and after its timings: a memory-bound kernel's speed follows the memory clock, and
    the SM clock dips under the power cap). Read with nvidia-smi, found by the device's PCI
    bus id; {} where that is not possible, and while ``quack-edu grade`` runs the notebook (its
    sandbox refuses the process, and flags the notebook: lesson 08's bench, on an H100)."""
    from ..lessons.selfcheck import grading

    if grading():
        return {}
    try:
        p = torch.cuda.get_device_properties(device)
        bus = f"{p.pci_domain_id:08X}:{p.pci_bus_id:02X}:{p.pci_device_id:02X}.0"
        done = subprocess.run(
            [smi, f"--id={bus}", f"--query-gpu={','.join(CLOCK_FIELDS)}",
             "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
    except Exception:  # no CUDA device, no nvidia-smi: the record goes without
        return {}
    if done.returncode or not done.stdout.strip():
        return {}
    values = [v.strip() for v in done.stdout.strip().splitlines()[0].split(",")]
    if len(values) != len(CLOCK_FIELDS):
        return {}
    out = {}
    for name, v in zip(CLOCK_FIELDS.values(), values, strict=True):
        with contextlib.suppress(ValueError):
            out[name] = float(v)
    return out


@contextlib.contextmanager
def no_gc():
    """Python's garbage collector off while calls are timed, as ``timeit`` does: a launch-bound
    call measures the host, and a collection pass over the objects a torch.compile peer leaves
    behind would land in some kernels' timings and not in others'. (No collection first: over
    torch.compile's heap one takes long, and the timed calls make no cycles to collect.)"""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def why(e: Exception, n: int = 300) -> str:
    """An exception as one line for the record."""
    return " ".join(f"{type(e).__name__}: {e}".split())[:n]


def version(package: str) -> str:
    """'package version' as installed, for the record."""
    from .doctor import installed_version

    return f"{package} {installed_version(package) or '(not installed)'}"


def pyplot():
    """pyplot, on the Agg backend unless a caller (a notebook) imported it first with its own."""
    import matplotlib

    if "matplotlib.pyplot" not in sys.modules:
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def finish(plt, fig, path):
    """Save ``fig`` to ``path`` and close it; without a path return it (a notebook shows it)."""
    fig.tight_layout()
    if path is None:
        return fig
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None
