"""Options of the ``llama`` model (no torch import: read by ``forge-run check``)."""

from __future__ import annotations

import attrs

from forge_core.api import ModelFacts, above, at_least

_count = at_least(1)


def _doc(text: str) -> dict[str, str]:
    return {"doc": text}


@attrs.frozen
class LlamaOptions:
    dim: int = attrs.field(default=256, validator=_count, metadata=_doc("Hidden size."))
    n_layers: int = attrs.field(
        default=4, validator=_count, metadata=_doc("Transformer blocks.")
    )
    n_heads: int = attrs.field(
        default=8, validator=_count, metadata=_doc("Query heads; head dim is dim / n_heads.")
    )
    n_kv_heads: int = attrs.field(
        default=4,
        validator=_count,
        metadata=_doc("Key/value heads (grouped-query attention); must divide n_heads."),
    )
    ffn_hidden: int = attrs.field(
        default=0,
        validator=at_least(0),
        metadata=_doc(
            "SwiGLU hidden size; 0 computes it the Llama way: 2/3 of 4 * dim, rounded up "
            "to a multiple of multiple_of."
        ),
    )
    multiple_of: int = attrs.field(
        default=64,
        validator=_count,
        metadata=_doc("Rounding of the computed SwiGLU hidden size (when ffn_hidden is 0)."),
    )
    norm_eps: float = attrs.field(
        default=1e-5, validator=above(0), metadata=_doc("RMSNorm epsilon.")
    )
    rope_theta: float = attrs.field(
        default=10000.0, validator=above(0), metadata=_doc("Rotary embedding base.")
    )
    max_seq_len: int = attrs.field(
        default=2048,
        validator=_count,
        metadata=_doc("Longest sequence (and largest position) the rotary table covers."),
    )
    tie_embeddings: bool = attrs.field(
        default=False,
        metadata=_doc("Share the token embedding matrix with the output projection."),
    )
    init_std: float = attrs.field(
        default=0.02,
        validator=above(0),
        metadata=_doc(
            "Std of the normal init of embeddings and linear weights; the output "
            "projections of each block (wo, w2) use init_std / sqrt(2 * n_layers)."
        ),
    )
    init_from_hf: str = attrs.field(
        default="",
        metadata=_doc(
            "Path to a local Hugging Face Llama folder (config.json + safetensors) to "
            "initialise from, to continue pretraining; its shapes must match these "
            "options and its vocabulary is used. Empty: random init."
        ),
    )


def ffn_hidden_size(options: LlamaOptions) -> int:
    """The SwiGLU hidden size the options resolve to."""
    if options.ffn_hidden:
        return options.ffn_hidden
    hidden = int(2 * (4 * options.dim) / 3)
    return options.multiple_of * ((hidden + options.multiple_of - 1) // options.multiple_of)


def llama_facts(options: LlamaOptions) -> ModelFacts:
    """What the parallelism rules need to know (``ModelSpec.facts``)."""
    return ModelFacts(blocks=options.n_layers, heads=options.n_heads, kv_heads=options.n_kv_heads,
                      tied_embeddings=options.tie_embeddings)
