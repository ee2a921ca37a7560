"""LoRA (Hu et al., 2021): a low-rank update ``B A`` beside each targeted projection.

For every block and every role in ``targets``, the projection ``W`` the model declares
for that role (``ParallelContract.roles``) computes ``W x + (alpha / r) B A dropout(x)``:
``A`` (``r x in``) starts like PEFT's (Kaiming-uniform), ``B`` (``out x r``) at zero, so
the first forward equals the base model's exactly. Everything else is frozen.

Layout, chosen so that every strategy and every reader of the base keeps working:

- the base projection is left in place, its parameters keep their names (a Hugging Face
  import, the tensor-parallel plan and ``export-hf`` see the base model's keys);
- the adapter is a sibling module ``<name>_lora`` (``attention.wq_lora.lora_A``) inside
  the same block, so FSDP shards, pipeline stages keep, act_ckpt recomputes and compile
  compiles it with its block;
- a forward hook on the projection adds the adapter's output. Under tensor parallelism
  the hook runs before the projection's output is redistributed, on DTensors, and the
  adapter's weights are DTensors placed to match (column-wise projection: ``A``
  replicated, ``B`` sharded by rows; row-wise: ``A`` sharded by columns, ``B``
  replicated), which this transform adds to the model's tensor-parallel plan.

Initial values come from ``run.seed`` and each parameter's name, never from the global
generator, so one process, every layout and a resumed run start from the same adapters.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import math
from collections.abc import Iterator
from typing import Any

import attrs
import torch
from torch import nn
from torch.distributed.tensor import Replicate, Shard, distribute_module, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel
from torch.distributed.tensor.parallel.style import ParallelStyle

from forge_core.api import ForgeError, TransformContext

#: Suffix of the sibling module that holds a projection's adapter.
SUFFIX = "_lora"


class LoraAdapter(nn.Module):
    """``(alpha / rank) * B(A(dropout(x)))`` for one projection."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float, dropout: float) -> None:
        super().__init__()
        kw = {"device": base.weight.device, "dtype": base.weight.dtype}
        self.lora_A = nn.Linear(base.in_features, rank, bias=False, **kw)
        self.lora_B = nn.Linear(rank, base.out_features, bias=False, **kw)
        self.dropout = nn.Dropout(dropout) if dropout else nn.Identity()
        self.scale = alpha / rank
        self.enabled = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lora_B(self.lora_A(self.dropout(x))) * self.scale


