"""Hugging Face interop for ``llama``: export to a ``LlamaForCausalLM`` folder, and
initialise a Forge model from one (``model.options.init_from_hf``).

Key mapping (Forge -> Hugging Face), per layer ``i``::

    tok_embeddings.weight               model.embed_tokens.weight
    layers.i.attention_norm.weight      model.layers.i.input_layernorm.weight
    layers.i.attention.w{q,k,v,o}       model.layers.i.self_attn.{q,k,v,o}_proj.weight
    layers.i.ffn_norm.weight            model.layers.i.post_attention_layernorm.weight
    layers.i.feed_forward.w1 / w3 / w2  model.layers.i.mlp.gate_proj / up_proj / down_proj
    norm.weight                         model.norm.weight
    output.weight                       lm_head.weight (absent when embeddings are tied)

Forge's rotary uses transformers' ``rotate_half`` layout, so q/k weights are copied as
they are (no permutation). transformers is imported inside functions only; reading a
folder needs just ``json`` and ``safetensors``, so no code from the folder ever runs (a
``config.json`` with an ``auto_map`` is refused).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from forge_plugins.models.options import LlamaOptions, ffn_hidden_size

_LAYER_KEYS = {
    "attention_norm.weight": "input_layernorm.weight",
    "attention.wq.weight": "self_attn.q_proj.weight",
    "attention.wk.weight": "self_attn.k_proj.weight",
    "attention.wv.weight": "self_attn.v_proj.weight",
    "attention.wo.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "feed_forward.w1.weight": "mlp.gate_proj.weight",
    "feed_forward.w3.weight": "mlp.up_proj.weight",
    "feed_forward.w2.weight": "mlp.down_proj.weight",
}
_TOP_KEYS = {
    "tok_embeddings.weight": "model.embed_tokens.weight",
    "norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_KEYS_BACK = {hf: forge for forge, hf in _LAYER_KEYS.items()}
_TOP_KEYS_BACK = {hf: forge for forge, hf in _TOP_KEYS.items()}
#: Prefixes that wrappers add to state-dict keys (torch.compile, DDP).
_WRAPPER_PREFIXES = ("_orig_mod.", "module.")


def to_hf_key(key: str) -> str:
    if key in _TOP_KEYS:
        return _TOP_KEYS[key]
    match = re.fullmatch(r"layers\.(\d+)\.(.+)", key)
    if match and match.group(2) in _LAYER_KEYS:
        return f"model.layers.{match.group(1)}.{_LAYER_KEYS[match.group(2)]}"
    raise KeyError(f"no Hugging Face name for Forge llama key {key!r}")


def from_hf_key(key: str) -> str | None:
    """The Forge key for a Hugging Face key, or ``None`` for keys Forge does not keep
    (e.g. ``rotary_emb.inv_freq`` in older checkpoints)."""
    if key in _TOP_KEYS_BACK:
        return _TOP_KEYS_BACK[key]
    match = re.fullmatch(r"model\.layers\.(\d+)\.(.+)", key)
    if match and match.group(2) in _LAYER_KEYS_BACK:
        return f"layers.{match.group(1)}.{_LAYER_KEYS_BACK[match.group(2)]}"
    return None


def _strip_wrappers(key: str) -> str:
    changed = True
    while changed:
        changed = False
        for prefix in _WRAPPER_PREFIXES:
            if key.startswith(prefix):
                key, changed = key[len(prefix):], True
    return key


def hf_config(options: LlamaOptions, vocab_size: int, dtype: str = "float32", **token_ids: Any):
    """The ``transformers.LlamaConfig`` equivalent to ``options``."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=options.dim,
        intermediate_size=ffn_hidden_size(options),
        num_hidden_layers=options.n_layers,
        num_attention_heads=options.n_heads,
        num_key_value_heads=options.n_kv_heads,
        head_dim=options.dim // options.n_heads,
        hidden_act="silu",
        max_position_embeddings=options.max_seq_len,
        rms_norm_eps=options.norm_eps,
        rope_theta=options.rope_theta,
        tie_word_embeddings=options.tie_embeddings,
        attention_bias=False,
        mlp_bias=False,
        initializer_range=options.init_std,
        bos_token_id=token_ids.get("bos_token_id"),
        eos_token_id=token_ids.get("eos_token_id"),
        pad_token_id=token_ids.get("pad_token_id"),
        dtype=dtype,
        architectures=["LlamaForCausalLM"],
    )


