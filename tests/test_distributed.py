"""quack_edu's ops on DTensors (``quack_edu.distributed``) and under FSDP2: values and gradients
against ``torch.nn.RMSNorm`` on the full tensors, the placements, and the rules themselves.

The CPU tests use ``fake_kernel`` (tests/test_rmsnorm_api.py: the kernels replaced by the fp32
references, the device check off), so they test the sharding, not the kernels' numbers. They
run on two kinds of mesh:

* ``gloo1``: a real one-rank gloo process group, what a run goes through (FSDP2 included). On
  one rank ``Partial()`` and ``Replicate()`` hold the same numbers, so it cannot tell them apart;
* ``sim2``: two ranks simulated in this process (PyTorch's fake process group and
  ``LocalTensorMode``: every rank's local tensor is kept, collectives are computed from them).
  A ``dw`` that is not summed over the ranks, or a norm over half rows, gives wrong numbers.

The rules are also checked as DTensor's sharding propagation applies them on a two-rank mesh.
GPU tests: the real kernels on a one-rank NCCL mesh; ``scripts/distributed_check.py`` runs the
same checks on every rank of a ``torchrun``.
"""

import contextlib
import importlib
import os
import subprocess
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest
import test_rmsnorm_api
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

import quack_edu.distributed as D  # noqa: F401  (quack_edu.rmsnorm imports it last)
from quack_edu.reference import TOLERANCES, rstd_ref
from quack_edu.reference import rmsnorm_bwd_ref as bwd_ref32
from quack_edu.reference import rmsnorm_ref as ref32

R = importlib.import_module("quack_edu.rmsnorm")  # quack_edu.rmsnorm is the function
ROOT = Path(__file__).resolve().parents[1]
fake_kernel = test_rmsnorm_api.fake_kernel
F32, BF16 = torch.float32, torch.bfloat16

# --------------------------------------------------------------------------------------------
# Meshes
# --------------------------------------------------------------------------------------------


@dataclass
class Ranks:
    """A mesh, and the context its ranks' code runs in (the simulation, for ``sim2``)."""

    mesh: object
    active: object  # () -> context manager

    @property
    def size(self) -> int:
        return self.mesh.size()

    def full(self, t) -> list[torch.Tensor]:
        """A DTensor's full value on every rank, as plain tensors (call within ``active()``)."""
        full = t.full_tensor().detach()
        each = getattr(full, "_local_tensors", None)  # a LocalTensor: one tensor a rank
        return [full] if each is None else list(each.values())


@pytest.fixture
def gloo1(tmp_path):
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        yield Ranks(init_device_mesh("cpu", (1,)), contextlib.nullcontext)
    finally:
        dist.destroy_process_group()


@pytest.fixture
def sim2():
    fake_pg = pytest.importorskip("torch.testing._internal.distributed.fake_pg")
    local = pytest.importorskip("torch.distributed._local_tensor")
    dist.init_process_group("fake", store=fake_pg.FakeStore(), rank=0, world_size=2)
    try:
        yield Ranks(init_device_mesh("cpu", (2,)), lambda: local.LocalTensorMode(2))
    finally:
        dist.destroy_process_group()


@pytest.fixture(params=["gloo1", "sim2"])
def ranks(request, fake_kernel):
    return request.getfixturevalue(request.param)


def assert_each(got: list, expected, dtype=F32, what=""):
    """Every rank's tensor of ``got`` against ``expected`` (the tolerance of ``dtype``)."""
    assert got, what
    for rank, t in enumerate(got):
        torch.testing.assert_close(
            t.float(), expected.float(), **TOLERANCES[dtype], msg=f"{what} on rank {rank}"
        )


def _as_dtensor(t, ranks, placement, grad=True):
    d = distribute_tensor(t.detach(), ranks.mesh, [placement])
    return d.requires_grad_(grad)


# --------------------------------------------------------------------------------------------
# Values and gradients against nn.RMSNorm / the fp32 reference on the full tensors
# --------------------------------------------------------------------------------------------

# x (5, 6, 40): 5 and 6 rows do not split evenly over 2 ranks with Shard(0); 40 is the norm
ROWS = [Shard(0), Shard(1), Replicate()]


