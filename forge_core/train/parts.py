"""What one run is built of, declared: :func:`build_parts` constructs every component of
the judged plan once, in order, and :class:`RunParts` holds them for the loop.

The order matters: the tokenizer first (its vocabulary sizes the model), the data (read
from the token cache, which one process per node fills while the others wait), the model
with its attention backend, then the strategies (``train.compile`` among them) applied in their
declared order, with the loss ``train.loss`` names (the chunked loss takes over the
model's output head before any strategy shards it) and the objective ``train.objective``
names (with its frozen reference model when it needs one:
:func:`~forge_core.train.reference.build_reference`), the optimizers (one per model
part), the loader, evaluation data, the MFU meter and the collector of the model's own
statistics.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs
import numpy as np
import torch

from forge_core import components
from forge_core.api import ForgeError, Plan
from forge_core.distributed.mesh import build_mesh, token_group
from forge_core.distributed.parallelize import is_meta, parallelize, wrap_attention
from forge_core.distributed.placement import Placement, all_gather_object
from forge_core.train import flops, model_stats, module_hooks, precision
from forge_core.train.checkpoint import CheckpointManager
from forge_core.train.loss import build_loss
from forge_core.train.memory import MemoryMeter
from forge_core.train.mfu import MfuMeter, build_meter
from forge_core.train.reference import adapters_off, build_reference, needs_copy

if TYPE_CHECKING:
    from forge_core.registry import Registries


@attrs.frozen
class RunParts:
    tokenizer: Any
    #: The training rows (``.rows``, ``.seq_len``, ``.summary``).
    data: Any
    #: The model with the plan's strategies applied
    #: (:class:`~forge_core.distributed.parallelize.ParallelModel`).
    pmodel: Any
    optimizers: list[Any]
    loader: Any
    checkpoints: CheckpointManager
    memory: MemoryMeter
    mfu: MfuMeter
    #: Held-out data when ``eval.enabled``.
    eval_data: Any | None
    #: What the run records to rebuild this model (a pretrained model may keep a larger,
    #: padded vocabulary than its tokenizer's).
    vocab_size: int
    n_params: int
    #: Rows per micro-batch on each data-parallel rank.
    micro_batch: int
    #: A per-process count times this, summed over every process, counts each batch
    #: once (every process of a data-parallel slice reads the same batch).
    slice_weight: float
    #: Input tokens a step trains on: ``train.batch_size`` full rows, whatever the packer
    #: put in them.
    step_inputs: int
    #: ``count(batch) -> int``, the query-key pairs the attention computes for a batch
    #: (for MFU; :func:`~forge_core.train.flops.pair_counter`).
    count_pairs: Callable[[dict[str, torch.Tensor]], int]
    #: What the model reports about its training forwards (:mod:`forge_core.train.model_stats`).
    stats: model_stats.ModelStatistics
    #: The frozen copy that is the objective's reference, when it is a copy
    #: (:func:`~forge_core.train.reference.build_reference`), else ``None``.
    reference_copy: torch.nn.Module | None = None


def micro_batch_size(batch_size: int, dp: int, grad_accum: int) -> int:
    micro = batch_size // (dp * grad_accum)
    if micro < 1 or micro * dp * grad_accum != batch_size:
        raise ForgeError(
            f"train.batch_size = {batch_size} does not split into {dp} data-parallel "
            f"ranks x {grad_accum} accumulation steps"
        )
    return micro


def active_note(mfu: MfuMeter) -> str:
    """What the model line says when a token uses only some of the matmul parameters."""
    if mfu.n_active == mfu.n_matmul:
        return ""
    return f", {mfu.n_active / 1e6:.2f}M active per token: MFU counts these"


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def build_parts(
    plan: Plan,
    registries: Registries,
    placement: Placement,
    run_dir: Any,
    log: Callable[[str], None],
    warn: Callable[[str], None],
) -> RunParts:
    from forge_core.data.build import build_training_data
    from forge_core.data.loader import StatefulLoader

    cfg, pl = plan.config, placement
    train = cfg.train
    precision.check_precision(train.precision, pl.device)
    seed_everything(cfg.run.seed)
    tokenizer = components.tokenizer(plan, registries)
    data = build_training_data(plan, registries, tokenizer, is_main=pl.is_main)
    log(data.summary)

    # The mesh first: a strategy's attention wrapper (context parallelism) needs its group.
    mesh = build_mesh(plan.degrees, pl.device)
    backend = components.attention(plan, registries)
    attention = wrap_attention(backend, plan, mesh)
    model = components.model(plan, registries, int(tokenizer.vocab_size), attention)
    vocab_size = int(getattr(model, "vocab_size", None) or tokenizer.vocab_size)
    n_params = sum(p.numel() for p in model.parameters())
    n_trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    mfu = build_meter(plan, registries, model, vocab_size, pl.device, pl.world_size, warn)
    if not is_meta(model):  # one on the meta device is materialised by parallelize
        model.to(pl.device)
    token_loss = build_loss(model, cfg)
    objective = components.objective(plan, registries, token_loss)
    # A copied reference is taken from the model as built, before any strategy shards it;
    # with adapters, the reference is the trained model with them off, unless the run starts
    # from another run's adapters: then it is a copy that gets them (forge_core.train.start_adapters).
    copied = objective.needs_reference and (needs_copy(model) or bool(cfg.model.init_adapters_from))
    reference = build_reference(model, pl.device) if copied else None
    pmodel = parallelize(
        model, plan, pl.device, loss_fn=token_loss, mesh=mesh, objective=objective, reference=reference
    )
    if objective.needs_reference and not copied:
        pmodel.reference = adapters_off(pmodel)
    step_tokens = train.batch_size * data.seq_len
    module_hooks.set_token_group(pmodel.parts, token_group(mesh, plan.dims), step_tokens)
    dp = pmodel.dp_size
    micro_batch = micro_batch_size(train.batch_size, dp, train.grad_accum)
    optimizers = [components.optimizer(plan, registries, part) for part in pmodel.parts]
    if data.stream is not None:
        from forge_core.data.stream import StreamingLoader

        loader = StreamingLoader(
            data.stream.source,
            tokenizer,
            data.stream.pack_window,
            micro_batch,
            seq_len=data.seq_len,
            dp_rank=pmodel.dp_rank,
            dp_size=dp,
            seed=cfg.run.seed,
            shuffle=cfg.data.shuffle,
            window_tokens=cfg.data.stream.window_tokens,
            ahead=cfg.data.stream.ahead,
            report=log,
        )
    else:
        loader = StatefulLoader(
            data.rows,
            micro_batch,
            dp_rank=pmodel.dp_rank,
            dp_size=dp,
            seed=cfg.run.seed,
            shuffle=cfg.data.shuffle,
            num_workers=cfg.data.num_workers,
        )
    eval_data = None
    if cfg.eval.enabled:
        from forge_core.train.evaluate import build_eval_data

        eval_data = build_eval_data(plan, registries, tokenizer, is_main=pl.is_main)
        log(eval_data.summary)
    frozen = (
        f"; {n_trainable:,} trainable ({n_trainable / n_params:.2%}) under {', '.join(cfg.model.transforms)}"
        if n_trainable < n_params
        else ""
    )
    log(
        f"model: {cfg.model.name}, {n_params / 1e6:.2f}M parameters ({mfu.n_matmul / 1e6:.2f}M in matmuls"
        f"{active_note(mfu)}{frozen}), attention {cfg.attention.backend}; "
        f"device {pl.device} x {pl.world_size}; "
        f"peak {mfu.peak / 1e12:.3g} TFLOP/s ({mfu.peak_source})"
    )
    return RunParts(
        tokenizer=tokenizer,
        data=data,
        pmodel=pmodel,
        optimizers=optimizers,
        loader=loader,
        checkpoints=CheckpointManager(
            run_dir, cfg.checkpoint.keep, pl.rank, pl.world_size, background=cfg.checkpoint.async_save
        ),
        memory=MemoryMeter(pl.device),
        mfu=mfu,
        eval_data=eval_data,
        vocab_size=vocab_size,
        n_params=n_params,
        micro_batch=micro_batch,
        slice_weight=dp / pl.world_size,
        step_inputs=train.batch_size * data.seq_len,
        count_pairs=flops.pair_counter(backend, plan.specs["attention"].honours),
        stats=model_stats.ModelStatistics(
            pmodel.parts, 1.0 / model_stats.copies(plan.dims, plan.degrees), all_gather_object
        ),
        reference_copy=reference.module if reference is not None else None,
    )
