"""Frozen spec objects that plugins return from the registration hooks.

A spec is metadata: it names a component, summarises it in one line, points at the
implementation by a lazy import path (``"package.module:attr"``) and declares the
capabilities the rule engine reasons about. Nothing here imports torch, so ``forge-run
check``, ``plugins`` and ``rules`` stay fast; the implementation is imported only when a
run actually builds the component (``spec.load()``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, ClassVar

import attrs


@attrs.frozen
class NoOptions:
    """Options class for a component that takes no options."""


def _check_impl(instance: Any, attribute: attrs.Attribute, value: str) -> None:
    module, sep, attr = value.partition(":")
    if not sep or not module or not attr:
        raise ValueError(
            f"{type(instance).__name__} {instance.name!r}: impl must be 'package.module:attr', got {value!r}"
        )


def _check_name(instance: Any, attribute: attrs.Attribute, value: str) -> None:
    if not value or not value.replace("_", "").replace("-", "").isalnum():
        raise ValueError(f"component name must be letters, digits, '-' or '_', got {value!r}")


def import_path(path: str) -> Any:
    """Import ``"package.module:attr"`` (``attr`` may be dotted) and return the object."""
    module_name, _, attr = path.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


@attrs.frozen(kw_only=True)
class ComponentSpec:
    """Fields every component spec has.

    ``options`` is an attrs class; the config's option block for this component is
    structured against it (unknown keys rejected, strict scalars), so a component's
    settings are validated before anything is built.

    ``fetch`` is optionally a torch-free ``"package.module:function"``,
    ``fetch(options) -> None``, that brings onto this machine what the (structured)
    options name elsewhere (a model or tokenizer by Hub id). ``forge-run train`` calls
    it for the chosen component of each option block (``model``, ``data.tokenizer``,
    ...) before judging the config, so the rules then see the files; ``forge-run check``
    never calls it and judges what is already here. It returns at once when there is
    nothing to fetch, and raises :class:`~forge_core.api.ForgeError` when fetching fails.
    """

    kind: ClassVar[str] = "component"

    name: str = attrs.field(validator=_check_name)
    summary: str
    impl: str = attrs.field(validator=_check_impl)
    options: type = NoOptions
    fetch: str | None = None

    def load(self) -> Any:
        """Import and return the implementation object named by ``impl``."""
        return import_path(self.impl)


@attrs.frozen(kw_only=True)
class AttentionBackendSpec(ComponentSpec):
    """An attention kernel. ``honours`` lists the per-token metadata it respects
    (``{"doc_ids"}`` for a backend that masks attention across documents)."""

    kind: ClassVar[str] = "attention"
    honours: frozenset[str] = attrs.field(default=frozenset(), converter=frozenset)
    #: What else it can do (``QUERY_SHARDS``: it answers ``prepare_queries``, the
    #: attention of a share of a row's queries over the whole row's keys that context
    #: parallelism's all-gather mode needs).
    supports: frozenset[str] = attrs.field(default=frozenset(), converter=frozenset)


@attrs.frozen(kw_only=True)
class ParallelismSpec(ComponentSpec):
    """A parallelism strategy or model wrapper.

    - ``mesh_dim``: the ``parallel.*`` degree that switches it on (``"pp"``, ``"tp"``,
      ``"dp_shard"``, ``"dp_replicate"``, ``"cp"``); ``None`` for a wrapper enabled by
      name in ``parallel.wrappers``. A strategy is switched on when that degree, times
      the degrees of dimensions that shard with it, is above 1.
    - ``dim``: the :class:`~forge_core.api.MeshDim` this strategy declares (its degree
      key, its place in the mesh, how it combines with data parallelism), or ``None``.
      Every mesh dimension, the built-ins' included, is declared this way.
    - ``attention``: optionally ``"package.module:function"``, called as
      ``wrap(backend, ctx) -> backend`` with the run's attention backend and an
      :class:`~forge_core.api.AttentionContext` when the strategy is active, before the
      model is built: the backend the model gets (context parallelism gathers keys and
      values over its group there).
    - ``enabled_by``: for a wrapper, a boolean config path that switches it on as well
      as its name in ``parallel.wrappers`` (the built-in ``compile`` wrapper:
      ``"train.compile"``); ``None``: the name only.
    - ``order``: strategies are applied in ascending order (pipeline split 100, tensor
      parallel 200, activation checkpointing 250, compile 300, data-parallel wrapping
      400).
    - ``forwards``: the per-token metadata keys that reach every layer under this
      strategy; ``None`` means all of them (the strategy does not change what a layer
      sees). A strategy whose later layers receive only hidden states forwards
      ``frozenset()``; the built-in pipeline hands every stage its microbatch's
      ``doc_ids`` and ``positions`` and forwards both.
    - ``yields_to``: names of strategies that, when active, take over this one's job
      (``ddp`` yields to ``fsdp``, which does HSDP when both DP degrees are above 1).
    - ``drops_metadata_because``: why metadata outside ``forwards`` is lost; quoted by
      the rule that refuses such a combination.
    - ``requires``: the pieces of the model's parallel contract the strategy needs
      (``{TENSOR_PARALLEL}``, ``{PIPELINE}``, from :mod:`forge_core.api`); a model whose
      spec does not declare them in ``supports`` is refused by ``forge-run check``.
    - ``handles_meta_device``: the strategy applies to a model whose tensors are still on
      the meta device (a model that loads a checkpoint is built there, see
      :class:`ModelSpec`) and leaves it there. Before the first strategy that does not,
      the kernel materialises the model (``to_empty`` then ``init_weights``), so with
      only such strategies before it each process allocates just what it holds.
    """

    kind: ClassVar[str] = "parallelism"
    mesh_dim: str | None = None
    dim: Any = None
    attention: str | None = None
    enabled_by: str | None = None
    order: int = 500
    forwards: frozenset[str] | None = attrs.field(
        default=None, converter=lambda v: None if v is None else frozenset(v)
    )
    yields_to: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    drops_metadata_because: str = ""
    requires: frozenset[str] = attrs.field(default=frozenset(), converter=frozenset)
    handles_meta_device: bool = False

    def forwards_key(self, key: str) -> bool:
        return self.forwards is None or key in self.forwards


@attrs.frozen(kw_only=True)
class PackerSpec(ComponentSpec):
    """Turns tokenized documents into fixed-length rows. ``emits`` lists the per-token
    metadata it returns beside ``input_ids`` and ``labels`` (``{"doc_ids", "positions"}``
    for a packer that isolates documents). ``emits_when`` optionally names a boolean
    option that switches emission off (``"isolate"`` for ``concat``)."""

    kind: ClassVar[str] = "packer"
    emits: frozenset[str] = attrs.field(default=frozenset(), converter=frozenset)
    emits_when: str | None = None

    def emitted(self, options: Any) -> frozenset[str]:
        """The metadata this packer emits under ``options`` (its structured options)."""
        if self.emits_when is not None and not getattr(options, self.emits_when, True):
            return frozenset()
        return self.emits


@attrs.frozen(kw_only=True)
class ModelSpec(ComponentSpec):
    """A model family.

    - ``max_seq_len_option``: the option holding the longest sequence the model
      supports (used by the sequence-length rule).
    - ``accepts``: the per-token metadata its forward takes as keyword arguments.
    - ``hf_export``: optionally ``"package.module:function"`` used by ``forge-run
      export-hf`` (called as ``export(model_state_dict, options, out_dir,
      vocab_size=...)``, plus ``eos_token_id``/``pad_token_id``/``bos_token_id``/
      ``max_shard_size`` keywords when the function accepts them; the state dict is
      already in the dtype asked for).
    - ``hf_key``: optionally ``"package.module:function"`` mapping a Forge parameter name
      to its Hugging Face name (``layers.0.attention.wq.weight`` ->
      ``model.layers.0.self_attn.q_proj.weight``): how ``export-hf --adapter`` names the
      adapted modules in a PEFT folder.
    - ``supports``: the pieces of the parallel contract its implementation supplies
      through ``parallel_contract()`` (``BLOCKS``, ``TENSOR_PARALLEL``,
      ``SEQUENCE_PARALLEL``, ``PIPELINE``, ``OUTPUT_HEAD`` from :mod:`forge_core.api`); a
      strategy that ``requires`` one it lacks is refused, and so are
      ``parallel.options.tp.sequence_parallel`` without ``SEQUENCE_PARALLEL`` and
      ``train.loss.name: chunked`` without ``OUTPUT_HEAD``.
    - ``facts``: a torch-free function of the structured options returning
      :class:`~forge_core.api.ModelFacts` (layers, heads, kv heads, tied embeddings),
      which the parallelism rules read whatever the options are called; ``None`` when
      the model declares none (a strategy whose rules need them is then refused).
    - ``resolve_options``: optionally a torch-free ``"package.module:function"``,
      ``resolve(options) -> options``, that the config loader applies to the structured
      model options before any rule, ``facts`` or build sees them: it fills options the
      config left unset (for example from a checkpoint's ``config.json``). It must not
      raise for a missing or broken file: the model's rules report that.
    - ``pretrained_option``: optionally the option that points at pretrained weights.
      A model whose weights come from there may be built on the meta device; the trainer
      materialises it after sharding (:class:`ParallelismSpec` ``handles_meta_device``):
      ``module.to_empty(device=...)`` then ``module.init_weights()``, which must fill
      every parameter and buffer of the module as this process holds it. Commands that
      restore a Forge checkpoint instead (``export-hf``, ``sample``) clear the option
      (set it to ``""``), so they need neither the pretrained files nor the time to
      read them.
    - ``pretrained_folder``: optionally a torch-free ``"package.module:function"``,
      ``folder(options) -> str``, the local path of the pretrained weights when the
      option's value may name them otherwise (a Hub id: its cached snapshot); the
      identity of a base under adapters is taken from that folder's files. Without it
      the option's value is the path.
    """

    kind: ClassVar[str] = "model"
    max_seq_len_option: str | None = "max_seq_len"
    accepts: frozenset[str] = attrs.field(default=frozenset(), converter=frozenset)
    hf_export: str | None = None
    hf_key: str | None = None
    supports: frozenset[str] = attrs.field(default=frozenset(), converter=frozenset)
    facts: Callable[[Any], Any] | None = None
    resolve_options: str | None = None
    pretrained_option: str | None = None
    pretrained_folder: str | None = None


@attrs.frozen(kw_only=True)
class TransformSpec(ComponentSpec):
    """A model transform (adapters such as LoRA), enabled by listing its name in
    ``model.transforms``: applied to the model right after it is built, before any
    strategy, by training and by ``eval``, ``sample`` and ``export-hf`` alike.

    - ``saves_trainable_only``: checkpoints hold only the parameters that stay trainable
      once the transform is applied (the adapters), not the frozen base: the base comes
      from the model's pretrained weights (its ``pretrained_option``) or from the seed,
      and its identity is recorded in the checkpoint and checked on resume.
    - ``weight_options``: the names of its options that change what its saved parameters
      are or mean (LoRA: ``targets``, ``rank``, ``alpha``; not ``dropout``). Their values
      are recorded in every checkpoint and compared wherever one is loaded into a model
      of this transform (resume, ``model.init_adapters_from``): a difference is refused
      naming each option with both values, instead of adapters dropped or misread.
    """

    kind: ClassVar[str] = "transform"
    saves_trainable_only: bool = False
    weight_options: tuple[str, ...] = ()


@attrs.frozen(kw_only=True)
class SourceSpec(ComponentSpec):
    """A data source: yields documents as text, or as token arrays when ``pretokenized``.

    ``streaming_option``: the name of a boolean field of the source's options that asks
    for the source to be read as a stream (``hf_datasets``: ``streaming``); when it is
    true the run streams the source as under ``data.stream.enabled``."""

    kind: ClassVar[str] = "source"
    pretokenized: bool = False
    streaming_option: str = ""


@attrs.frozen(kw_only=True)
class TokenizerSpec(ComponentSpec):
    """A tokenizer factory."""

    kind: ClassVar[str] = "tokenizer"


@attrs.frozen(kw_only=True)
class OptimizerSpec(ComponentSpec):
    """An optimizer factory."""

    kind: ClassVar[str] = "optimizer"


@attrs.frozen(kw_only=True)
class ScheduleSpec(ComponentSpec):
    """A learning-rate schedule: a pure function of the step."""

    kind: ClassVar[str] = "schedule"


@attrs.frozen(kw_only=True)
class ObjectiveSpec(ComponentSpec):
    """A training objective: what a step minimises and what its normalizer counts
    (``train.objective``; the built-in ``lm`` is the token cross-entropy).

    - ``needs``: per-token metadata the objective reads from the batch (``doc_ids``): the
      chosen packer must emit it.
    - ``batch_keys``: keys of the batch the objective reads that the model must NOT
      receive (kept out of the forward's keyword arguments).
    - ``metrics``: the names of the metrics it adds to every step (and, prefixed
      ``eval/``, to every evaluation), each a mean over what ``count`` counts.
    - ``unit``: what ``count`` counts, plural (``tokens``, ``pairs``): the evaluation
      reports it as ``eval/<unit>``.
    - ``per_token``: it is the token cross-entropy (its evaluation has a perplexity).
    - ``pipeline``: it can run on the last pipeline stage, which sees only the output
      and the labels of each microbatch: there ``loss`` is called with a batch of
      ``labels`` alone and no reference, and its metrics are not reported.
    - ``hidden_states``: it can take the hidden states the chunked loss hands over
      (``train.loss.name: chunked``) instead of the logits.
    - ``token_split``: it is a sum over tokens, so a strategy that splits each row's
      tokens over processes (context parallelism) computes it in shares.
    The rules refuse a config whose layout the objective cannot run under.
    """

    kind: ClassVar[str] = "objective"
    needs: frozenset[str] = attrs.field(default=frozenset(), converter=frozenset)
    batch_keys: frozenset[str] = attrs.field(default=frozenset(), converter=frozenset)
    metrics: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    unit: str = "tokens"
    per_token: bool = False
    pipeline: bool = False
    hidden_states: bool = False
    token_split: bool = False


@attrs.frozen(kw_only=True)
class LoggerSpec(ComponentSpec):
    """A logger: its implementation is a class whose instances implement lifecycle hooks."""

    kind: ClassVar[str] = "logger"
