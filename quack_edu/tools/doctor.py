"""`quack-edu doctor`: what this machine has, which mode the lessons run in, how to fix problems.

Exit status 0 when the install works (GPU mode, or compile-only mode on a machine without a
Hopper GPU); non-zero when something is broken (a package missing, a kernel that won't compile).
"""

from __future__ import annotations

import importlib.metadata as md
import platform
import sys
from dataclasses import dataclass, field


@dataclass
class Check:
    name: str
    value: str
    ok: bool = True
    fix: str = ""


@dataclass
class DoctorReport:
    checks: list[Check] = field(default_factory=list)
    mode: str = "compile-only"
    mode_reason: str = ""

    @property
    def broken(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]

    def add(self, name, value, ok=True, fix=""):
        self.checks.append(Check(name, str(value), ok, fix))

    def __str__(self) -> str:  # print(doctor_report()) shows the table
        return self.text()

    def text(self) -> str:
        width = max(len(c.name) for c in self.checks) + 2
        lines = ["quack-edu doctor", ""]
        for c in self.checks:
            mark = "ok " if c.ok else "FIX"
            lines.append(f"  [{mark}] {c.name:<{width}}{c.value}")
            if c.fix:
                lines.append(f"        {'':<{width}}-> {c.fix}")
        lines.append("")
        if self.mode == "gpu":
            lines.append(f"Mode: GPU. {self.mode_reason}: lessons compile and run the kernels.")
        else:
            lines.append(
                f"Mode: compile-only ({self.mode_reason}). Kernels compile for sm_90a and the "
                "lessons show their PTX/SASS; cells that need a Hopper GPU show recorded H200 "
                "results instead."
            )
        if self.broken:
            lines.append(f"{len(self.broken)} problem(s) to fix: see the lines marked FIX.")
        return "\n".join(lines)


def installed_version(dist: str) -> str | None:
    """The installed version of the distribution ``dist``, or None."""
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def _device_attributes(index: int = 0) -> dict:
    """Cluster support, SM count and opt-in shared memory per block, from the CUDA driver."""
    from cuda.bindings import driver

    def get(attr):
        err, value = driver.cuDeviceGetAttribute(attr, dev)
        if err != driver.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"cuDeviceGetAttribute({attr.name}) failed: {err}")
        return value

    (err,) = driver.cuInit(0)
    if err != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cuInit failed: {err}")
    err, dev = driver.cuDeviceGet(index)
    a = driver.CUdevice_attribute
    return {
        "cluster_launch": bool(get(a.CU_DEVICE_ATTRIBUTE_CLUSTER_LAUNCH)),
        "sms": get(a.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT),
        "smem_per_block_optin": get(a.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN),
        "smem_per_sm": get(a.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR),
        "regs_per_sm": get(a.CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR),
    }


