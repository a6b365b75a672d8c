"""Host-side glue shared by every kernel: dtype maps, input checks, fake tensors, compiling.

Every kernel is compiled the same way on a laptop and on an H200: ``cute.compile`` on *fake*
tensors (a dtype, a shape whose row count M is symbolic, and a row stride with a known
divisibility), with the TVM-FFI calling convention. The compiled function is then called with
torch tensors directly, on torch's current stream. On a machine without a Hopper GPU the same
compile yields the PTX/SASS that `quack_edu.tools.inspect` reads; it just cannot be launched.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass

import cutlass  # noqa: E402
import cutlass.cute as cute  # noqa: E402
import torch

from . import (
    _env,  # noqa: F401  (sets the DSL's target before cutlass is imported)
    compile_cache,
)
from .dtypes import (  # noqa: F401  (re-exported: runtime.cute_dtype ...)
    DTYPE_NAMES,
    SUPPORTED,
    TORCH_TO_CUTE,
    cute_dtype,
    torch_dtype,
    unsupported_dtype,
)

#: SUPPORTED as a stage's input check lists it: "bfloat16, float16, float32"
_STAGE_WORDS = ", ".join(sorted(str(d).removeprefix("torch.") for d in SUPPORTED))


@dataclass(frozen=True)
class LaunchShape:
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    cluster: tuple[int, int, int] = (1, 1, 1)
    smem_bytes: int = 0


class RMSNormKernel:
    """Base of every stage's kernel class: the pure-Python side (dtype, N, config, shapes).

    A subclass adds ``__call__`` (``@cute.jit``: derive layouts, launch) and ``kernel``
    (``@cute.kernel``: the device code), and may override ``launch_shape``/``row_align``.
    ``config`` is the stage's frozen config dataclass (see ``quack_edu.config``).
    """

    #: bytes one thread moves per global access; rows must be aligned to it (0: scalar access)
    vector_bytes = 16
    #: stage name, as in ``quack_edu.stages.STAGES``
    name = ""

    def __init__(self, dtype, N: int, config, weight_dtype=None):
        self.dtype = cute_dtype(dtype)
        self.weight_dtype = cute_dtype(weight_dtype if weight_dtype is not None else dtype)
        self.N = int(N)
        self.config = config

    @classmethod
    def row_align_for(cls, dtype) -> int:
        """Row starts (and the row stride, and N) must be multiples of this many elements."""
        return max(1, cls.vector_bytes * 8 // cute_dtype(dtype).width)

    @classmethod
    def max_N_for(cls, dtype) -> int | None:
        """The largest row this stage handles for ``dtype`` (None: no limit)."""
        return None

    @property
    def row_align(self) -> int:
        return self.row_align_for(self.dtype)

    def launch_shape(self, M: int) -> LaunchShape:
        raise NotImplementedError

    def compile_args(self):
        """Every argument ``cute.compile`` passes to ``__call__``: fakes of (x, weight, out),
        eps and the stream (a stage with more tensors overrides this and ``wrap_compiled``)."""
        x, w, out = self.fake_args()
        stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
        return (x, w, out, cutlass.Float32(1e-6), stream)

    def wrap_compiled(self, compiled):
        """What ``compile_kernel`` returns: callable as ``fn(x, weight, out, eps)``."""
        return compiled

    def fake_args(self):
        """Fake tensors standing for (x, weight, out), with M symbolic."""
        M = cute.sym_int()
        align = self.row_align
        abytes = align * self.dtype.width // 8
        x, out = (
            cute.runtime.make_fake_tensor(
                self.dtype,
                (M, self.N),
                (cute.sym_int64(divisibility=align), 1),
                assumed_align=abytes,
            )
            for _ in range(2)
        )
        wbytes = 16 if self.vector_bytes else self.weight_dtype.width // 8
        w = cute.runtime.make_fake_compact_tensor(
            self.weight_dtype, (self.N,), assumed_align=wbytes
        )
        return x, w, out


def compile_kernel(kernel: RMSNormKernel, options: str = "") -> Callable:
    """``cute.compile`` a kernel object on fake tensors, TVM-FFI calling convention.

    Without ``options``, in GPU mode, a kernel compiled before by any process is loaded from
    the disk cache instead (``quack_edu.compile_cache``): the same function, callable with
    the same positional arguments, without ``__ptx__``/``__cubin__``. ``options`` (``--keep-ptx``,
    ``--dump-dir``, ...) ask for what only a fresh compile produces: they bypass the cache."""
    opts = ("--enable-tvm-ffi " + options).strip()

    def build():
        return cute.compile(kernel, *kernel.compile_args(), options=opts)

    compiled = build() if options else compile_cache.cached_compile(kernel, opts, build)
    return kernel.wrap_compiled(compiled)


def direct_call(compiled) -> Callable:
    """The TVM-FFI function inside a compiled kernel, when calling it with the same positional
    arguments means the same thing (no defaults or keywords to fill in, no raw pointers to
    convert); else the compiled kernel itself. It skips two Python layers of the DSL's
    wrapper: 0.4-0.8 µs of a short row's host cost on the H200's host."""
    wrapper = getattr(compiled, "_kwargs_wrapper", None)
    raw = getattr(compiled, "_tvm_ffi_function", None)
    if wrapper is None or raw is None or compiled.execution_args.has_pointer_address_arg_specs:
        return compiled
    try:
        params = inspect.signature(wrapper).parameters.values()
    except (TypeError, ValueError):
        return compiled
    if any(p.kind is not p.POSITIONAL_OR_KEYWORD or p.default is not p.empty for p in params):
        return compiled
    return raw


@functools.cache
def _compiled(kernel_cls, dtype, weight_dtype, N, config):
    return compile_kernel(kernel_cls(dtype, N, config, weight_dtype))


def check_inputs(x, weight, *, stage: str, row_align: int = 1, max_N: int | None = None, out=None):
    """Validate (x, weight, and ``out`` if given) for a stage's ``rmsnorm_fwd``; raise an error
    that names the argument and the fix. Types, shapes, dtypes, N and the memory layout first,
    the device last, so every other message can be seen on a machine without a GPU."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if not isinstance(weight, torch.Tensor):
        raise TypeError(f"weight must be a torch.Tensor, got {type(weight).__name__}")
    if x.dim() != 2:
        raise ValueError(
            f"x must be 2-D (M, N), got shape {tuple(x.shape)}; flatten the leading dims with "
            "x.reshape(-1, x.shape[-1])"
        )
    for name, t in (("x", x), ("weight", weight)):
        if t.dtype not in SUPPORTED:
            raise unsupported_dtype(name, t.dtype, _STAGE_WORDS)
    M, N = x.shape
    if weight.shape != (N,):
        raise ValueError(
            f"weight must have shape ({N},) to match x's last dim, got {tuple(weight.shape)}"
        )
    if N == 0:
        raise ValueError("x has N=0 columns: the mean over an empty row is undefined")
    if max_N is not None and N > max_N:
        raise ValueError(
            f"N={N} is beyond what the '{stage}' stage supports for {x.dtype} (at most {max_N})"
        )
    if row_align > 1 and N % row_align:
        raise ValueError(
            f"the '{stage}' stage loads rows in 16-byte vectors of {row_align} {x.dtype} elements, "
            f"so N must be a multiple of {row_align}; got N={N}"
        )
    if x.stride(1) != 1:
        raise ValueError(
            f"x's rows must be contiguous (last-dim stride 1), got strides {tuple(x.stride())}; "
            "pass x.contiguous()"
        )
    if weight.stride(0) != 1:
        raise ValueError(
            f"weight must be contiguous, got stride {weight.stride(0)}; pass weight.contiguous()"
        )
    if row_align > 1:
        if M > 1 and x.stride(0) % row_align:
            raise ValueError(
                f"x's row stride must be a multiple of {row_align} elements (16 bytes) for the "
                f"'{stage}' stage's vector loads, got {x.stride(0)}; pass x.contiguous()"
            )
        if x.data_ptr() % 16:
            raise ValueError(
                f"x must start on a 16-byte boundary (data_ptr % 16 = {x.data_ptr() % 16}) for "
                f"the '{stage}' stage's vector loads; pass x.clone()"
            )
        if weight.data_ptr() % 16:
            raise ValueError("weight must start on a 16-byte boundary; pass weight.clone()")
    if out is not None:
        _check_out(out, x, row_align)
    check_device(
        x,
        ("weight", weight),
        ("out", out),
        without_gpu="use quack_edu.tools.inspect.compile_report() to compile and read them",
    )


