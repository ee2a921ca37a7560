"""The ``llama`` model: a Llama-style decoder-only transformer.

Token embedding -> ``n_layers`` blocks (RMSNorm, grouped-query attention with rotary
embeddings, RMSNorm, SwiGLU MLP, both residual) -> RMSNorm -> output projection.
Attention itself is delegated to the configured backend (``attention.backend``), which
builds its mask once per forward (:meth:`prepare`) and is reused by every layer.

Names are stable so that checkpoints (and the model's own parallel plans) can address
them: ``tok_embeddings``, ``layers["<i>"]`` (an ``nn.ModuleDict`` keyed ``"0"`` ..
``"n_layers-1"``: deleting layers for a pipeline stage keeps the other keys), each with
``attention_norm``, ``attention.{wq,wk,wv,wo}``, ``ffn_norm``,
``feed_forward.{w1,w2,w3}`` (gate, down, up), then ``norm`` and ``output``. The family
(``model.options.family``, :func:`~forge_plugins.models.options.features`) adds biases
(qwen2: on ``wq/wk/wv``; llama and qwen3 with ``attention_bias``: on all four; llama
with ``mlp_bias``: on the MLP) or ``attention.q_norm``/``k_norm`` (qwen3: an RMSNorm over
each head's channels of the queries and keys, before rotary; olmo2: over the whole query
and key projections). An olmo2 block is post-norm: ``post_attention_norm`` and
``post_ffn_norm`` normalise the outputs of attention and MLP before each residual add, and
it has no ``attention_norm``/``ffn_norm``. With ``model.options.moe`` the
blocks it selects (:func:`~forge_plugins.models.options.is_moe_layer`) have an ``MoE``
feed-forward instead (:mod:`forge_plugins.models.moe`: ``feed_forward.router``,
``feed_forward.experts``, optionally ``feed_forward.shared``); the forward passes
``doc_ids`` to a block only when its feed-forward asks for them (``needs_doc_ids``:
per-document balancing), so a block's four positional inputs never change. A pipeline
stage may set ``tok_embeddings``, ``norm`` or ``output`` to ``None``: forward then takes hidden states
``(B, S, dim)`` instead of token ids, or returns hidden states instead of logits.

The parallelism strategies know the model through :meth:`Llama.parallel_contract`
only: the blocks are ``layers``; a pipeline stage sets ``tok_embeddings`` (first stage
only) or ``norm`` and ``output`` (last stage only) to ``None``; the tensor-parallel plan
(which covers every family's extra parameters: biases are sharded with their layer, the
per-head q/k norms are ``partial``, olmo2's whole-projection ones sharded with their heads)
is in :mod:`forge_plugins.models.llama_parallel`;
the output head is ``output`` (the chunked loss applies it itself); the routed experts
of an MoE block are ``feed_forward.experts`` (``ParallelContract.experts``).

Init (:meth:`Llama.init_weights`, re-runnable after building on the meta device):
embeddings and every linear weight ~ N(0, init_std); the projections that write into the
residual stream (``wo`` and ``w2``) ~ N(0, init_std / sqrt(2 * n_layers)) so the
residual's variance does not grow with depth; biases are zeros; RMSNorm weights are
ones; a tied output shares the embedding matrix. In an MoE block the router's gate and
every expert's ``w1``/``w3`` ~ N(0, init_std), every expert's ``w2`` (and the shared
experts') as a dense ``w2``, the selection bias zeros.

With ``init_from_hf`` (a folder, or a Hub id's cached snapshot) the checkpoint is the
init: :func:`build` returns the model on the meta device (no memory), the trainer shards
it as the strategies say, moves it to its device with ``to_empty`` and calls
:meth:`Llama.init_weights`, which reads from the checkpoint only the slice of each tensor
this process holds (:func:`forge_plugins.models.hf_interop.load_into`).

Sampling: :meth:`Llama.new_cache` and ``forward(..., cache=)`` decode with a key/value
cache (:mod:`forge_plugins.models.kv_cache`) through this same forward.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import torch
from torch import nn

from forge_core.api import DOC_IDS, ParallelContract, PipelineSplit, TensorParallelPlan
from forge_plugins.models.feed_forward import FeedForward
from forge_plugins.models.moe import MoE
from forge_plugins.models.options import (
    LlamaOptions,
    features,
    ffn_hidden_size,
    head_dim,
    held_roles,
    is_moe_layer,
)
from forge_plugins.models.rotary import Rotary, apply_rotary


class RMSNorm(nn.Module):
    """RMSNorm computed in fp32 (float64 for float64 inputs) and cast back, as
    transformers' LlamaRMSNorm does for fp32 and lower. ``weight_before_cast``: the
    weight multiplies the fp32 result before the cast back (transformers' Olmo2RMSNorm);
    the same in fp32, one rounding fewer in bf16."""

    def __init__(self, dim: int, eps: float, weight_before_cast: bool = False) -> None:
        super().__init__()
        self.eps = eps
        self.weight_before_cast = weight_before_cast
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Never below fp32, never below the input: a float64 model stays float64 throughout.
        # (Casts only when the dtype changes: each is a dispatch, which decoding one token
        # at a time notices.)
        compute = torch.float64 if x.dtype == torch.float64 else torch.float32
        h = x if x.dtype == compute else x.to(compute)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.weight_before_cast:
            h = self.weight * h
            return h if h.dtype == x.dtype else h.to(x.dtype)
        return self.weight * (h if h.dtype == x.dtype else h.to(x.dtype))


class ProjectionNorm(RMSNorm):
    """RMSNorm over a whole projection, every head's channels together (olmo2's q/k
    norms). Under tensor parallelism each rank holds the channels of its heads and a
    shard of the weight, and the plan sets ``group``
    (:class:`~forge_plugins.models.llama_parallel.ProjectionNormParallel`): each rank
    sums its channels' squares, the sums are all-reduced over the group, and each rank
    scales its channels by its shard of the weight."""

    group: Any = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.group is None:
            return super().forward(x)
        from torch.distributed.nn.functional import all_reduce

        compute = torch.float64 if x.dtype == torch.float64 else torch.float32
        h = x.to(compute)
        # all_reduce of torch.distributed.nn carries gradients back to every rank's share.
        squares = all_reduce(h.pow(2).sum(-1, keepdim=True), group=self.group)
        h = h * torch.rsqrt(squares / self.weight.shape[0] + self.eps)  # the global width
        return (self.weight.to_local() * h).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, options: LlamaOptions, backend: Any) -> None:
        super().__init__()
        self.head_dim = head_dim(options)
        extra = features(options)
        q, kv = options.n_heads * self.head_dim, options.n_kv_heads * self.head_dim
        self.wq = nn.Linear(options.dim, q, bias=extra.qkv_bias)
        self.wk = nn.Linear(options.dim, kv, bias=extra.qkv_bias)
        self.wv = nn.Linear(options.dim, kv, bias=extra.qkv_bias)
        self.wo = nn.Linear(q, options.dim, bias=extra.out_bias)
        # Per head (qwen3): under tensor parallelism each rank normalises its own heads.
        # Over the whole projection (olmo2): the mean of squares spans every head, which
        # tensor parallelism splits, so the ranks sum their squares (ProjectionNorm).
        self.whole_qk_norm = extra.qk_norm == "projection"
        self.q_norm: RMSNorm | None = None
        self.k_norm: RMSNorm | None = None
        if self.whole_qk_norm:
            self.q_norm, self.k_norm = (
                ProjectionNorm(q, options.norm_eps, True),
                ProjectionNorm(kv, options.norm_eps, True),
            )
        elif extra.qk_norm:
            self.q_norm, self.k_norm = (
                RMSNorm(self.head_dim, options.norm_eps),
                RMSNorm(self.head_dim, options.norm_eps),
            )
        self.backend = backend

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, prepared: Any, cache: Any = None
    ) -> torch.Tensor:
        batch, seq_len, _ = x.shape
        q, k = self.wq(x), self.wk(x)
        if self.whole_qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        # -1 heads: under tensor parallelism each rank holds a shard of the heads.
        q = q.view(batch, seq_len, -1, self.head_dim)
        k = k.view(batch, seq_len, -1, self.head_dim)
        v = self.wv(x).view(batch, seq_len, -1, self.head_dim)
        if self.q_norm is not None and not self.whole_qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if cache is None:
            out = self.backend.attend(q, k, v, prepared)
        else:
            out = cache.attend(q, k, v, self.backend, prepared)
        return self.wo(out.transpose(1, 2).reshape(batch, seq_len, -1))


class Block(nn.Module):
    def __init__(self, options: LlamaOptions, backend: Any, moe: bool = False) -> None:
        super().__init__()
        # Pre-norm (the norms' inputs are the sub-layers' inputs) or, for olmo2, post-norm
        # (their inputs are the sub-layers' outputs): distinct names, so a checkpoint of
        # one ordering can never load into the other.
        post = features(options).post_norm
        self.attention_norm = None if post else RMSNorm(options.dim, options.norm_eps)
        self.attention = Attention(options, backend)
        self.ffn_norm = None if post else RMSNorm(options.dim, options.norm_eps)
        self.post_attention_norm = RMSNorm(options.dim, options.norm_eps, True) if post else None
        self.post_ffn_norm = RMSNorm(options.dim, options.norm_eps, True) if post else None
        self.feed_forward: nn.Module = (
            MoE(options.dim, options.moe)
            if moe
            else FeedForward(options.dim, ffn_hidden_size(options), features(options).mlp_bias)
        )

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        prepared: Any,
        cache: Any = None,
        doc_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        # The cache and doc ids only as keywords (sampling; an MoE block's per-document
        # balancing): training calls keep their four inputs, which tensor-parallel input
        # styles count.
        extra = {} if cache is None else {"cache": cache}
        ffn = self.feed_forward if doc_ids is None else functools.partial(self.feed_forward, doc_ids=doc_ids)
        if self.post_attention_norm is not None:
            x = x + self.post_attention_norm(self.attention(x, cos, sin, prepared, **extra))
            return x + self.post_ffn_norm(ffn(x))
        x = x + self.attention(self.attention_norm(x), cos, sin, prepared, **extra)
        return x + ffn(self.ffn_norm(x))


def check_options(options: LlamaOptions) -> LlamaOptions:
    """The options resolved (unset ones from the checkpoint or the defaults) and checked
    against the shape constraints (``forge-run check`` reports the same as rules)."""
    from forge_plugins.models.hf_config import resolve_options
    from forge_plugins.models.rules import option_problems

    options = resolve_options(options)
    problems = option_problems(options)
    if problems:
        raise ValueError("invalid llama options: " + "; ".join(problems))
    return options


class Llama(nn.Module):
    def __init__(self, options: LlamaOptions, vocab_size: int, attention: Any) -> None:
        super().__init__()
        options = check_options(options)
        self.options = options
        self.vocab_size = vocab_size
        self.attention_backend = attention
        self.tok_embeddings: nn.Embedding | None = nn.Embedding(vocab_size, options.dim)
        self.rope = Rotary(head_dim(options), options.max_seq_len, options.rope_theta, options.rope_scaling)
        self.layers = nn.ModuleDict(
            {str(i): Block(options, attention, is_moe_layer(options, i)) for i in range(options.n_layers)}
        )
        self.norm: RMSNorm | None = RMSNorm(options.dim, options.norm_eps, features(options).post_norm)
        self.output: nn.Linear | None = nn.Linear(options.dim, vocab_size, bias=False)
        if options.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight

    def parallel_contract(self) -> ParallelContract:
        """How the strategies split and shard this model (see the module docstring)."""
        feed_forwards = [layer.feed_forward for layer in self.layers.values()]
        extra = features(self.options)
        return ParallelContract(
            blocks="layers",
            pipeline=PipelineSplit(first=("tok_embeddings",), last=("norm", "output")),
            tensor_parallel=functools.partial(
                tensor_parallel_plan,
                qk_norm=extra.qk_norm == "head",
                projection_norm=extra.qk_norm == "projection",
                post_norm=extra.post_norm,
                dense=any(isinstance(ffn, FeedForward) for ffn in feed_forwards),
                moe=any(isinstance(ffn, MoE) for ffn in feed_forwards),
                shared=any(getattr(ffn, "shared", None) is not None for ffn in feed_forwards),
            ),
            output_head="output",
            experts="feed_forward.experts" if self.options.moe is not None else None,
            roles=held_roles(self.options),
        )

    def forward(
        self,
        input_ids: torch.Tensor,
        doc_ids: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
        cache: Any = None,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits ``(B, S, vocab)`` for ``input_ids (B, S)``.

        ``doc_ids (B, S)`` keeps packed documents from attending to each other;
        ``positions (B, S)`` restarts rotary positions at every document. Without an
        embedding (pipeline stage) ``input_ids`` are hidden states ``(B, S, dim)``; without
        an output projection the result is hidden states. With ``cache`` (from
        :meth:`new_cache`) the tokens continue the cached ones and are added to it;
        ``attention_mask (B, S)`` (with a cache only) is False at left padding, which no
        token attends to (``positions`` then count each row's own tokens).
        """
        if self.tok_embeddings is not None:
            h = self.tok_embeddings(input_ids)
        elif input_ids.is_floating_point():
            h = input_ids
        else:
            raise ValueError(
                "this model part has no token embedding: pass hidden states (B, S, dim), "
                f"got a {input_ids.dtype} tensor of shape {tuple(input_ids.shape)}"
            )
        seq_len = h.shape[1]
        if attention_mask is not None and cache is None:
            raise ValueError("attention_mask marks padding in a key/value cache: pass cache= with it")
        start = 0 if cache is None else cache.reserve(seq_len, attention_mask)
        cos, sin = self.rope(seq_len, positions, start)
        prepared = self.attention_backend.prepare(doc_ids, seq_len, h.device)
        for key, layer in self.layers.items():
            extra = {} if cache is None else {"cache": cache.layer(int(key))}
            if doc_ids is not None and getattr(layer.feed_forward, "needs_doc_ids", False):
                extra[DOC_IDS] = doc_ids
            h = layer(h, cos, sin, prepared, **extra)
        if cache is not None:
            cache.advance(seq_len)
        if self.norm is not None:
            h = self.norm(h)
        if self.output is not None:
            h = self.output(h)
        return h

    def new_cache(self, batch_size: int, max_len: int) -> Any:
        """A key/value cache for ``batch_size`` rows of up to ``max_len`` tokens (at most
        ``max_seq_len``), in the model's dtype and device."""
        from forge_plugins.models.kv_cache import KVCache

        if max_len > self.options.max_seq_len:
            raise ValueError(
                f"a cache of {max_len} tokens exceeds model.options.max_seq_len={self.options.max_seq_len}"
            )
        weight = next(iter(self.layers.values())).attention.wk.weight
        return KVCache(
            len(self.layers),
            batch_size,
            weight.shape[0] // head_dim(self.options),
            head_dim(self.options),
            max_len,
            weight.dtype,
            weight.device,
        )

    @torch.no_grad()
    def init_weights(self) -> None:
        """(Re)initialise every parameter and the rotary table as the module docstring
        says; with ``init_from_hf`` load the checkpoint instead, the part of it this
        module holds (a pipeline stage, DTensor shards)."""
        options = self.options
        self.rope.reset_table()
        if options.init_from_hf:
            from forge_plugins.models.hf_config import hf_dir
            from forge_plugins.models.hf_interop import load_into

            if options.tie_embeddings and self.tok_embeddings is not None and self.output is not None:
                self.output.weight = self.tok_embeddings.weight  # to_empty unties
            load_into(self, hf_dir(options))
            return
        std = options.init_std
        residual_std = std / math.sqrt(2 * options.n_layers)
        if self.tok_embeddings is not None:
            nn.init.normal_(self.tok_embeddings.weight, mean=0.0, std=std)
        for layer in self.layers.values():
            attention, ffn = layer.attention, layer.feed_forward
            dense = [ffn] if isinstance(ffn, FeedForward) else [ffn.shared] if ffn.shared is not None else []
            inputs = [
                attention.wq,
                attention.wk,
                attention.wv,
                *(f.w1 for f in dense),
                *(f.w3 for f in dense),
            ]
            outputs = [attention.wo, *(f.w2 for f in dense)]
            for linear in inputs:
                nn.init.normal_(linear.weight, mean=0.0, std=std)
            for linear in outputs:
                nn.init.normal_(linear.weight, mean=0.0, std=residual_std)
            for linear in inputs + outputs:
                if linear.bias is not None:
                    nn.init.zeros_(linear.bias)
            if isinstance(ffn, MoE):
                # Every expert as a dense SwiGLU; the router's gate as an input projection.
                nn.init.normal_(ffn.router.gate.weight, mean=0.0, std=std)
                nn.init.zeros_(ffn.router.expert_bias)
                nn.init.normal_(ffn.experts.w1, mean=0.0, std=std)
                nn.init.normal_(ffn.experts.w3, mean=0.0, std=std)
                nn.init.normal_(ffn.experts.w2, mean=0.0, std=residual_std)
            for norm in (
                layer.attention_norm,
                layer.ffn_norm,
                layer.post_attention_norm,
                layer.post_ffn_norm,
                layer.attention.q_norm,
                layer.attention.k_norm,
            ):
                if norm is not None:
                    nn.init.ones_(norm.weight)
        if self.norm is not None:
            nn.init.ones_(self.norm.weight)
        if self.output is not None:
            if options.tie_embeddings and self.tok_embeddings is not None:
                # Re-tie: moving off the meta device may have given each its own tensor.
                self.output.weight = self.tok_embeddings.weight
            else:
                nn.init.normal_(self.output.weight, mean=0.0, std=std)


