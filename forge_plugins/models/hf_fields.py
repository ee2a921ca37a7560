"""The fields of a Hugging Face ``config.json`` that decide what Forge builds: each one's
JSON type, the range its meaning implies, and its value when the key is left out or set
to ``null``, as transformers' config class of the checkpoint's ``model_type`` reads it (``LlamaConfig``,
``Qwen2Config``, ``Qwen3Config``, ``MistralConfig``, ``Olmo2Config``, ``Qwen3MoeConfig``,
``MixtralConfig`` of transformers 5; the mixture-of-experts fields of the last two are read by
:mod:`forge_plugins.models.hf_moe`).

An explicit ``null`` means what it means there: ``sliding_window: null`` is no window
(not the class default 4096), ``num_key_value_heads: null`` one key/value head per query
head, ``head_dim: null`` ``hidden_size / num_attention_heads`` (llama, mistral, mixtral),
``rope_scaling: null`` no scaling, a yarn ``truncate: null`` no rounding (olmo2 reads
``head_dim`` as llama does, but its attention cannot take a ``null`` one). Where
transformers cannot load a ``null`` (a field typed ``int``, ``head_dim`` of qwen2 whose
attention multiplies by it), Forge refuses it too. :func:`read_fields` reports every
problem at once, each naming the field with its value and a fix, and never builds
anything per layer.
"""

from __future__ import annotations

import json
import math
from typing import Any

import attrs

from forge_core.api import Validator, above, at_least
from forge_core.api.unstable import show_value
from forge_plugins.models.options import FAMILIES

#: The ``model_type`` values Forge reads: its families, and the two mixture-of-experts
#: architectures built on the qwen3 and mistral attention.
MODEL_TYPES = (*FAMILIES, "qwen3_moe", "mixtral")
_QWEN = ("qwen2", "qwen3")
_MOE = ("qwen3_moe", "mixtral")


@attrs.frozen
class _Marker:
    name: str


#: ``absent``: the key must be there. ``null``: transformers cannot load a null here.
REQUIRED, REFUSED = _Marker("required"), _Marker("refused")
#: Computed from other fields: ``num_key_value_heads`` (the query heads) and
#: ``head_dim`` (``hidden_size // num_attention_heads``).
DERIVED = _Marker("derived")

_KINDS = {"int": "an integer", "number": "a number", "bool": "true or false", "str": "a string"}
_FIX = "correct config.json (or re-save the checkpoint with save_pretrained)"


@attrs.frozen
class Field:
    """One ``config.json`` key. ``absent`` and ``null`` are the value when the key is
    left out or ``null`` (a marker above, or one value per family as a dict)."""

    name: str
    kind: str
    valid: Validator | None
    meaning: str
    absent: Any
    null: Any = REFUSED
    families: tuple[str, ...] = MODEL_TYPES

    def when(self, which: str, family: str) -> Any:
        value = getattr(self, which)
        return value[family] if isinstance(value, dict) else value


def _each(**values: Any) -> dict[str, Any]:
    return {family: values.get(family, values.get("other")) for family in MODEL_TYPES}


