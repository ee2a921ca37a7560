"""Run under ``torchrun`` (2 CPU processes, gloo): DPO training steps of a float64 llama
through the trainer's own step (:func:`~forge_core.train.step.optimizer_step`: the pairs
counted over every rank as the normalizer, the metric sums all-reduced) under ddp, fsdp
and fsdp with gradient accumulation, against one process on the same global batches.
The reference model is built as the trainer builds it (a frozen copy of the model before
any strategy). The rows hold one or two pairs each, so the ranks hold different numbers
of pairs. A control counts the second rank's pairs twice. Rank 0 writes each layout's
per-step loss, gradient norm and DPO metrics, and the largest relative difference of its
trained parameters from one process's.

Usage: ``torchrun --standalone --nproc-per-node 2 dpo_worker.py OUT.json``
"""

from __future__ import annotations

import json
import sys

import scenarios as S
import torch
import torch.distributed as dist
from pair_rows import pair_row, random_pairs, stack

from forge_core import components
from forge_core.cli.exiting import exit_process
from forge_core.distributed.mesh import build_mesh
from forge_core.distributed.parallelize import parallelize, single_process
from forge_core.registry import load_registries
from forge_core.train.loss import build_loss
from forge_core.train.reference import build_reference
from forge_core.train.step import optimizer_step

CPU = torch.device("cpu")
OBJECTIVE = {"objective": "dpo", "objective_options": {"beta": 0.5}}
LAYOUTS = {
    "ddp": ({"dp_replicate": 2}, {}),
    "fsdp": ({"dp_shard": 2}, {}),
    "fsdp_accum": ({"dp_shard": 2}, {"grad_accum": 2}),
    "ddp_miscounted": ({"dp_replicate": 2}, {}),  # the control
}


def global_batches() -> list[dict[str, torch.Tensor]]:
    """Two steps of 4 rows; rows of 2, 2, 1 and 2 pairs (4 on the first rank, 3 on the second)."""
    gen = torch.Generator().manual_seed(11)
    return [
        stack([pair_row(random_pairs(n, S.VOCAB, gen, longest=1), S.SEQ) for n in (2, 2, 1, 2)])
        for _ in range(2)
    ]


def train(pmodel, plan, slice_weight: float) -> list[dict[str, float]]:
    accum = plan.config.train.grad_accum
    optimizer = torch.optim.SGD([p for p in pmodel.parameters() if p.requires_grad], lr=S.LR)
    steps = []
    for batch in global_batches():
        local = {k: v.chunk(pmodel.dp_size)[pmodel.dp_rank] for k, v in batch.items()}
        rows = local["input_ids"].shape[0] // accum
        micro = [{k: v[i * rows : (i + 1) * rows] for k, v in local.items()} for i in range(accum)]
        outcome = optimizer_step(
            pmodel,
            [optimizer],
            micro,
            S.LR,
            precision_name="fp32",
            device=CPU,
            slice_weight=slice_weight,
            grad_clip=0.0,
            stop=False,
            count_pairs=lambda b: 0,
        )
        steps.append({"loss": outcome.loss, "norm": outcome.grad_norm, **outcome.metrics})
    return steps


def parameters(pmodel) -> dict[str, torch.Tensor]:
    """Every trained parameter, whole (gathered from its FSDP shards)."""
    out = {}
    for part in pmodel.parts:
        for name, param in part.named_parameters():
            full = param.full_tensor() if hasattr(param, "full_tensor") else param
            out[name.removeprefix("module.")] = full.detach().clone()
    return out


def worst(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> float:
    """The largest relative difference of a parameter of ``got`` from ``want``'s."""
    assert set(got) == set(want), sorted(set(got) ^ set(want))
    return max(float((got[k] - want[k]).norm() / want[k].norm()) for k in want)


def build(plan, registries, mesh=None):
    model = S.build_model(plan, registries, mesh).double()
    token_loss = build_loss(model, plan.config)
    objective = components.objective(plan, registries, token_loss)
    reference = build_reference(model, CPU)
    return model, token_loss, objective, reference


def main() -> None:
    out_path = sys.argv[1]
    dist.init_process_group("gloo")
    registries = load_registries()
    results = {}
    ref_plan = S.make_plan(registries, {}, OBJECTIVE, packed=True)
    model, token_loss, objective, reference = build(ref_plan, registries)
    one = single_process(model, token_loss)
    one.objective, one.reference = objective, reference
    # Both processes run the single-process reference on the whole batch: each counts half.
    results["one_process"] = train(one, ref_plan, 1 / dist.get_world_size())
    want = parameters(one)
    for name, (parallel, train_options) in LAYOUTS.items():
        plan = S.make_plan(registries, parallel, {**OBJECTIVE, **train_options}, world_size=2, packed=True)
        mesh = build_mesh(plan.degrees, CPU)
        model, token_loss, objective, reference = build(plan, registries, mesh)
        if name == "ddp_miscounted" and dist.get_rank() == 1:
            count = objective.count
            objective.count = lambda batch: 2 * count(batch)
        pmodel = parallelize(
            model, plan, CPU, token_loss, mesh=mesh, objective=objective, reference=reference
        )
        steps = train(pmodel, plan, pmodel.dp_size / dist.get_world_size())
        results[name] = {"steps": steps, "parameters": worst(parameters(pmodel), want)}
    if dist.get_rank() == 0:
        with open(out_path, "w") as f:
            json.dump(results, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    exit_process(main())
