"""Hugging Face interop for ``llama`` with torch: export a Forge model as the family's
``*ForCausalLM`` folder, and load a checkpoint into a model (``init_from_hf``).

Names map as :mod:`forge_plugins.models.hf_keys` says; the torch-free checks of a folder
are in :mod:`forge_plugins.models.hf_config` and :mod:`forge_plugins.models.hf_folder`.

Loading reads lazily: each tensor through ``safetensors.safe_open(...).get_slice``, and
of a DTensor parameter (FSDP or tensor-parallel shards, or both) only the block this
process holds, so no process holds more of the checkpoint than of the model. Sharded
checkpoints (``model.safetensors.index.json``) are read file by file as their index
says. Tensors are cast to the parameter's dtype as they are copied. An expert stack
(``feed_forward.experts.w1``, ``[E, dim, hidden]``) is read expert by expert, each
checkpoint matrix transposed into its slot, and of a stack that holds some experts
(``first_expert``, ``local_experts`` of its module: expert parallelism) or a shard of
them only those.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from forge_core.api import ForgeError
from forge_plugins.models.hf_config import ARCHITECTURES, hf_config_kwargs, hf_model_type
from forge_plugins.models.hf_folder import (
    INDEX,
    SINGLE,
    HFFolderMismatch,
    checkpoint_bytes,
    weight_map,
    where,
)
from forge_plugins.models.hf_keys import expert_hf_keys, forge_shapes, to_hf_key
from forge_plugins.models.hf_moe import export_problems, moe_type
from forge_plugins.models.options import LlamaOptions, with_defaults

#: Prefixes that wrappers add to state-dict keys (torch.compile, DDP).
_WRAPPER_PREFIXES = ("_orig_mod.", "module.")
#: Above this checkpoint size the loading shows a progress bar (on the first process).
_PROGRESS_BYTES = 1 << 30


def _strip_wrappers(key: str) -> str:
    changed = True
    while changed:
        changed = False
        for prefix in _WRAPPER_PREFIXES:
            if key.startswith(prefix):
                key, changed = key[len(prefix) :], True
    return key


def hf_config(options: LlamaOptions, vocab_size: int, dtype: str = "float32", **token_ids: Any):
    """The ``transformers`` config (``LlamaConfig``, ``Qwen2Config``, ``MixtralConfig``,
    ...) of the family."""
    from transformers import AutoConfig

    options = with_defaults(options)
    kwargs = hf_config_kwargs(options, vocab_size)
    return AutoConfig.for_model(
        hf_model_type(options),
        **kwargs,
        dtype=dtype,
        **{k: token_ids.get(k) for k in ("bos_token_id", "eos_token_id", "pad_token_id")},
    )


def write_weights(tensors: dict[str, Any], out: Path, max_shard_size: int | None = None) -> list[Path]:
    """``model.safetensors``, or shards of at most ``max_shard_size`` bytes (a larger
    tensor gets a shard of its own) with ``model.safetensors.index.json``, as
    ``save_pretrained`` names them."""
    from safetensors.torch import save_file

    sizes = {key: t.numel() * t.element_size() for key, t in tensors.items()}
    total = sum(sizes.values())
    if not max_shard_size or total <= max_shard_size:
        save_file(tensors, str(out / SINGLE), metadata={"format": "pt"})
        return [out / SINGLE]
    shards: list[list[str]] = [[]]
    filled = 0
    for key in tensors:
        if shards[-1] and filled + sizes[key] > max_shard_size:
            shards.append([])
            filled = 0
        shards[-1].append(key)
        filled += sizes[key]
    names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    for name, keys in zip(names, shards):
        save_file({key: tensors[key] for key in keys}, str(out / name), metadata={"format": "pt"})
    index = {
        "metadata": {"total_size": total},
        "weight_map": {key: name for name, keys in zip(names, shards) for key in keys},
    }
    (out / INDEX).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    return [out / name for name in names]


def export(
    model_state_dict: dict[str, Any],
    options: LlamaOptions,
    out_dir: str | Path,
    vocab_size: int | None = None,
    *,
    bos_token_id: int | None = None,
    eos_token_id: int | None = None,
    pad_token_id: int | None = None,
    max_shard_size: int | None = None,
) -> Path:
    """Write ``config.json`` (the family's architecture), ``generation_config.json`` and
    the weights (one file, or shards of at most ``max_shard_size`` bytes) that
    transformers loads.

    ``model_state_dict`` is a full (unsharded) Forge state dict, in the dtype to write;
    wrapper prefixes (``_orig_mod.``, ``module.``) are stripped. ``vocab_size`` defaults
    to the embedding's rows. The caller writes the tokenizer.
    """
    from transformers import GenerationConfig

    options = with_defaults(options)
    state = {_strip_wrappers(k): v for k, v in model_state_dict.items()}
    embedding = state.get("tok_embeddings.weight")
    if embedding is None:
        raise ValueError(
            "the state dict has no tok_embeddings.weight: export needs the whole model "
            "(gather pipeline stages and shards into one state dict first)"
        )
    if vocab_size is None:
        vocab_size = embedding.shape[0]
    expected = forge_shapes(options, embedding.shape[0])
    missing = sorted(expected.keys() - state.keys())
    if missing:
        raise ValueError(
            f"the state dict does not match model.options: missing {missing[:5]}"
            f"{' ...' if len(missing) > 5 else ''}; export with the options the run trained with"
        )
    problems = export_problems(options)
    bias = [k for k, v in state.items() if k.endswith("router.expert_bias") and bool(v.any())]
    if bias:
        problems.append(
            f"{len(bias)} MoE routers ({bias[0]}, ...) have a non-zero selection bias (loss-free "
            "balancing, moe.bias_update_rate): transformers' router has none, so it would choose "
            "other experts"
        )
    if problems:
        raise ForgeError(
            "this model has no Hugging Face architecture that computes as it does:\n  "
            + "\n  ".join(problems)
        )
    moe = moe_type(options)
    tensors = {}
    for key in sorted(expected):
        tensor = state[key].detach().to("cpu")
        names = expert_hf_keys(key, moe, range(tensor.shape[0])) if tensor.dim() == 3 else None
        if names is None:
            tensors[to_hf_key(key, moe)] = tensor.contiguous()
        else:  # expert e of a stack is the transpose of its nn.Linear weight
            tensors.update({name: tensor[e].t().contiguous() for e, name in enumerate(names)})
    dtype = str(embedding.dtype).removeprefix("torch.")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ids = {"bos_token_id": bos_token_id, "eos_token_id": eos_token_id, "pad_token_id": pad_token_id}
    hf_config(options, vocab_size, dtype=dtype, **ids).save_pretrained(out)
    GenerationConfig(**{k: v for k, v in ids.items() if v is not None}).save_pretrained(out)
    write_weights(tensors, out, max_shard_size)
    return out


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _read_into(view: Any, target: Any, name: str) -> None:
    """Copy the part of checkpoint tensor ``view`` (a safetensors slice) that ``target``
    holds: all of a plain tensor, this process's block of a DTensor."""
    full = tuple(view.get_shape())
    if full != tuple(target.shape):
        raise HFFolderMismatch(f"{name} has shape {list(full)}, the model expects {list(target.shape)}")
    local = target
    index: tuple[slice, ...] = tuple(slice(0, n) for n in full)
    if hasattr(target, "device_mesh"):
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

        shape, offset = compute_local_shape_and_global_offset(
            target.shape, target.device_mesh, target.placements
        )
        local = target.to_local()
        if tuple(local.shape) != tuple(shape):
            raise RuntimeError(f"{name}: the local shard is {tuple(local.shape)}, its placements say {shape}")
        index = tuple(slice(o, o + n) for o, n in zip(offset, shape))
    if local.numel() == 0:
        return
    local.copy_(view[index] if index else view[:])


def _read_expert(view: Any, target: Any, expert: int, name: str) -> None:
    """Copy into slot ``expert`` of stack ``target`` (``[E, a, b]``, plain or a DTensor)
    the part this process holds of checkpoint matrix ``view`` (``[b, a]``)."""
    full = tuple(view.get_shape())
    if full != (target.shape[2], target.shape[1]):
        raise HFFolderMismatch(
            f"{name} has shape {list(full)}, the model expects {[target.shape[2], target.shape[1]]}"
        )
    local, offset = target, (0, 0, 0)
    shape = tuple(target.shape)
    if hasattr(target, "device_mesh"):
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

        shape, offset = compute_local_shape_and_global_offset(
            target.shape, target.device_mesh, target.placements
        )
        local = target.to_local()
    row = expert - offset[0]
    if not 0 <= row < shape[0] or 0 in shape:
        return
    block = view[offset[2] : offset[2] + shape[2], offset[1] : offset[1] + shape[1]]
    local[row].copy_(block.t())


def _experts_held(model: Any, name: str, param: Any) -> range:
    """The global indices of the experts of a stack, slot by slot: all of them for a
    stack of every expert (whole, or a DTensor whose placements say which this process
    holds), else its module's ``first_expert`` on (a stack sliced to local experts)."""
    module = model.get_submodule(name.rsplit(".", 1)[0])
    if param.shape[0] == getattr(module, "num_experts", param.shape[0]):
        return range(param.shape[0])
    first = int(module.first_expert)
    return range(first, first + param.shape[0])


def load_into(model: Any, hf_dir: str | Path) -> None:
    """Copy a Hugging Face checkpoint's weights into ``model`` (a Forge llama whose
    parameters are materialised: whole, a pipeline stage holding some layers, or DTensor
    shards) in place, reading only what it holds. One file is open at a time, so the
    pages of the checkpoint mapped in memory are those of one file at most."""
    import torch
    from safetensors import safe_open
    from tqdm import tqdm

    hf_dir = Path(hf_dir)
    files = weight_map(hf_dir)
    moe = moe_type(with_defaults(model.options)) if hasattr(model, "options") else None
    # file -> (checkpoint key, parameter, its slot in an expert stack or None)
    by_file: dict[Path, list[tuple[str, Any, int | None]]] = {}
    unplaced = []
    for name, param in model.named_parameters():
        key = _strip_wrappers(name)
        experts = _experts_held(model, name, param) if param.dim() == 3 else None
        names = expert_hf_keys(key, moe, experts) if experts is not None else None
        if names is not None:
            for slot, hf_key in enumerate(names):
                if hf_key in files:
                    by_file.setdefault(files[hf_key], []).append((hf_key, param, slot))
                else:
                    unplaced.append(hf_key)
            continue
        hf_key = to_hf_key(key, moe)
        if hf_key not in files and hf_key == "lm_head.weight":
            hf_key = "model.embed_tokens.weight"  # a tied checkpoint stores the matrix once
        if hf_key in files:
            by_file.setdefault(files[hf_key], []).append((hf_key, param, None))
        else:
            unplaced.append(hf_key)
    if unplaced:
        raise HFFolderMismatch(
            f"{where(hf_dir)}: weights missing for {', '.join(unplaced[:5])}"
            f"{' ...' if len(unplaced) > 5 else ''}"
        )
    progress = tqdm(
        total=sum(map(len, by_file.values())),
        desc=f"loading {hf_dir.name}",
        unit="tensor",
        leave=False,
        disable=_rank() != 0 or checkpoint_bytes(hf_dir) < _PROGRESS_BYTES,
    )
    with torch.no_grad(), progress:
        # Not in any checkpoint (Qwen3-MoE and Mixtral route without one): the MoE
        # routers' selection bias starts at zero, as in a fresh model.
        for name, buffer in model.named_buffers():
            if name.endswith("router.expert_bias"):
                buffer.zero_()
        for path in sorted(by_file):
            with safe_open(str(path), framework="pt") as f:
                for hf_key, param, expert in by_file[path]:
                    if expert is None:
                        _read_into(f.get_slice(hf_key), param, hf_key)
                    else:
                        _read_expert(f.get_slice(hf_key), param, expert, hf_key)
                    progress.update()


__all__ = ["ARCHITECTURES", "export", "hf_config", "load_into", "write_weights"]