@pytest.mark.parametrize("placement", ROWS, ids=str)
@pytest.mark.parametrize("dtype", [F32, BF16], ids=str)
def test_module_on_dtensor_matches_nn_rmsnorm(ranks, placement, dtype):
    torch.manual_seed(0)
    theirs = nn.RMSNorm(40, eps=1e-6)
    with torch.no_grad():
        theirs.weight.normal_()
    x = torch.randn(5, 7, 40, dtype=dtype)
    g = torch.randn(5, 7, 40, dtype=dtype)
    xr = x.float().requires_grad_()
    (theirs(xr) * g.float()).sum().backward()

    with ranks.active():
        ours = R.QuackRMSNorm(40)
        ours.weight = nn.Parameter(distribute_tensor(theirs.weight.detach(), ranks.mesh))
        xd = _as_dtensor(x, ranks, placement)
        out = ours(xd)
        (out * distribute_tensor(g, ranks.mesh, [placement])).sum().backward()
        placements = out.placements, xd.grad.placements, ours.weight.grad.placements
        got = [ranks.full(t) for t in (out, xd.grad, ours.weight.grad)]
    assert out.dtype == dtype
    sums = Replicate() if placement == Replicate() else Partial()
    assert placements == ((placement,), (placement,), (sums,))
    assert_each(got[0], theirs(xr), dtype, "out")
    assert_each(got[1], xr.grad, dtype, "dx")
    assert_each(got[2], theirs.weight.grad, F32, "dw")  # a sum over every rank's rows


def test_weight_grad_is_each_ranks_partial_sum(sim2, fake_kernel):
    """dw is Partial: each rank holds the sum over its own rows, not the total."""
    torch.manual_seed(0)
    x, w, g = torch.randn(6, 32), torch.randn(32), torch.randn(6, 32)
    with sim2.active():
        xd, wd = _as_dtensor(x, sim2, Shard(0)), _as_dtensor(w, sim2, Replicate())
        (R.rmsnorm(xd, wd) * distribute_tensor(g, sim2.mesh, [Shard(0)])).sum().backward()
        local = list(wd.grad.to_local()._local_tensors.values())
        full = sim2.full(wd.grad)
    _, dw_top, _ = bwd_ref32(x[:3], w, g[:3], rstd_ref(x[:3]))
    _, dw_bottom, _ = bwd_ref32(x[3:], w, g[3:], rstd_ref(x[3:]))
    assert_each(local[:1], dw_top, what="rank 0's dw")
    assert_each(local[1:], dw_bottom, what="rank 1's dw")
    assert_each(full, dw_top + dw_bottom, what="dw")


def test_one_row_over_two_ranks(sim2, fake_kernel):
    """x Shard(0) with fewer rows than ranks (DTensor 2.13 then runs the replicated rule
    rather than leave a rank without rows): the values are still the whole norm's."""
    torch.manual_seed(0)
    x, w, g = torch.randn(1, 32), torch.randn(32), torch.randn(1, 32)
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    (ref32(xr, wr) * g).sum().backward()
    with sim2.active():
        xd, wd = _as_dtensor(x, sim2, Shard(0)), _as_dtensor(w, sim2, Replicate())
        out = R.rmsnorm(xd, wd)
        (out * distribute_tensor(g, sim2.mesh, [Shard(0)])).sum().backward()
        got = [sim2.full(t) for t in (out, xd.grad, wd.grad)]
    assert_each(got[0], ref32(x, w), what="out")
    assert_each(got[1], xr.grad, what="dx")
    assert_each(got[2], wr.grad, what="dw")


@pytest.mark.parametrize("placement", [Shard(1), Shard(-1)], ids=["rows", "last"])
def test_last_dim_sharding_is_gathered_before_the_norm(ranks, placement):
    """No rule shards the normalised dim: a DTensor sharded there is redistributed first, and
    the norm is over whole rows (on 2 ranks, half rows would give other numbers)."""
    torch.manual_seed(0)
    x, w, g = torch.randn(4, 6, 64), torch.randn(64), torch.randn(4, 6, 64)
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    (ref32(xr, wr) * g).sum().backward()
    with ranks.active():
        xd, wd = _as_dtensor(x, ranks, placement), _as_dtensor(w, ranks, Replicate())
        out = R.rmsnorm(xd, wd)
        (out * distribute_tensor(g, ranks.mesh, [placement])).sum().backward()
        got = [ranks.full(t) for t in (out, xd.grad, wd.grad)]
    assert Shard(2) not in out.placements and Shard(-1) not in out.placements
    assert_each(got[0], ref32(x, w), what="out")
    assert_each(got[1], xr.grad, what="dx")
    assert_each(got[2], wr.grad, what="dw")


