"""Forge llama parameter names <-> Hugging Face names, and the shapes a checkpoint must
have (no torch). The four families use the same Hugging Face names. Per layer ``i``::

    tok_embeddings.weight               model.embed_tokens.weight
    layers.i.attention_norm.weight      model.layers.i.input_layernorm.weight
    layers.i.attention.w{q,k,v,o}.*     model.layers.i.self_attn.{q,k,v,o}_proj.{weight,bias}
    layers.i.attention.{q,k}_norm.weight  model.layers.i.self_attn.{q,k}_norm.weight   (qwen3)
    layers.i.ffn_norm.weight            model.layers.i.post_attention_layernorm.weight
    layers.i.feed_forward.w1 / w3 / w2  model.layers.i.mlp.gate_proj / up_proj / down_proj
    norm.weight                         model.norm.weight
    output.weight                       lm_head.weight (absent when embeddings are tied)

Forge's rotary uses transformers' ``rotate_half`` layout, so q/k weights are copied as
they are (no permutation).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from forge_plugins.models.options import LlamaOptions, features, ffn_hidden_size, head_dim

_LAYER_MODULES = {
    "attention_norm": "input_layernorm",
    "attention.wq": "self_attn.q_proj",
    "attention.wk": "self_attn.k_proj",
    "attention.wv": "self_attn.v_proj",
    "attention.wo": "self_attn.o_proj",
    "attention.q_norm": "self_attn.q_norm",
    "attention.k_norm": "self_attn.k_norm",
    "ffn_norm": "post_attention_layernorm",
    "feed_forward.w1": "mlp.gate_proj",
    "feed_forward.w3": "mlp.up_proj",
    "feed_forward.w2": "mlp.down_proj",
}
_LAYER_MODULES_BACK = {hf: forge for forge, hf in _LAYER_MODULES.items()}
_TOP_KEYS = {
    "tok_embeddings.weight": "model.embed_tokens.weight",
    "norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_TOP_KEYS_BACK = {hf: forge for forge, hf in _TOP_KEYS.items()}
#: Checkpoint entries that are not parameters (older transformers saved the rotary table).
IGNORED = re.compile(r".*\.rotary_emb\.inv_freq")
#: A layer's Hugging Face prefix, its index written as to_hf_key writes it.
_HF_LAYER = re.compile(r"model\.layers\.(0|[1-9][0-9]{0,17})\.")


def to_hf_key(key: str) -> str:
    if key in _TOP_KEYS:
        return _TOP_KEYS[key]
    match = re.fullmatch(r"layers\.(\d+)\.(.+)\.(weight|bias)", key)
    if match and match.group(2) in _LAYER_MODULES:
        return f"model.layers.{match.group(1)}.{_LAYER_MODULES[match.group(2)]}.{match.group(3)}"
    raise KeyError(f"no Hugging Face name for Forge llama key {key!r}")


def from_hf_key(key: str) -> str | None:
    """The Forge key for a Hugging Face key, or ``None`` for a key Forge has no name for."""
    if key in _TOP_KEYS_BACK:
        return _TOP_KEYS_BACK[key]
    match = re.fullmatch(r"model\.layers\.(\d+)\.(.+)\.(weight|bias)", key)
    if match and match.group(2) in _LAYER_MODULES_BACK:
        return f"layers.{match.group(1)}.{_LAYER_MODULES_BACK[match.group(2)]}.{match.group(3)}"
    return None


def stored_layers(hf_keys: Iterable[str]) -> set[int]:
    """The layer indices that Hugging Face tensor names hold (one pass over the names:
    the layer count a ``config.json`` claims is checked against it before anything is
    built per layer)."""
    return {int(match.group(1)) for key in hf_keys if (match := _HF_LAYER.match(key))}


def forge_shapes(options: LlamaOptions, vocab_size: int) -> dict[str, tuple[int, ...]]:
    """Every parameter of a Forge llama with (resolved) ``options``, by state-dict key,
    with its shape (a tied output is listed once, as the embedding)."""
    hd, ffn, dim = head_dim(options), ffn_hidden_size(options), options.dim
    q, kv = options.n_heads * hd, options.n_kv_heads * hd
    extra = features(options)
    layer = {
        "attention_norm.weight": (dim,),
        "ffn_norm.weight": (dim,),
        "attention.wq.weight": (q, dim),
        "attention.wk.weight": (kv, dim),
        "attention.wv.weight": (kv, dim),
        "attention.wo.weight": (dim, q),
        "feed_forward.w1.weight": (ffn, dim),
        "feed_forward.w3.weight": (ffn, dim),
        "feed_forward.w2.weight": (dim, ffn),
    }
    if extra.qkv_bias:
        layer.update({"attention.wq.bias": (q,), "attention.wk.bias": (kv,), "attention.wv.bias": (kv,)})
    if extra.out_bias:
        layer["attention.wo.bias"] = (dim,)
    if extra.mlp_bias:
        layer.update(
            {"feed_forward.w1.bias": (ffn,), "feed_forward.w3.bias": (ffn,), "feed_forward.w2.bias": (dim,)}
        )
    if extra.qk_norm:
        layer.update({"attention.q_norm.weight": (hd,), "attention.k_norm.weight": (hd,)})
    shapes = {f"layers.{i}.{key}": shape for i in range(options.n_layers) for key, shape in layer.items()}
    shapes["tok_embeddings.weight"] = (vocab_size, dim)
    shapes["norm.weight"] = (dim,)
    if not options.tie_embeddings:
        shapes["output.weight"] = (vocab_size, dim)
    return shapes


def expected_hf_shapes(options: LlamaOptions, vocab_size: int) -> dict[str, tuple[int, ...]]:
    """The shape of every Hugging Face weight a Forge llama with ``options`` takes."""
    return {to_hf_key(key): shape for key, shape in forge_shapes(options, vocab_size).items()}