def _check_out(out, x, row_align: int) -> None:
    """``out`` receives the result: like x (shape, dtype), rows contiguous, not overlapping."""
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"out must be a torch.Tensor or None, got {type(out).__name__}")
    if out.shape != x.shape:
        raise ValueError(f"out must have x's shape {tuple(x.shape)}, got {tuple(out.shape)}")
    if out.dtype != x.dtype:
        raise TypeError(f"out must have x's dtype {x.dtype}, got {out.dtype}")
    M, N = x.shape
    if out.stride(1) != 1 or (M > 1 and out.stride(0) < N):
        raise ValueError(
            f"out's rows must be contiguous and not overlap (strides (>= {N}, 1)), got strides "
            f"{tuple(out.stride())}; pass out=None or torch.empty_like(x)"
        )
    if row_align > 1 and (out.data_ptr() % 16 or (M > 1 and out.stride(0) % row_align)):
        raise ValueError(
            f"out must start on a 16-byte boundary with a row stride that is a multiple of "
            f"{row_align} elements (data_ptr % 16 = {out.data_ptr() % 16}, row stride "
            f"{out.stride(0)}); pass out=None or torch.empty_like(x)"
        )


#: an empty kernel, for the driver's occupancy calculator (clusters resident at once)
_PROBE_PTX = b""".version 8.0
.target sm_90
.address_size 64
.visible .entry quack_edu_probe() { ret; }
"""


