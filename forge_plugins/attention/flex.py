"""``flex``: FlexAttention with a ``BlockMask`` (causal and same document).

:meth:`FlexAttention.prepare` builds one ``BlockMask`` per forward, shared by every
layer: about ``(S / block_size)^2`` int32 block indices per row (tens of KiB at
``S = 8192`` against 64 MiB for ``sdpa``'s dense mask), built from per-block document
ranges without materialising ``S x S`` (:func:`~forge_plugins.attention.masks.document_block_mask`).
Without ``doc_ids`` it uses the causal ``BlockMask``, cached per length and device.
:meth:`FlexAttention.prepare_queries` (context parallelism) builds the rectangular one,
``Q_LEN = Sq`` queries at given row positions against ``KV_LEN = S`` keys
(:func:`~forge_plugins.attention.masks.query_block_mask`).

The kernel is ``flex_attention`` compiled once per process
(:mod:`~forge_plugins.attention.flex_kernel`, which says what compiles when). It runs
forward on CPU and CUDA. PyTorch has no FlexAttention backward on CPU, so when
gradients are needed on CPU the forward still runs the compiled kernel and the backward
is :mod:`~forge_plugins.attention.flex_cpu_backward`, which recomputes
attention block by block over the same ``BlockMask`` (memory: one query block's scores,
``heads x block_size x kept keys``, never ``S x S``). On CUDA the native backward is used.

Building the backend points inductor at a cache directory keyed by what the compiled
kernel depends on (:mod:`~forge_plugins.attention.inductor_cache`).
"""

from __future__ import annotations

from typing import Any

import torch

from forge_plugins.attention.eager import check_heads
from forge_plugins.attention.flex_cpu_backward import flex_attention_cpu_trainable
from forge_plugins.attention.flex_kernel import flex_forward
from forge_plugins.attention.inductor_cache import use_keyed_cache_dir
from forge_plugins.attention.masks import document_block_mask, query_block_mask


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
        # Before anything compiles (train.compile traces the blocks before flex's first
        # call): the cache directory keyed by what the compiled kernel depends on.
        use_keyed_cache_dir()

    def prepare(self, doc_ids: torch.Tensor | None, seq_len: int, device: torch.device | str) -> Any:
        if doc_ids is not None:
            return document_block_mask(doc_ids, seq_len, device, self.block_size)
        key = (seq_len, str(device))
        if key not in self._causal:
            self._causal[key] = document_block_mask(None, seq_len, device, self.block_size)
        return self._causal[key]

    def prepare_queries(
        self,
        doc_ids: torch.Tensor | None,
        query_index: torch.Tensor,
        seq_len: int,
        device: torch.device | str,
    ) -> Any:
        return query_block_mask(doc_ids, query_index, seq_len, device, self.block_size)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prepared: Any) -> torch.Tensor:
        check_heads(q, k)
        if _needs_cpu_backward(q, k, v):
            return flex_attention_cpu_trainable(q, k, v, prepared)
        if q.device.type == "cpu":
            # Nothing needs a gradient here; no_grad matches the grad mode of the
            # trainable path's forward, so both share one compiled graph.
            with torch.no_grad():
                return flex_forward(q, k, v, prepared)
        return flex_forward(q, k, v, prepared)
