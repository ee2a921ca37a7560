"""Registers the ``llama`` model family and its rules (no torch import here)."""

from __future__ import annotations

from forge_core.api import BLOCKS, DOC_IDS, OUTPUT_HEAD, PIPELINE, POSITIONS, TENSOR_PARALLEL, ModelSpec, hookimpl
from forge_plugins.models.options import LlamaOptions, llama_facts


@hookimpl
def forge_models() -> list[ModelSpec]:
    return [
        ModelSpec(
            name="llama",
            summary="Llama-style decoder: RMSNorm, rotary, grouped-query attention, SwiGLU",
            impl="forge_plugins.models.llama:build",
            options=LlamaOptions,
            accepts={DOC_IDS, POSITIONS},
            hf_export="forge_plugins.models.hf_interop:export",
            max_seq_len_option="max_seq_len",
            supports={BLOCKS, TENSOR_PARALLEL, PIPELINE, OUTPUT_HEAD},
            facts=llama_facts,
        )
    ]


@hookimpl
def forge_rules() -> list:
    from forge_plugins.models.rules import rules

    return rules()