def doctor_report(compile_check: bool = True) -> DoctorReport:
    rep = DoctorReport()
    py = sys.version_info
    rep.add(
        "Python",
        f"{platform.python_version()} ({sys.executable})",
        ok=py >= (3, 11),
        fix="" if py >= (3, 11) else "use Python 3.11 or newer",
    )

    try:
        import torch
    except ImportError as e:
        rep.add(
            "PyTorch", f"not importable ({e})", ok=False, fix="make test (or pip install torch)"
        )
        rep.mode_reason = "PyTorch is missing"
        return rep
    cuda_build = torch.version.cuda
    rep.add("PyTorch", f"{torch.__version__} (CUDA build: {cuda_build or 'none, CPU-only'})")

    from .._env import MODE

    rep.mode, rep.mode_reason = MODE.name, MODE.reason
    if torch.cuda.is_available():
        name = torch.cuda.get_device_name(0)
        cap = torch.cuda.get_device_capability(0)
        hopper = tuple(cap) == (9, 0)
        rep.add(
            "GPU",
            f"{name}, compute capability {cap[0]}.{cap[1]}",
            ok=True,
            fix="" if hopper else "kernels need sm_90 (H100/H200/GH200); lessons run compile-only",
        )
        try:
            attrs = _device_attributes(0)
            rep.add(
                "Clusters / shared memory",
                f"cluster launch {'yes' if attrs['cluster_launch'] else 'no'}, "
                f"{attrs['sms']} SMs, {attrs['smem_per_block_optin'] // 1024} KiB smem per block "
                f"(opt-in), {attrs['smem_per_sm'] // 1024} KiB per SM, "
                f"{attrs['regs_per_sm']} registers per SM",
                ok=attrs["cluster_launch"] or not hopper,
            )
            if attrs["cluster_launch"]:
                from ..runtime import _RESIDENT_ERRORS, resident_clusters

                held = {n: resident_clusters(0, n, 256, 1) for n in (2, 4, 8, 16)}
                if None in held.values():
                    why = _RESIDENT_ERRORS.get(0, "libcuda.so.1 not found")
                    text = f"unknown ({why}): the backward's grid is estimated instead"
                else:
                    text = ", ".join(f"{v} of {n}" for n, v in held.items()) + (
                        " CTAs (one CTA an SM; a cluster's CTAs share a GPC: the backward's"
                        " persistent grid is one wave of these)"
                    )
                rep.add("Clusters held at once", text)
        except Exception as e:  # driver too old, bindings missing: say so, not fatal
            rep.add(
                "Clusters / shared memory",
                f"could not query the driver ({e})",
                ok=False,
                fix="update the NVIDIA driver (CUDA 12.4+ for clusters from Python)",
            )
    else:
        has_nvidia = _nvidia_smi_present()
        rep.add(
            "GPU",
            "none visible to PyTorch",
            ok=not (has_nvidia and cuda_build is None),
            fix=(
                "this machine has an NVIDIA driver but torch is a CPU build: install a CUDA "
                "build, e.g. pip install torch --index-url https://download.pytorch.org/whl/cu128"
                if has_nvidia and cuda_build is None
                else ""
            ),
        )

    dsl = installed_version("nvidia-cutlass-dsl")
    libs = [
        d.metadata["Name"]
        for d in md.distributions()
        if (d.metadata["Name"] or "").startswith("nvidia-cutlass-dsl-libs-cu")
    ]
    if dsl is None:
        rep.add(
            "CuTe DSL", "not installed", ok=False, fix="pip install 'nvidia-cutlass-dsl>=4.8,<4.9'"
        )
        return rep
    ok_ver = dsl.startswith("4.8")
    rep.add(
        "CuTe DSL",
        f"nvidia-cutlass-dsl {dsl} ({', '.join(sorted(set(libs))) or 'no runtime libs'})",
        ok=ok_ver,
        fix=""
        if ok_ver
        else "the lessons are written for 4.8.x: pip install 'nvidia-cutlass-dsl>=4.8,<4.9'",
    )
    try:
        import cutlass  # noqa: F401
    except Exception as e:
        rep.add(
            "CuTe DSL import",
            f"failed: {type(e).__name__}: {e}",
            ok=False,
            fix="reinstall: pip install --force-reinstall 'nvidia-cutlass-dsl>=4.8,<4.9'",
        )
        return rep
    import os

    arch = os.environ.get("CUTE_DSL_ARCH", "(auto-detected from the GPU)")
    rep.add("DSL target", arch)

    from .. import compile_cache

    rep.add("Kernel cache", compile_cache.describe())

    from .inspect import nvdisasm_path

    tool = nvdisasm_path()
    rep.add(
        "SASS (nvdisasm)",
        tool or "not found: reports show PTX only",
        ok=True,
        fix="" if tool else "pip install 'nvidia-cuda-nvdisasm>=13.4,<14'",
    )

    if compile_check:
        try:
            from .inspect import compile_report

            r = compile_report("naive", 256, "bf16", sass=False)
            ok = r.target == "sm_90a"
            rep.add(
                "Compile check",
                f"naive stage, N=256 bf16 -> .target {r.target}, {r.registers} registers",
                ok=ok,
                fix="" if ok else "set CUTE_DSL_ARCH=sm_90a before importing cutlass",
            )
        except Exception as e:
            rep.add(
                "Compile check",
                f"failed: {type(e).__name__}: {str(e)[:300]}",
                ok=False,
                fix="reinstall with `make test`; report the error if it persists",
            )
    return rep


def _nvidia_smi_present() -> bool:
    import shutil

    return shutil.which("nvidia-smi") is not None


def run_doctor(argv=None) -> int:
    rep = doctor_report()
    print(rep.text())
    return 1 if rep.broken else 0
