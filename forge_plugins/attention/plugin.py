"""Registers the built-in attention backends and their rules (no torch import here)."""

from __future__ import annotations

from forge_core.api import DOC_IDS, QUERY_SHARDS, AttentionBackendSpec, NoOptions, hookimpl
from forge_plugins.attention.options import FlexOptions, SdpaOptions


@hookimpl
def forge_attention_backends() -> list[AttentionBackendSpec]:
    return [
        AttentionBackendSpec(
            name="sdpa",
            summary="scaled_dot_product_attention; causal flash path, dense O(S^2) mask with doc_ids",
            impl="forge_plugins.attention.sdpa:SdpaAttention",
            options=SdpaOptions,
            honours={DOC_IDS},
            supports={QUERY_SHARDS},
        ),
        AttentionBackendSpec(
            name="flex",
            summary="Compiled FlexAttention with a BlockMask; scales to long packed rows",
            impl="forge_plugins.attention.flex:FlexAttention",
            options=FlexOptions,
            honours={DOC_IDS},
            supports={QUERY_SHARDS},
        ),
        AttentionBackendSpec(
            name="eager",
            summary="Explicit softmax attention; the numerical reference, slow",
            impl="forge_plugins.attention.eager:EagerAttention",
            options=NoOptions,
            honours={DOC_IDS},
            supports={QUERY_SHARDS},
        ),
    ]


@hookimpl
def forge_rules() -> list:
    from forge_plugins.attention.rules import rules

    return rules()
