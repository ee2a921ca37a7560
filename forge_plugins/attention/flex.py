"""``flex``: FlexAttention with a ``BlockMask`` (causal and same document).

:meth:`FlexAttention.prepare` builds one ``BlockMask`` per forward, shared by every
layer: about ``(S / block_size)^2`` int32 block indices per row (tens of KiB at
``S = 8192`` against 64 MiB for ``sdpa``'s dense mask), built from per-block document
ranges without materialising ``S x S`` (:func:`~forge_plugins.attention.masks.document_block_mask`).
Without ``doc_ids`` it uses the causal ``BlockMask``, cached per length and device.

``flex_attention`` is compiled once per process, lazily, on first use (the first call
pays the compile, about 15 s on CPU). Shapes are static: each new batch or sequence
shape compiles once more (about 12 s on CPU), because on CPU torch 2.13's kernel
compiled for dynamic shapes (what ``torch.compile`` switches to on the second shape)
fails to build (a C++ error in the generated code); pipeline microbatches and a
smaller evaluation batch are such new shapes. It runs forward on CPU and CUDA. PyTorch has no FlexAttention backward
on CPU, so when gradients are needed on CPU the forward still runs the compiled kernel
and the backward is :mod:`~forge_plugins.attention.flex_cpu_backward`, which recomputes
attention block by block over the same ``BlockMask`` (memory: one query block's scores,
``heads x block_size x kept keys``, never ``S x S``). On CUDA the native backward is used.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from forge_plugins.attention.eager import check_heads
from forge_plugins.attention.masks import document_block_mask

_compiled_flex: Any = None


def compiled_flex_attention() -> Any:
    """``torch.compile(flex_attention)``, created on first use and shared process-wide."""
    global _compiled_flex
    if _compiled_flex is None:
        from torch.nn.attention.flex_attention import flex_attention

        _compiled_flex = torch.compile(flex_attention, dynamic=False)
    return _compiled_flex


def _needs_cpu_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    return (
        q.device.type == "cpu"
        and torch.is_grad_enabled()
        and (q.requires_grad or k.requires_grad or v.requires_grad)
    )


class FlexAttention:
    def __init__(self, options: Any) -> None:
        self.options = options
        self.block_size = options.block_size
        self._causal: dict[tuple[int, str], Any] = {}

    def prepare(
        self, doc_ids: torch.Tensor | None, seq_len: int, device: torch.device | str
    ) -> Any:
        if doc_ids is not None:
            return document_block_mask(doc_ids, seq_len, device, self.block_size)
        key = (seq_len, str(device))
        if key not in self._causal:
            self._causal[key] = document_block_mask(None, seq_len, device, self.block_size)
        return self._causal[key]

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prepared: Any) -> torch.Tensor:
        check_heads(q, k)
        if _needs_cpu_backward(q, k, v):
            from forge_plugins.attention.flex_cpu_backward import flex_attention_cpu_trainable

            return flex_attention_cpu_trainable(q, k, v, prepared)
        if q.device.type == "cpu":
            # Nothing needs a gradient here; no_grad matches the grad mode of the
            # trainable path's forward, so both share one compiled graph.
            with torch.no_grad():
                return flex_forward(q, k, v, prepared)
        return flex_forward(q, k, v, prepared)


def flex_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_mask: Any) -> torch.Tensor:
    """The compiled kernel, called the same way by every path (one compilation)."""
    return compiled_flex_attention()(
        q, k, v, block_mask=block_mask, scale=1.0 / math.sqrt(q.shape[-1]),
        enable_gqa=q.shape[1] != k.shape[1],
    )
