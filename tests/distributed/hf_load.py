"""Run under ``torchrun``: build the llama from a sharded Hugging Face checkpoint
(``model.options.init_from_hf`` alone) under several layouts, as the trainer does
(built on the meta device, sharded by :func:`parallelize`, then loaded), and record
what each process holds and whether it is the checkpoint. ``test_hf_load.py`` launches
it and asserts. The ``moe_*`` layouts load ``MOE_DIR``, a Qwen3-MoE checkpoint: under
``ep`` each process holds its experts of every stack, under ``fsdp`` a shard of the
experts; each expert stack is compared with the checkpoint's matrices of its experts,
stacked and transposed.

Usage: ``torchrun --standalone --nproc-per-node 2 hf_load.py OUT.json HF_DIR MOE_DIR NAME [NAME ...]``

For every parameter a process holds it records the largest difference to the
checkpoint's tensor: of the whole tensor gathered by DTensor itself (``full_tensor``)
for a shard, of the tensor for a plain parameter (a pipeline stage's). It also records
how many elements the process holds, and the logits of a probe batch where the layout
computes them in every process.
"""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from safetensors.torch import load_file

from forge_core import components
from forge_core import plan as planning
from forge_core.api import Plan
from forge_core.cli.exiting import exit_process
from forge_core.config.blocks import resolve_components
from forge_core.config.schema import ForgeConfig
from forge_core.config.structuring import structure
from forge_core.distributed.parallelize import is_meta, parallelize
from forge_core.registry import load_registries
from forge_core.train.loss import loss_fn
from forge_plugins.models.hf_folder import weight_map
from forge_plugins.models.hf_keys import expert_hf_keys, to_hf_key

if TYPE_CHECKING:
    from forge_core.registry import Registries

LAYOUTS = {
    "fsdp": {"dp_shard": 2},
    "tp": {"tp": 2},
    "pp": {"pp": 2, "options": {"pp": {"schedule": "gpipe", "microbatches": 2}}},
    "moe_ep": {"ep": 2},
    "moe_fsdp": {"dp_shard": 2},
}
PROBE = torch.arange(16).reshape(2, 8) % 50


def make_plan(registries: Registries, hf_dir: str, parallel: dict[str, Any]) -> Plan:
    raw = {
        "model": {"name": "llama", "options": {"init_from_hf": hf_dir}},
        "attention": {"backend": "sdpa"},
        "data": {"packer": "none", "seq_len": 8},
        "parallel": parallel,
        "train": {"batch_size": 4},
    }
    config, issues = structure(raw, ForgeConfig)
    assert not issues, issues
    config, issues = resolve_components(config, registries)
    assert not issues, issues
    return planning.make_plan(config, registries, dist.get_world_size())


def checkpoint_tensors(hf_dir: str) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for path in sorted(set(weight_map(hf_dir).values())):
        tensors.update(load_file(str(path)))
    return tensors


def checkpoint_of(key: str, tensors: dict[str, torch.Tensor], experts: int) -> torch.Tensor:
    """The checkpoint's tensor of Forge parameter ``key``: an expert stack as its
    experts' matrices, each transposed (Qwen3-MoE names)."""
    names = expert_hf_keys(key, "qwen3_moe", range(experts))
    if names is None:
        return tensors[to_hf_key(key, "qwen3_moe")]
    return torch.stack([tensors[name].t() for name in names])


def main() -> None:
    out_path, dense_dir, moe_dir, names = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
    dist.init_process_group("gloo")
    registries = load_registries()
    results: dict[str, Any] = {}
    for name in names:
        hf_dir = moe_dir if name.startswith("moe_") else dense_dir
        expected = checkpoint_tensors(hf_dir)
        plan = make_plan(registries, hf_dir, LAYOUTS[name])
        model = components.model(plan, registries, 50, components.attention(plan, registries))
        meta = is_meta(model)
        pmodel = parallelize(model, plan, torch.device("cpu"), loss_fn)
        held, diffs = 0, {}
        for part in pmodel.parts:
            for key, param in part.named_parameters():
                local = param.to_local() if hasattr(param, "to_local") else param
                held += local.numel()
                whole = param.full_tensor() if hasattr(param, "full_tensor") else param
                want = checkpoint_of(key, expected, param.shape[0])
                diffs[key] = float((whole.detach() - want.to(whole.dtype)).abs().max())
        result: dict[str, Any] = {"built_on_meta": meta, "held": held, "diffs": diffs}
        if pmodel.forward is not None:
            with torch.no_grad():
                result["logits"] = pmodel.forward(PROBE).tolist()
        every = [None] * dist.get_world_size()
        dist.all_gather_object(every, result)
        results[name] = every
    if dist.get_rank() == 0:
        with open(out_path, "w") as f:
            json.dump(results, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    exit_process(main())
