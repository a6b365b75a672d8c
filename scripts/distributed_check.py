#!/usr/bin/env python3
"""QuackRMSNorm under FSDP2 and sequence parallelism on real GPUs, on every rank of a torchrun.

    source .gpu/env.sh; torchrun --nproc-per-node 2 scripts/distributed_check.py
    source .gpu/env.sh; torchrun --nproc-per-node 1 scripts/distributed_check.py
    torchrun --nproc-per-node 1 scripts/distributed_check.py --json results.json  # a record

Each check compares QuackRMSNorm (the real kernels, ``quack_edu.distributed``'s rules) with
``torch.nn.RMSNorm``:

* ``fsdp2``: a small model ``fully_shard``-ed over every rank, each rank its own batch: the
  losses and every parameter's gradient for three SGD steps;
* ``sp``: x ``(B, S, N)`` bf16 sharded on S (``SequenceParallel``): out, dx, and dw, whose
  ranks' Partial sums DTensor adds, against ``nn.RMSNorm`` on the full x;
* ``heads``: x ``(B, S, H, D)`` sharded on H with a per-head weight ``(H, D)``;
* ``fsdp2+sp``: the model on a ``(dp=1, tp=world)`` mesh, the norm sequence-parallel over tp
  inside FSDP2 (the norm's weight a DTensor, its gradient Partial over tp).

Prints one line on rank 0, ``distributed_check: PASS world_size=N (checks)`` or
``distributed_check: FAIL world_size=N: what``, and exits 1 on a failure.
"""

from __future__ import annotations

import os
import sys
import warnings

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import SequenceParallel, parallelize_module

import quack_edu.distributed  # noqa: F401  (the rules; quack_edu.rmsnorm imports it too)
from quack_edu import QuackRMSNorm, rmsnorm

# fp32: the kernel and torch sum in other orders; bf16: one rounding of the output
TOL = {torch.float32: dict(atol=1e-4, rtol=1e-4), torch.bfloat16: dict(atol=1.6e-2, rtol=1.6e-2)}


#: what failed on this rank: a check records and goes on, so every rank makes the same
#: collective calls whatever fails (a rank that stopped early would hang the others)
FAILURES: list[str] = []


def close(what, got, expected, dtype=torch.float32, **tol):
    try:
        torch.testing.assert_close(got.float(), expected.float(), **(tol or TOL[dtype]))
    except AssertionError as e:
        FAILURES.append(f"{what}: {' '.join(str(e).split())[:300]}")


def expect(what, got, expected):
    if got != expected:
        FAILURES.append(f"{what}: {got}, expected {expected}")


def norm(cls, n, device="cuda"):
    """An RMSNorm of ``cls`` with the same random weight whatever the class."""
    torch.manual_seed(0)
    m = cls(n, eps=1e-6, device=device)
    with torch.no_grad():
        m.weight.normal_()
    return m


def model(cls, tp=None):
    torch.manual_seed(0)
    with torch.device("cuda"):
        m = nn.Sequential(nn.Linear(64, 512), norm(cls, 512), nn.GELU(), nn.Linear(512, 16))
    if tp is not None:  # the norm's weight a Replicate DTensor, its input sharded on S
        parallelize_module(m[1], tp, SequenceParallel(use_local_output=True))
    return m


def train(what, mesh, tp=None, steps=3):
    """Two models, nn.RMSNorm's and ours, fully_shard-ed over ``mesh``: their losses and
    gradients at every step. x (B, S, 64), S sharded over tp when there is one."""
    models = []
    for cls in (nn.RMSNorm, QuackRMSNorm):
        m = model(cls, tp)
        for layer in m:
            fully_shard(layer, mesh=mesh)
        models.append(fully_shard(m, mesh=mesh))
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in models]
    g = torch.Generator("cuda").manual_seed(1 + dist.get_rank())  # each rank its own batch
    for step in range(steps):
        x = torch.randn(4, 256, 64, device="cuda", generator=g)
        losses = []
        for m in models:
            loss = m(x).square().mean()
            loss.backward()
            losses.append(loss.detach())
        close(f"{what} step {step} loss", losses[1], losses[0])
        for (name, p), q in zip(models[0].named_parameters(), models[1].parameters(), strict=True):
            close(f"{what} step {step} grad {name}", q.grad.full_tensor(), p.grad.full_tensor())
        for o in opts:
            o.step()
            o.zero_grad()


