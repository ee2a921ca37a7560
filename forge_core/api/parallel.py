"""Parallelism as plugins see it: what a strategy is given and may return, and the
contract through which a model tells the strategies how it is split and sharded.

A model declares on its spec which contract pieces it supplies (``supports``, from the
capability constants below) and the facts the rules need (``facts``); its
implementation answers ``parallel_contract()`` with a :class:`ParallelContract`. The
built-in strategies read only that: no strategy knows a model's module names.

Torch-free: torch objects (modules, parallel styles) appear only as values a model
supplies, so rules and specs import this for ``forge-run check``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import Any

import attrs


@attrs.frozen
class MeshDim:
    """A dimension of the device mesh, declared by the strategy that owns it
    (:attr:`~forge_core.api.ParallelismSpec.dim`); its degree is the config key
    ``parallel.<name>``, validated from this declaration like every other.

    - ``place``: the mesh is laid out in ascending ``place`` (outermost first): the
      built-ins are ``pp`` 100, ``dp_replicate`` 200, ``dp_shard`` 300, ``ep`` 350,
      ``cp`` 400 and ``tp`` 500 (innermost, so that its ranks are neighbours).
    - ``default``: the degree when the config gives none; ``fills_world``: the degree
      may be -1, taking what the other degrees leave of the world size (one dimension
      at most: ``dp_shard``).
    - ``reads_own_batch``: ranks along it read different batches (data parallelism).
    - ``splits_tokens``: ranks along it read the same batch but each computes the loss
      of a share of its tokens (context parallelism): every loss sum is summed over
      them, and their gradients too.
    - ``splits_layers``: ranks along it hold different layers (pipeline stages): the
      gradient norm adds their squares instead of counting them as copies.
    - ``shards_with``: the dimension whose parameter sharding this one joins (``cp``
      joins ``dp_shard``: FSDP shards over ``dp_shard x cp``, and is switched on when
      that product is above 1). A strategy that already shards some parameters along
      its own dimension (``ep`` splits the experts) leaves them as DTensors sharded
      there; FSDP shards those over the rest only.
    """

    name: str
    place: int
    summary: str
    default: int = 1
    fills_world: bool = False
    reads_own_batch: bool = False
    splits_tokens: bool = False
    splits_layers: bool = False
    shards_with: str | None = None


@attrs.frozen
class AttentionContext:
    """What a strategy's attention wrapper (:attr:`~forge_core.api.ParallelismSpec.attention`)
    is given beside the run's attention backend: the process group along the strategy's
    mesh dimension (``None`` in one process), this process's ``rank`` in it, its
    ``size``, and the strategy's structured ``options``."""

    group: Any
    rank: int
    size: int
    options: Any