FIELDS = (
    Field("vocab_size", "int", at_least(1), "rows of the token embedding", REQUIRED),
    Field("hidden_size", "int", at_least(1), "the width of every token's vector", REQUIRED),
    Field("intermediate_size", "int", at_least(1), "the SwiGLU hidden size", REQUIRED),
    Field("num_hidden_layers", "int", at_least(1), "the transformer blocks", REQUIRED),
    Field("num_attention_heads", "int", at_least(1), "the query heads of each layer", REQUIRED),
    Field(
        "num_key_value_heads",
        "int",
        at_least(1),
        "the key/value heads of each layer",
        _each(llama=DERIVED, olmo2=DERIVED, mistral=8, mixtral=8, qwen3_moe=4, other=32),
        _each(mistral=REFUSED, mixtral=REFUSED, qwen3_moe=REFUSED, other=DERIVED),
    ),
    Field(
        "head_dim",
        "int",
        at_least(1),
        "the width of each head",
        _each(qwen3=128, other=DERIVED),
        _each(llama=DERIVED, mistral=DERIVED, mixtral=DERIVED, other=REFUSED),
    ),
    Field(
        "max_position_embeddings",
        "int",
        at_least(1),
        "the positions the rotary table covers",
        _each(llama=2048, olmo2=2048, mistral=131072, mixtral=131072, other=32768),
    ),
    Field(
        "rms_norm_eps",
        "number",
        above(0),
        "it keeps the RMSNorm division finite",
        _each(mixtral=1e-5, olmo2=1e-5, other=1e-6),
    ),
    Field("tie_word_embeddings", "bool", None, "", False),
    Field("hidden_act", "str", None, "", "silu"),
    Field("attention_bias", "bool", None, "", False, families=("llama", "qwen3", "qwen3_moe", "olmo2")),
    Field("mlp_bias", "bool", None, "", False, families=("llama",)),
    Field("pretraining_tp", "int", at_least(1), "a split of the projections", 1, 1, families=("llama",)),
    Field(
        "sliding_window",
        "int",
        at_least(1),
        "the positions each token attends to (null: no window)",
        _each(mixtral=None, other=4096),
        None,
        families=("mistral", "mixtral", "qwen3_moe", *_QWEN),
    ),
    Field("use_sliding_window", "bool", None, "", False, families=(*_QWEN, "qwen3_moe")),
    Field("max_window_layers", "int", at_least(0), "the layers before the windowed ones", 28, families=_QWEN),
    # The mixture-of-experts fields (read into model.options.moe by hf_moe). Qwen3-MoE
    # names the expert count num_experts as well: hf_moe reads either spelling.
    Field(
        "num_local_experts",
        "int",
        at_least(1),
        "the routed experts of each MoE layer",
        _each(qwen3_moe=128, mixtral=8),
        families=_MOE,
    ),
    Field(
        "num_experts_per_tok",
        "int",
        at_least(1),
        "the experts each token is sent to",
        _each(qwen3_moe=8, mixtral=2),
        families=_MOE,
    ),
    Field(
        "moe_intermediate_size",
        "int",
        at_least(1),
        "the SwiGLU hidden size of one expert",
        768,
        families=("qwen3_moe",),
    ),
    Field(
        "decoder_sparse_step",
        "int",
        at_least(1),
        "every how many layers one is an MoE layer",
        1,
        families=("qwen3_moe",),
    ),
    Field("norm_topk_prob", "bool", None, "", False, families=("qwen3_moe",)),
    Field(
        "router_jitter_noise", "number", at_least(0), "noise on the router input", 0.0, families=("mixtral",)
    ),
)

#: Keys of a rope dict (``rope_parameters``, or the older ``rope_scaling``) by rope type,
#: each ``(kind, range, null)``: null is REFUSED, or None (the key as if absent: the
#: default, or computed), or a value.
_ROPE_FIELDS: dict[str, tuple[str, Validator | None, Any]] = {
    "rope_theta": ("number", above(0), REFUSED),
    "partial_rotary_factor": ("number", above(0), None),
    "factor": ("number", above(0), REFUSED),
    "original_max_position_embeddings": ("int", at_least(1), REFUSED),
    "low_freq_factor": ("number", above(0), REFUSED),
    "high_freq_factor": ("number", above(0), REFUSED),
    # transformers' yarn: ``beta_fast or 32``, ``attention_factor`` computed when null,
    # ``if truncate:`` (so null does not round); its null factor is below (_rope).
    "beta_fast": ("number", above(0), None),
    "beta_slow": ("number", above(0), None),
    "attention_factor": ("number", above(0), None),
    "mscale": ("number", None, None),
    "mscale_all_dim": ("number", None, None),
    "truncate": ("bool", None, False),
}
#: Keys of each rope type (transformers' names) besides rope_type and rope_theta.
ROPE_KEYS = {
    "default": (),
    "linear": ("factor",),
    "dynamic": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    "yarn": (
        "factor",
        "original_max_position_embeddings",
        "attention_factor",
        "beta_fast",
        "beta_slow",
        "truncate",
    ),
}


def json_shown(value: Any) -> str:
    """A config.json value as a message shows it: ``null``/``true``/``false`` as JSON
    writes them, anything else as its (shortened) repr."""
    return json.dumps(value) if value is None or isinstance(value, bool) else show_value(value)


def _finite(value: int | float) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:  # an integer beyond the floats
        return False


def _type_problem(where: str, value: Any, kind: str) -> str | None:
    if isinstance(value, bool):
        ok = kind == "bool"
    elif kind == "int":
        ok = isinstance(value, int)
    elif kind == "number":
        ok = isinstance(value, (int, float)) and _finite(value)
    else:
        ok = isinstance(value, {"bool": bool, "str": str}[kind])
    if ok:
        return None
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    what = "not finite" if number and kind == "number" else f"not {_KINDS[kind]}"
    return f"config.json {where}={json_shown(value)} is {what}; {_FIX}"


