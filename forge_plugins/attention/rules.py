"""Compatibility rules of the attention backends: plain check functions over a
:class:`~forge_core.rules.RuleContext` (config and chosen specs only, no torch)."""

from __future__ import annotations

from typing import Any

from forge_core.specs import DOC_IDS
from forge_plugins.attention.options import SdpaOptions

HONOURS_DOC_IDS = "attention.honours-doc-ids"
SDPA_DENSE_MASK = "sdpa.dense-mask-long-seq"


def check_honours_doc_ids(ctx: Any) -> str | None:
    """Error: the packer isolates documents but the backend would let them attend across."""
    backend = ctx.specs.get("attention")
    if backend is None or DOC_IDS not in ctx.emitted or DOC_IDS in backend.honours:
        return None
    return (
        f"packer {ctx.config.data.packer!r} emits doc_ids to keep packed documents apart, "
        f"but attention backend {backend.name!r} does not honour doc_ids: every token would "
        "attend to the earlier documents of its row while the loss still looks normal"
    )


def check_sdpa_dense_mask(ctx: Any) -> str | None:
    """Warning: sdpa's dense document mask at long sequence lengths."""
    backend = ctx.specs.get("attention")
    if backend is None or backend.name != "sdpa" or DOC_IDS not in ctx.emitted:
        return None
    options = ctx.config.attention.options
    threshold = getattr(
        options, "dense_mask_warn_seq_len", SdpaOptions().dense_mask_warn_seq_len
    )
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
    from forge_core.rules import Rule

    return [
        Rule(
            id=HONOURS_DOC_IDS,
            severity="error",
            paths=("data.packer", "attention.backend"),
            summary="A packer that emits doc_ids needs an attention backend that honours them",
            check=check_honours_doc_ids,
            fix="choose a backend that honours doc_ids (attention.backend=flex or sdpa), or a "
            "packer that does not isolate documents",
        ),
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