def test_a_partial_x_is_reduced_before_the_norm(sim2, fake_kernel):
    """The norm is not linear in x: a Partial x is summed over the ranks first."""
    torch.manual_seed(0)
    parts = [torch.randn(4, 32), torch.randn(4, 32)]
    w = torch.randn(32)
    with (mode := sim2.active()):  # the mode's rank_map (torch 2.11 has no module-level one)
        xd = DTensor.from_local(mode.rank_map(lambda r: parts[r].clone()), sim2.mesh, [Partial()])
        out = R.rmsnorm(xd, distribute_tensor(w, sim2.mesh))
        got = sim2.full(out)
    assert_each(got, ref32(parts[0] + parts[1], w), what="out")


@pytest.mark.parametrize("placement", [Shard(1), Shard(0)], ids=["heads", "rows"])
def test_per_head_weight_is_sharded_with_the_heads(ranks, placement):
    """x (B, H, D) sharded on H: the (H, D) weight is split with the heads (each rank scales
    its heads by theirs) and dw stays a whole sum per head; sharded on B, dw is Partial."""
    torch.manual_seed(0)
    x, w, g = torch.randn(5, 4, 32), torch.randn(4, 32), torch.randn(5, 4, 32)
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    (ref32(xr, wr) * g).sum().backward()
    with ranks.active():
        xd, wd = _as_dtensor(x, ranks, placement), _as_dtensor(w, ranks, Replicate())
        out = R.rmsnorm(xd, wd)
        (out * distribute_tensor(g, ranks.mesh, [placement])).sum().backward()
        placements = out.placements, wd.grad.placements
        got = [ranks.full(t) for t in (out, xd.grad, wd.grad)]
    dw_placement = Shard(0) if placement == Shard(1) else Partial()
    assert placements == ((placement,), (dw_placement,))
    assert_each(got[0], ref32(x, w), what="out")
    assert_each(got[1], xr.grad, what="dx")
    assert_each(got[2], wr.grad, what="dw")


def test_residual_bias_prenorm_and_dtypes(ranks):
    """Every tensor argument on Shard(1) or replicated: x bf16 with an fp32 residual (so
    residual_out is fp32, a tensor of its own), weight and bias, prenorm's two outputs."""
    torch.manual_seed(0)
    x, res = torch.randn(3, 6, 48, dtype=BF16), torch.randn(3, 6, 48)
    w, b = torch.randn(48), torch.randn(48)
    g1, g2 = torch.randn(3, 6, 48, dtype=BF16), torch.randn(3, 6, 48)
    refs = [t.float().requires_grad_() for t in (x, w, b, res)]
    out_r, res_out_r = ref32(*refs)
    ((out_r * g1.float()).sum() + (res_out_r * g2).sum()).backward()
    with ranks.active():
        ins = [_as_dtensor(t, ranks, Shard(1) if t.dim() == 3 else Replicate())
               for t in (x, w, b, res)]  # fmt: skip
        out, res_out = R.rmsnorm(*ins, prenorm=True)
        g1d, g2d = (distribute_tensor(t, ranks.mesh, [Shard(1)]) for t in (g1, g2))
        ((out * g1d).sum() + (res_out * g2d).sum()).backward()
        dtypes = out.dtype, res_out.dtype, *(t.grad.dtype for t in ins)
        got = [ranks.full(t) for t in (out, res_out, *(t.grad for t in ins))]
    assert dtypes == (BF16, F32, BF16, F32, F32, F32)
    assert_each(got[0], out_r, BF16, "out")
    assert_each(got[1], res_out_r, F32, "residual_out")
    for t, ref, name in zip(got[2:], refs, ("dx", "dw", "db", "dresidual"), strict=True):
        # dx and dresidual are the same fp32 gradient, dx rounded to x's bf16
        assert_each(t, ref.grad, BF16 if name == "dx" else F32, name)