def _checked(where: str, value: Any, kind: str, valid: Validator | None, meaning: str) -> str | None:
    """The type and range problem of one present, non-null value."""
    problem = _type_problem(where, value, kind)
    if problem or valid is None or valid.test(value):
        return problem
    why = f" ({meaning})" if meaning else ""
    return f"config.json {where}={json_shown(value)} must be {valid.description}{why}; {_FIX}"


def _refused_null(where: str, family: str, absent: Any) -> str:
    if absent is REQUIRED:
        instead = "give its value"
    elif absent is DERIVED:
        instead = "remove the key to have it computed, or give its value"
    else:
        instead = f"remove the key for transformers' default ({json_shown(absent)}), or give its value"
    return f"config.json {where} is null, which transformers cannot load for a {family} checkpoint; {instead}"


def _fields(config: dict[str, Any], family: str) -> tuple[dict[str, Any], list[str]]:
    values: dict[str, Any] = {}
    problems: list[str] = []
    for field in FIELDS:
        if family not in field.families:
            continue  # transformers' class for the family has no such field and ignores the key
        if field.name not in config:
            value = field.when("absent", family)
            if value is REQUIRED:
                problems.append(f"config.json has no integer {field.name!r} ({field.meaning}); {_FIX}")
        elif config[field.name] is None:
            value = field.when("null", family)
            if value is REFUSED:
                problems.append(_refused_null(field.name, family, field.when("absent", family)))
        else:
            value = config[field.name]
            problem = _checked(field.name, value, field.kind, field.valid, field.meaning)
            if problem:
                problems.append(problem)
        values[field.name] = value
    return values, problems


def _shapes(values: dict[str, Any], family: str) -> list[str]:
    """Problems between fields (only once each of them is valid)."""
    heads, hidden = values["num_attention_heads"], values["hidden_size"]
    if values["num_key_value_heads"] is DERIVED:
        values["num_key_value_heads"] = heads
    derived = values["head_dim"] is DERIVED
    # transformers' LlamaConfig requires the division whatever head_dim says.
    if (derived or family == "llama") and hidden % heads:
        return [
            f"config.json hidden_size={hidden} is not a multiple of num_attention_heads={heads}: "
            f"every head must have the same width; {_FIX}"
        ]
    if derived:
        values["head_dim"] = hidden // heads
    problems = []
    kv = values["num_key_value_heads"]
    if heads % kv:
        problems.append(
            f"config.json num_key_value_heads={kv} does not divide num_attention_heads={heads}: "
            f"grouped-query attention shares each key/value head among equally many query heads; {_FIX}"
        )
    if values["head_dim"] % 2:
        width = (
            f"hidden_size / num_attention_heads = {hidden}/{heads} = {values['head_dim']}"
            if derived
            else f"head_dim={values['head_dim']}"
        )
        problems.append(f"config.json {width} is odd: rotary embeddings rotate pairs of channels; {_FIX}")
    return problems


def _layer_types(config: dict[str, Any], values: dict[str, Any]) -> list[str]:
    """qwen2/qwen3: ``layer_types`` (``null`` or absent: layers from ``max_window_layers``
    on are windowed) gives ``values["windowed_layers"]``, the number of layers that
    attend within ``sliding_window``, without a per-layer list."""
    n = values["num_hidden_layers"]
    window = values["sliding_window"] if values["use_sliding_window"] else None
    types = config.get("layer_types")
    if types is None:
        values["windowed_layers"] = max(0, n - values["max_window_layers"]) if window else 0
        return []
    allowed = ("full_attention", "sliding_attention")
    if not isinstance(types, list) or len(types) != n or not all(t in allowed for t in types):
        got = f"{len(types)} entries" if isinstance(types, list) else json_shown(types)
        return [
            f"config.json layer_types must be null or a list of num_hidden_layers={n} entries, each "
            f"{' or '.join(map(repr, allowed))} (got {got}); {_FIX}"
        ]
    values["windowed_layers"] = types.count("sliding_attention") if window else 0
    return []


#: transformers' ``default_theta`` where it is not 10000.
_DEFAULT_THETA = {"mixtral": 1_000_000.0}


