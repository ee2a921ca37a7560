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

from forge_core.api import ForgeError
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


class HFFolderMissing(ForgeError, FileNotFoundError):
    """The ``init_from_hf`` folder, its ``config.json`` or its weights are not there."""


class HFFolderMismatch(ForgeError, ValueError):
    """The ``init_from_hf`` folder does not fit the model options (every reason listed)."""


#: Keys ``config.json`` must have for the comparison with the options.
_REQUIRED_CONFIG_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")
#: The safetensors format caps its JSON header at 100 MB.
_MAX_SAFETENSORS_HEADER = 100_000_000
_INDEX = "model.safetensors.index.json"
_SINGLE = "model.safetensors"


def _where(hf_dir: str | Path) -> str:
    return f"model.options.init_from_hf={str(hf_dir)!r}"


def read_hf_config(hf_dir: str | Path) -> dict[str, Any]:
    """``config.json`` of a Hugging Face folder as a mapping (json only, no torch)."""
    folder = Path(hf_dir)
    if not folder.is_dir():
        what = "is not a directory" if folder.exists() else "does not exist"
        raise HFFolderMissing(
            f"{_where(hf_dir)}: the folder {what} (so there is no config.json); point it at a "
            "local Hugging Face Llama folder (as written by save_pretrained)"
        )
    path = folder / "config.json"
    if not path.is_file():
        raise HFFolderMissing(
            f"{_where(hf_dir)}: no config.json there; point it at a local Hugging Face Llama "
            "folder (as written by save_pretrained)"
        )
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise HFFolderMismatch(f"{_where(hf_dir)}: config.json is not valid JSON ({exc})") from None
    if not isinstance(config, dict):
        raise HFFolderMismatch(f"{_where(hf_dir)}: config.json holds {type(config).__name__}, not an object")
    if config.get("auto_map"):
        raise HFFolderMismatch(
            f"{_where(hf_dir)}: {path} names custom model code (auto_map: "
            f"{json.dumps(config['auto_map'])[:200]}). Forge never runs code from model folders: it reads "
            "config.json and the safetensors weights itself, and only a standard LlamaForCausalLM "
            "folder maps onto its llama"
        )
    return config


def _rope_theta_and_type(config: dict[str, Any]) -> tuple[float | None, str]:
    params = config.get("rope_parameters") or {}
    scaling = config.get("rope_scaling") or {}
    if not isinstance(params, dict):
        params = {}
    if not isinstance(scaling, dict):
        scaling = {}
    theta = config.get("rope_theta", params.get("rope_theta"))
    rope_type = params.get("rope_type") or scaling.get("rope_type") or scaling.get("type")
    return theta, rope_type or "default"


