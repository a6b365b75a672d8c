"""quack_edu's custom ops on DTensors: sharding rules for tensor, sequence and FSDP2 parallelism.

Importing this module (``quack_edu.rmsnorm`` does, last) tells DTensor how each of the four ops
``quack_edu::rmsnorm_fwd``, ``rmsnorm_fwd_tuned``, ``rmsnorm_bwd`` and ``rmsnorm_bwd_tuned`` may
be split over a device mesh. ``rmsnorm``, ``rmsnorm_fwd``, ``rmsnorm_bwd`` and ``QuackRMSNorm``
then take DTensor inputs: they call the registered op for a tensor subclass, DTensor picks the
cheapest rule below for the inputs' placements, moves data only where that rule asks for it,
and each rank runs the kernel on its local rows.

The rules, for one mesh dim (DTensor combines them over the dims of a mesh):

* **Rows are independent.** ``x``, ``residual`` and the outputs of ``x``'s shape may be
  ``Shard(d)`` on any dim ``d`` but the last; ``rstd`` (``x.shape[:-1]``) is ``Shard(d)`` with
  them; ``weight`` and ``bias`` are ``Replicate()``. Or everything ``Replicate()``.
* **The last dim is the one normalised**, so no rule shards it: a DTensor sharded there is
  redistributed to a rule's placement (DTensor's choice: an all-gather, or an all-to-all to
  rows) before the kernel runs, and the norm is over whole rows.
* **A per-head weight** ``(H, D)`` with ``x`` ``(..., H, D)`` sharded on ``H``: the weight and
  bias (and ``dw``, ``db``) are ``Shard(0)``, on ``H`` too, so each rank normalises its own
  heads with their own weights.
* **Backward.** ``dx`` and ``dresidual`` are sharded like ``x``, ``dout``, ``rstd`` and
  ``dresidual_out``. ``dw`` and ``db`` are sums over the rows: with the rows sharded each rank
  holds the sum over its own rows, so they are ``Partial()`` (sum), and DTensor adds the ranks'
  sums when they are redistributed (``full_tensor()``, FSDP2's reduce-scatter, the optimizer).
* **The backward is linear in the gradients** ``(dout, dresidual_out)``: with both
  ``Partial()`` and ``x``, ``rstd``, ``weight`` replicated, every output is ``Partial()`` and
  the reduction waits (as DTensor's rules for aten's linear ops do).
* **No rule takes a** ``Partial()`` ``x`` **or** ``residual``: the norm is not linear in them,
  so DTensor reduces them first.

FSDP2 (``fully_shard``) needs nothing of this on a one-dim mesh: it all-gathers the parameters
into plain tensors before the forward, so the norm sees plain tensors, and reduce-scatters
their gradients after the backward. With tensor or sequence parallelism beside it (a 2-D mesh)
the gathered parameters are DTensors on the tp mesh, and the rules above apply.

Why not ``torch.distributed.tensor.experimental.register_sharding``: in PyTorch 2.13 it expands
a rule with as many outputs as the schema has returns, one here (a ``Tensor[]`` whose length
depends on the arguments: ``store_rstd``, ``residual_out_dtype``, ``has_bias``,
``dres_dtype``). A rule naming one output fails when the list is checked ("`output_specs` has
1 output which does not equal the number of op outputs"); one naming more has its second
output taken for an input. The strategies here are registered on DTensor's sharding
propagator, the hook ``register_sharding`` itself uses, with the same kind of rule function:
it takes the op's arguments (tensors as ``DTensorSpec``) and returns ``(outputs, inputs)``
placement lists, expanded over the mesh with the number of tensors this call returns.

Importing ``torch.distributed.tensor`` takes about 0.6 s on a CPU, so this module does not: it
registers the rules at once if DTensor is already imported, else right after it is (a finder
on ``sys.meta_path`` that removes itself). A DTensor cannot exist before that.

A plain ``torch.Tensor`` among DTensor arguments is DTensor's error ("got mixed torch.Tensor
and DTensor"), as for ``torch.nn.RMSNorm``: give the weight as a DTensor (``distribute_tensor``,
``parallelize_module`` with ``SequenceParallel``), or call under
``torch.distributed.tensor.experimental.implicit_replication()``.
"""

from __future__ import annotations

import importlib.util
import sys
import warnings

import torch

__all__ = ["fwd_rules", "bwd_rules", "register", "OPS"]

#: the ops' names, and the rule function of each
OPS = {
    "rmsnorm_fwd": "fwd",
    "rmsnorm_fwd_tuned": "fwd",
    "rmsnorm_bwd": "bwd",
    "rmsnorm_bwd_tuned": "bwd",
}


def _placements():
    """DTensor's placement classes, imported when a rule is first asked for."""
    from torch.distributed.tensor import Partial, Replicate, Shard

    return Partial, Replicate, Shard


def _per_head(p) -> bool:
    return p is not None and p.ndim == 2


def _if(t, placement):
    """``placement`` for a tensor argument that was given, None for one that was not."""
    return None if t is None else placement


