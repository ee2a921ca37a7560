"""Run under ``torchrun`` (2 CPU processes, gloo): the gradient of every parameter of a
float64 llama after one forward and backward of one packed batch, under context
parallelism (cp = 2, through the trainer's path: the plan, the mesh, the wrapped
attention, ``parallelize`` and ``forward_backward``), against one process. For each
backend and cp attention mode, rank 0 writes the largest relative difference over all
parameters (each gradient gathered whole from its FSDP shards).

Usage: ``torchrun --standalone --nproc-per-node 2 cp_gradients.py OUT.json``
"""

from __future__ import annotations

import json
import sys

import scenarios as S
import torch
import torch.distributed as dist

from forge_core.api import IGNORE_INDEX, LABELS
from forge_core.cli.exiting import exit_process
from forge_core.distributed.mesh import build_mesh
from forge_core.distributed.parallelize import parallelize, single_process
from forge_core.registry import load_registries
from forge_core.train.loss import build_loss, loss_fn

#: flex is left out: its compiled kernel takes no float64 on CPU (inductor refuses it);
#: its cp attention is compared in float64 through the unfused kernel in
#: cp_attention_worker.py, and its training in fp32 in test_parallel_equivalence.py.
CASES = [("sdpa", "allgather"), ("sdpa", "ulysses"), ("eager", "allgather"), ("eager", "ulysses")]


def gradients(pmodel) -> dict[str, torch.Tensor]:
    out = {}
    for part in pmodel.parts:
        for name, param in part.named_parameters():
            grad = param.grad
            out[name] = (grad.full_tensor() if hasattr(grad, "full_tensor") else grad).detach().clone()
    return out


def one_step(pmodel, batch) -> dict[str, torch.Tensor]:
    tokens = float((batch[LABELS] != IGNORE_INDEX).sum())
    pmodel.forward_backward(batch, None, tokens)
    pmodel.finish_gradients()
    return gradients(pmodel)


def drop_other_ranks_keys() -> None:
    """The negative control: the gathered keys and values of the other ranks zeroed (a
    cp attention that attends only to its own shard's keys)."""
    from forge_plugins.context_parallel.attention import ContextParallelAttention

    gather = ContextParallelAttention.gather_keys

    def own_keys_only(self, k, v, prepared):
        full_k, full_v = gather(self, k, v, prepared)
        mine = torch.zeros(full_k.shape[-2], dtype=torch.bool)
        mine[prepared.order[0, self.ctx.rank * k.shape[-2] : (self.ctx.rank + 1) * k.shape[-2]]] = True
        keep = mine[:, None].to(full_k.dtype)
        return full_k * keep, full_v * keep

    ContextParallelAttention.gather_keys = own_keys_only


def main() -> None:
    out_path = sys.argv[1]
    dist.init_process_group("gloo")
    registries = load_registries()
    batch = S.packed_batches()[0]
    results = {}
    for attention, mode in [*CASES, ("sdpa", "allgather_dropped")]:
        if mode == "allgather_dropped":
            drop_other_ranks_keys()
        parallel = S.cp_options(2, mode.removesuffix("_dropped"))
        ref_plan = S.make_plan(registries, {}, {}, attention=attention, packed=True)
        ref = single_process(S.build_model(ref_plan, registries).double(), loss_fn)
        want = one_step(ref, batch)
        plan = S.make_plan(registries, parallel, {}, world_size=2, attention=attention, packed=True)
        mesh = build_mesh(plan.degrees, torch.device("cpu"))
        model = S.build_model(plan, registries, mesh).double()
        pmodel = parallelize(model, plan, torch.device("cpu"), build_loss(model, plan.config), mesh=mesh)
        got = one_step(pmodel, batch)
        assert set(got) == set(want), sorted(set(got) ^ set(want))
        worst = max(float((got[k] - want[k]).norm() / want[k].norm()) for k in want)
        results[f"{attention}_{mode}"] = {"worst": worst, "parameters": len(want)}
    if dist.get_rank() == 0:
        with open(out_path, "w") as f:
            json.dump(results, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    exit_process(main())
