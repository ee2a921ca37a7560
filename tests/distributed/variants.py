"""Model variants the distributed scenarios register as a third party would (plugin
``variants``, in process): a llama whose attention normalises every query and key head
(per-head RMSNorm, as Qwen3 and OLMo2 do) with those norms declared ``partial`` in its
tensor-parallel plan, and the same model with the norms left out of the plan.

Each rank applies the q/k norms to its own heads, so under tensor parallelism their
weight gradients are per-rank partial sums: declared ``partial``, the ``tp`` strategy
sums them over the group; left undeclared, it must refuse the model at build.
"""

from __future__ import annotations

import attrs
import torch

from forge_core.api import BLOCKS, PIPELINE, SEQUENCE_PARALLEL, TENSOR_PARALLEL, ModelSpec, hookimpl
from forge_plugins.models.llama import Attention, Llama, RMSNorm, tensor_parallel_plan
from forge_plugins.models.options import LlamaOptions, llama_facts
from forge_plugins.models.rotary import apply_rotary


class QKNormAttention(Attention):
    def __init__(self, options: LlamaOptions, backend) -> None:
        super().__init__(options, backend)
        self.q_norm = RMSNorm(self.head_dim, options.norm_eps)
        self.k_norm = RMSNorm(self.head_dim, options.norm_eps)

    def forward(self, x, cos, sin, prepared):
        batch, seq_len, _ = x.shape
        q = self.q_norm(self.wq(x).view(batch, seq_len, -1, self.head_dim))
        k = self.k_norm(self.wk(x).view(batch, seq_len, -1, self.head_dim))
        v = self.wv(x).view(batch, seq_len, -1, self.head_dim)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        out = self.backend.attend(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), prepared)
        return self.wo(out.transpose(1, 2).reshape(batch, seq_len, -1))


class QKNormLlama(Llama):
    declares_norms = True

    def __init__(self, options: LlamaOptions, vocab_size: int, attention) -> None:
        super().__init__(options, vocab_size, attention)
        for block in self.layers.values():
            block.attention = QKNormAttention(self.options, attention)  # the resolved options
        with torch.no_grad():  # norms away from ones, so that a wrong gradient shows at once
            for name, param in self.named_parameters():
                if name.endswith(("q_norm.weight", "k_norm.weight")):
                    param.uniform_(0.5, 1.5)

    def parallel_contract(self):
        return attrs.evolve(super().parallel_contract(), tensor_parallel=self.tensor_parallel_plan)

    def tensor_parallel_plan(self, *, sequence_parallel: bool):
        # The built-in plan declares q/k norms only for the qwen3 family: this model
        # declares its own (or, undeclared, leaves them out).
        return tensor_parallel_plan(sequence_parallel=sequence_parallel, qk_norm=self.declares_norms)


class UndeclaredQKNormLlama(QKNormLlama):
    declares_norms = False


def build(options: LlamaOptions, vocab_size: int, attention) -> QKNormLlama:
    model = QKNormLlama(options, vocab_size, attention)
    model.init_weights()
    return model


def build_undeclared(options: LlamaOptions, vocab_size: int, attention) -> UndeclaredQKNormLlama:
    model = UndeclaredQKNormLlama(options, vocab_size, attention)
    model.init_weights()
    return model


@hookimpl
def forge_models():
    common = dict(
        options=LlamaOptions,
        accepts=(),
        supports={BLOCKS, TENSOR_PARALLEL, SEQUENCE_PARALLEL, PIPELINE},
        facts=llama_facts,
    )
    return [
        ModelSpec(
            name="qknorm",
            summary="llama with per-head q/k RMSNorm, declared partial",
            impl="variants:build",
            **common,
        ),
        ModelSpec(
            name="qknorm_undeclared",
            summary="llama with per-head q/k RMSNorm left out of its plan",
            impl="variants:build_undeclared",
            **common,
        ),
    ]