def _rope_dict(config: dict[str, Any], family: str) -> tuple[dict[str, Any], dict[str, str], str | None]:
    """``(params, where, problem)``: the rope dict transformers reads, ``rope_scaling``
    when it is a non-empty object, else ``rope_parameters`` (``null``: plain rotary),
    with ``rope_type`` and ``rope_theta`` filled as transformers fills them (from
    ``type``, else ``"default"``; from the top-level ``rope_theta``, else the class's
    default: 10000, mixtral 1e6), and
    the name of each key in config.json (for messages)."""
    for key in ("rope_scaling", "rope_parameters"):
        if config.get(key) is not None and not isinstance(config[key], dict):
            return {}, {}, f"config.json {key}={json_shown(config[key])} must be null or an object; {_FIX}"
    source = "rope_scaling" if config.get("rope_scaling") else "rope_parameters"
    params = dict(config.get(source) or {})
    where = {key: f"{source}.{key}" for key in params}
    nested = [key for key, v in params.items() if isinstance(v, dict)]
    if nested:
        per_layer = (
            f"config.json {source}.{nested[0]} is an object: rotary parameters per layer type, which "
            "Forge does not implement (one rotary for every layer)"
        )
        return {}, {}, per_layer
    if "rope_type" not in params:
        params["rope_type"], where["rope_type"] = params.get("type", "default"), f"{source}.type"
    if "rope_theta" not in params:
        params["rope_theta"], where["rope_theta"] = (
            config.get("rope_theta", _DEFAULT_THETA.get(family, 10000.0)),
            "rope_theta",
        )
    if "partial_rotary_factor" not in params and config.get("partial_rotary_factor") is not None:
        params["partial_rotary_factor"] = config["partial_rotary_factor"]
        where["partial_rotary_factor"] = "partial_rotary_factor"
    if not isinstance(params["rope_type"], str):
        unnamed = (
            f"config.json {where['rope_type']}={json_shown(params['rope_type'])} must name a rope type "
            f"(transformers has no rotary function for it); {_FIX}"
        )
        return {}, {}, unnamed
    return params, where, None


def _rope(config: dict[str, Any], family: str) -> tuple[dict[str, Any], list[str]]:
    """The rope dict with every key its rope type reads checked and each null read as
    transformers reads it (the key dropped, or its value)."""
    params, where, problem = _rope_dict(config, family)
    if problem:
        return {}, [problem]
    rope_type = params["rope_type"]
    read = ("rope_theta", "partial_rotary_factor", *ROPE_KEYS.get(rope_type, ()))
    if rope_type == "yarn":
        read += ("mscale", "mscale_all_dim")
    out, problems = dict(params), []
    if rope_type not in ROPE_KEYS:
        problems.append(
            f"config.json {where['rope_type']}={rope_type!r}: rope type {rope_type!r} is not supported "
            f"(Forge implements {', '.join(ROPE_KEYS)}; dynamic only within the original context), so "
            "its positions would be rotated otherwise; start from a checkpoint with one of those"
        )
    else:
        # A key its type does not read would be ignored: reported (a null sets nothing).
        problems += [
            f"config.json {where[key]}={json_shown(params[key])} is not read by a {rope_type!r} rotary "
            f"(it reads {', '.join(read)}), so it would be ignored; remove it from config.json, or "
            "correct rope_type if it belongs to another"
            for key in params
            if key not in (*read, "rope_type", "type") and params[key] is not None
        ]
    for key in (key for key in read if key in params):
        kind, valid, null = _ROPE_FIELDS[key]
        if params[key] is not None:
            problem = _checked(where[key], params[key], kind, valid, "")
            problems += [problem] if problem else []
        elif (rope_type, key) == ("yarn", "factor"):
            del out[key]  # yarn computes it: max_position_embeddings / original_max_position_embeddings
        elif null is REFUSED:
            problems.append(
                f"config.json {where[key]} is null, which transformers cannot compute a "
                f"{rope_type!r} rotary with; give its value"
            )
        elif null is None:
            del out[key]
        else:
            out[key] = null
    return out, problems


def read_fields(config: dict[str, Any], family: str) -> tuple[dict[str, Any], list[str]]:
    """``(values, problems)`` of a ``config.json`` of ``family``: every field of
    :data:`FIELDS` the family has (absent and null read as transformers reads them,
    ``head_dim`` and ``num_key_value_heads`` computed when derived), ``"rope"`` (the
    rope dict, :func:`_rope`) and, for qwen2/qwen3/qwen3_moe, ``"windowed_layers"``. Any problem
    (a wrong type, a value out of range, a null transformers cannot load, fields that
    contradict each other) leaves the values unusable."""
    values, problems = _fields(config, family)
    if not problems:
        problems = _shapes(values, family)
    if not problems and family in _QWEN:
        problems = _layer_types(config, values)
    if family == "qwen3_moe":
        # Qwen3-MoE has no per-layer types: with use_sliding_window every layer is windowed.
        windowed = values["use_sliding_window"] and values["sliding_window"]
        values["windowed_layers"] = values["num_hidden_layers"] if windowed else 0
    values["rope"], rope_problems = _rope(config, family)
    return values, problems + rope_problems
