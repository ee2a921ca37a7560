"""Options of the ``llama`` model (no torch import: read by ``forge-run check``).

One model, four families of Hugging Face checkpoints (``family``): ``llama`` (Llama 1-3,
optionally with biases), ``qwen2`` (biases on q/k/v), ``qwen3`` (RMSNorm on each query
and key head) and ``mistral`` (a Llama that may declare a sliding window). They share the
blocks, the tensor-parallel plan and the pipeline split; a family only adds parameters.

**Unset options.** The shape and family options default to ``None`` ("unset"). The
loader fills every unset option before any rule or build sees it
(:func:`forge_plugins.models.hf_config.resolve_options`, named by the spec's
``resolve_options``): from the ``init_from_hf`` folder's ``config.json`` when it is set
and readable, else from :data:`DEFAULTS`. An option given in the config is never
replaced, so after resolution an option that differs from the checkpoint was given
explicitly, and the ``llama.init-from-hf`` rule reports it with both values. Two unset
options stay derived: ``head_dim`` (``dim / n_heads``) and ``ffn_hidden`` (the Llama
rounding of ``8/3 * dim``); read them through :func:`head_dim` and
:func:`ffn_hidden_size`.
"""

from __future__ import annotations

from typing import Any, Literal

import attrs

from forge_core.api import ModelFacts, Validator, above, at_least, satisfies

FAMILIES = ("llama", "qwen2", "qwen3", "mistral")
ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "llama3")
_UNSET = "null: from init_from_hf's config.json, else "


def _doc(text: str) -> dict[str, str]:
    return {"doc": text}


def unset_or(validator: Validator) -> Validator:
    """``validator``, or ``None`` (unset)."""
    return satisfies(f"{validator.description} (or null)", lambda v: v is None or validator.test(v))


_count = unset_or(at_least(1))


@attrs.frozen
class RopeScaling:
    """Rotary scaling, as transformers' ``rope_parameters`` / ``rope_scaling`` for Llama."""

    type: Literal["default", "linear", "dynamic", "yarn", "llama3"] = attrs.field(
        default="default",
        metadata=_doc(
            "default: plain rotary; linear: positions divided by factor; llama3: Llama 3.1 "
            "frequency bands; yarn: YaRN ramp and attention factor; dynamic: dynamic NTK, "
            "accepted while max_seq_len <= original_max_position_embeddings, where it is "
            "the plain rotary (transformers recomputes it from the longest sequence seen "
            "beyond that, which no fixed table reproduces). longrope is refused."
        ),
    )
    factor: float = attrs.field(default=1.0, validator=above(0), metadata=_doc("Scaling factor."))
    original_max_position_embeddings: int = attrs.field(
        default=0,
        validator=at_least(0),
        metadata=_doc("Context length of pretraining (llama3, yarn, dynamic); 0: unset."),
    )
    low_freq_factor: float = attrs.field(default=1.0, validator=above(0), metadata=_doc("llama3."))
    high_freq_factor: float = attrs.field(default=4.0, validator=above(0), metadata=_doc("llama3."))
    beta_fast: float = attrs.field(default=32.0, validator=above(0), metadata=_doc("yarn."))
    beta_slow: float = attrs.field(default=1.0, validator=above(0), metadata=_doc("yarn."))
    attention_factor: float = attrs.field(
        default=0.0,
        validator=at_least(0),
        metadata=_doc("yarn: scale of cos/sin; 0 computes 0.1 * ln(factor) + 1."),
    )
    truncate: bool = attrs.field(default=True, metadata=_doc("yarn: round the correction range."))


