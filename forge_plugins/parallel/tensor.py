"""``tp``: tensor parallelism with DTensor ``parallelize_module`` over the ``tp`` mesh,
applying the plan the model supplies (``ParallelContract.tensor_parallel``).

For the part it is given (the whole model, or a pipeline stage), the strategy:

1. notes which parameters are tied (one ``Parameter`` under several names);
2. applies the plan's root styles (skipping modules this part does not hold or holds as
   ``None``: a pipeline stage) and the block styles to every block (each the paths it
   holds: a mixture-of-experts block has no dense MLP);
3. re-ties tied parameters whose new placements agree (a tied embedding and output
   head are both sharded along the vocabulary), and refuses those whose do not: two
   separate copies would each get part of the gradient;
4. checks coverage: every parameter is now a DTensor, or matched by the plan's
   ``replicated`` or ``partial`` paths; anything else would be a plain per-rank copy
   whose gradient nobody reduces, so the build stops naming it;
5. registers a gradient finisher that SUMS the gradients of ``partial`` parameters over
   the tensor-parallel group (one all-reduce of one buffer per dtype), after the last
   backward of each step and before clipping;
6. hands the part's output on as a tensor of its own, not a view: a style with
   ``use_local_output=True`` (the output head's, which gathers the logits) returns
   ``DTensor.to_local()``, which is a view, and under FSDP that is the root module's
   output, on which FSDP warns that an in-place op would drop its pre-backward hook.
   :class:`_OwnTensor` gives the same storage, no copy, the same gradient.

The model builds identical weights on every rank (same seed); distributing a module
keeps each rank's slice of its local copy.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import parallelize_module

from forge_core.api import ForgeError, blocks_of, contract_of
from forge_core.api.unstable import tensor_parallel_coverage, tied_parameter_names


def _present(module: torch.nn.Module, path: str) -> bool:
    for name in path.split("."):
        module = getattr(module, name, None)
        if module is None:
            return False
    return True


def _owner(model: torch.nn.Module, name: str) -> tuple[torch.nn.Module, str]:
    prefix, _, leaf = name.rpartition(".")
    return (model.get_submodule(prefix) if prefix else model), leaf


def _placement(param: torch.Tensor) -> str:
    if isinstance(param, DTensor):
        return (
            f"{tuple(param.placements)} on mesh {param.device_mesh.mesh_dim_names} "
            f"of global shape {tuple(param.shape)}"
        )
    return f"a plain tensor of shape {tuple(param.shape)}"


def retie(model: torch.nn.Module, groups: list[list[str]], model_name: str) -> None:
    """Make every name of each group refer to one parameter again, when the placements
    the plan gave them agree; otherwise a ForgeError naming them."""
    for group in groups:
        params = [model.get_parameter(name) for name in group]
        if all(p is params[0] for p in params):
            continue
        placements = [_placement(p) for p in params]
        if len(set(placements)) > 1:
            shown = "; ".join(f"{name}: {where}" for name, where in zip(group, placements))
            raise ForgeError(
                f"tensor parallelism cannot keep the tied parameters of model {model_name!r} tied: "
                f"its plan places them differently ({shown}). Two separate copies would each get "
                "part of the gradient and drift apart. Fix: give the tied modules styles that shard "
                "the shared matrix the same way, or untie them (an option of the model)."
            )
        for name in group[1:]:
            owner, leaf = _owner(model, name)
            setattr(owner, leaf, params[0])


class PartialGradientSum:
    """SUM the gradients of ``partial`` parameters over the tensor-parallel group: each
    rank's gradient covers only its shard's use of the parameter (its heads).

    Holds (module, attribute) pairs, not the parameters: a later strategy (FSDP)
    replaces parameter objects. A gradient that FSDP has sharded over the data-parallel
    ranks is summed shard by shard: tensor-parallel peers hold the same shard."""

    def __init__(self, holders: list[tuple[torch.nn.Module, str]], group: Any) -> None:
        self.holders, self.group = holders, group

    def __call__(self) -> None:
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for module, leaf in self.holders:
            grad = getattr(module, leaf).grad
            if grad is not None:
                local = grad.to_local() if isinstance(grad, DTensor) else grad
                by_dtype.setdefault(local.dtype, []).append(local)
        for grads in by_dtype.values():
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat, group=self.group)
            offset = 0
            for g in grads:
                g.copy_(flat[offset : offset + g.numel()].view_as(g))
                offset += g.numel()


class _OwnTensor(torch.autograd.Function):
    """``view.detach()`` with the view's gradient: the same storage, no longer a view."""

    @staticmethod
    def forward(ctx, view: torch.Tensor) -> torch.Tensor:
        return view.detach()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return grad


def own_output(module: torch.nn.Module, args: Any, output: Any) -> Any:
    """Forward hook: the part's output as a tensor of its own when it is a view."""
    if isinstance(output, torch.Tensor) and not isinstance(output, DTensor) and output._base is not None:
        return _OwnTensor.apply(output)
    return output


class TensorParallel:
    def __init__(self, options: Any) -> None:
        self.options = options

    def apply(self, model: torch.nn.Module, ctx: Any) -> torch.nn.Module:
        model_name = ctx.model_name
        contract = contract_of(model)
        if contract is None or contract.tensor_parallel is None:
            raise ForgeError(
                f"model {model_name!r} supplies no tensor-parallel plan "
                "(parallel_contract().tensor_parallel), so tensor parallelism cannot shard it. "
                "Set parallel.tp: 1, or use a model whose spec "
                "declares TENSOR_PARALLEL in supports."
            )
        mesh = ctx.mesh["tp"]
        plan = contract.tensor_parallel(sequence_parallel=self.options.sequence_parallel)
        tied = tied_parameter_names(model)
        root = {path: style for path, style in plan.root.styles.items() if _present(model, path)}
        if root:
            parallelize_module(model, mesh, root)
        blocks = blocks_of(model)
        for block in blocks:
            # A block holds the plan's paths it has (an MoE block has no dense MLP).
            styles = {path: style for path, style in plan.block.styles.items() if _present(block, path)}
            parallelize_module(block, mesh, styles)
        retie(model, tied, model_name)
        uncovered, partial = tensor_parallel_coverage(
            model, blocks, plan, lambda _, p: isinstance(p, DTensor)
        )
        if uncovered:
            shown = ", ".join(uncovered[:12]) + (
                f" and {len(uncovered) - 12} more" if len(uncovered) > 12 else ""
            )
            raise ForgeError(
                f"tensor parallelism cannot place {len(uncovered)} parameter(s) of model {model_name!r}: "
                f"{shown}. Its tensor-parallel plan neither shards them nor declares them replicated or "
                "partial, so every rank would train its own copy and their gradients would never be "
                "reduced. Fix (model authors): add each to the plan's TensorParallelScope, in "
                "`replicated` when it is computed on replicated activations (the same gradient on "
                "every rank) or in `partial` when it is applied to each rank's shard (its gradients "
                "are then summed over the tensor-parallel ranks); or set parallel.tp: 1."
            )
        if partial:
            ctx.add_gradient_finisher(
                PartialGradientSum([_owner(model, n) for n in partial], mesh.get_group())
            )
        # Before FSDP (a later strategy) registers its own hooks, so they see this output.
        model.register_forward_hook(own_output)
        return model
