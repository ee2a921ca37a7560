"""The family report: which fields of a Hugging Face ``config.json`` Forge does not honour
(no torch).

Every key of a ``config.json`` is one of three things for its ``model_type``:

- **read**: a field of :data:`~forge_plugins.models.hf_fields.FIELDS` the family has, or
  one read beside them (:data:`READ`, :data:`READ_BY`: the model type, the rotary dict,
  qwen's ``layer_types``, the MoE layer list);
- **ignored, with the reason**: :data:`IGNORED` (every family) and :data:`IGNORED_BY`
  (some), fields that decide nothing Forge computes from a checkpoint (token ids, what
  transformers' forward returns, the dtype the weights are stored in). A few are
  ignored only at the value that changes nothing (``attention_dropout: 0``); another
  value is reported with its fix;
- anything else is **reported**, naming the field and its value: Forge would build the
  model without it, which is never done silently (as Mistral's ``sliding_window: null``
  once was read as the class default). A ``null`` sets nothing and is not reported.

A ``model_type`` Forge does not import is refused with the list of what is missing: what
its architecture needs that no field says (:data:`NEEDS`, for the families people ask
for), then every field outside those each family reads (:func:`unsupported_report`).
"""

from __future__ import annotations

from typing import Any

import attrs

from forge_plugins.models.hf_fields import FIELDS, MODEL_TYPES, json_shown


@attrs.frozen
class Ignored:
    """A field Forge does not read, and why that changes nothing. ``harmless``: the only
    values at which it changes nothing (empty: any value); ``fix`` for another value."""

    reason: str
    harmless: tuple[Any, ...] = ()
    fix: str = ""


#: Read beside :data:`~forge_plugins.models.hf_fields.FIELDS` by every family
#: (:mod:`~forge_plugins.models.hf_config`, :mod:`~forge_plugins.models.hf_folder`).
READ = (
    "model_type",
    "architectures",
    "auto_map",
    "rope_parameters",
    "rope_scaling",
    "rope_theta",
    "partial_rotary_factor",
)
#: ... and by some (qwen's per-layer attention, the MoE layers and expert count).
READ_BY = {
    "qwen2": ("layer_types",),
    "qwen3": ("layer_types",),
    "qwen3_moe": ("mlp_only_layers", "num_experts"),
    "mixtral": ("num_experts",),
}

_TOKENS = Ignored("a token id: the tokenizer's, which Forge reads from the tokenizer (data.tokenizer)")
_OUTPUTS = Ignored("what transformers' forward returns, not what it computes")
_SAMPLING = Ignored("a sampling default of transformers' generate; forge-run sample has its own options")
_NO_DROPOUT = "Forge's model applies no dropout; set it to 0 in config.json to train without it"

IGNORED: dict[str, Ignored] = {
    "transformers_version": Ignored("the version of transformers that wrote the file"),
    "_name_or_path": Ignored("where the checkpoint was loaded from when it was saved"),
    "dtype": Ignored("the dtype the weights are stored in; Forge casts them to the run's precision"),
    "torch_dtype": Ignored("the dtype the weights are stored in; Forge casts them to the run's precision"),
    "use_cache": Ignored("an inference switch of transformers; Forge's sampling always caches"),
    "initializer_range": Ignored(
        "the spread of a fresh initialisation; the checkpoint is the init (model.options.init_std "
        "for a fresh one)"
    ),
    "tokenizer_class": Ignored("the tokenizer's class; Forge's tokenizer is data.tokenizer"),
    "_attn_implementation_autoset": Ignored("which attention kernel transformers chose when it saved"),
    "is_llama_config": Ignored("a marker nanotron writes (SmolLM): the file is a llama's"),
    "rope_interleaved": Ignored(
        "rotary on interleaved channel pairs",
        (False,),
        "Forge rotates the two halves of each head (transformers' rotate_half), as the weights expect "
        "at false",
    ),
    "use_mrope": Ignored(
        "Qwen2-VL's multimodal rotary", (False,), "Forge's rotary has one position per token, not three"
    ),
    "attention_dropout": Ignored("dropout on the attention weights", (0, 0.0), _NO_DROPOUT),
    "embd_pdrop": Ignored("dropout on the embeddings", (0, 0.0), _NO_DROPOUT),
    "resid_pdrop": Ignored("dropout on the residual branches", (0, 0.0), _NO_DROPOUT),
    "output_router_logits": _OUTPUTS,
    "router_aux_loss_coef": Ignored(
        "the weight of transformers' load-balancing loss in training; Forge's is model.options.moe.aux_loss"
    ),
    "chunk_size_feed_forward": Ignored(
        "transformers computes the MLP in chunks of this many positions, the same values"
    ),
    "id2label": Ignored("labels of a classification head, which a causal language model has not"),
    "label2id": Ignored("labels of a classification head, which a causal language model has not"),
    "problem_type": Ignored("the loss of a classification head, which a causal language model has not"),
    "is_encoder_decoder": Ignored(
        "false for a decoder-only model", (False,), "an encoder-decoder model is not a llama"
    ),
    # Fields of other families (read where the family has them), harmless when off.
    **dict.fromkeys(
        ("attention_bias", "mlp_bias"),
        Ignored(
            "biases this family's architecture does not have",
            (False,),
            "transformers builds this family without them, so the checkpoint is another architecture",
        ),
    ),
    "use_sliding_window": Ignored(
        "a switch of qwen's windowed layers", (False,), "this family's attention has no window"
    ),
    "pretraining_tp": Ignored(
        "a split of the projections, the same product at 1", (1,), "Forge computes the projections whole"
    ),
    "pruned_heads": Ignored(
        "heads removed from attention", ({},), "a checkpoint with pruned heads has heads of unequal count"
    ),
    **dict.fromkeys(("bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id"), _TOKENS),
    **dict.fromkeys(
        ("return_dict", "output_attentions", "output_hidden_states", "torchscript", "use_return_dict"),
        _OUTPUTS,
    ),
    # Older files (transformers 4) carried generate's defaults in config.json.
    **dict.fromkeys(
        (
            "max_length",
            "min_length",
            "do_sample",
            "early_stopping",
            "num_beams",
            "temperature",
            "top_k",
            "top_p",
            "repetition_penalty",
            "length_penalty",
            "no_repeat_ngram_size",
            "num_return_sequences",
        ),
        _SAMPLING,
    ),
}
#: Ignored by some families only.
IGNORED_BY: dict[str, dict[str, Ignored]] = {
    "qwen3_moe": {
        # Real Qwen3-MoE files carry it; Qwen3MoeConfig has no such field.
        "max_window_layers": Ignored(
            "transformers' Qwen3-MoE does not read it: with use_sliding_window every layer is windowed"
        ),
    },
}

