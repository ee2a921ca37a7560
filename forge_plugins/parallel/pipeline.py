"""``pp``: pipeline parallelism with ``torch.distributed.pipelining``, packed documents
included.

The model is split into ``pp * virtual_stages`` stages by block
(:mod:`forge_plugins.parallel.split` documents the rule for the remainder and where
each schedule places the stages); the first stage also keeps what the model's split
names ``first`` (a token embedding), the last what it names ``last`` (final norm,
output head). Every process of the pipeline holds its own stages, later strategies
(tensor parallel, compile, FSDP/DDP) are applied to each stage module, and then the
schedule is built (``parallel.options.pp.schedule``): ``gpipe``, ``1f1b``,
``interleaved_1f1b``, ``looped_bfs``, ``interleaved_zero_bubble`` (loop placement),
``zbv_zero_bubble``, ``dualpipev`` (V placement: the first and the last stage on rank 0).

Its options are ``parallel.options.pp`` (``schedule``, ``microbatches``,
``virtual_stages``). The step's rows are cut into ``microbatches`` microbatches (0: one
per stage). The last stage calls the trainer's ``loss_fn`` on each microbatch and
back-propagates ``loss_sum / normalizer`` with the schedule's own division by the number
of microbatches off (the gradient convention,
docs/plugin-guide/parallelism.md#the-gradient-convention). The
summed loss and token count are then broadcast from the rank holding the last stage
(``pp - 1`` in loop placement, 0 in V placement) to the whole pipeline, so every process
logs the same loss.

Per-token metadata (every batch key but ``input_ids`` and ``labels``: ``doc_ids``,
``positions``) travels with each microbatch to every stage as keyword tensors of
``schedule.step``, and every stage's forward builds its own mask from them (the model
calls its attention backend's ``prepare``): no mask or other non-tensor object goes
through the schedule. What torch 2.13 does with them, measured on CPU/gloo with 2
processes and 4 microbatches under each of the seven schedules:

- Keyword tensors of ``schedule.step`` are chunked along dim 0 with the same split as
  the positional input and reach EVERY stage of every schedule (first, middle, last,
  both stages of a rank): the stage computing microbatch ``i`` gets slice ``i``, the
  one matching the hidden states it received (checked per call by carrying each row's
  index through the stages). Every rank must therefore pass them, not only the first.
- Extra *positional* stage inputs break on every schedule: shape inference runs the
  later stages on uninitialised tensors for whatever the previous stage did not send.
- Shape inference (the first step only) calls each stage's forward once more, with
  microbatch 0's keyword tensors (real values) and, after the first stage,
  uninitialised hidden states, and the loss once more on the last stage: the step
  keeps only the last ``microbatches`` losses, and what the stage's modules counted
  of that forward (``step_stats``, an MoE layer's routing statistics) is read and
  dropped right after it (:func:`drop_first_forward_stats`).
- ``schedule.eval`` (forward only) re-runs shape inference on every switch between
  training and evaluation, and under ``zbv_zero_bubble`` it still runs the
  input-backward actions and hangs the pipeline; evaluation therefore does not use it
  (:class:`PipelineEval`: a forward-only pass over the same stage modules).
- Accepted microbatch counts (pp = 2): gpipe, looped_bfs and zbv_zero_bubble any;
  1f1b at least pp; interleaved_1f1b and interleaved_zero_bubble a multiple of their
  number of rounds, ``max(1, microbatches // pp)``; dualpipev at least its number of
  stages, ``2 * pp``. The V schedules take exactly two stages per rank (otherwise an
  assertion in torch's schedule builder, or a KeyError for dualpipev).

What it knows of the model is its parallel contract (``parallel_contract()``): the
blocks (an ``nn.ModuleDict``, so that a stage keeps its blocks' state-dict keys) and the
:class:`~forge_core.api.PipelineSplit` naming the root modules only the first stage
keeps and those only the last one keeps; a stage is a shallow copy of the model with
the others set to ``None``.
"""

from __future__ import annotations

import copy
import functools
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining import schedules as torch_schedules

from forge_core.api import INPUT_IDS, LABELS, ForgeError, ModelSplit, contract_of
from forge_plugins.parallel.split import (
    SINGLE_STAGE_SCHEDULES,
    microbatches,
    rank_of_stage,
    stage_layer_ranges,
    stages_of_rank,
)

