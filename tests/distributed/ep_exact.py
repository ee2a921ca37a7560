"""Run under ``torchrun`` (2 CPU processes, gloo): expert parallelism proved in one
launch, against one process.

1. The collectives and the dispatcher alone, in float64:
   - ``all_to_all``: uneven splits (one rank sends nothing to a peer); the output rows
     and, through a weighted sum, the gradient of every sent row.
   - ``AllToAllDispatch``: toy routed experts (the seam of the model's
     ``RoutedExperts``: ``num_experts``, ``first_expert``, ``local_experts``,
     ``compute``) split over the two ranks; each rank routes its own tokens; outputs and
     the gradients of tokens, router weights and every expert's weights equal one
     process routing both ranks' tokens through all the experts. Some assignments are
     dropped (expert id -1) and one expert receives no token.
   - the negative control: a dispatcher that sends every token to the other rank's
     expert of the same local index must be caught.
2. The MoE llama in float64 under ``parallel.ep: 2`` through the trainer's path (plan,
   mesh, ``parallelize``, ``forward_backward``), each rank on its half of one packed
   batch: the gradient of every parameter (gathered whole) against one process on the
   whole batch, for both expert kernels.
3. The 2-process scenarios named on the command line (:func:`scenarios.run`).

Usage: ``torchrun --standalone --nproc-per-node 2 ep_exact.py OUT.json [SCENARIO ...]``
"""

from __future__ import annotations

import json
import sys

import scenarios as S
import torch
import torch.distributed as dist
from cp_gradients import gradients
from torch.distributed.device_mesh import init_device_mesh

from forge_core.api import IGNORE_INDEX, LABELS
from forge_core.cli.exiting import exit_process
from forge_core.distributed.mesh import build_mesh
from forge_core.distributed.parallelize import parallelize, single_process
from forge_core.train.loss import build_loss, loss_fn
from forge_plugins.expert_parallel.collectives import all_to_all
from forge_plugins.expert_parallel.dispatch import AllToAllDispatch
from forge_plugins.expert_parallel.slicing import slice_experts

E, K, DIM, HIDDEN, TOKENS = 4, 2, 6, 5, 7


class ToyExperts(torch.nn.Module):
    """Stacked SwiGLU experts with the model's seam; ``dispatcher`` None: every expert
    local, combined by the reference below."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.num_experts, self.first_expert, self.local_experts = E, 0, E
        self.w1 = torch.nn.Parameter(torch.randn(E, DIM, HIDDEN, generator=g, dtype=torch.float64))
        self.w3 = torch.nn.Parameter(torch.randn(E, DIM, HIDDEN, generator=g, dtype=torch.float64))
        self.w2 = torch.nn.Parameter(torch.randn(E, HIDDEN, DIM, generator=g, dtype=torch.float64))
        self.dispatcher = None

    def compute(self, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        w1, w2, w3 = (w.to_local() if hasattr(w, "to_local") else w for w in (self.w1, self.w2, self.w3))
        groups = x.split(counts.tolist())
        outs = [
            (torch.nn.functional.silu(g @ w1[e]) * (g @ w3[e])) @ w2[e] if len(g) else g
            for e, g in enumerate(groups)
        ]
        return torch.cat(outs) if outs else x

    def reference(self, x, indices, weights):
        """Every assignment through its expert, one by one."""
        out = torch.zeros_like(x)
        for t in range(x.shape[0]):
            for j in range(K):
                e = int(indices[t, j])
                if e >= 0:
                    one = self.compute(x[t : t + 1], torch.tensor([1 if i == e else 0 for i in range(E)]))
                    out[t] += weights[t, j] * one[0]
        return out


class WrongRank(AllToAllDispatch):
    """The negative control: every token goes to the other rank's expert with its local index."""

    def expert_key(self, experts, num_experts, local):
        return (experts + local) % num_experts


def routing(seed: int):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(TOKENS, DIM, generator=g, dtype=torch.float64)
    # Experts 0..2 only (expert 3 gets nothing); some assignments dropped.
    indices = torch.stack([torch.randperm(3, generator=g)[:K] for _ in range(TOKENS)])
    indices[1, 1] = -1
    indices[4, 0] = -1
    weights = torch.rand(TOKENS, K, generator=g, dtype=torch.float64)
    return x, indices, weights


def rel(a, b) -> float:
    return float((a - b).norm() / b.norm())