def sequence_parallel(mesh, dtype=torch.bfloat16):
    torch.manual_seed(0)  # the same full tensors on every rank
    x = torch.randn(2, 1000, 4096, device="cuda", dtype=dtype)
    g = torch.randn_like(x)
    theirs, ours = norm(nn.RMSNorm, 4096), norm(QuackRMSNorm, 4096)
    parallelize_module(ours, mesh, SequenceParallel())
    xr = x.float().requires_grad_()
    (theirs(xr) * g.float()).sum().backward()
    xd = distribute_tensor(x, mesh, [Shard(1)]).requires_grad_()
    out = ours(xd)
    (out * distribute_tensor(g, mesh, [Shard(1)])).sum().backward()
    expect("sp out placements", out.placements, (Shard(1),))
    expect("sp dw placements", ours.weight.grad.placements, (Partial(),))
    close("sp out", out.full_tensor(), theirs(xr), dtype)
    close("sp dx", xd.grad.full_tensor(), xr.grad, dtype)
    # dw sums 2000 rows in fp32, in another order than torch's
    close("sp dw", ours.weight.grad.full_tensor(), theirs.weight.grad, atol=1e-2, rtol=1e-4)


def heads(mesh):
    torch.manual_seed(0)
    H = 2 * mesh.size()
    x = torch.randn(2, 100, H, 128, device="cuda", dtype=torch.bfloat16)
    w, g = torch.randn(H, 128, device="cuda"), torch.randn_like(x)
    xr, wr = x.float().requires_grad_(), w.clone().requires_grad_()
    out_r = torch.nn.functional.rms_norm(xr, (128,), eps=1e-6) * wr
    (out_r * g.float()).sum().backward()
    xd = distribute_tensor(x, mesh, [Shard(2)]).requires_grad_()
    wd = distribute_tensor(w, mesh, [Replicate()]).requires_grad_()
    out = rmsnorm(xd, wd)
    (out * distribute_tensor(g, mesh, [Shard(2)])).sum().backward()
    expect("heads out placements", out.placements, (Shard(2),))
    expect("heads dw placements", wd.grad.placements, (Shard(0),))
    close("heads out", out.full_tensor(), out_r, torch.bfloat16)
    close("heads dx", xd.grad.full_tensor(), xr.grad, torch.bfloat16)
    close("heads dw", wd.grad.full_tensor(), wr.grad, atol=1e-2, rtol=1e-4)


def _record(path: str, world: int, checks: list[str], failures: list[str]) -> None:
    """The run as a JSON record: what passed, on which GPUs, with which versions."""
    import datetime
    import json
    from importlib.metadata import version

    record = {
        "kind": "distributed_check",
        "command": f"torchrun --nproc-per-node {world} scripts/distributed_check.py --json PATH",
        "date": datetime.date.today().isoformat(),
        "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
        "world_size": world,
        "torch": torch.__version__,
        "nvidia-cutlass-dsl": version("nvidia-cutlass-dsl"),
        "checks": checks,
        "status": "FAIL" if failures else "PASS",
        "failures": failures,
    }
    with open(path, "w") as f:
        json.dump(record, f, indent=1)


def main() -> int:
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    world, rank = dist.get_world_size(), dist.get_rank()
    mesh = init_device_mesh("cuda", (world,))
    mesh2d = init_device_mesh("cuda", (1, world), mesh_dim_names=("dp", "tp"))
    warnings.filterwarnings("ignore", "FSDP2-wrapped module")
    checks = {
        "fsdp2": lambda: train("fsdp2", mesh),
        "sp": lambda: sequence_parallel(mesh),
        "heads": lambda: heads(mesh),
        "fsdp2+sp": lambda: train("fsdp2+sp", mesh2d["dp"], tp=mesh2d["tp"]),
    }
    for name, check in checks.items():
        try:
            check()
        except Exception as e:  # a crash: the other ranks are likely to crash alike
            FAILURES.append(f"{name}: {type(e).__name__}: {' '.join(str(e).split())[:300]}")
    for failure in FAILURES:
        print(f"distributed_check: rank {rank}: {failure}", file=sys.stderr)
    failed = torch.tensor([len(FAILURES)], device="cuda")
    dist.all_reduce(failed)  # a failure on any rank fails the run
    if rank == 0:
        if failed.item():
            first = FAILURES[0] if FAILURES else "on another rank"
            print(f"distributed_check: FAIL world_size={world}: {failed.item()} failures, "
                  f"first {first}")  # fmt: skip
        else:
            print(f"distributed_check: PASS world_size={world} ({', '.join(checks)})")
        if len(sys.argv) > 2 and sys.argv[1] == "--json":
            _record(sys.argv[2], world, list(checks), FAILURES if failed.item() else [])
    dist.destroy_process_group()
    return 1 if failed.item() else 0


if __name__ == "__main__":
    sys.exit(main())
