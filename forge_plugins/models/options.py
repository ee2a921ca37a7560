"""Options of the ``llama`` model (no torch import: read by ``forge-run check``).

One model, five families of Hugging Face checkpoints (``family``): ``llama`` (Llama 1-3,
optionally with biases), ``qwen2`` (biases on q/k/v), ``qwen3`` (RMSNorm on each query
and key head), ``mistral`` (a Llama that may declare a sliding window) and ``olmo2``
(OLMo 2: the block's norms on the outputs of attention and MLP before the residual add,
and RMSNorm over the whole query and key projections). They share the blocks, the
tensor-parallel plan and the pipeline split; a family only adds or moves parameters.

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

from forge_core.api import (
    ModelFacts,
    Validator,
    above,
    at_least,
    non_blank,
    option,
    path_fits,
    satisfies,
)

FAMILIES = ("llama", "qwen2", "qwen3", "mistral", "olmo2")
ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "llama3")
_UNSET = "null: from init_from_hf's config.json, else "


def unset_or(validator: Validator) -> Validator:
    """``validator``, or ``None`` (unset)."""
    return satisfies(f"{validator.description} (or null)", lambda v: v is None or validator.test(v))


_count = unset_or(at_least(1))


@attrs.frozen
class RopeScaling:
    """Rotary scaling, as transformers' ``rope_parameters`` / ``rope_scaling`` for Llama."""

    type: Literal["default", "linear", "dynamic", "yarn", "llama3"] = option(
        "default",
        "default: plain rotary; linear: positions divided by factor; llama3: Llama 3.1 "
        "frequency bands; yarn: YaRN ramp and attention factor; dynamic: dynamic NTK, "
        "accepted while max_seq_len <= original_max_position_embeddings, where it is "
        "the plain rotary (transformers recomputes it from the longest sequence seen "
        "beyond that, which no fixed table reproduces). longrope is refused.",
    )
    factor: float = option(1.0, "Scaling factor.", above(0))
    original_max_position_embeddings: int = option(
        0,
        "Context length of pretraining (llama3, yarn, dynamic); 0: unset.",
        at_least(0),
    )
    low_freq_factor: float = option(1.0, "llama3.", above(0))
    high_freq_factor: float = option(4.0, "llama3.", above(0))
    beta_fast: float = option(32.0, "yarn.", above(0))
    beta_slow: float = option(1.0, "yarn.", above(0))
    attention_factor: float = option(
        0.0,
        "yarn: scale of cos/sin; 0 computes 0.1 * ln(factor) + 1.",
        at_least(0),
    )
    truncate: bool = option(True, "yarn: round the correction range.")


@attrs.frozen
class MoEOptions:
    """Mixture-of-experts feed-forward blocks (``model.options.moe``); see
    :mod:`forge_plugins.models.moe` for what each option computes."""

    num_experts: int = option(8, "Routed experts of each MoE block.", at_least(1))
    top_k: int = option(2, "Routed experts each token is sent to (at most num_experts).", at_least(1))
    expert_hidden: int = option(
        256, "SwiGLU hidden size of one routed expert (Hugging Face moe_intermediate_size).", at_least(1)
    )
    every: int = option(
        1,
        "Block i (from 0) is an MoE block when (i + 1) % every == 0: 1 makes every block MoE, "
        "2 the second, fourth, ... Ignored when layers is given.",
        at_least(1),
    )
    layers: list[int] | None = option(
        None, "The indices (from 0) of the MoE blocks, overriding every; null: from every."
    )
    shared_experts: int = option(
        0,
        "Shared experts every token goes through, computed as one dense SwiGLU of width "
        "shared_experts * expert_hidden (or shared_hidden); 0: none.",
        at_least(0),
    )
    shared_hidden: int | None = option(
        None,
        "Hidden size of the shared experts' SwiGLU; null: shared_experts * expert_hidden.",
        unset_or(at_least(1)),
    )
    router: Literal["softmax", "sigmoid"] = option(
        "softmax",
        "softmax: probabilities over all experts, the top_k kept (Mixtral, Qwen3-MoE); sigmoid: an "
        "independent score per expert, the top_k kept (DeepSeek-V3).",
    )
    normalize_weights: bool = option(
        False,
        "Divide each token's top_k weights by their sum (Hugging Face norm_topk_prob); usual with "
        "sigmoid, and with softmax it gives Mixtral's softmax over the kept logits.",
    )
    route_scale: float = option(
        1.0, "Factor on every routed weight (DeepSeek-V3 routed_scaling_factor).", above(0)
    )
    capacity_factor: float = option(
        0.0,
        "0: dropless (every assignment computed). Above 0: each expert takes at most "
        "ceil(capacity_factor * seq_len * top_k / num_experts) assignments of each row, kept by "
        "router weight (descending), then position; the others are dropped (the token keeps its "
        "residual and its other experts). Training forwards only: evaluation and sampling are dropless.",
        at_least(0),
    )
    aux_loss: float = option(
        0.0,
        "Coefficient of the load-balancing loss E * sum_e f_e * P_e (f_e: fraction of "
        "assignments to expert e, P_e: mean router probability of e); 0: off.",
        at_least(0),
    )
    aux_loss_scope: Literal["batch", "sequence"] = option(
        "batch",
        "Over which tokens f and P of the balancing loss are taken: batch (every token of the "
        "forward) or sequence (each document: a row, or under packing each packed document).",
    )
    z_loss: float = option(
        0.0, "Coefficient of the router z-loss, the mean of logsumexp(router logits)^2; 0: off.", at_least(0)
    )
    bias_update_rate: float = option(
        0.0,
        "Loss-free balancing (DeepSeek-V3): after each optimizer step every expert's selection "
        "bias moves by rate * sign(mean load - its load); the bias changes which experts are "
        "chosen, never the weights. 0: off.",
        at_least(0),
    )
    kernel: Literal["grouped", "loop"] = option(
        "grouped",
        "How the experts compute: grouped (one grouped GEMM per projection, torch._grouped_mm where "
        "the dtype and shapes allow it) or loop (one matmul per expert: the reference).",
    )


