"""Registers the ``llama`` model (families llama, qwen2, qwen3, mistral, olmo2) and its rules
(no torch import here)."""

from __future__ import annotations

from forge_core.api import (
    BLOCKS,
    DOC_IDS,
    OUTPUT_HEAD,
    PIPELINE,
    POSITIONS,
    SEQUENCE_PARALLEL,
    TENSOR_PARALLEL,
    ModelSpec,
    hookimpl,
)
from forge_plugins.models.options import LlamaOptions, llama_facts


@hookimpl
def forge_models() -> list[ModelSpec]:
    return [
        ModelSpec(
            name="llama",
            summary=(
                "Llama-style decoder (families llama, qwen2, qwen3, mistral, olmo2): RMSNorm, rotary, "
                "GQA, SwiGLU"
            ),
            impl="forge_plugins.models.llama:build",
            options=LlamaOptions,
            accepts={DOC_IDS, POSITIONS},
            hf_export="forge_plugins.models.hf_interop:export",
            hf_key="forge_plugins.models.hf_keys:to_hf_key",
            max_seq_len_option="max_seq_len",
            resolve_options="forge_plugins.models.hf_config:resolve_options",
            pretrained_option="init_from_hf",
            pretrained_folder="forge_plugins.models.hf_config:hf_dir",
            fetch="forge_plugins.models.hf_config:fetch",
            supports={BLOCKS, TENSOR_PARALLEL, SEQUENCE_PARALLEL, PIPELINE, OUTPUT_HEAD},
            facts=llama_facts,
        )
    ]


@hookimpl
def forge_rules() -> list:
    from forge_plugins.models.rules import rules

    return rules()