@attrs.frozen
class LlamaOptions:
    family: Literal["llama", "qwen2", "qwen3", "mistral"] | None = attrs.field(
        default=None,
        metadata=_doc(
            "Checkpoint family: llama, qwen2 (q/k/v biases), qwen3 (per-head q/k RMSNorm), "
            "mistral (may declare a sliding window). Decides the parameters and the "
            f"architecture export-hf writes. {_UNSET}llama."
        ),
    )
    dim: int | None = attrs.field(default=None, validator=_count, metadata=_doc(f"Hidden size. {_UNSET}256."))
    n_layers: int | None = attrs.field(
        default=None, validator=_count, metadata=_doc(f"Transformer blocks. {_UNSET}4.")
    )
    n_heads: int | None = attrs.field(default=None, validator=_count, metadata=_doc(f"Query heads. {_UNSET}8."))
    n_kv_heads: int | None = attrs.field(
        default=None,
        validator=_count,
        metadata=_doc(f"Key/value heads (grouped-query attention); must divide n_heads. {_UNSET}4."),
    )
    head_dim: int | None = attrs.field(
        default=None,
        validator=_count,
        metadata=_doc(f"Width of a head (even: rotary). {_UNSET}dim / n_heads."),
    )
    ffn_hidden: int | None = attrs.field(
        default=None,
        validator=unset_or(at_least(0)),
        metadata=_doc(
            f"SwiGLU hidden size. {_UNSET}computed the Llama way (as for 0): 2/3 of 4 * dim, "
            "rounded up to a multiple of multiple_of."
        ),
    )
    multiple_of: int = attrs.field(
        default=64,
        validator=at_least(1),
        metadata=_doc("Rounding of the computed SwiGLU hidden size."),
    )
    norm_eps: float | None = attrs.field(
        default=None, validator=unset_or(above(0)), metadata=_doc(f"RMSNorm epsilon. {_UNSET}1e-5.")
    )
    rope_theta: float | None = attrs.field(
        default=None, validator=unset_or(above(0)), metadata=_doc(f"Rotary embedding base. {_UNSET}10000.")
    )
    rope_scaling: RopeScaling | None = attrs.field(
        default=None,
        metadata=_doc(f"Rotary scaling (the keys below). {_UNSET}no scaling (type: default)."),
    )
    max_seq_len: int | None = attrs.field(
        default=None,
        validator=_count,
        metadata=_doc(
            "Longest sequence (and largest position) the rotary table covers. "
            f"{_UNSET}2048; from a checkpoint: max_position_embeddings, or its sliding "
            "window when that is shorter. Lower it to save the table's memory."
        ),
    )
    tie_embeddings: bool | None = attrs.field(
        default=None,
        metadata=_doc(f"Share the token embedding matrix with the output projection. {_UNSET}false."),
    )
    attention_bias: bool | None = attrs.field(
        default=None,
        metadata=_doc(
            "Biases on the q/k/v/o projections (families llama, qwen3; qwen2 always has "
            f"q/k/v biases and no o bias). {_UNSET}false."
        ),
    )
    mlp_bias: bool | None = attrs.field(
        default=None, metadata=_doc(f"Biases on the SwiGLU projections (family llama). {_UNSET}false.")
    )
    sliding_window: int | None = attrs.field(
        default=None,
        validator=unset_or(at_least(0)),
        metadata=_doc(
            "Sliding-window length of a mistral checkpoint; 0: none. Forge's attention "
            "backends attend to the whole causal context, so a window shorter than "
            f"max_seq_len is refused by a rule. {_UNSET}0."
        ),
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
            "Path to a local Hugging Face folder (config.json + safetensors, one file or "
            "sharded) of a LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM or "
            "MistralForCausalLM to start from. Every unset option is read from its "
            "config.json; an option given here that differs is an error. Each process "
            "reads only the weights it holds. Empty: random init."
        ),
    )


#: What an unset option becomes without a checkpoint (head_dim and ffn_hidden stay
#: derived, see the module docstring).
DEFAULTS: dict[str, Any] = {
    "family": "llama",
    "dim": 256,
    "n_layers": 4,
    "n_heads": 8,
    "n_kv_heads": 4,
    "norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "rope_scaling": RopeScaling(),
    "max_seq_len": 2048,
    "tie_embeddings": False,
    "attention_bias": False,
    "mlp_bias": False,
    "sliding_window": 0,
}


def with_defaults(options: LlamaOptions, values: dict[str, Any] | None = None) -> LlamaOptions:
    """``options`` with every unset option taken from ``values`` (a checkpoint's), else
    from :data:`DEFAULTS`. Options already set are kept."""
    values = values or {}
    filled = {
        name: values.get(name, default)
        for name, default in DEFAULTS.items()
        if getattr(options, name) is None
    }
    for name in ("head_dim", "ffn_hidden"):
        if getattr(options, name) is None and values.get(name) is not None:
            filled[name] = values[name]
    return attrs.evolve(options, **filled) if filled else options


def head_dim(options: LlamaOptions) -> int:
    """The width of a head the options resolve to."""
    options = with_defaults(options)
    return options.head_dim or options.dim // options.n_heads


def ffn_hidden_size(options: LlamaOptions) -> int:
    """The SwiGLU hidden size the options resolve to."""
    options = with_defaults(options)
    if options.ffn_hidden:
        return options.ffn_hidden
    hidden = int(2 * (4 * options.dim) / 3)
    return options.multiple_of * ((hidden + options.multiple_of - 1) // options.multiple_of)


@attrs.frozen
class Features:
    """The parameters a family adds to the plain Llama block."""

    qkv_bias: bool
    out_bias: bool
    mlp_bias: bool
    qk_norm: bool


def features(options: LlamaOptions) -> Features:
    """What the (resolved) options add: qwen2 has q/k/v biases, qwen3 q/k norms, llama and
    qwen3 may have biases on every attention projection, llama on the MLP too."""
    family = options.family or "llama"
    bias = bool(options.attention_bias)
    return Features(
        qkv_bias=family == "qwen2" or bias,
        out_bias=bias and family != "qwen2",
        mlp_bias=bool(options.mlp_bias),
        qk_norm=family == "qwen3",
    )


def llama_facts(options: LlamaOptions) -> ModelFacts:
    """What the parallelism rules need to know (``ModelSpec.facts``): the shapes the
    options resolve to, so a model started from a checkpoint is judged by the
    checkpoint's ``config.json`` (the loader has filled the unset options from it)."""
    options = with_defaults(options)
    return ModelFacts(blocks=options.n_layers, heads=options.n_heads, kv_heads=options.n_kv_heads,
                      tied_embeddings=bool(options.tie_embeddings))