@attrs.frozen
class LlamaOptions:
    family: Literal["llama", "qwen2", "qwen3", "mistral", "olmo2"] | None = option(
        None,
        "Checkpoint family: llama, qwen2 (q/k/v biases), qwen3 (per-head q/k RMSNorm), "
        "mistral (may declare a sliding window), olmo2 (norms after attention and MLP, "
        "q/k RMSNorm over the whole projection). Decides the parameters and the "
        f"architecture export-hf writes. {_UNSET}llama.",
    )
    dim: int | None = option(None, f"Hidden size. {_UNSET}256.", _count)
    n_layers: int | None = option(None, f"Transformer blocks. {_UNSET}4.", _count)
    n_heads: int | None = option(None, f"Query heads. {_UNSET}8.", _count)
    n_kv_heads: int | None = option(
        None,
        f"Key/value heads (grouped-query attention); must divide n_heads. {_UNSET}4.",
        _count,
    )
    head_dim: int | None = option(None, f"Width of a head (even: rotary). {_UNSET}dim / n_heads.", _count)
    ffn_hidden: int | None = option(
        None,
        f"SwiGLU hidden size. {_UNSET}computed the Llama way (as for 0): 2/3 of 4 * dim, "
        "rounded up to a multiple of multiple_of.",
        unset_or(at_least(0)),
    )
    multiple_of: int = option(64, "Rounding of the computed SwiGLU hidden size.", at_least(1))
    norm_eps: float | None = option(None, f"RMSNorm epsilon. {_UNSET}1e-5.", unset_or(above(0)))
    rope_theta: float | None = option(None, f"Rotary embedding base. {_UNSET}10000.", unset_or(above(0)))
    rope_scaling: RopeScaling | None = option(
        None,
        f"Rotary scaling (the keys below). {_UNSET}no scaling (type: default).",
    )
    max_seq_len: int | None = option(
        None,
        "Longest sequence (and largest position) the rotary table covers. "
        f"{_UNSET}2048; from a checkpoint: max_position_embeddings, or its sliding "
        "window when that is shorter. Lower it to save the table's memory.",
        _count,
    )
    tie_embeddings: bool | None = option(
        None,
        f"Share the token embedding matrix with the output projection. {_UNSET}false.",
    )
    attention_bias: bool | None = option(
        None,
        "Biases on the q/k/v/o projections (families llama, qwen3, olmo2; qwen2 always has "
        f"q/k/v biases and no o bias). {_UNSET}false.",
    )
    mlp_bias: bool | None = option(None, f"Biases on the SwiGLU projections (family llama). {_UNSET}false.")
    sliding_window: int | None = option(
        None,
        "Sliding-window length of a mistral checkpoint; 0: none. Forge's attention "
        "backends attend to the whole causal context, so a window shorter than "
        f"max_seq_len is refused by a rule. {_UNSET}0.",
        unset_or(at_least(0)),
    )
    init_std: float = option(
        0.02,
        "Std of the normal init of embeddings and linear weights; the output "
        "projections of each block (wo, w2) use init_std / sqrt(2 * n_layers).",
        above(0),
    )
    init_from_hf: str = option(
        "",
        "The checkpoint to start from: a local Hugging Face folder (config.json + "
        "safetensors, one file or sharded) or a Hub id (org/name, when no such local "
        "path exists, found in the Hugging Face cache and downloaded into it by "
        "`forge-run train` unless HF_HUB_OFFLINE is set) of a LlamaForCausalLM, "
        "Qwen2ForCausalLM, Qwen3ForCausalLM, MistralForCausalLM, Qwen3MoeForCausalLM or "
        "MixtralForCausalLM (the qwen3 and mistral families with moe). Every unset option "
        "is read from its config.json, and the routing options of moe left at their "
        "defaults; an option given here that differs is an error. Each process reads only "
        "the weights it holds. Empty: random init.",
        path_fits,
    )
    revision: str = option(
        "main",
        "The branch, tag or commit of an init_from_hf Hub id (not used for a local "
        "folder). A branch or tag is resolved to the commit it points at in the local "
        "cache when the config is loaded, so the run's config.yaml records that commit "
        "and a resume whose cache has moved on is told the revision changed.",
        non_blank,
    )
    moe: MoEOptions | None = option(
        None,
        "Mixture-of-experts feed-forward blocks (the keys below); null: every block is dense.",
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
    #: ``"head"``: an RMSNorm over each head's channels (qwen3); ``"projection"``: over the
    #: whole query and key projections, every head together (olmo2); ``None``: none.
    qk_norm: Literal["head", "projection"] | None
    #: The block's two norms apply to the outputs of attention and MLP, before the
    #: residual add, instead of to their inputs (olmo2).
    post_norm: bool


def features(options: LlamaOptions) -> Features:
    """What the (resolved) options add: qwen2 has q/k/v biases, qwen3 per-head q/k norms,
    olmo2 whole-projection q/k norms and norms after each sub-layer; llama, qwen3 and olmo2
    may have biases on every attention projection, llama on the MLP too."""
    family = options.family or "llama"
    bias = bool(options.attention_bias)
    return Features(
        qkv_bias=family == "qwen2" or bias,
        out_bias=bias and family != "qwen2",
        mlp_bias=bool(options.mlp_bias),
        qk_norm={"qwen3": "head", "olmo2": "projection"}.get(family),
        post_norm=family == "olmo2",
    )


def is_moe_layer(options: LlamaOptions, index: int) -> bool:
    """Whether block ``index`` (from 0) has an MoE feed-forward: listed in ``moe.layers``,
    or, without a list, ``(index + 1) % moe.every == 0``."""
    moe = options.moe
    if moe is None:
        return False
    if moe.layers is not None:
        return index in moe.layers
    return (index + 1) % moe.every == 0


def held_roles(options: LlamaOptions) -> dict[str, str]:
    """The roles of :data:`ROLES` that some block holds: when every block is a
    mixture-of-experts one, no block has the dense MLP projections."""
    if all(is_moe_layer(options, i) for i in range(options.n_layers)):
        return {role: path for role, path in ROLES.items() if not role.startswith("mlp.")}
    return dict(ROLES)


def llama_facts(options: LlamaOptions) -> ModelFacts:
    """What the parallelism rules need to know (``ModelSpec.facts``): the shapes the
    options resolve to, so a model started from a checkpoint is judged by the
    checkpoint's ``config.json`` (the loader has filled the unset options from it)."""
    options = with_defaults(options)
    return ModelFacts(
        blocks=options.n_layers,
        heads=options.n_heads,
        kv_heads=options.n_kv_heads,
        tied_embeddings=bool(options.tie_embeddings),
        roles=frozenset(held_roles(options)),
        experts=0 if options.moe is None else options.moe.num_experts,
    )


#: The block projections by role (``ParallelContract.roles``), what model transforms
#: (LoRA) target: the attention's q/k/v/o and the SwiGLU MLP's gate, up and down.
ROLES = {
    "attention.q": "attention.wq",
    "attention.k": "attention.wk",
    "attention.v": "attention.wv",
    "attention.o": "attention.wo",
    "mlp.gate": "feed_forward.w1",
    "mlp.up": "feed_forward.w3",
    "mlp.down": "feed_forward.w2",
}