def export(
    model_state_dict: dict[str, Any],
    options: LlamaOptions,
    out_dir: str | Path,
    vocab_size: int | None = None,
    *,
    bos_token_id: int | None = None,
    eos_token_id: int | None = None,
    pad_token_id: int | None = None,
) -> Path:
    """Write ``config.json`` and ``model.safetensors`` that ``LlamaForCausalLM`` loads.

    ``model_state_dict`` is a full (unsharded) Forge state dict; wrapper prefixes
    (``_orig_mod.``, ``module.``) are stripped. ``vocab_size`` defaults to the embedding's
    rows. The caller copies the run's tokenizer into ``out_dir`` when it has one.
    """
    import torch
    from safetensors.torch import save_file

    state = {_strip_wrappers(k): v for k, v in model_state_dict.items()}
    embedding = state.get("tok_embeddings.weight")
    if embedding is None:
        raise ValueError(
            "the state dict has no tok_embeddings.weight: export needs the whole model "
            "(gather pipeline stages and shards into one state dict first)"
        )
    if vocab_size is None:
        vocab_size = embedding.shape[0]
    expected = {f"layers.{i}.{name}" for i in range(options.n_layers) for name in _LAYER_KEYS}
    expected |= {"tok_embeddings.weight", "norm.weight"}
    if not options.tie_embeddings:
        expected.add("output.weight")
    missing = sorted(expected - state.keys())
    if missing:
        raise ValueError(
            f"the state dict does not match model.options: missing {missing[:5]}"
            f"{' ...' if len(missing) > 5 else ''}; export with the options the run trained with"
        )
    tensors = {
        to_hf_key(key): state[key].detach().to("cpu").contiguous().clone()
        for key in sorted(expected)
    }
    dtype = str(embedding.dtype).removeprefix("torch.")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = hf_config(
        options, vocab_size, dtype=dtype,
        bos_token_id=bos_token_id, eos_token_id=eos_token_id, pad_token_id=pad_token_id,
    )
    config.save_pretrained(out)
    with torch.no_grad():
        save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def read_hf_config(hf_dir: str | Path) -> dict[str, Any]:
    path = Path(hf_dir) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(
            f"model.options.init_from_hf={str(hf_dir)!r}: no config.json there; point it at a "
            "local Hugging Face Llama folder (as written by save_pretrained)"
        )
    config = json.loads(path.read_text())
    if isinstance(config, dict) and config.get("auto_map"):
        raise ValueError(
            f"model.options.init_from_hf={str(hf_dir)!r}: {path} names custom model code (auto_map: "
            f"{json.dumps(config['auto_map'])[:200]}). Forge never runs code from model folders: it reads "
            "config.json and the safetensors weights itself, and only a standard LlamaForCausalLM "
            "folder maps onto its llama"
        )
    return config


def _rope_theta_and_type(config: dict[str, Any]) -> tuple[float | None, str]:
    params = config.get("rope_parameters") or {}
    scaling = config.get("rope_scaling") or {}
    theta = config.get("rope_theta", params.get("rope_theta"))
    rope_type = params.get("rope_type") or scaling.get("rope_type") or scaling.get("type")
    return theta, rope_type or "default"