def _add_adapter(adapter: LoraAdapter, module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
    if not adapter.enabled:
        return output
    return output + adapter(args[0])


def _submodule(block: nn.Module, path: str) -> nn.Module | None:
    """``block``'s submodule at ``path`` (itself for ``""``), or ``None`` when it has none."""
    try:
        return block.get_submodule(path) if path else block
    except AttributeError:
        return None


def _seeded(seed: int, name: str) -> torch.Generator:
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little"))


def _fill(param: torch.Tensor, full: torch.Tensor) -> None:
    """Copy ``full`` (the whole tensor) into ``param``, a plain tensor or a DTensor whose
    local part is this process's share of it."""
    if hasattr(param, "device_mesh"):
        # src_data_rank=None: every process computed the same full tensor; keep its own part.
        full = distribute_tensor(
            full.to(param.device), param.device_mesh, param.placements, src_data_rank=None
        )
        param.to_local().copy_(full.to_local())
    else:
        param.copy_(full)


def adapters(module: nn.Module) -> Iterator[tuple[str, nn.Module, str, LoraAdapter]]:
    """``(adapter path, parent module, projection attribute, adapter)`` for every adapter
    under ``module``."""
    for path, parent in module.named_modules():
        for name, child in list(parent._modules.items()):
            if isinstance(child, LoraAdapter):
                prefix = f"{path}." if path else ""
                yield prefix + name, parent, name[: -len(SUFFIX)], child


@attrs.define
class Lora:
    """The ``lora`` transform (:class:`~forge_core.api.ModelTransform`)."""

    options: Any
    seed: int = 0

    def apply(self, model: nn.Module, ctx: TransformContext) -> None:
        self.seed = ctx.seed
        options = self.options
        missing = [t for t in options.targets if t not in ctx.roles]
        if missing or ctx.blocks is None:
            raise ForgeError(
                f"model.transform_options.lora.targets: model {ctx.model_name!r} declares no "
                f"projection for {missing or options.targets} (its roles: {sorted(ctx.roles) or 'none'})"
            )
        for param in model.parameters():
            param.requires_grad_(False)
        blocks = getattr(model, ctx.blocks)
        adapted = dict.fromkeys(options.targets, 0)
        for block in blocks.values() if hasattr(blocks, "values") else blocks:
            for role in options.targets:
                path = ctx.roles[role]
                owner_path, _, attr = path.rpartition(".")
                owner = _submodule(block, owner_path)
                base = getattr(owner, attr, None) if owner is not None else None
                if base is None:
                    # Not every block holds every role: a mixture-of-experts block has no
                    # dense MLP projections, so only the dense blocks get those adapters.
                    continue
                adapted[role] += 1
                if not isinstance(base, nn.Linear):
                    raise ForgeError(
                        f"model {ctx.model_name!r}: role {role!r} names {path!r}, a "
                        f"{type(base).__name__}, but LoRA adapts linear projections (nn.Linear) only"
                    )
                adapter = LoraAdapter(base, options.rank, options.alpha, options.dropout)
                owner.add_module(attr + SUFFIX, adapter)
                base.register_forward_hook(functools.partial(_add_adapter, adapter))
        absent = [role for role, count in adapted.items() if not count]
        if absent:
            raise ForgeError(
                f"model.transform_options.lora.targets: no block of model {ctx.model_name!r} holds "
                f"the projection of {absent} ({', '.join(ctx.roles[r] for r in absent)}); a "
                "mixture-of-experts block has no dense MLP projections. Target other roles "
                f"(its roles: {sorted(ctx.roles)})."
            )
        _extend_tensor_parallel_plan(model, ctx)

    @torch.no_grad()
    def initialize(self, module: nn.Module) -> None:
        for path, _, _, adapter in adapters(module):
            a = adapter.lora_A.weight
            full = torch.empty(a.shape, dtype=torch.float32)
            # PEFT's init of A: kaiming_uniform_(a=sqrt(5)), i.e. U(-1/sqrt(in), 1/sqrt(in)).
            bound = 1.0 / math.sqrt(a.shape[1])
            full.uniform_(-bound, bound, generator=_seeded(self.seed, f"{path}.lora_A.weight"))
            _fill(a, full.to(a.dtype))
            b = adapter.lora_B.weight
            _fill(b, torch.zeros(b.shape, dtype=b.dtype))

    @contextlib.contextmanager
    def detached(self, module: nn.Module) -> Iterator[None]:
        found = list(adapters(module))
        for _, parent, attr, _ in found:
            del parent._modules[attr + SUFFIX]
        try:
            yield
        finally:
            for _, parent, attr, adapter in found:
                parent._modules[attr + SUFFIX] = adapter

    @contextlib.contextmanager
    def disabled(self, module: nn.Module) -> Iterator[None]:
        found = [adapter for *_, adapter in adapters(module)]
        for adapter in found:
            adapter.enabled = False
        try:
            yield
        finally:
            for adapter in found:
                adapter.enabled = True

    @torch.no_grad()
    def merge(self, module: nn.Module) -> None:
        for _, parent, attr, adapter in list(adapters(module)):
            base = getattr(parent, attr)
            delta = adapter.lora_B.weight.double() @ adapter.lora_A.weight.double() * adapter.scale
            base.weight.add_(delta.to(base.weight.dtype))
            for key, hook in list(base._forward_hooks.items()):
                if isinstance(hook, functools.partial) and hook.args[:1] == (adapter,):
                    del base._forward_hooks[key]
            del parent._modules[attr + SUFFIX]

    def write_adapter(self, module: nn.Module, directory: str, hf_key: Any, base: str) -> None:
        """Write the adapters as a PEFT folder (``adapter_config.json`` and
        ``adapter_model.safetensors``) that ``peft.PeftModel.from_pretrained`` loads onto
        the Hugging Face base model ``base``; ``hf_key`` maps a Forge parameter name to
        the Hugging Face one (``ModelSpec.hf_key``)."""
        import json
        from pathlib import Path

        from safetensors.torch import save_file

        tensors, modules = {}, set()
        for path, parent, attr, adapter in adapters(module):
            owner = path[: -len(attr + SUFFIX)]
            hf_module = hf_key(f"{owner}{attr}.weight").removesuffix(".weight")
            modules.add(hf_module.rpartition(".")[2])
            for part in ("lora_A", "lora_B"):
                weight = getattr(adapter, part).weight.detach()
                tensors[f"base_model.model.{hf_module}.{part}.weight"] = weight.contiguous().cpu()
        options = self.options
        config = {
            "peft_type": "LORA",
            "task_type": "CAUSAL_LM",
            "base_model_name_or_path": base,
            "r": options.rank,
            "lora_alpha": options.alpha,
            "lora_dropout": options.dropout,
            "target_modules": sorted(modules),
            "bias": "none",
            "fan_in_fan_out": False,
            "inference_mode": True,
            "init_lora_weights": True,
            "use_rslora": False,
            "modules_to_save": None,
        }
        Path(directory, "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n")
        save_file(tensors, str(Path(directory, "adapter_model.safetensors")), metadata={"format": "pt"})


# --- tensor parallelism -------------------------------------------------------------


def _extend_tensor_parallel_plan(model: nn.Module, ctx: TransformContext) -> None:
    """Have the model's tensor-parallel plan place the adapters' weights to match their
    projections' styles (see the module docstring)."""
    declare = getattr(model, "parallel_contract", None)
    if not callable(declare):
        return
    contract = declare()
    if contract.tensor_parallel is None:
        return
    targets = [ctx.roles[role] for role in ctx.options.targets]
    plan_of = functools.partial(_with_adapters, contract.tensor_parallel, tuple(targets))
    # An instance attribute, so pipeline stages (shallow copies of the model) keep it;
    # it asks the model's own contract, as the model that built the stages answers it.
    model.parallel_contract = functools.partial(_contract_with, declare, plan_of)


def _contract_with(declare: Any, plan_of: Any) -> Any:
    return attrs.evolve(declare(), tensor_parallel=plan_of)


def _with_adapters(base_plan: Any, targets: tuple[str, ...], **kwargs: Any) -> Any:
    plan = base_plan(**kwargs)
    styles = dict(plan.block.styles)
    for path in targets:
        style = styles.get(path)
        if isinstance(style, ColwiseParallel):
            a, b = Replicate(), Shard(0)
        elif isinstance(style, RowwiseParallel):
            a, b = Shard(1), Replicate()
        else:
            raise ForgeError(
                f"LoRA cannot follow the tensor-parallel plan at {path!r} "
                f"({type(style).__name__ if style is not None else 'no style'}): it places adapters beside "
                "column-wise and row-wise projections only"
            )
        styles[path + SUFFIX + ".lora_A"] = PlaceWeights(a)
        styles[path + SUFFIX + ".lora_B"] = PlaceWeights(b)
    return attrs.evolve(plan, block=attrs.evolve(plan.block, styles=styles))


def _place_weights(placement: Any, name: str, module: nn.Module, mesh: Any) -> None:
    for key, param in list(module.named_parameters(recurse=False)):
        placed = distribute_tensor(param, mesh, [placement], src_data_rank=None)
        module.register_parameter(key, nn.Parameter(placed, requires_grad=param.requires_grad))


class PlaceWeights(ParallelStyle):
    """A tensor-parallel style that only distributes a module's own weights (no input or
    output redistribution): the adapter computes on the DTensors its projection's style
    hands the hook."""

    def __init__(self, placement: Any) -> None:
        super().__init__()
        self.placement = placement

    def _apply(self, module: nn.Module, device_mesh: Any) -> nn.Module:
        return distribute_module(module, device_mesh, functools.partial(_place_weights, self.placement))