@attrs.frozen
class ParallelContext:
    """Passed to ``strategy.apply(model, ctx)``: the strategy's own options and the few
    facts of the run a strategy needs, never the whole config (a strategy's settings
    are its ``options``; what else it needs is named here).

    - ``model_name``: the configured model's name (``model.name``), for messages.
    - ``precision``: ``train.precision`` (``"fp32"`` or ``"bf16"``): the data-parallel
      strategies set their mixed-precision policy from it.
    - ``mesh``: a ``torch.distributed.device_mesh.DeviceMesh`` with one dimension per
      declared :class:`MeshDim`, in their ``place`` order, named like them (``pp``,
      ``dp_replicate``, ``dp_shard``, ``ep``, ``cp``, ``tp``; size-1 dimensions included), or
      ``None`` in a single process.
    - ``dims``: the declared :class:`MeshDim` s, in mesh order.
    - ``device``: the ``torch.device`` this process trains on.
    - ``options``: the strategy's structured options (``parallel.options.<name>``).
    - ``loss_fn``: ``loss_fn(output, labels) -> (loss_sum, token_count)``, over what the
      model part holding the output returns (logits, or hidden states when the chunked
      loss took over the output head); a strategy that takes over forward and backward
      (pipeline parallelism) computes the loss with it, or with the one its step is given.
    - ``gradient_finishers``: see :meth:`add_gradient_finisher`.
    - ``gradient_syncs``: see :meth:`add_gradient_sync`.
    """

    model_name: str
    precision: str
    mesh: Any
    device: Any
    options: Any
    loss_fn: Any = None
    gradient_finishers: list[Callable[[], None]] = attrs.field(factory=list)
    gradient_syncs: list[Callable[[bool], AbstractContextManager]] = attrs.field(factory=list)
    dims: tuple[MeshDim, ...] = ()

    def mesh_along(self, *names: str, without: tuple[str, ...] = ()) -> Any:
        """The mesh over dimensions ``names``, each widened by the dimensions that
        declare they shard with it (:attr:`MeshDim.shards_with`) except those in
        ``without``: ``mesh_along("dp_shard")`` is ``dp_shard x cp`` flattened into one
        dimension named ``dp_shard_cp`` when context parallelism is declared,
        ``mesh_along("dp_replicate", "dp_shard")`` the 2-D mesh of ``dp_replicate`` and
        that. ``without`` leaves out a dimension a parameter is already sharded along
        (FSDP shards experts, which ``ep`` splits, over ``dp_shard x cp`` only).
        Collective the first time (it may create process groups): every rank calls it.
        ``None`` in one process."""
        if self.mesh is None:
            return None
        columns = [
            (name, *(d.name for d in self.dims if d.shards_with == name and d.name not in without))
            for name in names
        ]
        if all(len(column) == 1 for column in columns):
            return self.mesh[names[0]] if len(names) == 1 else self.mesh[names]
        every = tuple(dim for column in columns for dim in column)
        # Flattened (and unflattened) meshes are kept, not sliced again from the root:
        # torch deprecates slicing a flattened dimension out of the root mesh.
        flat = self.mesh[every]._flatten("_".join(every))
        if len(columns) == 1:
            return flat
        sizes = tuple(math.prod(self.mesh[dim].size() for dim in column) for column in columns)
        return flat._unflatten(0, sizes, tuple("_".join(column) for column in columns))

    def add_gradient_sync(self, sync: Callable[[bool], AbstractContextManager]) -> None:
        """Declare how the module this strategy returns synchronises gradients:
        ``sync(enabled)`` returns a context manager entered around each micro-batch's
        forward and backward, ``enabled`` false on every micro-batch of a step but the
        last, so a data-parallel wrapper reduces once per step (DDP: its ``no_sync()``
        when not enabled; FSDP2: ``set_requires_gradient_sync(enabled)``). The trainer
        knows which wrapper it holds only from this; nothing registered: gradients are
        reduced by every backward (or not at all)."""
        self.gradient_syncs.append(sync)

    def add_gradient_finisher(self, finish: Callable[[], None]) -> None:
        """Have ``finish()`` called once per optimizer step, on every process, after the
        last backward and before the gradient norm is taken and clipped: the place to
        reduce gradients the strategy's own communication does not (tensor parallelism
        sums the gradients of ``partial`` parameters over its group there)."""
        self.gradient_finishers.append(finish)


@attrs.define
class ModelSplit:
    """What a strategy's ``apply`` returns when it splits the model (pipeline
    parallelism) instead of returning a module.

    Later strategies are applied to each of ``parts`` separately; once every strategy
    has been applied, ``finalize(pmodel, runners)`` is called with the
    :class:`~forge_core.distributed.parallelize.ParallelModel` and, for each part, the module
    the later strategies returned for it (a wrapper, or the part itself), and sets
    ``train_step`` and ``is_last_stage`` (and anything else it drives).
    """

    parts: list[Any]
    finalize: Callable[[Any, list[Any]], None]


# --- the model's parallel contract ------------------------------------------------------

# Contract pieces a model declares in ``ModelSpec.supports`` and a strategy names in
# ``ParallelismSpec.requires``:
#: A contract piece: the model names its repeated blocks.
BLOCKS = "blocks"
#: A contract piece: the model supplies a tensor-parallel plan.
TENSOR_PARALLEL = "tensor_parallel"
#: A contract piece: the model's tensor-parallel plan also exists with sequence
#: parallelism (``parallel.options.tp.sequence_parallel``).
SEQUENCE_PARALLEL = "sequence_parallel"
#: A contract piece: the model supplies a pipeline split.
PIPELINE = "pipeline"
#: A contract piece: the model names its output projection (``train.loss.name: chunked``).
OUTPUT_HEAD = "output_head"