def _driver_structs():
    """``CUlaunchAttribute`` and ``CUlaunchConfig`` of cuda.h, for ctypes."""
    import ctypes as C

    class ClusterDim(C.Structure):
        _fields_ = [("x", C.c_uint), ("y", C.c_uint), ("z", C.c_uint)]

    class Value(C.Union):  # CUlaunchAttributeValue: 64 bytes, 8-byte aligned
        _fields_ = [("clusterDim", ClusterDim), ("pad", C.c_uint64 * 8)]

    class Attribute(C.Structure):
        _fields_ = [("id", C.c_int), ("value", Value)]  # value at offset 8 (its alignment)

    class Config(C.Structure):
        _fields_ = [("dims", C.c_uint * 7), ("stream", C.c_void_p)]
        _fields_ += [("attrs", C.POINTER(Attribute)), ("num_attrs", C.c_uint)]

    return Attribute, Config


@functools.cache
def resident_clusters(device_index: int, cluster_n: int, num_threads: int, ctas_per_sm: int):
    """Clusters of ``cluster_n`` CTAs (``num_threads`` each, at most ``ctas_per_sm`` an SM) that
    the GPU holds at once, from the CUDA driver's occupancy calculator
    (``cuOccupancyMaxActiveClusters``, called through ctypes on an empty kernel given the
    shared memory that leaves ``ctas_per_sm`` CTAs an SM); None where it cannot say. A
    cluster's CTAs must share a GPC, so this is often fewer than SMs x ctas_per_sm /
    cluster_n. A persistent grid of exactly this many clusters is one wave with every
    cluster busy to the end; a larger one leaves a last, partial wave."""
    import ctypes as C

    from .config import SMEM_PER_SM, SMEM_RESERVED_PER_CTA

    try:
        cuda = C.CDLL("libcuda.so.1")
    except OSError:
        return None

    def ok(status):
        if status != 0:
            raise RuntimeError(f"CUDA driver error {status}")

    Attribute, Config = _driver_structs()
    try:
        module, fn, dev, ctx = C.c_void_p(), C.c_void_p(), C.c_int(), C.c_void_p()
        cap, n = C.c_int(), C.c_int()
        ok(cuda.cuInit(0))
        ok(cuda.cuDeviceGet(C.byref(dev), device_index))
        ok(cuda.cuDevicePrimaryCtxRetain(C.byref(ctx), dev))  # torch's context too
        ok(cuda.cuCtxPushCurrent_v2(ctx))
        try:
            ok(cuda.cuModuleLoadData(C.byref(module), C.c_char_p(_PROBE_PTX)))
            ok(cuda.cuModuleGetFunction(C.byref(fn), module, b"quack_edu_probe"))
            ok(cuda.cuDeviceGetAttribute(C.byref(cap), 97, dev))  # smem a CTA, opt-in
            ok(cuda.cuFuncSetAttribute(fn, 8, cap.value))  # max dynamic shared memory
            ok(cuda.cuFuncSetAttribute(fn, 14, 1))  # clusters of more than 8 CTAs allowed
            smem = SMEM_PER_SM // max(1, ctas_per_sm) - SMEM_RESERVED_PER_CTA
            attr = Attribute(id=4)  # CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
            dim = attr.value.clusterDim
            dim.x, dim.y, dim.z = cluster_n, 1, 1
            dims = (cluster_n, 1, 1, num_threads, 1, 1, min(smem, cap.value))
            cfg = Config(dims=(C.c_uint * 7)(*dims), attrs=C.pointer(attr), num_attrs=1)
            ok(cuda.cuOccupancyMaxActiveClusters(C.byref(n), fn, C.byref(cfg)))
        finally:
            if module.value:
                cuda.cuModuleUnload(module)
            cuda.cuCtxPopCurrent_v2(C.byref(C.c_void_p()))
            cuda.cuDevicePrimaryCtxRelease_v2(dev)
        return n.value or None
    except Exception as e:  # noqa: BLE001 (the caller's estimate stands in)
        _RESIDENT_ERRORS[device_index] = f"{type(e).__name__}: {e}"
        return None


