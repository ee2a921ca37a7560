"""The mixture-of-experts feed-forward of the ``llama`` model (``model.options.moe``).

An :class:`MoE` block replaces a block's dense SwiGLU: a :class:`Router` scores the
experts of every token and keeps ``top_k`` of them, :class:`RoutedExperts` computes each
kept (token, expert) assignment with that expert's SwiGLU, and the token's output is the
sum of its experts' outputs, each times its router weight, plus the shared experts'
dense SwiGLU when there are any. Routing is per token: it needs no mask and no document
ids (only the sequence-scope balancing statistics read them).

Names (stable: checkpoints, Hugging Face interop, the strategies):
``router.gate`` (``nn.Linear(dim, num_experts)``, weight ``[E, dim]``), ``router.expert_bias``
(persistent buffer ``[E]``), ``experts.w1``/``w3`` ``[E_local, dim, expert_hidden]`` and
``experts.w2`` ``[E_local, expert_hidden, dim]`` (a token multiplies as ``x @ w1[e]``),
``shared`` (a dense ``FeedForward``) when shared experts exist.

The seam expert parallelism replaces is ``experts.dispatcher``: called as
``dispatcher(experts, x (T, dim), indices (T, k), weights (T, k)) -> (T, dim)``, the weighted
sum over each token's experts. ``indices`` are global expert ids; an assignment dropped
by the capacity factor has index ``-1`` and weight 0 and must not be computed, so every
dispatcher sees the same kept assignments. :class:`LocalDispatch` (the default) sorts
the assignments by expert, calls ``experts.compute`` once and sums them back per token.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from forge_plugins.models.feed_forward import FeedForward
from forge_plugins.models.options import MoEOptions

#: dtypes torch._grouped_mm has kernels for on CPU (CUDA: bfloat16 only, on sm90+).
_GROUPED_CPU_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def routing_dtype(dtype: torch.dtype) -> torch.dtype:
    """Router probabilities are computed in fp32, never below the input (fp64 stays fp64)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


class Router(nn.Module):
    """Scores every expert of each token and keeps the ``top_k`` best.

    softmax: probabilities over all experts; sigmoid: an independent score per expert.
    The selection adds ``expert_bias`` (loss-free balancing) to the scores; the weights
    are the scores of the chosen experts without it (renormalised to sum 1 with
    ``normalize_weights``), times ``route_scale``."""

    def __init__(self, dim: int, options: MoEOptions) -> None:
        super().__init__()
        self.num_experts, self.top_k = options.num_experts, options.top_k
        self.kind, self.normalize = options.router, options.normalize_weights
        self.route_scale = options.route_scale
        self.gate = nn.Linear(dim, options.num_experts, bias=False)
        self.register_buffer("expert_bias", torch.zeros(options.num_experts), persistent=True)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(logits, scores, indices, weights)`` for tokens ``x (T, dim)``: logits and
        scores ``(T, E)`` in the routing dtype, the chosen experts ``(T, k)`` in
        descending order of biased score, and their weights ``(T, k)``."""
        logits = self.gate(x).to(routing_dtype(x.dtype))
        scores = logits.softmax(-1) if self.kind == "softmax" else logits.sigmoid()
        choice = scores.detach() + self.expert_bias.to(scores.dtype)
        indices = choice.topk(self.top_k, dim=-1).indices
        weights = scores.gather(-1, indices)
        if self.normalize:
            weights = weights / weights.sum(-1, keepdim=True)
        return logits, scores, indices, weights * self.route_scale


def grouped_mm_fits(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether ``torch._grouped_mm`` has a kernel for these operands: its dtypes, and
    rows whose strides are multiples of 16 bytes."""
    if x.device.type == "cuda":
        fits = x.dtype == torch.bfloat16
    else:
        fits = x.dtype in _GROUPED_CPU_DTYPES
    size = x.element_size()
    return fits and all((n * size) % 16 == 0 for n in (x.shape[-1], w.shape[-1]))


