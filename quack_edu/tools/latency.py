"""Memory latency, measured: one thread follows a chain of dependent loads (a pointer chase).

    python -m quack_edu.tools.latency --out benchmarks/results/latency.json

Each load's address is the value the previous load returned, so no two loads overlap: the time
per step is the latency of one load, nothing hidden. The chain visits the slots of a buffer
(one slot every ``stride_bytes``, so every step touches a new cache line) in a random order,
so no prefetcher or open DRAM page helps. Two buffers:

* ``dram``: 1 GiB, 20x the H200's L2: nearly every step misses L2 and goes to HBM;
* ``l2``: 16 MiB, inside L2 (and 64x an SM's L1): after a first walk, the chain lives in L2.

The time per load is the slope of time against steps between a short and a long chase, so the
launch's fixed cost cancels. Each call starts where the previous one stopped: in the 1 GiB
buffer no timed step reads a line an earlier step brought into L2. A random walk over 1 GiB
also misses the GPU's TLBs now and then; that is part of what a load far away costs, and the
stride mode (``--order stride``: slots in address order) shows how much.

Little's law (lessons 01-05): bytes in flight = bandwidth x latency. This is the latency.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

import cutlass
import cutlass.cute as cute
from cutlass import Int32

BUFFERS = {"dram": 1 << 30, "l2": 16 << 20}
STRIDE = 128  # bytes between slots: one 128-byte line each
L2_BYTES = 50 << 20  # the H100's L2 (the H200's: 60 MiB); a buffer of half of it stays there


@cute.kernel
def chase_kernel(mNext: cute.Tensor, mOut: cute.Tensor, steps: Int32):
    """One thread: i = next[i], ``steps`` times, from ``out[0]``; the index it stops at goes back
    to ``out[0]``, so the next call walks on into lines no call has touched yet."""
    i = mOut[0]
    for _ in cutlass.range(steps, unroll=1):
        i = mNext[i]
    mOut[0] = i


@cute.jit
def chase(mNext: cute.Tensor, mOut: cute.Tensor, steps: Int32, stream):
    chase_kernel(mNext, mOut, steps).launch(grid=[1, 1, 1], block=[1, 1, 1], stream=stream)


def compile_args():
    n = cute.sym_int()
    nxt = cute.runtime.make_fake_tensor(Int32, (n,), (1,), assumed_align=4)
    out = cute.runtime.make_fake_compact_tensor(Int32, (1,), assumed_align=4)
    stream = cute.runtime.make_fake_stream(use_tvm_ffi_env_stream=True)
    return nxt, out, Int32(1), stream


def compile_chase(options: str = ""):
    """The compiled chase, callable as ``fn(next, out, steps)`` on torch CUDA tensors (int32)."""
    return cute.compile(chase, *compile_args(), options=("--enable-tvm-ffi " + options).strip())


def make_chain(
    buffer_bytes: int, stride_bytes: int = STRIDE, order: str = "random", seed=0, device="cuda"
):
    """An int32 tensor on the GPU: ``next[s]`` is the element index of the slot after slot ``s``
    (slots every ``stride_bytes``), one cycle through every slot, starting at element 0."""
    import torch

    step = stride_bytes // 4
    slots = buffer_bytes // stride_bytes
    if order == "random":
        g = torch.Generator(device="cpu").manual_seed(seed)
        perm = torch.randperm(slots - 1, generator=g) + 1
        perm = torch.cat([torch.zeros(1, dtype=perm.dtype), perm]).to(device)
    else:
        perm = torch.arange(slots, device=device)
    nxt = torch.zeros(buffer_bytes // 4, dtype=torch.int32, device=device)
    nxt[perm * step] = (torch.roll(perm, -1) * step).to(torch.int32)
    return nxt


def ns_per_load(
    buffer_bytes: int,
    *,
    short: int = 2_000,
    long: int = 20_000,
    order: str = "random",
    rounds: int = 3,
    fn=None,
) -> float:
    """Nanoseconds per dependent load, chasing through a buffer of ``buffer_bytes`` (GPU)."""
    import torch

    fn = fn or compile_chase()
    nxt = make_chain(buffer_bytes, order=order)
    out = torch.zeros(1, dtype=torch.int32, device="cuda")  # where the chase starts
    # Warm the module. A buffer meant for L2 is walked whole first, so that it is all there; a
    # DRAM-sized one only briefly: each timed call walks on into lines never touched before.
    fn(nxt, out, buffer_bytes // STRIDE if buffer_bytes <= L2_BYTES // 2 else short)
    torch.cuda.synchronize()

    def ms(steps):
        start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
        start.record()
        fn(nxt, out, steps)
        end.record()
        end.synchronize()
        return start.elapsed_time(end)

    best = []
    for _ in range(rounds):
        best.append((ms(long) - ms(short)) * 1e6 / (long - short))
    best.sort()
    return best[len(best) // 2]


def measure(orders=("random",)) -> dict:
    import torch

    fn = compile_chase()
    rows = []
    for order in orders:
        for name, nbytes in BUFFERS.items():
            ns = ns_per_load(nbytes, order=order, fn=fn)
            rows.append(dict(level=name, buffer_bytes=nbytes, order=order, ns_per_load=ns))
            print(f"{name:5s} {nbytes / 2**20:7.0f} MiB  {order:6s}  {ns:7.1f} ns per load")
    return {
        "gpu": torch.cuda.get_device_name(0),
        "date": datetime.date.today().isoformat(),
        "cutlass_dsl": getattr(cutlass, "__version__", None),
        "torch": torch.__version__,
        "stride_bytes": STRIDE,
        "method": "one thread, dependent int32 loads (i = next[i]), each call walking on from "
        "where the last stopped; slope between 2000 and 20000 steps; median of 3",
        "rows": rows,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="memory latency by pointer chase (needs a GPU)")
    ap.add_argument("--out", type=Path, help="write the record here (JSON)")
    ap.add_argument("--order", choices=("random", "stride", "both"), default="both")
    args = ap.parse_args(argv)
    from .._env import MODE

    if not MODE.gpu:
        print(f"needs a Hopper GPU: {MODE.reason}", file=sys.stderr)
        return 2
    orders = ("random", "stride") if args.order == "both" else (args.order,)
    record = measure(orders)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(record, indent=1) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
