"""Which mode the package runs in, decided once, before CuTe DSL is imported.

CuTe DSL reads its ``CUTE_DSL_*`` variables once, when ``cutlass`` is first imported. On a
machine without a GPU it then compiles, silently, for sm_100a (Blackwell). Every kernel in
this project is a Hopper (sm_90a) kernel, so on a machine without a Hopper GPU we pin the
target to sm_90a: kernels still compile, and the PTX/SASS the lessons read is the real thing
("compile-only mode"). On a Hopper GPU the DSL detects sm_90a itself ("GPU mode").

``QUACK_EDU_MODE=compile-only`` forces compile-only mode on a GPU machine (useful in tests).
"""

from __future__ import annotations

import os
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

TARGET_ARCH = "sm_90a"
HOPPER_CAPABILITY = (9, 0)


@dataclass(frozen=True)
class Mode:
    name: str  # "gpu" or "compile-only"
    reason: str
    gpu_name: str | None = None
    capability: tuple[int, int] | None = None

    @property
    def gpu(self) -> bool:
        return self.name == "gpu"


def _detect() -> Mode:
    forced = os.environ.get("QUACK_EDU_MODE", "").strip().lower()
    try:
        import torch
    except ImportError:
        return Mode("compile-only", "PyTorch is not installed")
    if not torch.cuda.is_available():
        why = "PyTorch sees no CUDA GPU"
        if torch.version.cuda is None:
            why += f" (torch {torch.__version__} is a CPU-only build)"
        return Mode("compile-only", why)
    name = torch.cuda.get_device_name(0)
    cap = tuple(torch.cuda.get_device_capability(0))
    if cap != HOPPER_CAPABILITY:
        return Mode(
            "compile-only",
            f"{name} is sm_{cap[0]}{cap[1]}; these kernels need a Hopper GPU (sm_90)",
            name,
            cap,
        )
    if forced == "compile-only":
        return Mode("compile-only", "QUACK_EDU_MODE=compile-only is set", name, cap)
    return Mode("gpu", f"{name} (sm_90) is available", name, cap)


def _configure_dsl(mode: Mode) -> None:
    if mode.gpu:
        return
    if "cutlass" in sys.modules:
        if os.environ.get("CUTE_DSL_ARCH") != TARGET_ARCH:
            warnings.warn(
                "cutlass was imported before quack_edu, so CuTe DSL may target the wrong GPU "
                f"architecture. Import quack_edu first, or set CUTE_DSL_ARCH={TARGET_ARCH}.",
                stacklevel=3,
            )
        return
    os.environ.setdefault("CUTE_DSL_ARCH", TARGET_ARCH)


def cache_location(env_var: str, name: str) -> Path | None:
    """Where one of the package's on-disk caches lives: the path in ``env_var``, else ``name``
    under ``$XDG_CACHE_HOME/quack_edu`` (default ``~/.cache/quack_edu``); None when
    ``env_var`` turns it off (``0``, ``off``, ``false``, ``no`` or ``none``)."""
    value = os.environ.get(env_var, "").strip()
    if value.lower() in {"0", "off", "false", "no", "none"}:
        return None
    if value:
        return Path(value).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "quack_edu" / name


def gpu_kind(mode: Mode | None = None) -> str | None:
    """The GPU's kind as the config tables name it (``"H100"``, ``"H200"``), from the name of
    device 0 (a process on GPUs of two kinds takes device 0's tables); None for another GPU,
    or none: the tables' defaults (chosen on the H200)."""
    name = ((mode or MODE).gpu_name or "").upper()
    return next((k for k in ("H100", "H200") if k in name), None)


MODE = _detect()
_configure_dsl(MODE)