class _ContiguousGrad(torch.autograd.Function):
    """Identity whose backward makes the incoming gradient contiguous: the backward of
    ``torch._grouped_mm`` refuses expanded (stride-0) gradients, which a sum produces."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad.contiguous()


def grouped_matmul(x: torch.Tensor, w: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """``x (N, a)`` whose rows come in contiguous groups of ``counts`` times ``w (G, a, b)``:
    group ``g``'s rows by ``w[g]``, in one grouped GEMM (``torch._grouped_mm``), or where
    it has no kernel (float64, unaligned widths) one batched matmul over the groups padded
    to the largest."""
    if grouped_mm_fits(x, w):
        offsets = counts.cumsum(0).to(torch.int32)
        return _ContiguousGrad.apply(torch._grouped_mm(x, w, offs=offsets))
    groups = w.shape[0]
    longest = int(counts.max()) if counts.numel() else 0
    starts = counts.cumsum(0) - counts
    group = torch.repeat_interleave(torch.arange(groups, device=x.device), counts, output_size=x.shape[0])
    slot = torch.arange(x.shape[0], device=x.device) - starts[group]
    padded = x.new_zeros(groups, longest, x.shape[-1]).index_put((group, slot), x)
    return torch.bmm(padded, w)[group, slot]


class RoutedExperts(nn.Module):
    """The routed experts this process holds: ``local_experts`` SwiGLUs with global ids
    ``[first_expert, first_expert + local_experts)``, their weights stacked on dim 0."""

    def __init__(self, dim: int, options: MoEOptions) -> None:
        super().__init__()
        experts, hidden = options.num_experts, options.expert_hidden
        self.num_experts = experts
        self.first_expert = 0
        self.local_experts = experts
        self.kernel = options.kernel
        self.w1 = nn.Parameter(torch.empty(experts, dim, hidden))
        self.w3 = nn.Parameter(torch.empty(experts, dim, hidden))
        self.w2 = nn.Parameter(torch.empty(experts, hidden, dim))
        self.dispatcher: Any = LocalDispatch()

    def compute(self, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """The SwiGLU of each local expert over its contiguous group of rows of
        ``x (N, dim)``: ``counts[e]`` rows for local expert ``e``, in order. Under expert
        parallelism the weights are DTensors sharded over the ep ranks: their local
        tensors are this process's experts."""
        w1, w3, w2 = (w.to_local() if hasattr(w, "to_local") else w for w in (self.w1, self.w3, self.w2))
        if self.kernel == "loop":
            return torch.cat(
                [
                    (F.silu(rows @ w1[e]) * (rows @ w3[e])) @ w2[e]
                    for e, rows in enumerate(x.split(counts.tolist()))
                ]
                or [x.new_zeros(0, w2.shape[-1])]
            )
        hidden = F.silu(grouped_matmul(x, w1, counts)) * grouped_matmul(x, w3, counts)
        return grouped_matmul(hidden, w2, counts)

    def forward(self, x: torch.Tensor, indices: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        return self.dispatcher(self, x, indices, weights)


class LocalDispatch:
    """Every expert in this process: sort the kept assignments by expert (stable, so a
    token's assignments stay in token order), one ``compute``, then each assignment's
    output times its weight summed back onto its token."""

    def __call__(
        self, experts: RoutedExperts, x: torch.Tensor, indices: torch.Tensor, weights: torch.Tensor
    ) -> torch.Tensor:
        local = indices.reshape(-1) - experts.first_expert
        held = (local >= 0) & (local < experts.local_experts)
        # Dropped (-1) and not-held assignments sort after every held one.
        key = torch.where(held, local, experts.local_experts)
        order = key.argsort(stable=True)[: int(held.sum())]
        counts = torch.bincount(key[order], minlength=experts.local_experts)
        token = order // indices.shape[1]
        out = experts.compute(x[token], counts) * weights.reshape(-1)[order].unsqueeze(-1).to(x.dtype)
        return x.new_zeros(x.shape[0], out.shape[-1]).index_add(0, token, out)


class MoE(nn.Module):
    """Router, routed experts and optional shared experts of one block."""

    def __init__(self, dim: int, options: MoEOptions) -> None:
        super().__init__()
        self.options = options
        self.router = Router(dim, options)
        self.experts = RoutedExperts(dim, options)
        shared = options.shared_hidden or options.shared_experts * options.expert_hidden
        self.shared = FeedForward(dim, shared) if options.shared_experts else None

    @property
    def needs_doc_ids(self) -> bool:
        """Whether the block should be given the batch's ``doc_ids`` (sequence-scope
        balancing: its statistics are per document)."""
        return self.options.aux_loss > 0 and self.options.aux_loss_scope == "sequence"

    def forward(self, x: torch.Tensor, doc_ids: torch.Tensor | None = None) -> torch.Tensor:
        """``x (B, S, dim) -> (B, S, dim)``; ``doc_ids (B, S)`` only for the
        sequence-scope balancing statistics of packed rows."""
        batch, seq_len, dim = x.shape
        tokens = x.reshape(-1, dim)
        _, _, indices, weights = self.router(tokens)
        out = self.experts(tokens, indices, weights)
        if self.shared is not None:
            out = out + self.shared(tokens)
        return out.view(batch, seq_len, dim)