def test_fwd_outputs_follow_the_flags(ranks):
    """One DTensor input, calls that return 1, 2 and 3 tensors: DTensor caches a rule by the
    op's arguments, so the flags must be part of the key."""
    torch.manual_seed(0)
    x, w, res = torch.randn(6, 32), torch.randn(32), torch.randn(6, 32)
    with ranks.active():
        xd, wd = _as_dtensor(x, ranks, Shard(0), False), _as_dtensor(w, ranks, Replicate(), False)
        resd = _as_dtensor(res, ranks, Shard(0), False)
        calls = [
            R.rmsnorm_fwd(xd, wd),
            R.rmsnorm_fwd(xd, wd, store_rstd=True),
            R.rmsnorm_fwd(xd, wd, residual=resd, store_rstd=True),
            R.rmsnorm_fwd(xd, wd),
        ]
        got = [[None if t is None else ranks.full(t) for t in outs] for outs in calls]
        placements = [[None if t is None else t.placements for t in outs] for outs in calls]
    s0 = (Shard(0),)
    assert placements == [[s0, s0, None], [s0, s0, s0], [s0, s0, s0], [s0, s0, None]]
    out_res, x_res = ref32(x, w, residual=res)
    expected = [
        (ref32(x, w), x, None),
        (ref32(x, w), x, rstd_ref(x)),
        (out_res, x_res, rstd_ref(x_res)),
        (ref32(x, w), x, None),
    ]
    for outs, (out, res_out, rstd) in zip(got, expected, strict=True):
        assert_each(outs[0], out, what="out")
        assert_each(outs[1], res_out, what="residual_out")
        if rstd is not None:
            assert_each(outs[2], rstd, what="rstd")


def test_backward_is_linear_in_partial_gradients(sim2, fake_kernel):
    """dout and dresidual_out Partial (x replicated): dx, dw, db, dresidual come out Partial,
    and their sums are the gradients of the summed dout."""
    torch.manual_seed(0)
    x, w = torch.randn(5, 32), torch.randn(32)
    douts = [torch.randn(5, 32), torch.randn(5, 32)]
    dres = [torch.randn(5, 32, dtype=BF16), torch.randn(5, 32, dtype=BF16)]
    rstd = rstd_ref(x)
    with (mode := sim2.active()):
        rep = [distribute_tensor(t, sim2.mesh) for t in (x, w, rstd)]
        douts_d = mode.rank_map(lambda r: douts[r].clone())
        dres_d = mode.rank_map(lambda r: dres[r].clone())
        dout = DTensor.from_local(douts_d, sim2.mesh, [Partial()])
        dro = DTensor.from_local(dres_d, sim2.mesh, [Partial()])
        outs = R.rmsnorm_bwd(rep[0], rep[1], dout, rep[2], dro, has_bias=True)
        placements = [t.placements for t in outs]
        got = [sim2.full(t) for t in outs]
    assert placements == [(Partial(),)] * 4
    dres_sum = dres[0].float() + dres[1].float()
    dx, dw, db = bwd_ref32(x, w, douts[0] + douts[1], rstd, dres_sum, True)
    assert_each(got[0], dx, what="dx")
    assert_each(got[1], dw, what="dw")
    assert_each(got[2], db, what="db")
    # each rank's bf16 dresidual is rounded before the ranks' values are added
    assert_each(got[3], dx, BF16, "dresidual")


def test_a_plain_weight_with_a_dtensor_x_is_dtensors_error(gloo1, fake_kernel):
    """As for nn.RMSNorm: DTensor refuses a plain tensor among DTensors, unless asked to
    replicate it (then dw is a Partial DTensor, as torch's own rms_norm gives)."""
    from torch.distributed.tensor.experimental import implicit_replication

    x, w = torch.randn(4, 32), torch.randn(32, requires_grad=True)
    xd = _as_dtensor(x, gloo1, Shard(0))
    with pytest.raises(RuntimeError, match="mixed torch.Tensor and DTensor"):
        R.rmsnorm(xd, w)
    with implicit_replication():
        R.rmsnorm(xd, w).sum().backward()
    assert isinstance(w.grad, DTensor) and w.grad.placements == (Partial(),)
    wr = w.detach().clone().requires_grad_()
    ref32(x, wr).sum().backward()
    assert_each(gloo1.full(w.grad), wr.grad, what="dw")


