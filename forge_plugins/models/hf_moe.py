"""The mixture-of-experts part of a Hugging Face ``config.json`` <-> ``model.options.moe``
(no torch), for the two architectures Forge reads and writes:

- ``qwen3_moe`` (``Qwen3MoeForCausalLM``): the qwen3 block (per-head q/k norms) whose
  feed-forward is sparse in layer ``i`` when ``i`` is not in ``mlp_only_layers`` and
  ``(i + 1) % decoder_sparse_step == 0`` (Forge's ``every``, or the explicit ``layers``),
  dense (``intermediate_size``) elsewhere; experts of ``moe_intermediate_size``;
- ``mixtral`` (``MixtralForCausalLM``): the mistral block, every layer sparse, experts of
  ``intermediate_size``.

Both route as Forge's ``router: softmax``: the softmax over every expert's logit, the
``num_experts_per_tok`` largest kept; Mixtral always renormalises the kept weights to sum
1 and Qwen3-MoE when ``norm_topk_prob`` (Forge's ``normalize_weights``; for Mixtral this
equals the original "top-k of the logits, then a softmax over those k"). Neither has
shared experts, a routed scale or a selection bias, so a Forge model with one of those
has no such export (:func:`export_problems`). The training-only options (capacity,
balancing losses, bias updates, kernel) are not part of a checkpoint: transformers routes
dropless, as Forge does by default.

A checkpoint decides the routing options of :data:`DECIDED`: with ``init_from_hf``, an
option of ``model.options.moe`` left at its default takes the checkpoint's value
(:func:`with_checkpoint_moe`), one set to another value that differs from the
checkpoint is an error naming both (:func:`moe_mismatches`).
"""

from __future__ import annotations

from typing import Any

import attrs

from forge_core.api.unstable import show_value
from forge_plugins.models.options import LlamaOptions, MoEOptions, is_moe_layer

#: model_type -> (the Forge family of its attention, its architecture).
MOE_TYPES = {
    "qwen3_moe": ("qwen3", "Qwen3MoeForCausalLM"),
    "mixtral": ("mistral", "MixtralForCausalLM"),
}
#: The MoE options a checkpoint decides (the rest are training choices).
DECIDED = (
    "num_experts",
    "top_k",
    "expert_hidden",
    "every",
    "layers",
    "shared_experts",
    "router",
    "normalize_weights",
    "route_scale",
)
_FIX = "correct config.json (or re-save the checkpoint with save_pretrained)"


def moe_type(options: LlamaOptions) -> str | None:
    """The Hugging Face MoE architecture of (resolved) ``options`` with experts: a qwen3
    block is Qwen3-MoE's, a llama or mistral block Mixtral's (the same block without
    biases); ``None`` without experts, or for qwen2 (Qwen2-MoE's shared expert has a
    gate of its own Forge's MoE lacks)."""
    if options.moe is None:
        return None
    return {"qwen3": "qwen3_moe", "mistral": "mixtral", "llama": "mixtral"}.get(options.family or "llama")


