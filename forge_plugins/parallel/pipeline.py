"""``pp``: pipeline parallelism with ``torch.distributed.pipelining``.

The model is split into ``pp * virtual_stages`` stages by block
(:mod:`forge_plugins.parallel.split` documents the rule for the remainder); the first
stage also keeps what the model's split names ``first`` (a token embedding), the last
what it names ``last`` (final norm, output head). Every process
of the pipeline holds its own stages (one, or several under interleaved 1F1B), later
strategies (tensor parallel, compile, FSDP/DDP) are applied to each stage module, and
then the schedule is built: ``gpipe`` (every forward, then every backward), ``1f1b``
(one forward one backward in steady state: activation memory bounded by the number of
stages) or ``interleaved_1f1b`` (several smaller stages per rank: a smaller bubble).

Its options are ``parallel.options.pp`` (``schedule``, ``microbatches``,
``virtual_stages``). The step's rows are cut into ``microbatches`` microbatches (0: one
per rank). The last stage calls the trainer's ``loss_fn`` on each microbatch and
back-propagates ``loss_sum / normalizer`` (the step's global token count,
:mod:`forge_core.train.parallelize`), with the schedule's own division by the number of
microbatches off, so the gradients equal a single process's on the whole batch. The
summed loss and token count are then broadcast from the last stage to the whole pipeline, so every process logs the same loss.

What it knows of the model is its parallel contract (``parallel_contract()``): the
blocks (an ``nn.ModuleDict``, so that a stage keeps its blocks' state-dict keys) and the
:class:`~forge_core.api.PipelineSplit` naming the root modules only the first stage
keeps and those only the last one keeps; a stage is a shallow copy of the model with
the others set to ``None``. Per-token metadata never reaches a later stage: the
founding rule keeps document-isolating packers away, and a batch that carries metadata
anyway is refused here.
"""

from __future__ import annotations

import copy
import functools
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

from forge_core.api import INPUT_IDS, LABELS, ForgeError, ModelSplit, contract_of
from forge_plugins.parallel.split import microbatches, stage_layer_ranges, stages_of_rank

SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B, "interleaved_1f1b": ScheduleInterleaved1F1B}


def _shallow_copy(module: nn.Module) -> nn.Module:
    """A new module object sharing every child and tensor with ``module`` but with its own
    registries (children, parameters, buffers, hooks), so a stage can drop children
    without touching the others."""
    new = module.__class__.__new__(module.__class__)
    new.__dict__.update(
        {k: copy.copy(v) if isinstance(v, (dict, set, list)) else v for k, v in module.__dict__.items()}
    )
    return new


def split_of(model: nn.Module, model_name: str) -> tuple[Any, nn.ModuleDict]:
    """The model's contract and its blocks, or a ForgeError saying what is missing."""
    contract = contract_of(model)
    blocks = None if contract is None else getattr(model, contract.blocks, None)
    if contract is None:
        missing = "it has no parallel_contract()"
    elif contract.pipeline is None:
        missing = "its parallel contract has no pipeline split"
    elif not isinstance(blocks, nn.ModuleDict):
        missing = f"its blocks ({contract.blocks!r}) are not an nn.ModuleDict"
    else:
        return contract, blocks
    raise ForgeError(
        f"pipeline parallelism cannot split model {model_name!r} ({type(model).__name__}): {missing}. "
        "Set parallel.pp: 1, or use a model whose spec declares PIPELINE in supports (its contract "
        "names the blocks, an nn.ModuleDict, and a PipelineSplit)."
    )


def stage_module(model: nn.Module, contract: Any, keep: list[str], first: bool, last: bool) -> nn.Module:
    """The part of ``model`` one stage runs: the blocks named in ``keep``, plus the first
    stage's and the last stage's own root modules where this stage is one of those."""
    blocks = getattr(model, contract.blocks)
    stage = _shallow_copy(model)
    setattr(stage, contract.blocks, nn.ModuleDict({key: blocks[key] for key in keep}))
    for name in () if first else contract.pipeline.first:
        setattr(stage, name, None)
    for name in () if last else contract.pipeline.last:
        setattr(stage, name, None)
    return stage


def pipeline_stages(model: nn.Module, model_name: str, n_stages: int) -> list[nn.Module]:
    """Every stage module of ``model`` cut into ``n_stages``, in stage order, exactly as
    this strategy builds them (the conformance kit's ``check_model`` runs them in
    sequence in one process against the unsplit model)."""
    contract, blocks = split_of(model, model_name)
    keys = list(blocks.keys())
    return [
        stage_module(model, contract, [keys[i] for i in blocks_of_stage], first=s == 0, last=s == n_stages - 1)
        for s, blocks_of_stage in enumerate(stage_layer_ranges(len(keys), n_stages))
    ]