# --------------------------------------------------------------------------------------------
# The rules, as DTensor's sharding propagation applies them on a two-rank mesh
# --------------------------------------------------------------------------------------------

S0, S1, S2, RE, PA = Shard(0), Shard(1), Shard(2), Replicate(), Partial()
X, W, WH, RSTD = (4, 6, 8), (8,), (6, 8), (4, 6)  # x (B, H, D); WH a per-head weight
FWD = [
    # (what, args: a tensor as (shape, placement), expected outputs, expected inputs)
    ("rows", [(X, S0), (W, RE), None, None, F32, None, 1e-6, True, 0.0], [S0, S0], [S0, RE]),
    ("seq + residual", [(X, S1), (W, RE), (W, RE), (X, S1), F32, F32, 1e-6, True, 0.0],
     [S1, S1, S1], [S1, RE, RE, S1]),
    ("last dim gathered", [(X, S2), (W, RE), None, None, F32, None, 1e-6, False, 0.0],
     [RE], [RE, RE]),
    ("replicated", [(X, RE), (W, RE), None, None, F32, None, 1e-6, True, 0.0], [RE, RE], [RE, RE]),
    ("heads", [(X, S1), (WH, RE), (WH, RE), None, F32, None, 1e-6, True, 0.0],
     [S1, S1], [S1, S0, S0]),
    ("weight gathered", [(X, S0), (W, S0), None, None, F32, None, 1e-6, False, 0.0], [S0],
     [S0, RE]),
]  # fmt: skip
BWD = [
    ("rows", [(X, S0), (W, RE), (X, S0), (RSTD, S0), None, True, None, 0.0], [S0, PA, PA],
     [S0, RE, S0, S0]),
    ("seq + dresidual", [(X, S1), (W, RE), (X, S1), (RSTD, S1), (X, S1), False, BF16, 0.0],
     [S1, PA, S1], [S1, RE, S1, S1, S1]),
    ("heads", [(X, S1), (WH, RE), (X, S1), (RSTD, S1), None, True, None, 0.0], [S1, S0, S0],
     [S1, S0, S1, S1]),
    ("partial grads", [(X, RE), (W, RE), (X, PA), (RSTD, RE), (X, PA), True, BF16, 0.0],
     [PA, PA, PA, PA], [RE, RE, PA, RE, PA]),
    ("replicated", [(X, RE), None, (X, RE), (RSTD, RE), None, True, None, 0.0], [RE, RE],
     [RE, RE, RE]),
]  # fmt: skip


def _propagate(mesh, op, args):
    """The placements DTensor gives the outputs, and the ones it moves the inputs to."""
    from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
    from torch.distributed.tensor._op_schema import OpSchema

    def spec(arg):
        if not (isinstance(arg, tuple) and isinstance(arg[0], tuple)):
            return arg
        t = torch.empty(arg[0])
        meta = TensorMeta(t.shape, t.stride(), t.dtype)
        return DTensorSpec(mesh, (arg[1],), tensor_meta=meta)

    propagator = DTensor._op_dispatcher.sharding_propagator
    schema = OpSchema(op, tuple(spec(a) for a in args), {}, propagator.op_to_schema_info[op])
    found = propagator.propagate_op_sharding_non_cached(schema)
    moved = (found.redistribute_schema or schema).args_spec
    return [s.placements[0] for s in found.output_spec], [s.placements[0] for s in moved]


@pytest.mark.parametrize("name", sorted(D.OPS))
def test_rules_on_a_two_rank_mesh(sim2, name):
    op = getattr(torch.ops.quack_edu, name).default
    for what, args, outs, ins in FWD if D.OPS[name] == "fwd" else BWD:
        assert _propagate(sim2.mesh, op, args) == (outs, ins), what


def test_a_partial_x_is_reduced_by_the_rules(sim2):
    args = [(X, PA), (W, RE), None, None, F32, None, 1e-6, True, 0.0]
    outs, ins = _propagate(sim2.mesh, torch.ops.quack_edu.rmsnorm_fwd.default, args)
    assert ins[0] in (S0, S1, RE) and outs == [ins[0], ins[0]]