def expert_count_key(config: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """``config`` with Qwen3-MoE's other spelling ``num_experts`` read as
    ``num_local_experts`` (transformers' ``attribute_map``; older checkpoints write it),
    and the problem when both are there and differ."""
    if "num_experts" not in config:
        return config, []
    if "num_local_experts" in config and config["num_local_experts"] != config["num_experts"]:
        return config, [
            f"config.json num_experts={show_value(config['num_experts'])} and num_local_experts="
            f"{show_value(config['num_local_experts'])} name the same expert count differently; "
            f"keep one of them. {_FIX}"
        ]
    return {**config, "num_local_experts": config["num_experts"]}, []


def _mlp_only_layers(config: dict[str, Any]) -> tuple[list[int], list[str]]:
    value = config.get("mlp_only_layers")
    if value is None:
        return [], []  # transformers reads null and absent as no dense layer
    if not isinstance(value, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in value
    ):
        return [], [
            f"config.json mlp_only_layers={show_value(value)} must be null or a list of layer "
            f"indices (integers from 0); {_FIX}"
        ]
    return value, []


def moe_from_fields(
    config: dict[str, Any], model_type: str, fields: dict[str, Any]
) -> tuple[MoEOptions | None, list[str]]:
    """``(moe options, problems)`` from a checkpoint's checked ``fields``
    (:func:`~forge_plugins.models.hf_fields.read_fields`); ``None`` for a dense type."""
    if model_type not in MOE_TYPES:
        return None, []
    experts, top_k = fields["num_local_experts"], fields["num_experts_per_tok"]
    problems = []
    if top_k > experts:
        problems.append(
            f"config.json num_experts_per_tok={top_k} is more than the {experts} experts "
            f"(num_local_experts); each token goes to distinct experts. {_FIX}"
        )
    if model_type == "mixtral":
        if fields["router_jitter_noise"]:
            problems.append(
                f"router_jitter_noise={fields['router_jitter_noise']!r}: Forge's router multiplies no "
                "noise into its input in training; set it to 0 in config.json to train without it"
            )
        values = {"expert_hidden": fields["intermediate_size"], "normalize_weights": True}
    else:
        mlp_only, found = _mlp_only_layers(config)
        problems += found
        step, n = fields["decoder_sparse_step"], fields["num_hidden_layers"]
        values = {
            "expert_hidden": fields["moe_intermediate_size"],
            "normalize_weights": fields["norm_topk_prob"],
        }
        if mlp_only:
            values["layers"] = [i for i in range(n) if (i + 1) % step == 0 and i not in mlp_only]
        else:
            values["every"] = step
    if problems:
        return None, problems
    return MoEOptions(num_experts=experts, top_k=top_k, router="softmax", **values), []


def with_checkpoint_moe(options: LlamaOptions, checkpoint: MoEOptions | None) -> LlamaOptions:
    """``options`` with the checkpoint's MoE block where ``model.options.moe`` is unset,
    and its :data:`DECIDED` options where the given block leaves them at their defaults."""
    if checkpoint is None:
        return options
    if options.moe is None:
        return attrs.evolve(options, moe=checkpoint)
    default = MoEOptions()
    taken = {
        name: getattr(checkpoint, name)
        for name in DECIDED
        if getattr(options.moe, name) == getattr(default, name)
    }
    return attrs.evolve(options, moe=attrs.evolve(options.moe, **taken))


def _hf_names(model_type: str, moe: MoEOptions) -> dict[str, str]:
    """option -> the config.json field that decides it (for messages); the others are
    fixed by the architecture."""
    names = {"num_experts": "num_local_experts", "top_k": "num_experts_per_tok"}
    if model_type == "mixtral":
        return {**names, "expert_hidden": "intermediate_size"}
    layers = "mlp_only_layers" if moe.layers is not None else "decoder_sparse_step"
    return {
        **names,
        "expert_hidden": "moe_intermediate_size",
        "every": "decoder_sparse_step",
        "layers": layers,
        "normalize_weights": "norm_topk_prob",
    }


def moe_mismatches(options: LlamaOptions, model_type: str, checkpoint: MoEOptions | None) -> list[str]:
    """Every MoE option of the (resolved) ``options`` that differs from the checkpoint's,
    with both values and the fix; an MoE block for a dense checkpoint."""
    if options.moe is None or checkpoint is None:
        if options.moe is not None:
            return [
                f"model.options.moe is set but config.json model_type={model_type!r} is a dense "
                "checkpoint (no experts to load); remove moe from model.options, or point init_from_hf "
                "at a Qwen3-MoE or Mixtral checkpoint"
            ]
        return []
    names = _hf_names(model_type, checkpoint)
    problems = []
    for name in DECIDED:
        ours, theirs = getattr(options.moe, name), getattr(checkpoint, name)
        if ours == theirs or (name == "every" and checkpoint.layers is not None):
            continue
        if name in names:
            theirs_shown = f"config.json {names[name]}={theirs!r}"
        else:
            theirs_shown = f"every {MOE_TYPES[model_type][1]} has {name}={theirs!r}"
        problems.append(
            f"model.options.moe.{name}={ours!r} but {theirs_shown}: leave moe.{name} at its default "
            f"to take the checkpoint's value, or point init_from_hf at a checkpoint with {name}={ours!r}"
        )
    return problems


def export_problems(options: LlamaOptions) -> list[str]:
    """Why the (resolved) ``options``' MoE model has no Hugging Face architecture that
    computes as it does; empty when it has one (or has no experts)."""
    moe = options.moe
    if moe is None:
        return []
    kind = moe_type(options)
    if kind is None:
        why = {
            "qwen2": "Qwen2-MoE gates a shared expert, which Forge's MoE does not",
            "olmo2": "OLMo 2 has no mixture-of-experts architecture (OLMoE is another family)",
        }[options.family]
        return [
            f"model.options.family={options.family!r} with experts: {why}; use family qwen3 (exported "
            "as Qwen3MoeForCausalLM) or mistral (MixtralForCausalLM)"
        ]
    arch = MOE_TYPES[kind][1]
    problems = []
    if moe.shared_experts:
        problems.append(
            f"model.options.moe.shared_experts={moe.shared_experts}: {arch} has no shared experts"
        )
    if moe.router != "softmax":
        problems.append(
            f"model.options.moe.router={moe.router!r}: {arch} routes by a softmax over the experts"
        )
    if moe.route_scale != 1:
        problems.append(
            f"model.options.moe.route_scale={moe.route_scale!r}: {arch} does not scale routed weights"
        )
    if kind == "mixtral":
        dense = [i for i in range(options.n_layers) if not is_moe_layer(options, i)]
        if dense:
            problems.append(
                f"model.options.moe leaves blocks {dense} dense: every block of a {arch} is an MoE block "
                "(family qwen3 exports dense blocks among MoE ones as Qwen3MoeForCausalLM)"
            )
        if not moe.normalize_weights:
            problems.append(
                f"model.options.moe.normalize_weights=false: {arch} always renormalises the top_k weights"
            )
        if options.attention_bias or options.mlp_bias:
            problems.append(f"model.options.attention_bias or mlp_bias: {arch} has no biases")
    return problems


def moe_config_kwargs(options: LlamaOptions) -> dict[str, Any]:
    """The MoE fields of the transformers config for (resolved) ``options`` with experts
    (:func:`export_problems` empty)."""
    moe = options.moe
    kind = moe_type(options)
    kwargs: dict[str, Any] = {
        "num_local_experts": moe.num_experts,
        "num_experts_per_tok": moe.top_k,
        "output_router_logits": False,
    }
    if kind == "mixtral":
        return {**kwargs, "intermediate_size": moe.expert_hidden, "router_jitter_noise": 0.0}
    layers = [i for i in range(options.n_layers) if is_moe_layer(options, i)]
    step = moe.every if moe.layers is None else 1
    mlp_only = [i for i in range(options.n_layers) if i not in layers and (i + 1) % step == 0]
    return {
        **kwargs,
        "moe_intermediate_size": moe.expert_hidden,
        "decoder_sparse_step": step,
        "mlp_only_layers": mlp_only,
        "norm_topk_prob": moe.normalize_weights,
    }
