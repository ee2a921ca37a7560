"""The ``llama`` model: a Llama-style decoder-only transformer.

Token embedding -> ``n_layers`` blocks (RMSNorm, grouped-query attention with rotary
embeddings, RMSNorm, SwiGLU MLP, both residual) -> RMSNorm -> output projection.
Attention itself is delegated to the configured backend (``attention.backend``), which
builds its mask once per forward (:meth:`prepare`) and is reused by every layer.

Names are stable so that checkpoints (and the model's own parallel plans) can address
them: ``tok_embeddings``, ``layers["<i>"]`` (an ``nn.ModuleDict`` keyed ``"0"`` ..
``"n_layers-1"``: deleting layers for a pipeline stage keeps the other keys), each with
``attention_norm``, ``attention.{wq,wk,wv,wo}``, ``ffn_norm``,
``feed_forward.{w1,w2,w3}`` (gate, down, up), then ``norm`` and ``output``. Linear
layers have no bias.

The parallelism strategies know the model through :meth:`Llama.parallel_contract`
only: the blocks are ``layers``; a pipeline stage sets ``tok_embeddings`` (first stage
only) or ``norm`` and ``output`` (last stage only) to ``None``, and forward then takes
hidden states ``(B, S, dim)`` instead of token ids, or returns hidden states instead of
logits; the tensor-parallel plan is in :mod:`forge_plugins.models.llama_parallel`; the
output head is ``output`` (the chunked loss applies it itself).

Init (:meth:`Llama.init_weights`, re-runnable after building on the meta device):
embeddings and every linear weight ~ N(0, init_std); the projections that write into the
residual stream (``wo`` and ``w2``) ~ N(0, init_std / sqrt(2 * n_layers)) so the
residual's variance does not grow with depth; RMSNorm weights are ones; a tied output
shares the embedding matrix. With ``init_from_hf`` the weights are then loaded from the
Hugging Face folder.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from forge_core.api import ParallelContract, PipelineSplit, TensorParallelPlan
from forge_plugins.models.options import LlamaOptions, ffn_hidden_size
from forge_plugins.models.rotary import Rotary, apply_rotary


class RMSNorm(nn.Module):
    """RMSNorm computed in fp32 (float64 for float64 inputs) and cast back, as
    transformers' LlamaRMSNorm does for fp32 and lower."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Never below fp32, never below the input: a float64 model stays float64 throughout.
        h = x.to(torch.promote_types(x.dtype, torch.float32))
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, options: LlamaOptions, backend: Any) -> None:
        super().__init__()
        self.head_dim = options.dim // options.n_heads
        self.wq = nn.Linear(options.dim, options.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(options.dim, options.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(options.dim, options.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(options.n_heads * self.head_dim, options.dim, bias=False)
        self.backend = backend

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, prepared: Any
    ) -> torch.Tensor:
        batch, seq_len, _ = x.shape
        # -1 heads: under tensor parallelism each rank holds a shard of the heads.
        q = self.wq(x).view(batch, seq_len, -1, self.head_dim)
        k = self.wk(x).view(batch, seq_len, -1, self.head_dim)
        v = self.wv(x).view(batch, seq_len, -1, self.head_dim)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        out = self.backend.attend(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), prepared)
        return self.wo(out.transpose(1, 2).reshape(batch, seq_len, -1))


class FeedForward(nn.Module):
    """SwiGLU: ``w2(silu(w1 x) * w3 x)``."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, options: LlamaOptions, backend: Any) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(options.dim, options.norm_eps)
        self.attention = Attention(options, backend)
        self.ffn_norm = RMSNorm(options.dim, options.norm_eps)
        self.feed_forward = FeedForward(options.dim, ffn_hidden_size(options))

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, prepared: Any
    ) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), cos, sin, prepared)
        return x + self.feed_forward(self.ffn_norm(x))


def check_options(options: LlamaOptions) -> None:
    """The shape constraints (``forge-run check`` reports the same as rules)."""
    from forge_plugins.models.rules import head_dim_problem, heads_problem

    problems = [m for m in (heads_problem(options), head_dim_problem(options)) if m]
    if problems:
        raise ValueError("invalid llama options: " + "; ".join(problems))


class Llama(nn.Module):
    def __init__(self, options: LlamaOptions, vocab_size: int, attention: Any) -> None:
        super().__init__()
        check_options(options)
        self.options = options
        self.vocab_size = vocab_size
        self.attention_backend = attention
        self.tok_embeddings: nn.Embedding | None = nn.Embedding(vocab_size, options.dim)
        self.rope = Rotary(options.dim // options.n_heads, options.max_seq_len, options.rope_theta)
        self.layers = nn.ModuleDict(
            {str(i): Block(options, attention) for i in range(options.n_layers)}
        )
        self.norm: RMSNorm | None = RMSNorm(options.dim, options.norm_eps)
        self.output: nn.Linear | None = nn.Linear(options.dim, vocab_size, bias=False)
        if options.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight

    def parallel_contract(self) -> ParallelContract:
        """How the strategies split and shard this model (see the module docstring)."""
        return ParallelContract(
            blocks="layers",
            pipeline=PipelineSplit(first=("tok_embeddings",), last=("norm", "output")),
            tensor_parallel=tensor_parallel_plan,
            output_head="output",
        )

    def forward(
        self,
        input_ids: torch.Tensor,
        doc_ids: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits ``(B, S, vocab)`` for ``input_ids (B, S)``.

        ``doc_ids (B, S)`` keeps packed documents from attending to each other;
        ``positions (B, S)`` restarts rotary positions at every document. Without an
        embedding (pipeline stage) ``input_ids`` are hidden states ``(B, S, dim)``; without
        an output projection the result is hidden states.
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
        cos, sin = self.rope(seq_len, positions)
        prepared = self.attention_backend.prepare(doc_ids, seq_len, h.device)
        for layer in self.layers.values():
            h = layer(h, cos, sin, prepared)
        if self.norm is not None:
            h = self.norm(h)
        if self.output is not None:
            h = self.output(h)
        return h

    @torch.no_grad()
    def init_weights(self) -> None:
        """(Re)initialise every parameter and the rotary table as the module docstring says."""
        options = self.options
        std = options.init_std
        residual_std = std / math.sqrt(2 * options.n_layers)
        self.rope.reset_table()
        if self.tok_embeddings is not None:
            nn.init.normal_(self.tok_embeddings.weight, mean=0.0, std=std)
        for layer in self.layers.values():
            for linear in (layer.attention.wq, layer.attention.wk, layer.attention.wv,
                           layer.feed_forward.w1, layer.feed_forward.w3):
                nn.init.normal_(linear.weight, mean=0.0, std=std)
            for linear in (layer.attention.wo, layer.feed_forward.w2):
                nn.init.normal_(linear.weight, mean=0.0, std=residual_std)
            nn.init.ones_(layer.attention_norm.weight)
            nn.init.ones_(layer.ffn_norm.weight)
        if self.norm is not None:
            nn.init.ones_(self.norm.weight)
        if self.output is not None:
            if options.tie_embeddings and self.tok_embeddings is not None:
                # Re-tie: moving off the meta device may have given each its own tensor.
                self.output.weight = self.tok_embeddings.weight
            else:
                nn.init.normal_(self.output.weight, mean=0.0, std=std)
        if options.init_from_hf and not any(p.is_meta for p in self.parameters()):
            from forge_plugins.models.hf_interop import load_into

            load_into(self, options.init_from_hf)


def tensor_parallel_plan(*, sequence_parallel: bool) -> TensorParallelPlan:
    """The plan of :mod:`forge_plugins.models.llama_parallel`, imported only when tensor
    parallelism is applied."""
    from forge_plugins.models import llama_parallel

    return llama_parallel.tensor_parallel_plan(sequence_parallel=sequence_parallel)


def build(options: LlamaOptions, vocab_size: int, attention: Any) -> Llama:
    """The model factory named by the ``llama`` spec.

    With ``init_from_hf`` the Hugging Face config is checked against ``options`` first
    (a clear error lists every mismatch) and its vocabulary size is used.
    """
    if options.init_from_hf:
        from forge_plugins.models.hf_interop import check_hf_compatible

        vocab_size = check_hf_compatible(options, options.init_from_hf, vocab_size)
    model = Llama(options, vocab_size, attention)
    model.init_weights()
    return model