def config_mismatches(options: LlamaOptions, config: dict[str, Any], vocab_size: int | None = None) -> list[str]:
    """Every difference between a Hugging Face ``config.json`` and ``options``, each with
    both values and the option value that would match. ``vocab_size`` (the tokenizer's,
    when known) may be smaller than the checkpoint's, never larger."""
    if config.get("model_type") != "llama":
        return [f"model_type is {config.get('model_type')!r}, expected 'llama'"]
    missing = [key for key in _REQUIRED_CONFIG_KEYS if not isinstance(config.get(key), int)]
    if missing:
        return [f"config.json has no integer {key!r}" for key in missing]
    theta, rope_type = _rope_theta_and_type(config)
    if rope_type != "default":
        return [
            f"rope type {rope_type!r} is not supported (Forge's llama implements the default "
            "rotary embedding only)"
        ]
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
    if head_dim is not None and head_dim != config["hidden_size"] / n_heads:
        problems.append(
            f"head_dim={head_dim!r} with {n_heads} heads differs from hidden_size="
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
    return problems


def expected_hf_shapes(options: LlamaOptions, vocab_size: int) -> dict[str, tuple[int, ...]]:
    """The shape of every Hugging Face weight a Forge llama with ``options`` takes."""
    head_dim = options.dim // options.n_heads
    q, kv, ffn, dim = options.n_heads * head_dim, options.n_kv_heads * head_dim, ffn_hidden_size(options), options.dim
    layer = {
        "input_layernorm.weight": (dim,), "post_attention_layernorm.weight": (dim,),
        "self_attn.q_proj.weight": (q, dim), "self_attn.k_proj.weight": (kv, dim),
        "self_attn.v_proj.weight": (kv, dim), "self_attn.o_proj.weight": (dim, q),
        "mlp.gate_proj.weight": (ffn, dim), "mlp.up_proj.weight": (ffn, dim), "mlp.down_proj.weight": (dim, ffn),
    }
    shapes = {f"model.layers.{i}.{key}": shape for i in range(options.n_layers) for key, shape in layer.items()}
    shapes["model.embed_tokens.weight"] = (vocab_size, dim)
    shapes["model.norm.weight"] = (dim,)
    if not options.tie_embeddings:
        shapes["lm_head.weight"] = (vocab_size, dim)
    return shapes


def weight_files(hf_dir: str | Path) -> list[Path]:
    """The safetensors files of a folder (from its sharded index, or the single file)."""
    folder = Path(hf_dir)
    index = folder / _INDEX
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            names = sorted(set(weight_map.values()))
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise HFFolderMismatch(f"{_where(hf_dir)}: {_INDEX} is not a safetensors index ({exc!r})") from None
        absent = [name for name in names if not (folder / name).is_file()]
        if absent:
            raise HFFolderMissing(f"{_where(hf_dir)}: {_INDEX} names {', '.join(absent[:5])}, which are not there")
        return [folder / name for name in names]
    if (folder / _SINGLE).is_file():
        return [folder / _SINGLE]
    others = sorted(p.name for p in folder.glob("*.bin")) + sorted(p.name for p in folder.glob("*.pt*"))
    found = f" (found {', '.join(others[:3])}: not read, pickles can run code)" if others else ""
    raise HFFolderMissing(
        f"{_where(hf_dir)}: no {_SINGLE} (or sharded {_INDEX}){found}; only safetensors weights "
        "are read; re-save the model with save_pretrained(safe_serialization=True)"
    )


def safetensors_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape from a safetensors file's JSON header (no tensor is read)."""
    try:
        with open(path, "rb") as f:
            size = int.from_bytes(f.read(8), "little")
            if not 2 <= size <= min(_MAX_SAFETENSORS_HEADER, path.stat().st_size - 8):
                raise ValueError(f"header length {size}")
            header = json.loads(f.read(size))
        return {
            name: tuple(int(d) for d in entry["shape"])
            for name, entry in header.items() if name != "__metadata__"
        }
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise HFFolderMismatch(f"{path}: not a readable safetensors file ({exc})") from None


def weight_mismatches(options: LlamaOptions, hf_dir: str | Path, vocab_size: int) -> list[str]:
    """Weights the options need that the folder lacks, and shapes that differ (both
    shapes shown), read from the safetensors headers."""
    found: dict[str, tuple[int, ...]] = {}
    for path in weight_files(hf_dir):
        found.update(safetensors_shapes(path))
    expected = expected_hf_shapes(options, vocab_size)
    missing = [key for key in expected if key not in found]
    problems = []
    if missing:
        problems.append(f"weights missing for {len(missing)} tensors: {', '.join(missing[:5])}"
                        f"{' ...' if len(missing) > 5 else ''}")
    problems += [
        f"{key} has shape {list(found[key])}, the options need {list(shape)}"
        for key, shape in expected.items() if key in found and found[key] != shape
    ]
    return problems


def _folder_problems(options: LlamaOptions, hf_dir: str | Path, vocab_size: int | None) -> tuple[list[str], int]:
    """``(mismatches, checkpoint vocab size)``; an unreadable folder raises."""
    config = read_hf_config(hf_dir)
    problems = config_mismatches(options, config, vocab_size)
    if problems:
        return problems, 0  # the weights would only repeat these differences shape by shape
    return weight_mismatches(options, hf_dir, config["vocab_size"]), config["vocab_size"]


def hf_folder_problems(options: LlamaOptions, hf_dir: str | Path, vocab_size: int | None = None) -> list[str]:
    """Every reason the folder cannot initialise a llama with ``options``, from
    ``config.json`` and the safetensors headers only (no torch): what ``forge-run check``
    reports and what the build refuses. Empty when the folder fits."""
    try:
        return _folder_problems(options, hf_dir, vocab_size)[0]
    except ForgeError as exc:
        return [str(exc).removeprefix(f"{_where(hf_dir)}: ")]


def check_hf_compatible(
    options: LlamaOptions, hf_dir: str | Path, vocab_size: int | None = None
) -> int:
    """Check a Hugging Face Llama folder against ``options``; return its vocab size.

    The same checks as :func:`hf_folder_problems`, raised: :class:`HFFolderMissing` for
    a missing folder, ``config.json`` or weights, :class:`HFFolderMismatch` listing every
    mismatch with the option value that would match. ``vocab_size`` (the tokenizer's)
    may be smaller than the checkpoint's, never larger.
    """
    problems, hf_vocab = _folder_problems(options, hf_dir, vocab_size)
    if problems:
        raise HFFolderMismatch(f"{_where(hf_dir)} does not match the model options:\n  " + "\n  ".join(problems))
    return hf_vocab


def _load_tensors(hf_dir: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    tensors: dict[str, Any] = {}
    for path in weight_files(hf_dir):
        tensors.update(load_file(str(path)))
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
        raise HFFolderMismatch(f"{hf_dir}: weights missing for {missing[:5]}")
    with torch.no_grad():
        for key, target in targets.items():
            source = loaded[key]
            if source.shape != target.shape:
                raise HFFolderMismatch(
                    f"{hf_dir}: {to_hf_key(key)} has shape {tuple(source.shape)}, the model "
                    f"expects {tuple(target.shape)}"
                )
            target.copy_(source)