def tensor_parallel_plan(
    *,
    sequence_parallel: bool,
    qk_norm: bool = False,
    projection_norm: bool = False,
    post_norm: bool = False,
    dense: bool = True,
    moe: bool = False,
    shared: bool = False,
) -> TensorParallelPlan:
    """The plan of :mod:`forge_plugins.models.llama_parallel`, imported only when tensor
    parallelism is applied."""
    from forge_plugins.models import llama_parallel

    return llama_parallel.tensor_parallel_plan(
        sequence_parallel=sequence_parallel,
        qk_norm=qk_norm,
        projection_norm=projection_norm,
        post_norm=post_norm,
        dense=dense,
        moe=moe,
        shared=shared,
    )


def build(options: LlamaOptions, vocab_size: int, attention: Any) -> Llama:
    """The model factory named by the ``llama`` spec.

    With ``init_from_hf`` the folder is checked against the resolved options first (a
    clear error lists every mismatch), its vocabulary size is used, and the model is
    returned on the meta device: ``to_empty(device=...)`` then ``init_weights()`` load
    it (the trainer does so after sharding it).
    """
    options = check_options(options)
    if options.init_from_hf:
        from forge_plugins.models.hf_config import check_hf_compatible, hf_dir

        vocab_size = check_hf_compatible(options, hf_dir(options), vocab_size)
        with torch.device("meta"):
            return Llama(options, vocab_size, attention)
    model = Llama(options, vocab_size, attention)
    model.init_weights()
    return model