def check_all_to_all(rank: int) -> dict[str, float]:
    # Rank 0 sends 3 rows to itself and 0 to rank 1; rank 1 sends 1 to rank 0, 2 to itself.
    send = [[3, 0], [1, 2]][rank]
    recv = [[3, 1], [0, 2]][rank]
    x = (torch.arange(sum(send) * 2, dtype=torch.float64).view(-1, 2) + 100 * rank).requires_grad_()
    y = all_to_all(x, send, recv, None)
    scale = torch.arange(1, y.shape[0] + 1, dtype=torch.float64)[:, None] * (rank + 1)
    (y * scale).sum().backward()
    want = [
        torch.tensor([[0, 1], [2, 3], [4, 5], [100, 101]], dtype=torch.float64),
        torch.tensor([[102, 103], [104, 105]], dtype=torch.float64),
    ][rank]
    # The gradient of each sent row is the scale the receiving rank gave it.
    grad = [torch.tensor([1.0, 2, 3]), torch.tensor([4.0, 2, 4])][rank][:, None].expand(-1, 2)
    return {"values": float((y.detach() - want).abs().max()), "grads": float((x.grad - grad).abs().max())}


def check_dispatch(mesh, rank: int, dispatcher_class) -> dict[str, float]:
    mine = routing(10 + rank)
    both = [routing(10 + r) for r in range(2)]
    ref = ToyExperts()
    xs = [t[0].clone().requires_grad_() for t in both]
    ws = [t[2].clone().requires_grad_() for t in both]
    want = [ref.reference(xs[r], both[r][1], ws[r]) for r in range(2)]
    (sum((w * (r + 1)).sum() for r, w in enumerate(want)) + sum(w.square().sum() for w in want)).backward()

    ep = ToyExperts()
    slice_experts(ep, mesh, dispatcher_class(mesh.get_group(), mesh.size()))
    x, indices, weights = mine[0].clone().requires_grad_(), mine[1], mine[2].clone().requires_grad_()
    got = ep.dispatcher(ep, x, indices, weights)
    ((got * (rank + 1)).sum() + got.square().sum()).backward()
    first, local = ep.first_expert, ep.local_experts
    out = {
        "output": rel(got.detach(), want[rank].detach()),
        "x": rel(x.grad, xs[rank].grad),
        "weights": rel(weights.grad, ws[rank].grad),
    }
    for name in ("w1", "w2", "w3"):
        out[name] = rel(getattr(ep, name).grad.full_tensor(), getattr(ref, name).grad)
    # 0 when this rank holds its own contiguous block, experts [rank * 2, rank * 2 + 2).
    out["block"] = float((first, local, ep.w1.to_local().shape[0]) != (rank * 2, 2, 2))
    return out


def one_step(pmodel, batch) -> dict[str, torch.Tensor]:
    tokens = float((batch[LABELS] != IGNORE_INDEX).sum())
    local = {k: v.chunk(pmodel.dp_size)[pmodel.dp_rank] for k, v in batch.items()}
    pmodel.forward_backward(local, None, tokens)
    pmodel.finish_gradients()
    return gradients(pmodel)


def check_model_gradients(kernel: str) -> dict[str, float]:
    registries = S.load_registries(extra=(("variants", S.variants),))
    batch = S.packed_batches()[0]
    moe = {"moe": {**S.MOE, "kernel": kernel}}
    S.VARIANTS[f"ep_moe_{kernel}"] = ("llama", moe)
    ref_plan = S.make_plan(registries, {}, {}, f"ep_moe_{kernel}", packed=True)
    ref = single_process(S.build_model(ref_plan, registries).double(), loss_fn)
    want = one_step(ref, batch)
    plan = S.make_plan(registries, {"ep": 2}, {}, f"ep_moe_{kernel}", world_size=2, packed=True)
    mesh = build_mesh(plan.degrees, torch.device("cpu"))
    model = S.build_model(plan, registries, mesh).double()
    pmodel = parallelize(model, plan, torch.device("cpu"), build_loss(model, plan.config), mesh=mesh)
    got = one_step(pmodel, batch)
    assert set(got) == set(want), sorted(set(got) ^ set(want))
    worst = max(float((got[k] - want[k]).norm() / want[k].norm()) for k in want)
    experts = sum(1 for k in want if ".experts." in k)
    return {"worst": worst, "parameters": len(want), "expert_parameters": experts}


def main() -> None:
    out_path, names = sys.argv[1], sys.argv[2:]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("ep",))
    results = {
        "all_to_all": check_all_to_all(rank),
        "dispatch": check_dispatch(mesh, rank, AllToAllDispatch),
        "wrong_rank": check_dispatch(mesh, rank, WrongRank),
    }
    gathered = [None, None]
    dist.all_gather_object(gathered, results)
    worst = {case: {key: max(g[case][key] for g in gathered) for key in results[case]} for case in results}
    for kernel in ("grouped", "loop"):
        worst[f"gradients_{kernel}"] = check_model_gradients(kernel)
    worst["scenarios"] = S.run(names, dist.get_world_size())
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(worst, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    exit_process(main())