#: An attention backend that declares it (``AttentionBackendSpec.supports``) answers
#: ``prepare_queries(doc_ids, query_index, seq_len, device)``: the mask of a share of a
#: row's queries (at row positions ``query_index``) over every key of the row.
QUERY_SHARDS = "query_shards"


@attrs.frozen
class ModelFacts:
    """What rules need to know about a configured model, whatever its options call it:
    returned by ``ModelSpec.facts(options)`` (torch-free) and read by the strategies'
    rules (heads divisible by the tensor-parallel degree, layers per pipeline stage,
    tied embeddings, routed experts divisible by the expert-parallel degree)."""

    blocks: int  # repeated blocks (layers)
    heads: int  # query heads
    kv_heads: int  # key/value heads
    tied_embeddings: bool = False  # the output head shares the token embedding's matrix
    #: The roles of its block projections (``ParallelContract.roles``' keys), which model
    #: transforms target (``forge_core.api.transforms.ROLES``).
    roles: frozenset[str] = attrs.field(default=frozenset(), converter=frozenset)
    experts: int = 0  # routed experts of each mixture-of-experts layer; 0: a dense model


@attrs.frozen
class PipelineSplit:
    """How a pipeline stage is cut from the model. ``first``: root attributes only the
    first stage keeps (the token embedding); ``last``: root attributes only the last
    stage keeps (final norm, output head). A stage sets the others to ``None``: without
    its ``first`` modules the forward takes hidden states ``(B, S, dim)`` in place of
    ``input_ids``; without its ``last`` modules it returns hidden states. Per-token
    metadata (``doc_ids``, ``positions``) always arrive as keyword arguments."""

    first: tuple[str, ...] = attrs.field(converter=tuple)
    last: tuple[str, ...] = attrs.field(converter=tuple)


@attrs.frozen
class TensorParallelScope:
    """The tensor-parallel plan of one scope (the model part's root, or one block);
    every path is relative to the scope and names a module or a parameter.

    - ``styles``: module path -> a torch ``ParallelStyle`` (``ColwiseParallel()``, ...),
      applied with ``parallelize_module``.
    - ``replicated``: kept whole and computed on replicated activations, so every
      tensor-parallel rank gets the same gradient (norms without sequence parallelism).
    - ``partial``: kept whole but applied to this rank's shard (per-head q/k norms):
      the strategy SUMS their gradients over the tensor-parallel group.

    After the plan is applied, every parameter must be sharded (a DTensor) or matched by
    ``replicated`` or ``partial``; otherwise the build stops naming it."""

    styles: Mapping[str, Any] = attrs.field(factory=dict)
    replicated: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    partial: tuple[str, ...] = attrs.field(default=(), converter=tuple)


@attrs.frozen
class TensorParallelPlan:
    """``root``: paths relative to the model part (entries for modules a pipeline stage
    does not hold are skipped); ``block``: paths relative to each block."""

    root: TensorParallelScope = attrs.field(factory=TensorParallelScope)
    block: TensorParallelScope = attrs.field(factory=TensorParallelScope)


