"""A tiny routed model that reports statistics of its training forwards the way a
mixture-of-experts layer does (``step_stats`` and this module's ``summarize_stats``), and
declares the share of its experts' parameters a token uses (``active_fraction``): the
test double of the statistics and active-parameter mechanisms (tests/test_model_stats.py).

Each block routes every token to the ``top_k`` of ``experts`` linear experts its gate
scores highest and adds their mean output. The router counts, in training mode only,
the assignments each expert received and the forwards; ``summarize_stats`` turns the
totals into ``load_min``/``load_max``/``load_cv`` (fractions of the assignments) and the
number of assignments.
"""

from __future__ import annotations

from typing import Any

import attrs
import torch

from forge_core.api import DOC_IDS, POSITIONS, ModelSpec, ParallelContract, hookimpl


def summarize_stats(totals: dict[str, torch.Tensor]) -> dict[str, float]:
    load = totals["tokens_per_expert"] / totals["tokens_per_expert"].sum().clamp_min(1)
    return {
        "load_min": float(load.min()),
        "load_max": float(load.max()),
        "load_cv": float(load.std(unbiased=False) / load.mean()),
        "assignments": float(totals["tokens_per_expert"].sum()),
    }


class Router(torch.nn.Module):
    def __init__(self, dim: int, experts: int, top_k: int) -> None:
        super().__init__()
        self.gate = torch.nn.Linear(dim, experts, bias=False)
        self.top_k = top_k
        self.register_buffer("counts", torch.zeros(experts), persistent=False)
        self.register_buffer("forwards", torch.zeros(()), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        chosen = self.gate(x).topk(self.top_k, dim=-1).indices
        if self.training:  # evaluation forwards are not the training step's
            self.counts += torch.bincount(chosen.reshape(-1), minlength=self.counts.numel()).to(self.counts)
            self.forwards += 1
        return chosen

    def step_stats(self) -> dict[str, torch.Tensor]:
        out = {"tokens_per_expert": self.counts.clone(), "forwards": self.forwards.clone()}
        self.counts.zero_()
        self.forwards.zero_()
        return out


class Experts(torch.nn.Module):
    def __init__(self, dim: int, experts: int, top_k: int) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(experts, dim, dim) * 0.1)
        self.top_k = top_k

    def active_fraction(self) -> float:
        return self.top_k / self.w.shape[0]

    def forward(self, x: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
        return torch.einsum("bsd,bskde->bse", x, self.w[chosen]) / self.top_k


class Block(torch.nn.Module):
    def __init__(self, dim: int, experts: int, top_k: int) -> None:
        super().__init__()
        self.router = Router(dim, experts, top_k)
        self.experts = Experts(dim, experts, top_k)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.experts(x, self.router(x))


@attrs.frozen
class ToyOptions:
    dim: int = 8
    experts: int = 4
    top_k: int = 2
    n_layers: int = 2
    max_seq_len: int = 64


class ToyModel(torch.nn.Module):
    def __init__(self, options: ToyOptions, vocab_size: int) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(vocab_size, options.dim)
        self.layers = torch.nn.ModuleDict(
            {str(i): Block(options.dim, options.experts, options.top_k) for i in range(options.n_layers)}
        )
        self.out = torch.nn.Linear(options.dim, vocab_size, bias=False)

    def parallel_contract(self) -> ParallelContract:
        return ParallelContract(blocks="layers")

    def forward(self, input_ids: torch.Tensor, **metadata: Any) -> torch.Tensor:
        x = self.emb(input_ids)
        for block in self.layers.values():
            x = block(x)
        return self.out(x)


def build(options: ToyOptions, vocab_size: int, attention: Any) -> ToyModel:
    return ToyModel(options, vocab_size)


class ToyPlugin:
    """Registers the ``toy_routed`` model."""

    @hookimpl
    def forge_models(self):
        return [
            ModelSpec(
                name="toy_routed",
                summary="Test model whose routers report statistics",
                impl="toy_router:build",
                options=ToyOptions,
                accepts={DOC_IDS, POSITIONS},
            )
        ]