#: What an architecture Forge does not import needs beyond any field of its config.json.
NEEDS = {
    "gemma3_text": (
        "embeddings multiplied by sqrt(hidden_size)",
        "RMSNorm weights applied as (1 + w)",
        "a norm before and after both attention and the MLP",
        "per-head q/k RMSNorm",
        "sliding-window layers among global ones, each kind with its own rotary base",
        "a GELU-tanh MLP",
    ),
    "phi3": (
        "q, k and v fused into one qkv_proj and gate and up into one gate_up_proj",
        "LongRoPE (su) rotary scaling where rope_scaling sets it",
    ),
    "deepseek_v3": (
        "multi-head latent attention (low-rank queries and keys/values with a decoupled rotary part)",
        "sigmoid routing with group-limited top-k and a correction bias",
        "shared experts",
        "dense first layers",
        "multi-token prediction layers",
    ),
    "gpt_oss": (
        "attention sinks (a learned logit per head)",
        "alternating sliding-window layers",
        "an MoE with a clamped SwiGLU and biases on the experts and router",
    ),
}
NEEDS["gemma3"] = ("a vision tower (Gemma 3 is multimodal)", *NEEDS["gemma3_text"])


def read_by(family: str) -> frozenset[str]:
    """The keys a family's import reads."""
    fields = (field.name for field in FIELDS if family in field.families)
    return frozenset((*fields, *READ, *READ_BY.get(family, ())))


def _ignored(family: str | None) -> dict[str, Ignored]:
    return {**IGNORED, **IGNORED_BY.get(family or "", {})}


def _unread(config: dict[str, Any], read: frozenset[str], family: str | None) -> list[tuple[str, str]]:
    """``(key, why)`` of every non-null key neither read nor harmlessly ignored; ``why``
    is empty for a key Forge knows nothing of."""
    ignored = _ignored(family)
    found = []
    for key in sorted(config):
        value = config[key]
        if value is None or key in read:
            continue
        rule = ignored.get(key)
        if rule is None:
            found.append((key, ""))
        elif rule.harmless and not any(value == ok and type(value) is type(ok) for ok in rule.harmless):
            found.append((key, f"{rule.reason}: {rule.fix}"))
    return found


def unread_fields(config: dict[str, Any], family: str, architecture: str) -> list[str]:
    """One problem per field of a ``config.json`` of a family Forge imports that Forge
    would not honour, naming the field, its value and the fix."""
    problems = []
    for key, why in _unread(config, read_by(family), family):
        shown = f"config.json {key}={json_shown(config[key])}"
        if why:
            problems.append(f"{shown}: {why}")
        else:
            problems.append(
                f"{shown} is not a field Forge reads for a {family} checkpoint, so Forge would build "
                f"the model without it; if transformers' {architecture} has no such field either "
                "(it ignores it too), remove it from config.json, else Forge cannot reproduce this "
                "checkpoint"
            )
    return problems


#: The keys every family reads: what any decoder Forge imports has in common.
_COMMON = frozenset.intersection(*(read_by(family) for family in MODEL_TYPES))


def unsupported_report(config: dict[str, Any], model_type: str) -> list[str]:
    """What an architecture Forge does not import needs: the features no field says
    (:data:`NEEDS`, when known), and every non-null field outside those each family reads."""
    problems = []
    needs = NEEDS.get(model_type)
    if needs:
        problems.append(f"a {model_type} model needs what Forge's llama lacks: {'; '.join(needs)}")
    fields = _unread(config, _COMMON, None)
    if fields:
        problems.append(
            f"config.json fields of this {model_type} checkpoint that Forge does not honour: "
            + ", ".join(f"{key}={json_shown(config[key])}" for key, _ in fields)
        )
    return problems
