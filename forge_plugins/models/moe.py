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

import math
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
        self.top_k = options.top_k
        self.first_expert = 0
        self.local_experts = experts
        self.kernel = options.kernel
        #: What every token's routed weights sum to when none is dropped (normalised
        #: weights: route_scale), or None when it varies; the conformance kit checks it.
        self.weight_sum: float | None = options.route_scale if options.normalize_weights else None
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

    def active_fraction(self) -> float:
        """The share of these parameters one token is computed with: ``top_k`` of the
        ``num_experts`` experts (the FLOPs behind MFU, :mod:`forge_core.train.flops`)."""
        return self.top_k / self.num_experts

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


def capacity_keep(
    indices: torch.Tensor, weights: torch.Tensor, factor: float, num_experts: int
) -> torch.Tensor:
    """Which assignments ``(B, S, k)`` a capacity factor keeps: in each row, each expert
    takes at most ``ceil(factor * S * k / num_experts)`` of the row's assignments, in the
    order of router weight (descending), then position, then slot (ascending), by stable
    sorts. A row's result depends on that row alone, so it is the same whichever batch
    or process the row is in."""
    batch, seq_len, k = indices.shape
    capacity = math.ceil(factor * seq_len * k / num_experts)
    experts = indices.reshape(batch, seq_len * k)
    by_weight = weights.detach().reshape(batch, -1).argsort(dim=-1, descending=True, stable=True)
    order = by_weight.gather(-1, experts.gather(-1, by_weight).argsort(dim=-1, stable=True))
    sorted_experts = experts.gather(-1, order)
    counts = torch.zeros(batch, num_experts, dtype=torch.long, device=indices.device)
    counts.scatter_add_(-1, experts, torch.ones_like(experts))
    starts = counts.cumsum(-1) - counts
    rank = torch.arange(seq_len * k, device=indices.device) - starts.gather(-1, sorted_experts)
    keep = torch.zeros_like(experts, dtype=torch.bool).scatter(-1, order, rank < capacity)
    return keep.view(batch, seq_len, k)


class _AddGradient(torch.autograd.Function):
    """Returns ``out`` unchanged; in backward adds the gradient of ``penalty`` (a scalar)
    to the graph, as if ``penalty`` had been added to the loss: the balancing losses
    train the router without changing the model's output or its loss value."""

    @staticmethod
    def forward(ctx: Any, out: torch.Tensor, penalty: torch.Tensor) -> torch.Tensor:
        ctx.penalty = (penalty.dtype, penalty.device)
        return out.view_as(out)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        dtype, device = ctx.penalty
        return grad, torch.ones((), dtype=dtype, device=device)


def _in_backward() -> bool:
    """Whether this forward runs inside a backward pass (activation checkpointing's
    recomputation), which must not count its statistics twice."""
    return torch._C._current_graph_task_id() != -1


def _group_size(group: Any) -> int:
    return 1 if group is None else torch.distributed.get_world_size(group)


STAT_KEYS = ("aux_loss", "z_loss", "dropped", "assignments", "forwards", "steps")