def fwd_rules(
    x, weight, bias, residual, out_dtype, residual_out_dtype, eps, store_rstd, weight_offset
):
    """The placements ``rmsnorm_fwd`` accepts on one mesh dim: a list of ``(outputs, inputs)``,
    outputs ``[out, residual_out if residual_out_dtype, rstd if store_rstd]``, inputs
    ``[x, weight, bias, residual]`` (None for an argument not given). Tensors are anything
    with ``ndim`` (a ``DTensorSpec`` when DTensor asks)."""
    _, Replicate, Shard = _placements()
    head = _per_head(weight if weight is not None else bias)

    def rule(px, pparam, prstd):
        outs = [px]
        if residual_out_dtype is not None:
            outs.append(px)
        if store_rstd:
            outs.append(prstd)
        return outs, [px, _if(weight, pparam), _if(bias, pparam), _if(residual, px)]

    rules = [rule(Replicate(), Replicate(), Replicate())]
    for d in range(x.ndim - 1):
        # x (..., H, D) sharded on H: each rank holds its heads, and their weights
        pparam = Shard(0) if head and d == x.ndim - 2 else Replicate()
        rules.append(rule(Shard(d), pparam, Shard(d)))
    return rules


def bwd_rules(x, weight, dout, rstd, dresidual_out, has_bias, dres_dtype, weight_offset):
    """The placements ``rmsnorm_bwd`` accepts on one mesh dim: a list of ``(outputs, inputs)``,
    outputs ``[dx, dw if weight, db if has_bias, dresidual if dres_dtype]``, inputs
    ``[x, weight, dout, rstd, dresidual_out]`` (None for an argument not given)."""
    Partial, Replicate, Shard = _placements()
    head = _per_head(weight)

    def rule(px, pparam, pdparam, pgrad):
        """px: x and rstd; pgrad: dout, dresidual_out and the outputs of x's shape."""
        outs = [pgrad]
        if weight is not None:
            outs.append(pdparam)
        if has_bias:
            outs.append(pdparam)
        if dres_dtype is not None:
            outs.append(pgrad)
        return outs, [px, _if(weight, pparam), pgrad, px, _if(dresidual_out, pgrad)]

    rules = [rule(Replicate(), Replicate(), Replicate(), Replicate())]
    for d in range(x.ndim - 1):
        if head and d == x.ndim - 2:  # sharded on H: each rank's heads, whole sums
            rules.append(rule(Shard(d), Shard(0), Shard(0), Shard(d)))
        else:  # sharded rows: each rank sums dw, db over its rows
            rules.append(rule(Shard(d), Replicate(), Partial(), Shard(d)))
    # linear in (dout, dresidual_out): partial gradients give partial outputs
    rules.append(rule(Replicate(), Replicate(), Partial(), Partial()))
    return rules


def _spec(arg):
    """An argument as the rule functions see it: a DTensor's spec, anything else as it is."""
    from torch.distributed.tensor._op_schema import OpStrategy

    if isinstance(arg, OpStrategy):
        return arg.strategies[0].output_spec
    return arg


def _strategy(rules):
    """DTensor's strategy function for an op whose rules are ``rules``: every rule expanded
    over the mesh's dims, the outputs always a tuple (the op returns a list, even of one)."""
    from torch.distributed.tensor._dtensor_spec import DTensorSpec
    from torch.distributed.tensor._ops.utils import expand_to_full_mesh_op_strategy

    def strategy(op_schema):
        args = [_spec(a) for a in op_schema.args_schema]
        kwargs = {k: _spec(v) for k, v in op_schema.kwargs_schema.items()}
        found = rules(*args, **kwargs)
        n_out = len(found[0][0])
        strategy = expand_to_full_mesh_op_strategy(
            op_schema.get_mesh_from_args(),
            op_schema,
            [outs + ins for outs, ins in found],
            input_index=n_out,
        )
        for spec in strategy.strategies:
            if isinstance(spec.output_specs, DTensorSpec):
                spec.output_specs = (spec.output_specs,)
        return strategy

    return strategy


def register() -> None:
    """Register the strategies of the four ops with DTensor (again: the last one counts)."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._op_schema import RuntimeSchemaInfo

    propagator = DTensor._op_dispatcher.sharding_propagator
    rules = {"fwd": fwd_rules, "bwd": bwd_rules}
    for name, kind in OPS.items():
        op = getattr(torch.ops.quack_edu, name).default
        # every argument after x is in DTensor's cache key: which tensors are given and the
        # flags decide how many tensors the op returns
        propagator.register_op_strategy(op, _strategy(rules[kind]), RuntimeSchemaInfo(1))


# --------------------------------------------------------------------------------------------
# Registering when DTensor is imported
# --------------------------------------------------------------------------------------------

_DTENSOR = "torch.distributed.tensor"


class _RegisterAfterImport:
    """A meta-path finder that lets ``torch.distributed.tensor`` be imported as usual, then
    registers the rules: importing it costs about 0.6 s on a CPU, which ``import quack_edu``
    does not pay unless DTensor is used. A DTensor exists only once that module has run."""

    def find_spec(self, name, path=None, target=None):
        if name != _DTENSOR:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)  # the spec the other finders give
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_register(module):
            exec_module(module)
            _register_or_warn()

        spec.loader.exec_module = exec_then_register
        return spec


def _register_or_warn() -> None:
    """``register()``, where a failure must not fail the user's import of DTensor."""
    try:
        register()
    except Exception as e:  # a PyTorch whose DTensor internals moved
        warnings.warn(
            f"quack_edu: the DTensor sharding rules of its ops could not be registered "
            f"({type(e).__name__}: {e}); rmsnorm on DTensor inputs will fail",
            RuntimeWarning,
            stacklevel=2,
        )


if _DTENSOR in sys.modules:
    register()
elif not any(isinstance(f, _RegisterAfterImport) for f in sys.meta_path):
    sys.meta_path.insert(0, _RegisterAfterImport())