def check_hf_compatible(
    options: LlamaOptions, hf_dir: str | Path, vocab_size: int | None = None
) -> int:
    """Check a Hugging Face Llama folder against ``options``; return its vocab size.

    Every mismatch is listed with the option value that would match. ``vocab_size`` (the
    tokenizer's) may be smaller than the checkpoint's, never larger.
    """
    config = read_hf_config(hf_dir)
    where = f"model.options.init_from_hf={str(hf_dir)!r}"
    if config.get("model_type") != "llama":
        raise ValueError(f"{where}: model_type is {config.get('model_type')!r}, expected 'llama'")
    theta, rope_type = _rope_theta_and_type(config)
    if rope_type != "default":
        raise ValueError(
            f"{where}: rope type {rope_type!r} is not supported (Forge's llama implements the "
            "default rotary embedding only)"
        )
    n_heads = config["num_attention_heads"]
    pairs = [
        ("dim", options.dim, "hidden_size", config["hidden_size"]),
        ("n_layers", options.n_layers, "num_hidden_layers", config["num_hidden_layers"]),
        ("n_heads", options.n_heads, "num_attention_heads", n_heads),
        ("n_kv_heads", options.n_kv_heads, "num_key_value_heads",
         config.get("num_key_value_heads") or n_heads),
        ("ffn_hidden", ffn_hidden_size(options), "intermediate_size", config["intermediate_size"]),
        ("norm_eps", options.norm_eps, "rms_norm_eps", config.get("rms_norm_eps", 1e-6)),
        ("rope_theta", options.rope_theta, "rope_theta", theta if theta is not None else 10000.0),
        ("tie_embeddings", options.tie_embeddings, "tie_word_embeddings",
         bool(config.get("tie_word_embeddings", False))),
    ]
    problems = [
        f"model.options.{name}={ours!r} but {hf_name}={theirs!r} (set {name}={theirs!r})"
        for name, ours, hf_name, theirs in pairs
        if ours != theirs
    ]
    head_dim = config.get("head_dim")
    if head_dim is not None and head_dim * n_heads != config["hidden_size"]:
        problems.append(
            f"head_dim={head_dim} with {n_heads} heads differs from hidden_size="
            f"{config['hidden_size']}; Forge's llama needs head_dim = dim / n_heads"
        )
    for flag in ("attention_bias", "mlp_bias"):
        if config.get(flag):
            problems.append(f"{flag}=true; Forge's llama has no biases")
    if config.get("hidden_act", "silu") != "silu":
        problems.append(f"hidden_act={config['hidden_act']!r}; Forge's llama uses silu")
    hf_vocab = config["vocab_size"]
    if vocab_size is not None and vocab_size > hf_vocab:
        problems.append(
            f"the tokenizer has {vocab_size} tokens but the checkpoint's vocab_size is "
            f"{hf_vocab}; use the tokenizer the checkpoint was trained with"
        )
    if problems:
        raise ValueError(f"{where} does not match the model options:\n  " + "\n  ".join(problems))
    return hf_vocab


def _load_tensors(hf_dir: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    index = hf_dir / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    elif (hf_dir / "model.safetensors").is_file():
        files = ["model.safetensors"]
    else:
        raise FileNotFoundError(
            f"{hf_dir}: no model.safetensors (or sharded index); only safetensors weights "
            "are read; re-save the model with save_pretrained(safe_serialization=True)"
        )
    tensors: dict[str, Any] = {}
    for name in files:
        tensors.update(load_file(str(hf_dir / name)))
    return tensors


def load_into(model: Any, hf_dir: str | Path) -> None:
    """Copy a Hugging Face Llama folder's weights into ``model`` (a Forge llama, possibly
    a pipeline stage holding only some layers) in place."""
    import torch

    hf_dir = Path(hf_dir)
    check_hf_compatible(model.options, hf_dir, model.vocab_size)
    loaded = {}
    for hf_key, tensor in _load_tensors(hf_dir).items():
        key = from_hf_key(hf_key)
        if key is not None:
            loaded[key] = tensor
    if model.options.tie_embeddings and "tok_embeddings.weight" in loaded:
        # A tied checkpoint stores only the embedding; the output is the same matrix.
        loaded["output.weight"] = loaded["tok_embeddings.weight"]
    targets = model.state_dict()
    missing = sorted(k for k in targets if k not in loaded)
    if missing:
        raise ValueError(f"{hf_dir}: weights missing for {missing[:5]}")
    with torch.no_grad():
        for key, target in targets.items():
            source = loaded[key]
            if source.shape != target.shape:
                raise ValueError(
                    f"{hf_dir}: {to_hf_key(key)} has shape {tuple(source.shape)}, the model "
                    f"expects {tuple(target.shape)}"
                )
            target.copy_(source)
