"""The compiled FlexAttention kernel, one per process, shared by the ``flex`` backend's
forward (:mod:`~forge_plugins.attention.flex`) and by the forward of its CPU training
path (:mod:`~forge_plugins.attention.flex_cpu_backward`): both call :func:`flex_forward`
the same way, so a shape compiles once for both.

``torch.compile(flex_attention)`` is created on first use (the first call pays the
compile, about 15 s on CPU) with static shapes: each new batch or sequence shape
compiles once more (about 12 s on CPU), because on CPU torch 2.13's kernel compiled for
dynamic shapes (what ``torch.compile`` switches to on the second shape) fails to build
(a C++ error in the generated code); pipeline microbatches and a smaller evaluation
batch are such new shapes.

Compiled kernels are cached in a directory keyed by what they depend on (torch version,
CPU kernel level, thread count), not in the cache every process on the machine shares,
unless the user set ``TORCHINDUCTOR_CACHE_DIR`` (:mod:`~forge_plugins.attention.inductor_cache`).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch.nn.attention.flex_attention import flex_attention

from forge_plugins.attention.inductor_cache import use_keyed_cache_dir

#: The compiled kernel once made; a caller may set it to another implementation of
#: ``flex_attention`` (PyTorch's unfused one runs every dtype without compiling).
compiled: Any = None


def compiled_flex_attention() -> Any:
    """``torch.compile(flex_attention)``, created on first use and shared process-wide."""
    global compiled
    if compiled is None:
        use_keyed_cache_dir()
        compiled = torch.compile(flex_attention, dynamic=False)
    return compiled


def flex_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_mask: Any) -> torch.Tensor:
    """Attention of ``q`` over ``k``, ``v`` under ``block_mask``, scale ``1/sqrt(head_dim)``,
    grouped-query heads broadcast: the one call every path makes (one compilation)."""
    return compiled_flex_attention()(
        q,
        k,
        v,
        block_mask=block_mask,
        scale=1.0 / math.sqrt(q.shape[-1]),
        enable_gqa=q.shape[1] != k.shape[1],
    )
