"""Compatibility rules of the attention backends: plain check functions over a
:class:`~forge_core.api.Plan` (config and chosen specs only, no torch).

The rule that a packer emitting ``doc_ids`` needs a backend that honours them is the
kernel's (``attention.honours-doc-ids`` in :mod:`forge_core.core_rules`): it reasons over
declared capabilities only and must hold for third-party backends even when this plugin
is blocked."""

from __future__ import annotations

from typing import Any

from forge_core.api import DOC_IDS
from forge_plugins.attention.options import SdpaOptions

SDPA_DENSE_MASK = "sdpa.dense-mask-long-seq"


def check_sdpa_dense_mask(ctx: Any) -> str | None:
    """Warning: sdpa's dense document mask at long sequence lengths."""
    backend = ctx.specs.get("attention")
    if backend is None or backend.name != "sdpa" or DOC_IDS not in ctx.emitted:
        return None
    options = ctx.config.attention.options
    threshold = getattr(options, "dense_mask_warn_seq_len", SdpaOptions().dense_mask_warn_seq_len)
    seq_len = ctx.config.data.seq_len
    if seq_len < threshold:
        return None
    mib = seq_len * seq_len / 2**20
    return (
        f"with document isolation, sdpa builds a dense {seq_len}x{seq_len} boolean mask "
        f"every forward ({mib:.0f} MiB per batch row) and cannot use the flash kernel, so "
        "attention computes every masked entry; flex's BlockMask costs about "
        f"{(seq_len // 128) ** 2 * 16 / 1024:.0f} KiB per row and skips masked blocks"
    )


def rules() -> list[Any]:
    from forge_core.api import Rule

    return [
        Rule(
            id=SDPA_DENSE_MASK,
            severity="warning",
            paths=("attention.backend", "data.seq_len", "data.packer"),
            summary="sdpa with document isolation builds an O(S^2) mask at long sequence lengths",
            check=check_sdpa_dense_mask,
            fix="set attention.backend=flex, or raise "
            "attention.options.dense_mask_warn_seq_len to silence this warning",
        ),
    ]
