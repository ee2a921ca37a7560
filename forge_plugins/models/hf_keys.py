"""Forge llama parameter names <-> Hugging Face names, and the shapes a checkpoint must
have (no torch). The families use the same Hugging Face names. Per layer ``i``::

    tok_embeddings.weight               model.embed_tokens.weight
    layers.i.attention_norm.weight      model.layers.i.input_layernorm.weight
    layers.i.attention.w{q,k,v,o}.*     model.layers.i.self_attn.{q,k,v,o}_proj.{weight,bias}
    layers.i.attention.{q,k}_norm.weight  model.layers.i.self_attn.{q,k}_norm.weight   (qwen3)
    layers.i.ffn_norm.weight            model.layers.i.post_attention_layernorm.weight
    layers.i.feed_forward.w1 / w3 / w2  model.layers.i.mlp.gate_proj / up_proj / down_proj
    norm.weight                         model.norm.weight
    output.weight                       lm_head.weight (absent when embeddings are tied)

An olmo2 block is post-norm, its norms named apart from the pre-norm ones (its q/k norms
are over the whole projection, ``[n_heads * head_dim]`` and ``[n_kv_heads * head_dim]``)::

    layers.i.post_attention_norm.weight  model.layers.i.post_attention_layernorm.weight
    layers.i.post_ffn_norm.weight        model.layers.i.post_feedforward_layernorm.weight

An MoE block (``model.options.moe``) is named as its architecture
(:func:`~forge_plugins.models.hf_moe.moe_type`) names it, with ``B`` the block's module
(``mlp`` in Qwen3-MoE, ``block_sparse_moe`` in Mixtral)::

    layers.i.feed_forward.router.gate.weight   model.layers.i.B.gate.weight
    layers.i.feed_forward.experts.w1 [E, dim, h]   model.layers.i.B.experts.e.gate_proj.weight [h, dim] (w1)
    layers.i.feed_forward.experts.w3 [E, dim, h]   model.layers.i.B.experts.e.up_proj.weight [h, dim] (w3)
    layers.i.feed_forward.experts.w2 [E, h, dim]   model.layers.i.B.experts.e.down_proj.weight [dim, h] (w2)

One Forge stack holds every expert, tokens multiplying as ``x @ w1[e]``; the checkpoint
holds each expert's matrix as ``nn.Linear`` does, so expert ``e`` of a stack is the
transpose of its Hugging Face tensor (what ``save_pretrained`` of transformers 5 writes:
one tensor per expert, though its models fuse them in memory).

Forge's rotary uses transformers' ``rotate_half`` layout, so q/k weights are copied as
they are (no permutation).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from forge_plugins.models.hf_moe import moe_type
from forge_plugins.models.options import LlamaOptions, features, ffn_hidden_size, head_dim, is_moe_layer

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
#: The post-norm block's norms (olmo2): Hugging Face's post_attention_layernorm is the
#: pre-norm ffn_norm in the other families, so mapping back needs the family.
_POST_NORMS = {
    "post_attention_norm": "post_attention_layernorm",
    "post_ffn_norm": "post_feedforward_layernorm",
}
_LAYER_MODULES_BACK = {hf: forge for forge, hf in _LAYER_MODULES.items()}
_POST_NORMS_BACK = {hf: forge for forge, hf in _POST_NORMS.items()}
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
#: MoE type -> (the block's module, each Forge expert stack's per-expert name).
MOE_NAMES = {
    "qwen3_moe": ("mlp", {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}),
    "mixtral": ("block_sparse_moe", {"w1": "w1", "w3": "w3", "w2": "w2"}),
}
_ROUTER = re.compile(r"layers\.(\d+)\.feed_forward\.router\.gate\.weight")
_STACK = re.compile(r"layers\.(\d+)\.feed_forward\.experts\.(w[123])")


def to_hf_key(key: str, moe: str | None = None) -> str:
    """The Hugging Face name of a Forge key (an MoE router's in the names of MoE type
    ``moe``); an expert stack has one per expert (:func:`expert_hf_keys`)."""
    if key in _TOP_KEYS:
        return _TOP_KEYS[key]
    match = re.fullmatch(r"layers\.(\d+)\.(.+)\.(weight|bias)", key)
    modules = {**_LAYER_MODULES, **_POST_NORMS}
    if match and match.group(2) in modules:
        return f"model.layers.{match.group(1)}.{modules[match.group(2)]}.{match.group(3)}"
    router = _ROUTER.fullmatch(key)
    if router and moe in MOE_NAMES:
        return f"model.layers.{router.group(1)}.{MOE_NAMES[moe][0]}.gate.weight"
    raise KeyError(f"no Hugging Face name for Forge llama key {key!r}")


def expert_hf_keys(key: str, moe: str | None, experts: range) -> list[str] | None:
    """The Hugging Face names of the experts ``experts`` of a Forge expert stack
    (``layers.i.feed_forward.experts.w1``), ``None`` for a key that is not a stack."""
    match = _STACK.fullmatch(key)
    if not match:
        return None
    if moe not in MOE_NAMES:
        raise KeyError(f"no Hugging Face name for Forge llama key {key!r}")
    block, names = MOE_NAMES[moe]
    layer, stack = match.groups()
    return [f"model.layers.{layer}.{block}.experts.{e}.{names[stack]}.weight" for e in experts]


def from_hf_key(key: str, moe: str | None = None, post_norm: bool = False) -> str | None:
    """The Forge key for a Hugging Face key (an expert's: its stack's; a post-norm
    block's norms with ``post_norm``), or ``None`` for a key Forge has no name for."""
    if key in _TOP_KEYS_BACK:
        return _TOP_KEYS_BACK[key]
    match = re.fullmatch(r"model\.layers\.(\d+)\.(.+)\.(weight|bias)", key)
    back = {**_LAYER_MODULES_BACK, **_POST_NORMS_BACK} if post_norm else _LAYER_MODULES_BACK
    if match and match.group(2) in back:
        return f"layers.{match.group(1)}.{back[match.group(2)]}.{match.group(3)}"
    if match and moe in MOE_NAMES:
        block, names = MOE_NAMES[moe]
        back = {name: stack for stack, name in names.items()}
        if match.group(2) == f"{block}.gate":
            return f"layers.{match.group(1)}.feed_forward.router.gate.weight"
        expert = re.fullmatch(rf"{re.escape(block)}\.experts\.\d+\.(\w+)", match.group(2))
        if expert and expert.group(1) in back and match.group(3) == "weight":
            return f"layers.{match.group(1)}.feed_forward.experts.{back[expert.group(1)]}"
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
    norms = ("post_attention_norm", "post_ffn_norm") if extra.post_norm else ("attention_norm", "ffn_norm")
    layer = {
        **{f"{norm}.weight": (dim,) for norm in norms},
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
        whole = extra.qk_norm == "projection"
        layer.update(
            {
                "attention.q_norm.weight": (q if whole else hd,),
                "attention.k_norm.weight": (kv if whole else hd,),
            }
        )
    moe, sparse = options.moe, layer
    if moe is not None:  # an MoE block: the attention's parameters, the router and experts
        e, h = moe.num_experts, moe.expert_hidden
        sparse = {
            "feed_forward.router.gate.weight": (e, dim),
            "feed_forward.experts.w1": (e, dim, h),
            "feed_forward.experts.w3": (e, dim, h),
            "feed_forward.experts.w2": (e, h, dim),
        }
        if moe.shared_experts:
            shared = moe.shared_hidden or moe.shared_experts * h
            sparse.update(
                {
                    "feed_forward.shared.w1.weight": (shared, dim),
                    "feed_forward.shared.w3.weight": (shared, dim),
                    "feed_forward.shared.w2.weight": (dim, shared),
                }
            )
        sparse.update({k: v for k, v in layer.items() if not k.startswith("feed_forward.")})
    shapes = {
        f"layers.{i}.{key}": shape
        for i in range(options.n_layers)
        for key, shape in (sparse if is_moe_layer(options, i) else layer).items()
    }
    shapes["tok_embeddings.weight"] = (vocab_size, dim)
    shapes["norm.weight"] = (dim,)
    if not options.tie_embeddings:
        shapes["output.weight"] = (vocab_size, dim)
    return shapes


def expected_hf_shapes(options: LlamaOptions, vocab_size: int) -> dict[str, tuple[int, ...]]:
    """The shape of every Hugging Face weight a Forge llama with ``options`` takes (an
    expert stack ``[E, a, b]`` as ``E`` matrices ``[b, a]``)."""
    moe = moe_type(options)
    shapes: dict[str, tuple[int, ...]] = {}
    for key, shape in forge_shapes(options, vocab_size).items():
        experts = expert_hf_keys(key, moe, range(shape[0])) if len(shape) == 3 else None
        if experts is None:
            shapes[to_hf_key(key, moe)] = shape
        else:
            shapes.update(dict.fromkeys(experts, (shape[2], shape[1])))
    return shapes