class _MicrobatchLoss:
    """The loss the schedule calls on the last stage for every microbatch: records the
    loss sum and token count, returns ``loss_sum / normalizer`` to back-propagate."""

    def __init__(self) -> None:
        self.begin(None, 1.0)

    def begin(self, loss_fn: Any, normalizer: Any) -> None:
        self.loss_fn, self.normalizer = loss_fn, normalizer
        self.sums: list[torch.Tensor] = []
        self.tokens: list[torch.Tensor] = []

    def __call__(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        loss_sum, tokens = self.loss_fn(output, target)
        self.sums.append(loss_sum.detach())
        self.tokens.append(torch.as_tensor(tokens, device=loss_sum.device))
        return loss_sum / self.normalizer


class PipelineStep:
    """``train_step(batch, loss_fn, normalizer) -> (loss_sum, tokens)`` for one pipeline
    rank; every rank of the pipeline calls it with the same batch and gets the sums over
    the microbatches of what ``loss_fn`` returned on the last stage."""

    def __init__(self, schedule: Any, loss: _MicrobatchLoss, n_microbatches: int, has_first: bool,
                 has_last: bool, group: Any, last_rank: int, device: torch.device) -> None:
        self.schedule, self.loss, self.n_microbatches = schedule, loss, n_microbatches
        self.has_first, self.has_last = has_first, has_last
        self.group, self.last_rank, self.device = group, last_rank, device

    def __call__(self, batch: dict[str, torch.Tensor], loss_fn: Any, normalizer: Any = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
        extra = sorted(set(batch) - {INPUT_IDS, LABELS})
        if extra:
            raise ValueError(
                f"the batch carries {', '.join(extra)}, which pipeline parallelism cannot forward "
                "to later stages (rule parallel.metadata-reaches-layers): use a packer that does "
                "not isolate documents, or parallel.pp: 1"
            )
        self.loss.begin(loss_fn, normalizer)
        args = (batch[INPUT_IDS],) if self.has_first else ()
        kwargs: dict[str, Any] = {"target": batch[LABELS]} if self.has_last else {}
        self.schedule.step(*args, return_outputs=False, **kwargs)
        result = torch.zeros(2, dtype=torch.float64, device=self.device)
        if self.has_last:
            # The first step also calls the loss once while it infers the shapes of the
            # backward pass; only the last n_microbatches calls are the step's.
            n = self.n_microbatches
            result[0] = torch.stack(self.loss.sums[-n:]).double().sum()
            result[1] = torch.stack(self.loss.tokens[-n:]).double().sum()
        dist.broadcast(result, group=self.group, group_src=self.last_rank)
        return result[0].float(), result[1].long()


class PipelineParallel:
    #: How the stages are cut, for the conformance kit (no process group needed).
    stages = staticmethod(pipeline_stages)

    def __init__(self, options: Any) -> None:
        self.options = options

    def apply(self, model: nn.Module, ctx: Any) -> ModelSplit:
        options = self.options
        pp_mesh = ctx.mesh["pp"]
        pp, pp_rank = pp_mesh.size(), pp_mesh.get_local_rank()
        n_stages = pp * options.virtual_stages
        stages = pipeline_stages(model, ctx.config.model.name, n_stages)
        stage_ids = stages_of_rank(pp_rank, pp, options.virtual_stages)
        parts = [stages[s] for s in stage_ids]
        return ModelSplit(parts, functools.partial(self._finalize, ctx, stage_ids, n_stages))

    def _finalize(self, ctx: Any, stage_ids: list[int], n_stages: int,
                  pmodel: Any, runners: list[nn.Module]) -> None:
        pp_mesh = ctx.mesh["pp"]
        group = pp_mesh.get_group()
        stages = [
            PipelineStage(runner, stage, n_stages, ctx.device, group=group)
            for stage, runner in zip(stage_ids, runners)
        ]
        loss = _MicrobatchLoss()
        schedule_cls = SCHEDULES[self.options.schedule]
        # scale_grads=False: the trainer's loss is already normalised by the global token count.
        target = stages if schedule_cls is ScheduleInterleaved1F1B else stages[0]
        n_microbatches = microbatches(self.options, pp_mesh.size())
        schedule = schedule_cls(target, n_microbatches, loss_fn=loss, scale_grads=False)
        has_last = n_stages - 1 in stage_ids
        pmodel.train_step = PipelineStep(
            schedule, loss, n_microbatches, has_first=0 in stage_ids, has_last=has_last, group=group,
            last_rank=pp_mesh.size() - 1, device=ctx.device,
        )
        pmodel.is_last_stage = has_last
