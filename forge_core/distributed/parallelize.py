"""Apply the active parallelism strategies to a model and describe the result.

The trainer sees only :class:`ParallelModel`: the model parts this process holds (one,
or several pipeline stages), the data-parallel coordinates that decide which batch it
reads, an optional ``train_step`` for strategies that take over forward and backward
(pipeline parallelism), and a gradient-clipping function that computes the true global
norm across every shard and stage.

:func:`parallelize` knows no concrete strategy: it applies the strategies of the judged
:class:`~forge_core.api.Plan` (``plan.strategies``: active, in their declared ``order``,
each with its options) on a mesh of ``plan.degrees``; ``train.compile`` is one of them
(the ``compile`` wrapper, order 300).

Gradient convention (docs/plugin-guide/parallelism.md#the-gradient-convention):
data-parallel strategies SUM gradients over the data-parallel ranks, never average them,
and each micro-batch back-propagates ``loss_sum / global_tokens`` (``global_tokens``: the
labelled tokens of the whole step, every rank and accumulation micro-batch), so the sum
is the single-process gradient of the whole batch. :meth:`ParallelModel.forward_backward`
does that division.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import torch

from forge_core.api import parallel as contract
from forge_core.api.batch import LABELS
from forge_core.api.errors import ForgeError
from forge_core.api.protocols import BatchTransformingStrategy, PretrainedModel
from forge_core.api.transforms import initialize_transforms, transforms_detached

if TYPE_CHECKING:
    from forge_core.api import Plan


@attrs.define
class ParallelModel:
    """The model as this process holds it after every strategy is applied.

    - ``parts``: modules whose parameters this process trains and checkpoints (their
      state-dict keys equal the unsplit model's keys).
    - ``forward``: the module to call for logits when ``train_step`` is ``None`` (it may
      be a wrapper around ``parts[0]``, such as DistributedDataParallel).
    - ``train_step``: ``train_step(batch, loss_fn, normalizer) -> (loss_sum, tokens)``
      doing forward and backward itself (set by pipeline parallelism), or ``None``.
      ``loss_fn(logits, labels) -> (loss_sum, tokens)`` is called on the last stage per
      microbatch and ``loss_sum / normalizer`` back-propagated; the sums over the
      microbatches of ``loss_sum`` and ``tokens`` are returned to every process of the
      pipeline (every one calls it with the same batch).
    - ``eval_step``: ``eval_step(batch, loss_fn) -> (loss_sum, tokens)``, the
      forward-only counterpart of ``train_step`` (set with it), or ``None``.
    - ``dp_rank``/``dp_size``: this process's data-parallel coordinates; every process
      with the same ``dp_rank`` reads the same batch. ``dp_group`` sums over them
      (``None`` when ``dp_size`` is 1).
    - ``mesh``: the DeviceMesh, or ``None`` in one process; ``dims`` its declared
      dimensions (:class:`~forge_core.api.MeshDim`), in mesh order.
    - ``is_last_stage``: whether this process computes the loss (pipeline: last stage).
    - ``loss_fn``: the loss the model was built for (:func:`forge_core.train.loss.build_loss`):
      ``loss_fn(output, labels) -> (loss_sum, tokens)``; the default of
      :meth:`forward_backward` and :meth:`evaluate`. With the chunked loss the model's
      output is hidden states, so any other loss is refused there.
    - ``gradient_finishers``: what strategies registered through
      :meth:`~forge_core.api.ParallelContext.add_gradient_finisher`; the trainer calls
      :meth:`finish_gradients` once per optimizer step, after the last backward and
      before clipping.
    - ``batch_transforms``: what strategies declared (``batch_transform(ctx)``, see
      :class:`~forge_core.api.Strategy`), applied in order by :meth:`forward_backward`
      and :meth:`evaluate` before the model sees a batch.
    - ``objective``: the run's training objective (``train.objective``, an instance of
      its spec's implementation), through which :meth:`forward_backward` and
      :meth:`evaluate` compute the loss when no ``loss_fn`` is given (under pipeline
      parallelism, as :meth:`_stage_loss`); ``None``: the token loss ``loss_fn``.
      ``reference``: ``reference(inputs) -> output``, the frozen reference model's
      forward (no gradient) for an objective that ``needs_reference``, else ``None``.
      ``objective_sums``: the objective's metric sums over this process's micro-batches
      since :meth:`take_objective_sums` last emptied them.
    - ``token_split``: over how many processes each batch's tokens are split
      (``MeshDim.splits_tokens``: ``cp``); this process's loss sums are its share, so
      a sum over every process weights them by ``token_split`` over the processes that
      read the batch.
    - ``gradient_syncs``: what strategies declared through
      :meth:`~forge_core.api.ParallelContext.add_gradient_sync`, entered by
      :meth:`gradient_sync` around each micro-batch: how the wrapper that holds the
      model skips the gradient reduction on all but a step's last micro-batch.
    """

    parts: list[torch.nn.Module]
    forward: torch.nn.Module | None
    train_step: Callable[..., tuple[torch.Tensor, torch.Tensor]] | None = None
    eval_step: Callable[..., tuple[torch.Tensor, torch.Tensor]] | None = None
    dp_rank: int = 0
    dp_size: int = 1
    mesh: Any = None
    is_last_stage: bool = True
    dp_group: Any = None
    dims: tuple[Any, ...] = ()
    gradient_finishers: list[Callable[[], None]] = attrs.field(factory=list)
    loss_fn: Callable[..., tuple[torch.Tensor, torch.Tensor]] | None = None
    batch_transforms: list[Callable[[Any], Any]] = attrs.field(factory=list)
    token_split: int = 1
    objective: Any = None
    reference: Callable[[dict[str, torch.Tensor]], Any] | None = None
    objective_sums: dict[str, torch.Tensor] = attrs.field(factory=dict)

    def transform(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``batch`` as the model sees it: every strategy's batch transform applied."""
        for transform in self.batch_transforms:
            batch = transform(batch)
        return batch

    gradient_syncs: list[Callable[[bool], contextlib.AbstractContextManager]] = attrs.field(factory=list)

    def gradient_sync(self, enabled: bool) -> contextlib.AbstractContextManager:
        """Every declared gradient sync (:attr:`gradient_syncs`) for one micro-batch;
        ``enabled``: whether its backward reduces the gradients (the step's last)."""
        stack = contextlib.ExitStack()
        for sync in self.gradient_syncs:
            stack.enter_context(sync(enabled))
        return stack

    def finish_gradients(self) -> None:
        """Complete this step's gradients (after the last backward, before clipping)."""
        for finish in self.gradient_finishers:
            finish()

    def parameters(self):
        for part in self.parts:
            yield from part.parameters()

    def _loss(self, loss_fn: Callable | None) -> Callable:
        """``loss_fn``, or the model's own when ``None``; a loss over logits given to a
        model that returns hidden states (the chunked loss took over its head) is refused
        rather than computed on the wrong tensor."""
        own = self.loss_fn
        if loss_fn is None or loss_fn is own:
            if own is None:
                raise ForgeError(
                    "no loss given and the model was built without one (parallelize(loss_fn=...))"
                )
            return own
        if getattr(own, "takes_hidden_states", False) and not getattr(loss_fn, "takes_hidden_states", False):
            raise ForgeError(
                "this model was built for the chunked loss (train.loss.name: chunked): it returns hidden "
                "states, not logits, so a loss over logits cannot be applied to it. Pass loss_fn=None to "
                "use the model's own loss (ParallelModel.loss_fn)."
            )
        return loss_fn

    def take_objective_sums(self) -> dict[str, torch.Tensor]:
        """The objective's metric sums since the last call (float64), emptied."""
        sums, self.objective_sums = self.objective_sums, {}
        return sums

    def _objective_loss(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(loss_sum, count)`` of the objective on ``batch`` (already transformed); its
        metric sums are added to :attr:`objective_sums`."""
        objective = self.objective
        hidden = {LABELS, *getattr(objective, "batch_keys", ())}
        inputs = {k: v for k, v in batch.items() if k not in hidden}
        output = self.forward(**inputs)
        reference = None
        if objective.needs_reference:
            if self.reference is None:
                raise ForgeError(
                    f"objective {type(objective).__name__} needs a reference model, but the model was "
                    "parallelized without one (ParallelModel.reference)"
                )
            with torch.no_grad():
                reference = self.reference(inputs)
        loss_sum, count, sums = objective.loss(output, batch, reference)
        for name, value in sums.items():
            value = value.detach().double()
            self.objective_sums[name] = self.objective_sums.get(name, 0) + value
        return loss_sum, count

    def _uses_objective(self, loss_fn: Callable | None) -> bool:
        return self.objective is not None and loss_fn in (None, self.loss_fn)

    def _stage_loss(self, output: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The objective as the last pipeline stage calls a loss, per microbatch: from
        the output and the labels alone (an objective declares ``pipeline`` when that is
        all it needs); its metric sums stay on that stage and are not reported."""
        loss_sum, count, _ = self.objective.loss(output, {LABELS: labels}, None)
        return loss_sum, count

    def forward_backward(
        self, batch: dict[str, torch.Tensor], loss_fn: Callable | None, global_tokens: float | torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One micro-step with the gradient convention above: forward, ``loss_fn(output,
        labels) -> (loss_sum, tokens)``, backward of ``loss_sum / global_tokens``.
        Returns the detached ``(loss_sum, tokens)`` of this process's rows (under
        pipeline parallelism: of the pipeline's rows, on every stage; under a token
        split, of this process's share of them).

        ``batch`` holds ``input_ids``, ``labels`` and any per-token metadata the model
        accepts. ``loss_fn`` ``None``: the model's own (:attr:`loss_fn`).
        """
        objective = self._uses_objective(loss_fn)
        loss_fn = self._loss(loss_fn)
        batch = self.transform(batch)
        if self.train_step is not None:
            return self.train_step(batch, self._stage_loss if objective else loss_fn, global_tokens)
        if objective:
            loss_sum, tokens = self._objective_loss(batch)
        else:
            inputs = {k: v for k, v in batch.items() if k != LABELS}
            loss_sum, tokens = loss_fn(self.forward(**inputs), batch[LABELS])
        (loss_sum / global_tokens).backward()
        return loss_sum.detach(), torch.as_tensor(tokens)

    @torch.no_grad()
    def evaluate(
        self, batch: dict[str, torch.Tensor], loss_fn: Callable | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Forward only: ``(loss_sum, tokens)`` of this process's rows (under pipeline
        parallelism: of the pipeline's rows, on every stage), no gradient kept. The
        caller switches the parts to eval mode and back. ``loss_fn`` ``None``: the
        model's own (:attr:`loss_fn`, chunked when the run's loss is)."""
        objective = self._uses_objective(loss_fn)
        loss_fn = self._loss(loss_fn)
        batch = self.transform(batch)
        if self.train_step is not None:
            if self.eval_step is None:
                raise ForgeError("this parallel layout has no forward-only step for evaluation")
            return self.eval_step(batch, self._stage_loss if objective else loss_fn)
        if objective:
            loss_sum, tokens = self._objective_loss(batch)
        else:
            inputs = {k: v for k, v in batch.items() if k != LABELS}
            loss_sum, tokens = loss_fn(self.forward(**inputs), batch[LABELS])
        return loss_sum.detach(), torch.as_tensor(tokens)


def single_process(model: torch.nn.Module, loss_fn: Callable | None = None) -> ParallelModel:
    return ParallelModel(parts=[model], forward=model, loss_fn=loss_fn)


def is_meta(module: torch.nn.Module) -> bool:
    """Whether any parameter or buffer of ``module`` is still on the meta device."""
    return any(t.is_meta for t in (*module.parameters(), *module.buffers()))


def materialize(module: torch.nn.Module, device: torch.device | str) -> None:
    """Give a module built on the meta device real storage on ``device`` and fill it:
    ``to_empty`` then the model's ``init_weights()`` (which loads its checkpoint), with
    the model transforms' parameters out of its sight, then theirs
    (:mod:`forge_core.api.transforms`).
    Parameters shared under several names (tied embeddings) stay shared: a plain
    ``to_empty`` would give each name its own tensor. Nothing to do for a module with
    no meta tensor."""

    if not is_meta(module):
        return
    if not isinstance(module, PretrainedModel):
        raise ForgeError(
            f"{type(module).__name__} was built on the meta device but has no init_weights() to fill it "
            "(the model contract: ModelSpec.pretrained_option)"
        )
    shared: dict[int, list[str]] = {}
    for name, param in module.named_parameters(remove_duplicate=False):
        shared.setdefault(id(param), []).append(name)
    module.to_empty(device=device)
    for first, *others in (names for names in shared.values() if len(names) > 1):
        param = module.get_parameter(first)
        for name in others:
            owner, _, attr = name.rpartition(".")
            if module.get_parameter(name) is not param:
                setattr(module.get_submodule(owner), attr, param)
    # The model fills what its factory built; each model transform, its own parameters.
    with torch.no_grad():
        with transforms_detached(module):
            module.init_weights()
        initialize_transforms(module)


def parallelize(
    model: torch.nn.Module,
    plan: Plan,
    device: torch.device,
    loss_fn: Callable | None = None,
    mesh: Any = None,
    objective: Any = None,
    reference: Callable[[dict[str, torch.Tensor]], Any] | None = None,
) -> ParallelModel:
    """Apply ``plan.strategies`` to ``model`` on ``mesh`` (built from ``plan.degrees``
    when not given: :func:`~forge_core.distributed.mesh.build_mesh`; the caller builds it
    first when the attention backend needs it, :func:`wrap_attention`).
    A model built on the meta device (its weights come from a checkpoint) is
    materialised before the first strategy that does not declare
    ``handles_meta_device``, or after the last (:func:`materialize`).

    ``plan`` is the :class:`~forge_core.api.Plan` the run was judged with, against the
    world size it runs at: nothing is recomputed from the config. Every process calls
    this with an identically initialised model (same seed), so sharding a local copy
    gives every rank the weights a single process would have. ``objective`` and
    ``reference`` become the :class:`ParallelModel`'s (its loss when none is given).
    Returns the :class:`ParallelModel`.
    """
    from forge_core.api import ParallelContext
    from forge_core.distributed.mesh import build_mesh, dp_coords

    if mesh is None:
        mesh = build_mesh(plan.degrees, device)

    coords = dp_coords(mesh, plan.dims)
    pmodel = ParallelModel(
        parts=[model],
        forward=model,
        mesh=mesh,
        dp_rank=coords.rank,
        dp_size=coords.size,
        dp_group=coords.group,
        dims=plan.dims,
        loss_fn=loss_fn,
        token_split=plan.token_split,
        objective=objective,
        reference=reference,
    )
    parts: list[torch.nn.Module] = [model]
    runners: list[torch.nn.Module] = [model]
    split: contract.ModelSplit | None = None
    # A style that re-registers a parameter may make it trainable again (torch's
    # SequenceParallel does): what the model or its transforms froze stays frozen.
    frozen = {name for name, param in model.named_parameters() if not param.requires_grad}
    for strategy in plan.strategies:
        name = strategy.name
        if not strategy.spec.handles_meta_device:
            for part in parts:
                materialize(part, device)
        ctx = ParallelContext(
            model_name=plan.config.model.name,
            precision=plan.config.train.precision,
            mesh=mesh,
            device=device,
            options=strategy.options,
            loss_fn=loss_fn,
            gradient_finishers=pmodel.gradient_finishers,
            gradient_syncs=pmodel.gradient_syncs,
            dims=plan.dims,
        )
        impl = strategy.spec.load()(strategy.options)
        results = [impl.apply(runner, ctx) for runner in runners]
        # Once per strategy, not per part: a pipeline rank may hold several stages.
        transform = impl.batch_transform(ctx) if isinstance(impl, BatchTransformingStrategy) else None
        if transform is not None:
            pmodel.batch_transforms.append(transform)
        if any(isinstance(result, contract.ModelSplit) for result in results):
            if split is not None or len(results) != 1:
                raise ForgeError(
                    f"strategy {name!r} splits the model, but it is already split: only one "
                    "strategy may split the model, and it must be applied first"
                )
            split = results[0]
            parts, runners = list(split.parts), list(split.parts)
        else:
            runners = results
    for part in parts:
        materialize(part, device)
        for name, param in part.named_parameters():
            if name in frozen:
                param.requires_grad_(False)
    pmodel.parts = parts
    if split is not None:
        pmodel.forward = None
        split.finalize(pmodel, runners)
    else:
        pmodel.forward = runners[0]
    return pmodel


def wrap_attention(backend: Any, plan: Plan, mesh: Any) -> Any:
    """The attention backend the model is built with: ``backend`` passed through the
    attention wrapper of every active strategy that declares one
    (``ParallelismSpec.attention``), in application order, each given an
    :class:`~forge_core.api.AttentionContext` along the strategy's mesh dimension."""
    from forge_core.api import AttentionContext, import_path
    from forge_core.distributed.mesh import group_of, rank_along

    for strategy in plan.strategies:
        spec = strategy.spec
        if spec.attention is None:
            continue
        rank, size = rank_along(mesh, spec.mesh_dim) if spec.mesh_dim else (0, 1)
        group = group_of(mesh, spec.mesh_dim) if spec.mesh_dim else None
        ctx = AttentionContext(group=group, rank=rank, size=size, options=strategy.options)
        try:
            backend = import_path(spec.attention)(backend, ctx)
        except ForgeError:
            raise
        except Exception as exc:
            raise ForgeError(
                f"strategy {spec.name!r} (plugin {strategy.plugin!r}): its attention wrapper "
                f"{spec.attention!r} raised {type(exc).__name__}: {exc}"
            ) from exc
    return backend


def _by_placement(params: list[torch.nn.Parameter]) -> list[list[torch.nn.Parameter]]:
    """Parameters with a gradient, grouped so that each group's gradients are all plain
    tensors, or all DTensors on one mesh with one placement (what a foreach over the
    group needs)."""
    groups: dict[Any, list[torch.nn.Parameter]] = {}
    for param in params:
        if param.grad is None:
            continue
        spec = getattr(param.grad, "_spec", None)
        key = None if spec is None else (id(spec.mesh), tuple(spec.placements))
        groups.setdefault(key, []).append(param)
    return list(groups.values())


def _copies(grad: torch.Tensor, outside: int) -> int:
    """How many processes hold the same local gradient as this one: the replicated
    dimensions of its DTensor mesh, times every dimension outside that mesh except the
    pipeline's (stages hold different parameters). ``outside`` is the number of processes
    of every dimension but the pipeline's: a plain tensor is replicated over all of them
    (DDP replicas, tensor-parallel ranks)."""
    spec = getattr(grad, "_spec", None)
    if spec is None:
        return outside
    replicated = 1
    for size, placement in zip(spec.mesh.shape, spec.placements):
        if placement.is_replicate():
            replicated *= size
    return replicated * (outside // spec.mesh.size())


def _settled(grad: torch.Tensor) -> torch.Tensor:
    """The gradient with any pending partial sum reduced (under sequence parallelism the
    norms' weights get ``Partial`` gradients: each rank's share of the sequence)."""
    spec = getattr(grad, "_spec", None)
    if spec is None or not any(p.is_partial() for p in spec.placements):
        return grad
    from torch.distributed.tensor import Replicate

    return grad.redistribute(placements=[Replicate() if p.is_partial() else p for p in spec.placements])


def _global_norm(groups: list[list[torch.nn.Parameter]], mesh: Any, dims: tuple[Any, ...]) -> torch.Tensor:
    """The L2 norm of the whole model's gradient (``groups`` from :func:`_by_placement`):
    the squares of every shard (tensor and fully-sharded data parallel) and every
    pipeline stage, each counted once.

    Each process adds the squares of its local pieces, each divided by the number of
    processes that hold the same piece, and ONE all-reduce over all processes sums them,
    so every process gets the same bits (and clips replicated weights identically)."""
    import torch.distributed as dist

    outside = (
        1 if mesh is None else mesh.size() // math.prod(mesh[d.name].size() for d in dims if d.splits_layers)
    )
    device = groups[0][0].grad.device if groups else torch.device("cpu")
    total = torch.zeros((), dtype=torch.float64, device=device)
    for group in groups:
        grads = [_settled(p.grad) for p in group]
        local = [g.to_local() if hasattr(g, "to_local") else g for g in grads]
        norm = torch.nn.utils.get_total_norm(local, norm_type=2.0, foreach=True)
        total = total + norm.double() ** 2 / _copies(grads[0], outside)
    if mesh is not None:
        dist.all_reduce(total)
    return total.sqrt().float()


def clip_grad_norm(
    pmodel: ParallelModel, max_norm: float, params: Sequence[torch.nn.Parameter] | None = None
) -> torch.Tensor:
    """Global gradient norm (see :func:`_global_norm`), scaling every gradient by
    ``max_norm / norm`` when ``max_norm`` is above 0 and the norm exceeds it. Nothing
    waits on the host; a non-finite norm leaves non-finite gradients for the trainer's
    nonfinite policy to skip. ``params``: ``pmodel``'s parameters, listed once by a
    caller that clips every step (listing them walks every module); ``None``: listed here."""
    groups = _by_placement(list(pmodel.parameters()) if params is None else list(params))
    norm = _global_norm(groups, pmodel.mesh, pmodel.dims)
    if max_norm > 0:
        for group in groups:
            torch.nn.utils.clip_grads_with_norm_(group, max_norm, norm, foreach=True)
    return norm