@pytest.mark.parametrize("outputs", [1, 2])
def test_register_sharding_cannot_express_a_list_return(sim2, outputs):
    """Why quack_edu.distributed does not use torch's register_sharding (its docstring says
    more): the rule of an op returning Tensor[] fails however many outputs it names. When this
    test fails, PyTorch's register_sharding may have learnt lists."""
    from torch.distributed.tensor.experimental import register_sharding

    lib = torch.library.Library("quack_edu_test", "FRAGMENT")  # removed when lib is freed
    lib.define("two(Tensor x) -> Tensor[]")
    lib.impl("two", lambda x: [x.clone(), x.clone()], "CompositeExplicitAutograd")
    op = torch.ops.quack_edu_test.two.default

    @register_sharding(op)
    def rule(x):
        return [([RE] * outputs, [RE])]

    with pytest.raises(RuntimeError, match="Sharding propagation failed"):
        op(distribute_tensor(torch.randn(4, 8), sim2.mesh))


# --------------------------------------------------------------------------------------------
# FSDP2, and FSDP2 with a sequence-parallel norm
# --------------------------------------------------------------------------------------------


def _model(norm, tp=None, device="cpu"):
    torch.manual_seed(0)
    with torch.device(device):
        model = nn.Sequential(nn.Linear(16, 40), norm(40, eps=1e-6), nn.GELU(), nn.Linear(40, 8))
        with torch.no_grad():
            model[1].weight.normal_()
    if tp is not None:  # the norm's weight a Replicate DTensor, its input x sharded on dim 1
        from torch.distributed.tensor.parallel import SequenceParallel, parallelize_module

        parallelize_module(model[1], tp, SequenceParallel(use_local_output=True))
    return model


def _fully_shard(model, mesh):
    from torch.distributed.fsdp import fully_shard

    for layer in model:
        fully_shard(layer, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def _train(models, x, steps=3):
    """Each model's loss at every step, and its parameters' gradients (full tensors)."""
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in models]
    losses, grads = [], []
    for _ in range(steps):
        for m in models:
            loss = m(x).square().mean()
            loss.backward()
            losses.append(loss.item())
            grads.append([p.grad.full_tensor() for p in m.parameters()])
        for o in opts:
            o.step()
            o.zero_grad()
    return losses, grads


@pytest.mark.parametrize("sp", [False, True], ids=["fsdp2", "fsdp2+sp"])
def test_fsdp2_training_matches_nn_rmsnorm(gloo1, fake_kernel, sp):
    mesh = init_device_mesh("cpu", (1, 1), mesh_dim_names=("dp", "tp"))
    tp = mesh["tp"] if sp else None
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "FSDP2-wrapped module")
        models = [_fully_shard(_model(n, tp), mesh["dp"]) for n in (nn.RMSNorm, R.QuackRMSNorm)]
        assert isinstance(models[1][1].weight, DTensor)  # FSDP2's sharded parameter
        losses, grads = _train(models, torch.randn(2, 5, 16))
    assert len(fake_kernel.calls) == 6  # every step ran our forward and backward
    assert losses[1::2] == pytest.approx(losses[::2], rel=1e-5)
    for theirs, ours in zip(grads[::2], grads[1::2], strict=True):
        for a, b in zip(theirs, ours, strict=True):
            torch.testing.assert_close(b, a, **TOLERANCES[F32])


# --------------------------------------------------------------------------------------------
# Registration: when DTensor is imported after quack_edu
# --------------------------------------------------------------------------------------------


def test_rules_are_registered_when_dtensor_is_imported_later(subprocess_env):
    code = (
        "import sys, torch, quack_edu, quack_edu.distributed as D\n"
        "print('torch.distributed.tensor' in sys.modules)\n"
        "from torch.distributed.tensor import DTensor\n"
        "funcs = DTensor._op_dispatcher.sharding_propagator.op_strategy_funcs\n"
        "print(all(getattr(torch.ops.quack_edu, n).default in funcs for n in D.OPS))\n"
    )
    got = subprocess.run([sys.executable, "-c", code], env=subprocess_env, capture_output=True,
                         text=True, timeout=120)  # fmt: skip
    assert got.returncode == 0, got.stderr[-2000:]
    eager, registered = got.stdout.split()
    assert registered == "True"
    if eager == "True":  # something imported DTensor with quack_edu (torch._dynamo does)
        pytest.skip("DTensor was imported with quack_edu: registered at once, no later import")


# --------------------------------------------------------------------------------------------
# GPU: the real kernels on a one-rank NCCL mesh
# --------------------------------------------------------------------------------------------


