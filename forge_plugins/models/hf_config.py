"""A Hugging Face ``config.json`` <-> the ``llama`` options, without torch.

- :func:`options_from_hf_config`: the option values a checkpoint's ``config.json``
  describes, and every feature of it Forge cannot reproduce (each naming the field; a
  field Forge does not read is one: :mod:`forge_plugins.models.hf_report`).
- :func:`resolve_options`: the loader's resolver (``ModelSpec.resolve_options``): unset
  options from the ``init_from_hf`` checkpoint, else the defaults. It never raises: a
  folder it cannot read leaves the defaults, and the ``llama.init-from-hf`` rule says why.
- :func:`hf_dir`: the folder ``init_from_hf`` names, a Hub id's cached snapshot
  (:mod:`forge_plugins.hub`); :func:`fetch` (``ModelSpec.fetch``) downloads one.
- :func:`hf_folder_problems`: every reason a folder cannot initialise a llama with the
  (resolved) options: what that rule reports (:func:`init_problems`) and what the build
  refuses (:func:`check_hf_compatible`). An option that differs from the checkpoint after
  resolution was given explicitly; the message shows both values.
- :func:`hf_config_kwargs`: the ``transformers`` config of the family for export.

Each field is read as transformers' config class of the family reads it, absent or
``null`` (:mod:`forge_plugins.models.hf_fields`). A mixture-of-experts checkpoint
(``qwen3_moe``, ``mixtral``) is its attention family (qwen3, mistral) with
``model.options.moe`` (:mod:`forge_plugins.models.hf_moe`).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import attrs

from forge_core.api import ForgeError
from forge_core.api.unstable import show_value
from forge_plugins import hub
from forge_plugins.models.hf_fields import MODEL_TYPES, ROPE_KEYS, read_fields
from forge_plugins.models.hf_folder import HFFolderMismatch, checkpoint_shapes, read_hf_config, where
from forge_plugins.models.hf_keys import IGNORED, expected_hf_shapes, stored_layers
from forge_plugins.models.hf_moe import (
    MOE_TYPES,
    expert_count_key,
    moe_config_kwargs,
    moe_from_fields,
    moe_mismatches,
    moe_type,
    with_checkpoint_moe,
)
from forge_plugins.models.hf_report import unread_fields, unsupported_report
from forge_plugins.models.options import (
    LlamaOptions,
    RopeScaling,
    ffn_hidden_size,
    head_dim,
    with_defaults,
)

ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "mistral": "MistralForCausalLM",
    "olmo2": "Olmo2ForCausalLM",
}
#: The architecture of each model_type Forge reads.
_TYPE_ARCHITECTURES = {**ARCHITECTURES, **{kind: arch for kind, (_, arch) in MOE_TYPES.items()}}


def yarn_attention_factor(
    factor: float, mscale: float | None = None, mscale_all_dim: float | None = None
) -> float:
    """transformers' default YaRN attention factor."""

    def get(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    if mscale and mscale_all_dim:
        return float(get(factor, mscale) / get(factor, mscale_all_dim))
    return get(factor)


def _rope(params: dict[str, Any], max_pos: int) -> tuple[RopeScaling, list[str]]:
    """``(rope scaling, problems)`` from the rope dict of
    :func:`~forge_plugins.models.hf_fields.read_fields` (checked, nulls read, its type
    one of ``ROPE_KEYS``)."""
    rope_type = params["rope_type"]
    problems = []
    partial = params.get("partial_rotary_factor", 1.0)
    if partial != 1:
        problems.append(f"partial_rotary_factor={partial!r}: Forge rotates every channel of a head")
    values: dict[str, Any] = {"type": rope_type}
    for key in ROPE_KEYS[rope_type]:
        if key in params:
            values[key] = params[key]
    if rope_type == "dynamic":
        values["original_max_position_embeddings"] = max_pos
    if rope_type in ("llama3", "yarn") and not values.get("original_max_position_embeddings"):
        if rope_type == "llama3":
            problems.append("rope type 'llama3' without original_max_position_embeddings")
        values["original_max_position_embeddings"] = max_pos
    if rope_type == "yarn":
        if "factor" not in values:
            values["factor"] = max_pos / values["original_max_position_embeddings"]
        if "attention_factor" not in values:
            values["attention_factor"] = yarn_attention_factor(
                values["factor"], params.get("mscale"), params.get("mscale_all_dim")
            )
    if rope_type != "default" and "factor" not in values:
        problems.append(f"rope type {rope_type!r} without a factor")
    try:
        scaling = RopeScaling(**values)
    except (TypeError, ValueError) as exc:
        problems.append(f"rope parameters {params!r} are not valid ({exc})")
        scaling = RopeScaling()
    return scaling, problems


def _model_type(config: dict[str, Any]) -> tuple[str | None, list[str]]:
    family = config.get("model_type")
    if not isinstance(family, str) or family not in MODEL_TYPES:
        refused = (
            f"config.json model_type is {show_value(family)}: Forge's llama imports "
            f"{', '.join(map(repr, MODEL_TYPES))} checkpoints "
            f"(architectures {', '.join(_TYPE_ARCHITECTURES.values())})"
        )
        return None, [refused, *(unsupported_report(config, family) if isinstance(family, str) else [])]
    architectures = config.get("architectures")
    if architectures is not None and (
        not isinstance(architectures, list) or not all(isinstance(a, str) for a in architectures)
    ):
        return None, [f"config.json architectures={show_value(architectures)} must be a list of class names"]
    if architectures and _TYPE_ARCHITECTURES[family] not in architectures:
        return None, [
            f"config.json architectures is {architectures!r}; a {family} checkpoint Forge can load is "
            f"a {_TYPE_ARCHITECTURES[family]} (the causal language model with its lm_head)"
        ]
    return family, []


def options_from_hf_config(config: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """``(option values, problems)`` for a ``config.json``. The values cover every option
    a checkpoint decides (``moe``: its :class:`MoEOptions`, or ``None``); a problem names
    the field Forge cannot reproduce (a field it does not read is one, reported whatever
    else is). A field of the wrong type or out of range gives no values, only its problem."""
    model_type, problems = _model_type(config)
    if model_type is None:
        return {}, problems
    unread = unread_fields(config, model_type, _TYPE_ARCHITECTURES[model_type])
    config, problems = expert_count_key(config)
    fields, found = read_fields(config, model_type)
    problems += found
    moe, found = (None, []) if problems else moe_from_fields(config, model_type, fields)
    problems += found
    if problems:
        return {}, problems + unread
    family = MOE_TYPES[model_type][0] if model_type in MOE_TYPES else model_type
    max_pos = fields["max_position_embeddings"]
    scaling, problems = _rope(fields["rope"], max_pos)
    problems += unread
    window = 0
    if family == "mistral":
        window = fields["sliding_window"] or 0
    elif fields.get("windowed_layers"):
        problems.append(
            f"use_sliding_window=true with sliding_window={fields['sliding_window']}: "
            f"{fields['windowed_layers']} of the {fields['num_hidden_layers']} layers attend within the "
            "window (layer_types, or the layers from max_window_layers on), and Forge's attention "
            "backends have no sliding-window mask, so they would attend differently"
        )
    if fields["hidden_act"] != "silu":
        problems.append(f"hidden_act={fields['hidden_act']!r}; Forge's llama uses silu (SwiGLU)")
    if family == "llama" and fields["pretraining_tp"] != 1:
        tp = fields["pretraining_tp"]
        problems.append(f"pretraining_tp={tp!r}; Forge computes the projections whole (1)")
    values: dict[str, Any] = {
        "family": family,
        "dim": fields["hidden_size"],
        "n_layers": fields["num_hidden_layers"],
        "n_heads": fields["num_attention_heads"],
        "n_kv_heads": fields["num_key_value_heads"],
        "head_dim": fields["head_dim"],
        "ffn_hidden": fields["intermediate_size"],
        "norm_eps": float(fields["rms_norm_eps"]),
        "rope_theta": float(fields["rope"]["rope_theta"]),
        "rope_scaling": scaling,
        "max_seq_len": min(max_pos, window) if window else max_pos,
        "tie_embeddings": fields["tie_word_embeddings"],
        "attention_bias": fields.get("attention_bias", False),
        "mlp_bias": fields.get("mlp_bias", False),
        "sliding_window": window,
        "moe": moe,
    }
    return values, problems


HF_OPTION = "model.options.init_from_hf"


def hf_dir(options: LlamaOptions) -> str:
    """The local folder ``init_from_hf`` names: the path itself, or a Hub id's cached
    snapshot at ``revision``. Raises :class:`~forge_plugins.hub.HubNotCached` (with the
    download command) when the id is not cached."""
    return hub.local_folder(options.init_from_hf, options.revision, hub.MODEL_FILES, HF_OPTION)[0]


def fetch(options: LlamaOptions) -> None:
    """The spec's ``fetch``: download an ``init_from_hf`` Hub id that is not cached
    (config, safetensors and tokenizer files only), unless ``HF_HUB_OFFLINE`` is set."""
    if options.init_from_hf:
        hub.download(options.init_from_hf, options.revision, hub.MODEL_FILES, HF_OPTION)


def resolve_options(options: LlamaOptions) -> LlamaOptions:
    """Unset options from the ``init_from_hf`` checkpoint's ``config.json`` when it is
    set and readable, else from the defaults (:func:`~forge_plugins.models.options.with_defaults`).
    A Hub id's branch or tag becomes the commit it points at in the cache, which the
    run's saved config then records."""
    values: dict[str, Any] = {}
    if options.init_from_hf:
        try:
            folder, commit = hub.local_folder(
                options.init_from_hf, options.revision, hub.MODEL_FILES, HF_OPTION
            )
            if commit:
                options = attrs.evolve(options, revision=commit)
            values, _ = options_from_hf_config(read_hf_config(folder))
        except ForgeError:
            pass  # the llama.init-from-hf rule reports the folder
    return with_checkpoint_moe(with_defaults(options, values), values.get("moe"))


def _show(value: Any) -> str:
    if isinstance(value, RopeScaling):
        fields = {f.name: getattr(value, f.name) for f in attrs.fields(RopeScaling)}
        return (
            "{"
            + ", ".join(
                f"{k}: {v!r}" for k, v in fields.items() if v != getattr(RopeScaling(), k) or k == "type"
            )
            + "}"
        )
    return repr(value)


#: option -> the config.json key that decides it (for messages).
_HF_NAMES = {
    "family": "model_type",
    "dim": "hidden_size",
    "n_layers": "num_hidden_layers",
    "n_heads": "num_attention_heads",
    "n_kv_heads": "num_key_value_heads",
    "head_dim": "head_dim",
    "ffn_hidden": "intermediate_size",
    "norm_eps": "rms_norm_eps",
    "rope_theta": "rope_theta",
    "rope_scaling": "rope_parameters",
    "tie_embeddings": "tie_word_embeddings",
    "attention_bias": "attention_bias",
    "mlp_bias": "mlp_bias",
    "sliding_window": "sliding_window",
}


def config_mismatches(options: LlamaOptions, values: dict[str, Any]) -> list[str]:
    """Every option of the (resolved) ``options`` that differs from the checkpoint's
    ``values``, with both values and the fix."""
    ours = {name: getattr(options, name) for name in _HF_NAMES}
    ours["head_dim"], ours["ffn_hidden"] = head_dim(options), ffn_hidden_size(options)
    problems = []
    for name, hf_name in _HF_NAMES.items():
        if name in values and ours[name] != values[name]:
            derived = (
                " (derived)" if name in ("head_dim", "ffn_hidden") and not getattr(options, name) else ""
            )
            problems.append(
                f"model.options.{name}={_show(ours[name])}{derived} but config.json {hf_name}="
                f"{_show(values[name])}: remove {name} from model.options to take the checkpoint's "
                f"value, or point init_from_hf at a checkpoint with {name}={_show(ours[name])}"
            )
    return problems


def weight_mismatches(options: LlamaOptions, hf_dir: str | Path, vocab_size: int) -> list[str]:
    """Weights the options need that the folder lacks, shapes that differ (both shown),
    and tensors the options would leave unread, from the safetensors headers."""
    found = checkpoint_shapes(hf_dir)
    layers = stored_layers(found)
    if len(layers) != options.n_layers or max(layers, default=-1) != options.n_layers - 1:
        # Before anything per layer: the count is config.json's, and could be anything.
        held = f"model.layers.{min(layers)} to model.layers.{max(layers)}" if layers else "no layer"
        return [
            f"config.json num_hidden_layers={options.n_layers} but the weights hold {len(layers)} "
            f"layers ({held}); correct num_hidden_layers, or point init_from_hf at the folder "
            "whose weights this config.json describes"
        ]
    expected = expected_hf_shapes(options, vocab_size)
    problems = []
    missing = [key for key in expected if key not in found]
    if missing:
        problems.append(
            f"weights missing for {len(missing)} tensors: {', '.join(missing[:5])}"
            f"{' ...' if len(missing) > 5 else ''}"
        )
    problems += [
        f"{key} has shape {list(found[key])}, the options need {list(shape)}"
        for key, shape in expected.items()
        if key in found and found[key] != shape
    ]
    # A tied checkpoint may store the head as well: it is the embedding again.
    unread = [
        key
        for key in found
        if key not in expected
        and not IGNORED.fullmatch(key)
        and not (options.tie_embeddings and key == "lm_head.weight")
    ]
    if unread:
        problems.append(
            f"{len(unread)} tensors of the checkpoint have no place in the model: "
            f"{', '.join(sorted(unread)[:5])}{' ...' if len(unread) > 5 else ''}"
        )
    return problems


def _folder_problems(
    options: LlamaOptions, hf_dir: str | Path, vocab_size: int | None
) -> tuple[list[str], int]:
    """``(problems, checkpoint vocab size)``; an unreadable folder raises."""
    config = read_hf_config(hf_dir)
    values, problems = options_from_hf_config(config)
    if not values:
        return problems, 0
    # Unset options are the checkpoint's.
    options = with_checkpoint_moe(with_defaults(options, values), values["moe"])
    problems += config_mismatches(options, values)
    problems += moe_mismatches(options, config["model_type"], values["moe"])
    hf_vocab = config["vocab_size"]
    if vocab_size is not None and vocab_size > hf_vocab:
        problems.append(
            f"the tokenizer has {vocab_size} tokens but the checkpoint's vocab_size is "
            f"{hf_vocab}; use the tokenizer the checkpoint was trained with"
        )
    if problems:
        return problems, hf_vocab  # the weights would only repeat these differences shape by shape
    return weight_mismatches(options, hf_dir, hf_vocab), hf_vocab


def hf_folder_problems(options: LlamaOptions, hf_dir: str | Path, vocab_size: int | None = None) -> list[str]:
    """Every reason the folder cannot initialise a llama with the (resolved) ``options``,
    from ``config.json`` and the safetensors headers only. Empty when it fits."""
    try:
        return _folder_problems(options, hf_dir, vocab_size)[0]
    except ForgeError as exc:
        return [str(exc).removeprefix(f"{where(hf_dir)}: ")]


def init_problems(options: LlamaOptions) -> list[str]:
    """What the ``llama.init-from-hf`` rule reports: an uncached Hub id (with the
    download command), a revision given with a local folder, else every problem of
    the folder or snapshot (:func:`hf_folder_problems`)."""
    try:
        folder = hf_dir(options)
    except hub.HubNotCached as exc:
        return [str(exc).removeprefix(f"{HF_OPTION}=")]
    if options.revision != hub.DEFAULT_REVISION and not hub.is_hub_id(options.init_from_hf):
        return [
            f"revision={options.revision!r} with the local folder {options.init_from_hf!r}: a revision "
            "chooses a snapshot of a Hub id; remove revision, or give init_from_hf as org/name"
        ]
    problems = hf_folder_problems(options, folder)
    if hub.is_hub_id(options.init_from_hf):  # name the files the problems are about
        problems = [f"{options.init_from_hf} (cached snapshot {folder}): {p}" for p in problems]
    return problems


def check_hf_compatible(options: LlamaOptions, hf_dir: str | Path, vocab_size: int | None = None) -> int:
    """The checks of :func:`hf_folder_problems`, raised (a missing folder, config or
    weights as :class:`~forge_plugins.models.hf_folder.HFFolderMissing`); returns the
    checkpoint's vocabulary size. ``vocab_size`` (the tokenizer's) may be smaller than
    the checkpoint's, never larger."""
    problems, hf_vocab = _folder_problems(options, hf_dir, vocab_size)
    if problems:
        raise HFFolderMismatch(f"{where(hf_dir)} does not fit the model options:\n  " + "\n  ".join(problems))
    return hf_vocab


def rope_config(options: LlamaOptions) -> dict[str, Any] | None:
    """transformers' ``rope_scaling`` for the options (``None``: plain rotary)."""
    scaling = options.rope_scaling or RopeScaling()
    if scaling.type == "default":
        return None
    out: dict[str, Any] = {"rope_type": scaling.type}
    for key in ROPE_KEYS[scaling.type]:
        if key == "original_max_position_embeddings" and scaling.type == "dynamic":
            continue  # dynamic takes it from max_position_embeddings
        out[key] = getattr(scaling, key)
    if scaling.type == "yarn" and not scaling.attention_factor:
        out["attention_factor"] = yarn_attention_factor(scaling.factor)
    return out


def hf_model_type(options: LlamaOptions) -> str:
    """The ``model_type`` export writes for (resolved) ``options``: the family's, or
    with experts its MoE architecture's (:func:`~forge_plugins.models.hf_moe.moe_type`)."""
    return moe_type(options) or options.family or "llama"


def hf_config_kwargs(options: LlamaOptions, vocab_size: int) -> dict[str, Any]:
    """Keyword arguments of ``transformers.AutoConfig.for_model(hf_model_type(options),
    ...)`` that give the checkpoint of a Forge llama with (resolved) ``options`` (with
    experts, :func:`~forge_plugins.models.hf_moe.export_problems` empty)."""
    model_type = hf_model_type(options)
    # Mixtral is the mistral block with experts (a llama block without biases is the same).
    family = "mistral" if model_type == "mixtral" else options.family or "llama"
    scaling = options.rope_scaling or RopeScaling()
    max_pos = scaling.original_max_position_embeddings if scaling.type == "dynamic" else options.max_seq_len
    kwargs: dict[str, Any] = {
        "vocab_size": vocab_size,
        "hidden_size": options.dim,
        "intermediate_size": ffn_hidden_size(options),
        "num_hidden_layers": options.n_layers,
        "num_attention_heads": options.n_heads,
        "num_key_value_heads": options.n_kv_heads,
        "head_dim": head_dim(options),
        "hidden_act": "silu",
        "max_position_embeddings": max_pos,
        "rms_norm_eps": options.norm_eps,
        "rope_theta": options.rope_theta,
        "rope_scaling": rope_config(options),
        "tie_word_embeddings": bool(options.tie_embeddings),
        "initializer_range": options.init_std,
        "architectures": [_TYPE_ARCHITECTURES[model_type]],
    }
    if family in ("llama", "qwen3", "olmo2"):
        kwargs["attention_bias"] = bool(options.attention_bias)
    if family == "llama":
        kwargs["mlp_bias"] = bool(options.mlp_bias)
    if family == "mistral":
        kwargs["sliding_window"] = options.sliding_window or None
    if family in ("qwen2", "qwen3"):
        kwargs.update(use_sliding_window=False, sliding_window=None)
    if options.moe is not None:
        kwargs.update(moe_config_kwargs(options))
    return kwargs