@attrs.frozen
class ParallelContract:
    """What a model's ``parallel_contract()`` returns: all the strategies know of it.

    - ``blocks``: the attribute holding the repeated blocks (an ``nn.ModuleDict``, so
      that a pipeline stage keeps its blocks' state-dict keys): FSDP shards them one by
      one, ``train.compile`` compiles them one by one, pipeline parallelism splits them.
    - ``pipeline``: the :class:`PipelineSplit`, or ``None`` (no pipeline parallelism).
    - ``tensor_parallel``: called as ``tensor_parallel(sequence_parallel=bool)``, returns
      the :class:`TensorParallelPlan`; it builds torch styles, so it imports torch itself
      (lazily, in the model's package). ``None``: no tensor parallelism. A model that
      cannot run with sequence parallelism raises a ``ForgeError`` for ``True`` and
      leaves ``SEQUENCE_PARALLEL`` out of its spec's ``supports``, so that ``forge-run
      check`` refuses the option before any process starts.
    - ``output_head``: the root attribute holding the output projection, or ``None``. The
      model promises that the head is a linear map (``weight`` of shape ``(vocab, dim)``,
      optional ``bias``), called once on the final hidden states, and that its result is
      the forward's output with nothing applied after it. A loss that applies the head
      itself, chunk by chunk (``train.loss.name: chunked``), makes the head's forward the
      identity, so the model returns the hidden states; the head stays registered where
      it is (state-dict keys, sharding and tied weights unchanged). Declared on the spec
      as ``OUTPUT_HEAD`` in ``supports``.
    - ``experts``: the path, relative to a block, of its routed-experts module (a
      mixture-of-experts block's ``feed_forward.experts``), or ``None`` (no block has
      experts). A block without that submodule is dense. The module has ``num_experts``,
      ``first_expert``, ``local_experts``, expert-stacked parameters (dim 0: the local
      experts), ``compute(x_grouped, counts)`` and a replaceable ``dispatcher``; expert
      parallelism and the sharding strategies find experts only through this path.
    - ``roles``: role -> path of a linear projection (``nn.Linear``) relative to each
      block (``{"attention.q": "attention.wq", "mlp.up": "feed_forward.w3"}``): what a
      model transform (LoRA) targets, whatever the model calls its modules. The role
      names are those of :data:`forge_core.api.transforms.ROLES` where they apply; the
      model's ``facts`` list the same names (``ModelFacts.roles``) for ``check``.
    """

    blocks: str
    pipeline: PipelineSplit | None = None
    tensor_parallel: Callable[..., TensorParallelPlan] | None = None
    output_head: str | None = None
    experts: str | None = None
    roles: Mapping[str, str] = attrs.field(factory=dict)


def contract_of(module: Any) -> ParallelContract | None:
    """The module's :class:`ParallelContract`, or ``None`` when it declares none. A
    pipeline stage (a shallow copy of the model) answers like the model."""
    declare = getattr(module, "parallel_contract", None)
    return declare() if callable(declare) else None


def blocks_of(module: Any) -> list[Any]:
    """The repeated blocks of a model part, in order (what FSDP shards and compile
    compiles one by one); ``[]`` for a module that declares no contract or no blocks."""
    contract = contract_of(module)
    blocks = None if contract is None else getattr(module, contract.blocks, None)
    if blocks is None:
        return []
    values = getattr(blocks, "values", None)
    return list(values() if callable(values) else blocks)


# --- tensor-parallel bookkeeping shared by the tp strategy and the conformance kit -----


def tied_parameter_names(module: Any) -> list[list[str]]:
    """Groups of names under which one parameter is registered (tied weights, such as
    an output head sharing the token embedding's matrix), in registration order."""
    names: dict[int, list[str]] = {}
    for name, param in module.named_parameters(remove_duplicate=False):
        names.setdefault(id(param), []).append(name)
    return [group for group in names.values() if len(group) > 1]


def _declared(name: str, paths: Any) -> bool:
    return any(name == path or name.startswith(path + ".") for path in paths)


def tensor_parallel_coverage(
    module: Any, blocks: list[Any], plan: TensorParallelPlan, is_sharded: Callable[[str, Any], bool]
) -> tuple[list[str], list[str]]:
    """``(uncovered, partial)``: the names of the parameters of ``module`` (a model or a
    pipeline stage) that are neither sharded (``is_sharded(name, param)``) nor declared
    ``replicated`` or ``partial`` by the plan's scope they sit in (a block's scope for a
    parameter of one of ``blocks``, else the root's), and of those declared ``partial``.

    The ``tp`` strategy asks whether a parameter became a DTensor; the conformance kit,
    which has no process group, whether a style of the plan names its module."""
    prefixes = {id(sub): name + "." for name, sub in module.named_modules()}
    block_prefixes = [prefixes[id(block)] for block in blocks if id(block) in prefixes]
    uncovered, partial = [], []
    for name, param in module.named_parameters():
        if is_sharded(name, param):
            continue
        prefix = next((p for p in block_prefixes if name.startswith(p)), "")
        scope = plan.block if prefix else plan.root
        relative = name[len(prefix) :]
        if _declared(relative, scope.partial):
            partial.append(name)
        elif not _declared(relative, scope.replicated):
            uncovered.append(name)
    return uncovered, partial