@pytest.fixture
def nccl1(tmp_path):
    torch.cuda.set_device(0)
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("nccl", store=store, rank=0, world_size=1)
    try:
        yield Ranks(init_device_mesh("cuda", (1,)), contextlib.nullcontext)
    finally:
        dist.destroy_process_group()


@pytest.mark.gpu
@pytest.mark.parametrize("sp", [False, True], ids=["fsdp2", "fsdp2+sp"])
def test_gpu_fsdp2_training_matches_nn_rmsnorm(nccl1, sp):
    mesh = init_device_mesh("cuda", (1, 1), mesh_dim_names=("dp", "tp"))
    tp = mesh["tp"] if sp else None
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "FSDP2-wrapped module")
        models = [_fully_shard(_model(n, tp, "cuda"), mesh["dp"])
                  for n in (nn.RMSNorm, R.QuackRMSNorm)]  # fmt: skip
        losses, grads = _train(models, torch.randn(4, 96, 16, device="cuda"))
    assert losses[1::2] == pytest.approx(losses[::2], rel=1e-4)
    for theirs, ours in zip(grads[::2], grads[1::2], strict=True):
        for a, b in zip(theirs, ours, strict=True):
            # the kernel and torch sum over rows in other orders: fp32 rounding
            torch.testing.assert_close(b, a, atol=1e-4, rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [F32, BF16], ids=str)
def test_gpu_sequence_parallel_dtensor_input(nccl1, dtype):
    torch.manual_seed(0)
    theirs = nn.RMSNorm(4096, eps=1e-6, device="cuda")
    with torch.no_grad():
        theirs.weight.normal_()
    x = torch.randn(2, 333, 4096, device="cuda", dtype=dtype)
    g = torch.randn_like(x)
    xr = x.float().requires_grad_()
    (theirs(xr) * g.float()).sum().backward()
    ours = R.QuackRMSNorm(4096, device="cuda")
    ours.weight = nn.Parameter(distribute_tensor(theirs.weight.detach(), nccl1.mesh))
    xd = _as_dtensor(x, nccl1, Shard(1))
    out = ours(xd)
    (out * distribute_tensor(g, nccl1.mesh, [Shard(1)])).sum().backward()
    assert out.placements == (Shard(1),) and ours.weight.grad.placements == (Partial(),)
    assert_each(nccl1.full(out), theirs(xr), dtype, "out")
    assert_each(nccl1.full(xd.grad), xr.grad, dtype, "dx")
    # dw sums 666 rows: fp32 partial sums in another order than torch's
    torch.testing.assert_close(nccl1.full(ours.weight.grad)[0], theirs.weight.grad,
                               atol=1e-3, rtol=1e-4)  # fmt: skip


@pytest.mark.gpu
def test_gpu_tuned_ops_on_dtensors(nccl1):
    torch.manual_seed(0)
    x, w = torch.randn(8, 64, 1024, device="cuda", dtype=BF16), torch.randn(1024, device="cuda")
    g = torch.randn_like(x)
    xd, wd = _as_dtensor(x, nccl1, Shard(1), False), _as_dtensor(w, nccl1, Replicate(), False)
    out, _, rstd = R.rmsnorm_fwd_tuned(xd, wd, store_rstd=True)
    dx, dw, _, _ = R.rmsnorm_bwd_tuned(xd, wd, distribute_tensor(g, nccl1.mesh, [Shard(1)]), rstd)
    assert (out.placements, dx.placements, dw.placements) == ((S1,), (S1,), (PA,))
    assert_each(nccl1.full(out), ref32(x, w), BF16, "out")
    rdx, rdw, _ = bwd_ref32(x, w, g, rstd_ref(x))
    assert_each(nccl1.full(dx), rdx, BF16, "dx")
    torch.testing.assert_close(nccl1.full(dw)[0], rdw, atol=1e-2, rtol=1e-4)


@pytest.mark.gpu
def test_gpu_distributed_check_script_on_one_rank(subprocess_env):
    got = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "1",
         str(ROOT / "scripts" / "distributed_check.py")],
        env={**subprocess_env, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")},
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert got.returncode == 0, got.stdout[-3000:] + got.stderr[-3000:]
    assert "distributed_check: PASS world_size=1" in got.stdout