#: why ``resident_clusters`` could not say, by device (for ``quack-edu doctor``)
_RESIDENT_ERRORS: dict[int, str] = {}

_HOPPER: dict[int, bool] = {}  # device index -> is sm_90 (asked once per device)


def check_device(x, *others, without_gpu: str) -> None:
    """Every tensor on x's CUDA device, and that device a Hopper GPU; ``others``: (name,
    tensor) pairs, tensors possibly None. ``without_gpu``: what a machine without one can do
    instead (said when x is not on a GPU). Checked last, after everything a CPU can check."""
    if x.device.type != "cuda":
        raise ValueError(
            f"x is on {x.device}: the kernel runs on a CUDA GPU (Hopper, sm_90); move the "
            f"tensors with .cuda(). Without a Hopper GPU, {without_gpu}"
        )
    index = x.get_device()
    for name, t in others:
        if t is not None and t.get_device() != index:
            raise ValueError(
                f"{name} is on {t.device} but x is on {x.device}; put them on the same GPU "
                f"({name}.to(x.device))"
            )
    ok = _HOPPER.get(index)
    if ok is None:
        ok = _HOPPER[index] = torch.cuda.get_device_capability(index) == (9, 0)
    if not ok:
        cap = torch.cuda.get_device_capability(index)
        raise RuntimeError(
            f"{torch.cuda.get_device_name(index)} is sm_{cap[0]}{cap[1]}; the quack_edu "
            "kernels are built for Hopper (sm_90: H100, H200, GH200)"
        )


def run_forward(kernel_cls, x, weight, eps, config, out=None):
    """Check inputs, compile (cached per dtype, N and config) and launch on torch's stream.

    ``out`` (optional) receives the result: same shape, dtype and device as x, rows contiguous.
    A kernel class with its own way in (``run``, the final stage's) takes it from here.
    """
    if hasattr(kernel_cls, "run"):
        return kernel_cls.run(x, weight, eps, config, out)
    dtype = x.dtype if isinstance(x, torch.Tensor) and x.dtype in SUPPORTED else None
    check_inputs(
        x,
        weight,
        stage=kernel_cls.name,
        row_align=kernel_cls.row_align_for(dtype) if dtype else 1,
        max_N=kernel_cls.max_N_for(dtype) if dtype else None,
        out=out,
    )
    M, N = x.shape
    if out is None:
        out = torch.empty((M, N), dtype=x.dtype, device=x.device)
    if M == 0:
        return out
    fn = _compiled(kernel_cls, x.dtype, weight.dtype, N, config)
    fn(x, weight, out, float(eps))
    return out


def default_config_for(x, heuristic):
    """``heuristic(N, dtype)`` for a 2-D tensor ``x`` of a supported dtype, else None (then
    ``check_inputs`` rejects ``x`` with the precise reason before the config is used)."""
    if isinstance(x, torch.Tensor) and x.dim() == 2 and x.dtype in SUPPORTED:
        return heuristic(x.shape[1], x.dtype)
    return None


_SMS: dict = {}


def sm_count(device_index: int) -> int:
    """SMs of a CUDA device (asked once per device)."""
    n = _SMS.get(device_index)
    if n is None:
        props = torch.cuda.get_device_properties(device_index)
        n = _SMS[device_index] = props.multi_processor_count
    return n