#: ``parallel.options.pp.schedule`` -> torch's schedule class.
SCHEDULES = {
    "gpipe": torch_schedules.ScheduleGPipe,
    "1f1b": torch_schedules.Schedule1F1B,
    "interleaved_1f1b": torch_schedules.ScheduleInterleaved1F1B,
    "looped_bfs": torch_schedules.ScheduleLoopedBFS,
    "interleaved_zero_bubble": torch_schedules.ScheduleInterleavedZeroBubble,
    "zbv_zero_bubble": torch_schedules.ScheduleZBVZeroBubble,
    "dualpipev": torch_schedules.ScheduleDualPipeV,
}


def metadata_of(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The per-token metadata of a batch: every key but the inputs and the labels."""
    return {key: value for key, value in batch.items() if key not in (INPUT_IDS, LABELS)}


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
        stage_module(
            model, contract, [keys[i] for i in blocks_of_stage], first=s == 0, last=s == n_stages - 1
        )
        for s, blocks_of_stage in enumerate(stage_layer_ranges(len(keys), n_stages))
    ]


def drop_first_forward_stats(stage: nn.Module) -> None:
    """After the stage's next forward (shape inference's, in the first step), read and
    drop what its modules with ``step_stats()`` counted of it: that forward is not one
    of the step's microbatches."""
    handles = []

    def drop(module: nn.Module, args: Any, output: Any) -> None:
        handles.pop().remove()
        for inner in module.modules():
            read = getattr(inner, "step_stats", None)
            if callable(read):
                read()

    handles.append(stage.register_forward_hook(drop))


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

    def __init__(
        self,
        schedule: Any,
        loss: _MicrobatchLoss,
        n_microbatches: int,
        has_first: bool,
        has_last: bool,
        group: Any,
        last_rank: int,
        device: torch.device,
    ) -> None:
        self.schedule, self.loss, self.n_microbatches = schedule, loss, n_microbatches
        self.has_first, self.has_last = has_first, has_last
        self.group, self.last_rank, self.device = group, last_rank, device

    def metadata(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The keyword tensors this rank hands the schedule (all its stages need them)."""
        return metadata_of(batch)

    def __call__(
        self, batch: dict[str, torch.Tensor], loss_fn: Any, normalizer: Any = 1.0
    ) -> tuple[torch.Tensor, torch.Tensor]:
        self.loss.begin(loss_fn, normalizer)
        args = (batch[INPUT_IDS],) if self.has_first else ()
        kwargs: dict[str, Any] = {"target": batch[LABELS]} if self.has_last else {}
        self.schedule.step(*args, return_outputs=False, **kwargs, **self.metadata(batch))
        result = torch.zeros(2, dtype=torch.float64, device=self.device)
        if self.has_last:
            # The first step also calls the loss once while it infers the shapes of the
            # backward pass; only the last n_microbatches calls are the step's.
            n = self.n_microbatches
            result[0] = torch.stack(self.loss.sums[-n:]).double().sum()
            result[1] = torch.stack(self.loss.tokens[-n:]).double().sum()
        return broadcast_sums(result, self.group, self.last_rank)


def broadcast_sums(result: torch.Tensor, group: Any, src: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(loss_sum, tokens)`` from the pipeline rank ``src`` (the last stage's) to all;
    the sum stays float64 (a float64 model's loss is not rounded to float32 here)."""
    dist.broadcast(result, group=group, group_src=src)
    return result[0], result[1].long()


#: Floating dtypes hidden states may have between stages (their index is sent ahead).
_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
_MAX_DIMS = 6


class PipelineEval:
    """``eval_step(batch, loss_fn) -> (loss_sum, tokens)``: the forward-only counterpart
    of :class:`PipelineStep` over the same stage modules, for every schedule.

    Microbatches (as many as training uses, fewer for a batch with fewer rows) go
    through the stages in order, one at a time; a stage on another rank than the
    previous one receives the hidden states point to point, preceded by a small header
    (dtype and shape), so any batch and sequence length works. Every stage gets its
    microbatch's metadata from the batch, which every rank holds. The last stage
    computes ``loss_fn`` per microbatch; the sums are broadcast from its rank.
    """

    def __init__(
        self,
        runners: dict[int, nn.Module],
        n_stages: int,
        placement: Any,
        pp_rank: int,
        n_microbatches: int,
        group: Any,
        device: torch.device,
    ) -> None:
        self.runners, self.n_stages, self.placement = runners, n_stages, placement
        self.pp_rank, self.n_microbatches, self.group, self.device = pp_rank, n_microbatches, group, device

    def _send(self, h: torch.Tensor, dst: int) -> None:
        header = torch.zeros(2 + _MAX_DIMS, dtype=torch.long, device=h.device)
        header[0], header[1] = _DTYPES.index(h.dtype), h.dim()
        header[2 : 2 + h.dim()] = torch.tensor(h.shape)
        dist.send(header, group=self.group, group_dst=dst)
        dist.send(h.contiguous(), group=self.group, group_dst=dst)

    def _recv(self, src: int) -> torch.Tensor:
        header = torch.zeros(2 + _MAX_DIMS, dtype=torch.long, device=self.device)
        dist.recv(header, group=self.group, group_src=src)
        dtype, ndim = _DTYPES[int(header[0])], int(header[1])
        h = torch.empty(header[2 : 2 + ndim].tolist(), dtype=dtype, device=self.device)
        dist.recv(h, group=self.group, group_src=src)
        return h

    @torch.no_grad()
    def __call__(self, batch: dict[str, torch.Tensor], loss_fn: Any) -> tuple[torch.Tensor, torch.Tensor]:
        chunks = min(self.n_microbatches, batch[INPUT_IDS].shape[0])
        split = {key: value.tensor_split(chunks) for key, value in batch.items()}
        last = self.n_stages - 1
        result = torch.zeros(2, dtype=torch.float64, device=self.device)
        for micro in range(chunks):
            metadata = metadata_of({key: parts[micro] for key, parts in split.items()})
            h: torch.Tensor | None = split[INPUT_IDS][micro]
            for stage in range(self.n_stages):
                if self.placement(stage) != self.pp_rank:
                    continue
                if stage > 0 and self.placement(stage - 1) != self.pp_rank:
                    h = self._recv(self.placement(stage - 1))
                h = self.runners[stage](h, **metadata)
                if stage < last and self.placement(stage + 1) != self.pp_rank:
                    self._send(h, self.placement(stage + 1))
            if self.placement(last) == self.pp_rank:
                loss_sum, tokens = loss_fn(h, split[LABELS][micro])
                result[0] += loss_sum.double()
                result[1] += float(tokens)
        return broadcast_sums(result, self.group, self.placement(last))


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
        stages = pipeline_stages(model, ctx.model_name, n_stages)
        stage_ids = stages_of_rank(pp_rank, pp, options.virtual_stages, options.schedule)
        parts = [stages[s] for s in stage_ids]
        return ModelSplit(parts, functools.partial(self._finalize, ctx, stage_ids, n_stages))

    def _finalize(
        self, ctx: Any, stage_ids: list[int], n_stages: int, pmodel: Any, runners: list[nn.Module]
    ) -> None:
        options = self.options
        pp_mesh = ctx.mesh["pp"]
        pp, group = pp_mesh.size(), pp_mesh.get_group()
        stages = [
            PipelineStage(runner, stage, n_stages, ctx.device, group=group)
            for stage, runner in zip(stage_ids, runners)
        ]
        for runner in runners:
            drop_first_forward_stats(runner)
        loss = _MicrobatchLoss()
        schedule_cls = SCHEDULES[options.schedule]
        # scale_grads=False: the trainer's loss is already normalised by the global token count.
        target = stages[0] if options.schedule in SINGLE_STAGE_SCHEDULES else stages
        n_microbatches = microbatches(options, pp)
        schedule = schedule_cls(target, n_microbatches, loss_fn=loss, scale_grads=False)
        placement = functools.partial(rank_of_stage, pp=pp, schedule=options.schedule)
        has_last = n_stages - 1 in stage_ids
        pmodel.train_step = PipelineStep(
            schedule,
            loss,
            n_microbatches,
            has_first=0 in stage_ids,
            has_last=has_last,
            group=group,
            last_rank=placement(n_stages - 1),
            device=ctx.device,
        )
        pmodel.eval_step = PipelineEval(
            dict(zip(stage_ids, runners)),
            n_stages,
            placement,
            pp_mesh.get_local_rank(),
            n_microbatches,
            group,
            ctx.device,
        )
        pmodel.is_last_stage = has_last
        # The schedule drives the stages' gradient sync itself (torch's stages switch a
        # data-parallel wrapper's sync per microbatch and reduce after the last), so the
        # trainer's per-micro-batch toggle of the wrappers applied after the split goes.
        pmodel.gradient_syncs.clear()