class MoE(nn.Module):
    """Router, routed experts and optional shared experts of one block.

    **Balancing penalties** (each optional). They are added to the gradient by
    :class:`_AddGradient`: the logits and the loss are those of the model alone. Each is
    an average over the tokens of one optimizer step, as the language-model loss is, so
    that it is the same on 1 and N processes: this process adds its tokens' sum divided
    by the step's tokens over every process (``step_tokens``, given by the trainer,
    :meth:`set_token_group`; ``None``: this forward's tokens), and the data-parallel
    gradient sum adds the rest. With ``p_t`` a token's router probabilities (softmax: the
    probabilities; sigmoid: the scores normalised to sum 1) and ``f_e`` the fraction of
    a set of assignments (before any capacity drop) routed to expert ``e``:

    - balancing, scope ``batch``: ``E * sum_e f_e * p_te`` per token, ``f`` over the
      forward's tokens on every process that reads different tokens (the counts are
      summed over :attr:`token_group`): one forward of the micro-batch (a pipeline
      micro-batch under pipeline parallelism) across the data-parallel processes;
    - balancing, scope ``sequence``: the same with ``f`` over the token's document (each
      (row, doc id) pair of the ``doc_ids`` the block is given; a row without them is
      one document). A document's part depends on its tokens alone: a packed row gives
      what its documents give run alone, each weighted by its share of the tokens;
    - router z-loss: ``logsumexp(logits_t)^2`` per token.

    **Loss-free balancing** (``bias_update_rate``): :meth:`after_optimizer_step` moves
    ``router.expert_bias`` by ``rate * sign(mean load - load)``, the load being the
    assignments each expert was routed over the step's forwards, summed over
    :attr:`token_group`, so it is identical on every process.

    Only training forwards count (``self.training``); evaluation and sampling neither
    add penalties nor statistics.
    """

    def __init__(self, dim: int, options: MoEOptions) -> None:
        super().__init__()
        self.options = options
        self.router = Router(dim, options)
        self.experts = RoutedExperts(dim, options)
        shared = options.shared_hidden or options.shared_experts * options.expert_hidden
        self.shared = FeedForward(dim, shared) if options.shared_experts else None
        #: The processes that compute different tokens (data and context parallel), or
        #: ``None`` (this process alone); the tokens of one optimizer step over all of
        #: them, or ``None`` (each forward is a step): see :meth:`set_token_group`.
        self.token_group: Any = None
        self.step_tokens: int | None = None
        self._stats: dict[str, torch.Tensor] = {}
        # On the CPU even when the model is built on the meta device (init_from_hf).
        self._routed = torch.zeros(options.num_experts, device="cpu")

    def set_token_group(self, group: Any, step_tokens: int) -> None:
        """Called by the trainer once the strategies are applied: the process group of
        the processes that compute different tokens (``None`` in one process), and the
        tokens of one optimizer step over all of them (``train.batch_size *
        data.seq_len``)."""
        self.token_group, self.step_tokens = group, step_tokens

    @property
    def needs_doc_ids(self) -> bool:
        """Whether the block should be given the batch's ``doc_ids`` (sequence-scope
        balancing: its statistics are per document)."""
        return self.options.aux_loss > 0 and self.options.aux_loss_scope == "sequence"

    def forward(self, x: torch.Tensor, doc_ids: torch.Tensor | None = None) -> torch.Tensor:
        """``x (B, S, dim) -> (B, S, dim)``; ``doc_ids (B, S)`` only for the
        sequence-scope balancing statistics of packed rows."""
        options = self.options
        batch, seq_len, dim = x.shape
        tokens = x.reshape(-1, dim)
        logits, scores, indices, weights = self.router(tokens)
        routed = indices
        # Training only: evaluation and sampling are dropless (decoding one token at a
        # time would otherwise see a capacity of its own).
        if options.capacity_factor > 0 and self.training:
            keep = capacity_keep(
                indices.view(batch, seq_len, -1),
                weights.view(batch, seq_len, -1),
                options.capacity_factor,
                options.num_experts,
            ).view_as(indices)
            indices = torch.where(keep, indices, -1)
            weights = torch.where(keep, weights, 0.0)
        if x.device.type == "meta":
            # Shapes only (a meta-device copy measured by the trainer): how many rows each
            # expert computes depends on the values of the routing.
            out = torch.empty_like(tokens)
        else:
            out = self.experts(tokens, indices, weights)
        if self.shared is not None:
            out = out + self.shared(tokens)
        if self.training and x.device.type != "meta":
            out = self._balance(out, logits, scores, routed, indices, doc_ids, batch)
        return out.view(batch, seq_len, dim)

    def _balance(
        self,
        out: torch.Tensor,
        logits: torch.Tensor,
        scores: torch.Tensor,
        routed: torch.Tensor,
        kept: torch.Tensor,
        doc_ids: torch.Tensor | None,
        batch: int,
    ) -> torch.Tensor:
        """The penalties' gradients attached to ``out``; the step's statistics counted."""
        options, experts = self.options, self.options.num_experts
        tokens = routed.shape[0]
        routed_counts = torch.bincount(routed.reshape(-1), minlength=experts).to(scores.dtype)
        step_tokens = self.step_tokens or tokens
        aux = z = scores.new_zeros(())
        if options.aux_loss > 0:
            probs = scores if options.router == "softmax" else scores / scores.sum(-1, keepdim=True)
            if options.aux_loss_scope == "sequence":
                aux = self._sequence_aux(
                    probs, routed, self._documents(doc_ids, batch, tokens, scores.device)
                )
            else:
                counts = routed_counts.clone()
                if self.token_group is not None:
                    torch.distributed.all_reduce(counts, group=self.token_group)
                aux = experts * ((counts / counts.sum()) * probs.sum(0)).sum()
            aux = aux / step_tokens
        if options.z_loss > 0:
            z = logits.logsumexp(-1).pow(2).sum() / step_tokens
        penalty = options.aux_loss * aux + options.z_loss * z
        if penalty.requires_grad:
            out = _AddGradient.apply(out, penalty)
        if not _in_backward():
            self._count(routed_counts, kept, aux, z)
        return out

    @staticmethod
    def _documents(
        doc_ids: torch.Tensor | None, batch: int, tokens: int, device: torch.device
    ) -> torch.Tensor:
        """The document of each token, numbered from 0 over the forward: each (row, doc
        id) pair; without doc ids each row."""
        rows = torch.arange(batch, device=device).repeat_interleave(tokens // batch)
        if doc_ids is None:
            return rows
        docs = doc_ids.reshape(-1).long().to(device)
        return (rows * (int(docs.max()) + 1) + docs).unique(return_inverse=True)[1]

    def _sequence_aux(
        self, probs: torch.Tensor, routed: torch.Tensor, documents: torch.Tensor
    ) -> torch.Tensor:
        """``sum_t E * sum_e f_(doc t),e * p_te``: each document's tokens times its
        ``E * sum_e f_de * P_de``."""
        experts, k = self.options.num_experts, routed.shape[1]
        count = int(documents.max()) + 1
        assigned = probs.new_zeros(count, experts).index_put_(
            (documents.repeat_interleave(k), routed.reshape(-1)), probs.new_ones(()), accumulate=True
        )
        fraction = assigned / assigned.sum(-1, keepdim=True)
        return experts * (fraction[documents] * probs).sum()

    def _count(self, routed: torch.Tensor, kept: torch.Tensor, aux: torch.Tensor, z: torch.Tensor) -> None:
        received = torch.bincount(kept[kept >= 0], minlength=self.options.num_experts).float()
        values = {
            "tokens_per_expert": received.cpu(),
            "aux_loss": aux.detach().float().cpu(),
            "z_loss": z.detach().float().cpu(),
            "dropped": (kept < 0).sum().float().cpu(),
            "assignments": torch.tensor(float(kept.numel())),
            "forwards": torch.tensor(1.0 / _group_size(self.token_group)),
        }
        for key, value in values.items():
            self._stats[key] = self._stats[key] + value if key in self._stats else value
        self._routed = self._routed + routed.detach().float().cpu()

    def step_stats(self) -> dict[str, torch.Tensor]:
        """Sums over the training forwards since the last call (then reset), of this
        process: ``tokens_per_expert`` ``(E,)`` (the assignments each expert computed),
        ``aux_loss`` and ``z_loss`` (unscaled, this process's shares of each step's
        penalties, see the class docstring), ``dropped`` and ``assignments`` (dropped by
        the capacity factor, and all), ``forwards`` and ``steps`` (each forward and
        optimizer step counted ``1 / processes of token_group``). Summed over the
        processes that compute different tokens (:attr:`token_group`), every value is the
        global batch's, ``forwards`` and ``steps`` counted once; :func:`summarize_stats`
        turns such totals into metrics."""
        stats, self._stats = self._stats, {}
        zero = torch.zeros(())
        return {
            "tokens_per_expert": torch.zeros(self.options.num_experts),
            **dict.fromkeys(STAT_KEYS, zero),
            **stats,
        }

    @torch.no_grad()
    def after_optimizer_step(self) -> None:
        """Called by the trainer after every optimizer step that stepped: the loss-free
        bias update from the load the step's forwards routed (identical on every
        process: the load is summed over :attr:`token_group`)."""
        load, self._routed = self._routed, torch.zeros(self.options.num_experts)
        step = torch.tensor(1.0 / _group_size(self.token_group))
        self._stats["steps"] = self._stats["steps"] + step if "steps" in self._stats else step
        rate = self.options.bias_update_rate
        if rate <= 0:
            return
        bias = self.router.expert_bias
        load = load.to(bias.device, torch.float32)
        if self.token_group is not None:
            torch.distributed.all_reduce(load, group=self.token_group)
        bias += (rate * torch.sign(load.mean() - load)).to(bias.dtype)


def summarize_stats(totals: dict[str, torch.Tensor]) -> dict[str, float]:
    """Metrics of summed :meth:`MoE.step_stats`: ``load_min``/``load_max`` (the least and
    most loaded expert's assignments over the mean: 1 is balanced), ``load_cv`` (their
    coefficient of variation, population std over mean), ``aux_loss`` and ``z_loss``
    (per optimizer step, unscaled; the sum when no step has completed), ``dropped_frac``
    (dropped over all assignments)."""
    load = totals["tokens_per_expert"].double()
    mean = float(load.mean())
    steps = max(float(totals["steps"]), 1.0)
    return {
        "load_min": float(load.min()) / mean if mean else 0.0,
        "load_max": float(load.max()) / mean if mean else 0.0,
        "load_cv": float(load.std(correction=0)) / mean if mean else 0.0,
        "aux_loss": float(totals["aux_loss"]) / steps,
        "z_loss": float(totals["z_loss"]) / steps,
        "dropped_frac": float(totals["dropped"]) / max(float(totals["assignments"]), 1.0),
    }
