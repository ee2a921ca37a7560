"""Token dispatch and combine across an expert-parallel group: the all-to-all
counterpart of the model's local dispatcher (``LocalDispatch``), with the same
signature, ``dispatcher(experts, x, indices, weights) -> (T, dim)``.

Each rank holds experts ``[rank * local, (rank + 1) * local)`` of every MoE layer. A
forward:

1. sorts this rank's ``(token, expert)`` assignments by global expert id (stable), so
   they are grouped by the rank that holds the expert, then by expert;
2. tells every rank how many rows it receives per local expert (an all-to-all of the
   counts) and sends the rows (an all-to-all with uneven splits);
3. regroups what arrived (by source rank, then expert) by local expert, runs
   ``experts.compute`` over the groups, puts the rows back in arrival order;
4. sends them back (the inverse exchange) and sums each token's outputs weighted by its
   router weights.

Every rank of the group must call it once per MoE layer forward, in the same order
(the model's layers are the same on every rank, so they do). Tokens the capacity factor
drops were excluded by the model before the call; an assignment whose expert id is
negative is skipped, one with weight 0 contributes nothing.
"""

from __future__ import annotations

from typing import Any

import torch

from forge_plugins.expert_parallel.collectives import all_to_all, exchange_counts


class AllToAllDispatch:
    """The dispatcher ``parallel.ep`` installs on every routed-experts module: ``group``
    is the ep process group, ``size`` its size."""

    def __init__(self, group: Any, size: int) -> None:
        self.group, self.size = group, size

    def expert_key(self, experts: torch.Tensor, num_experts: int, local: int) -> torch.Tensor:
        """The global expert each assignment is sent to (its rank is ``key // local``).
        The identity; a subclass that changes it sends tokens to the wrong rank (the
        tests' negative control)."""
        return experts

    # Eager even inside a compiled block: the splits are read on the host between the
    # exchanges, and the experts' weights are DTensors whose local tensors it multiplies.
    @torch.compiler.disable
    def __call__(
        self, experts: Any, x: torch.Tensor, indices: torch.Tensor, weights: torch.Tensor
    ) -> torch.Tensor:
        tokens, k = indices.shape
        num, local = experts.num_experts, experts.local_experts
        flat = indices.reshape(-1)
        kept = (flat >= 0).nonzero().squeeze(1)  # dropped assignments are -1
        key = self.expert_key(flat[kept], num, local)
        order = torch.argsort(key, stable=True)
        assignment = kept[order]  # (token, slot) assignments grouped by expert
        token = assignment // k
        send = torch.bincount(key, minlength=num).view(self.size, local)
        recv = exchange_counts(send, self.group)  # row i: what rank i sends to my experts
        send_splits, recv_splits = send.sum(1).tolist(), recv.sum(1).tolist()
        arrived = all_to_all(x[token], send_splits, recv_splits, self.group)
        # Arrived rows are grouped by source rank, then by local expert: regroup by expert.
        block_expert = torch.arange(local, device=x.device).repeat(self.size)
        by_expert = torch.argsort(block_expert.repeat_interleave(recv.reshape(-1)), stable=True)
        computed = experts.compute(arrived[by_expert], recv.sum(0))
        back = torch.empty_like(by_expert)
        back[by_expert] = torch.arange(by_expert.numel(), device=x.device)
        returned = all_to_all(computed[back], recv_splits, send_splits, self.group)
        weight = weights.reshape(-1)[assignment].to(returned.dtype)
        out = x.new_zeros(tokens, returned.shape[-1])
        return out.index_add(0, token, returned * weight[:, None])
