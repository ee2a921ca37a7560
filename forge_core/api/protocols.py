"""The shape of each kind of implementation, stated in code.

Each ``Protocol`` says what the object a spec's ``impl`` builds must offer, as the hook
reference (:mod:`forge_core.hookspecs`) documents it; the conformance kit checks the
behaviour behind it. They are ``runtime_checkable``, so ``isinstance(obj, Packer)``
tells whether the methods are there (not whether they are right). Torch-free: tensors
and modules appear as ``Any``.

What a kind of component may offer beyond what it must is stated here too, one
protocol per optional capability (:class:`PairCountingBackend`,
:class:`BatchTransformingStrategy`, :class:`FingerprintedSource`, ...): the kernel uses a
capability when ``isinstance(obj, ThatProtocol)``, never by probing for a name, and the
conformance kit checks it when it is there.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Iterator
from typing import Any, Protocol, runtime_checkable

from forge_core.api.batch import INPUT_IDS, POSITIONS
from forge_core.api.packing import LazyPacker


@runtime_checkable
class AttentionBackend(Protocol):
    """Built as ``cls(options)``. ``prepare`` runs once per model forward and builds what
    every layer shares (a mask); ``attend`` takes ``q (B, heads, S, head_dim)`` and
    ``k``/``v (B, kv_heads, S, head_dim)`` and returns the shape of ``q``.

    Optional: :class:`PairCountingBackend`, :class:`QueryShardingBackend`."""

    def prepare(self, doc_ids: Any, seq_len: int, device: Any) -> Any: ...

    def attend(self, q: Any, k: Any, v: Any, prepared: Any) -> Any: ...


@runtime_checkable
class PairCountingBackend(Protocol):
    """An attention backend that counts the query-key pairs its mask allows for a batch
    (``doc_ids`` as the model hands them to ``prepare``, or ``None``), which the
    trainer's MFU counts; without it, causal attention within each document when the
    spec ``honours`` ``doc_ids``, over the whole row otherwise."""

    def attended_pairs(self, doc_ids: Any, rows: int, seq_len: int) -> int: ...


@runtime_checkable
class QueryShardingBackend(Protocol):
    """An attention backend that declares :data:`~forge_core.api.QUERY_SHARDS`: the mask
    of a share of a row's queries (at row positions ``query_index``) over every key of
    the row, which context parallelism's all-gather attention hands to ``attend``."""

    def prepare_queries(self, doc_ids: Any, query_index: Any, seq_len: int, device: Any) -> Any: ...


#: A packer: built as ``cls(options, seq_len=..., eos_id=..., pad_id=...)``,
#: ``layout(lengths)`` places the documents into rows
#: (:class:`~forge_core.api.packing.LazyPacker`).
Packer = LazyPacker


@runtime_checkable
class Source(Protocol):
    """Built as ``cls(options)``; yields documents in a deterministic order."""

    def documents(self) -> Iterator[Any]: ...

    def describe(self) -> str: ...

    # Optional: FingerprintedSource, FileFingerprintedSource, TokenDocumentSource,
    # RecordSource below.


@runtime_checkable
class FingerprintedSource(Protocol):
    """A source whose ``fingerprint()`` is a non-empty string that changes whenever its
    documents could (:func:`~forge_core.api.files_fingerprint` for a source that reads
    files); the token cache is keyed by it. Without it, every document is hashed."""

    def fingerprint(self) -> str: ...


@runtime_checkable
class FileFingerprintedSource(Protocol):
    """A source that names the files it reads (a :class:`~forge_core.api.FileSet`): the
    token cache hashes each file once and checks it by stat at later starts."""

    def fingerprint_files(self) -> Any: ...


@runtime_checkable
class TokenDocumentSource(Protocol):
    """A source of a token format: ``token_documents(eos_id)`` returns a
    :class:`~forge_core.api.TokenDocuments`, read in place without the token cache."""

    def token_documents(self, eos_id: int) -> Any: ...


@runtime_checkable
class RecordSource(Protocol):
    """A source that yields its records as mappings (``records()``), as chat data
    (``data.chat.format``) needs them, beside its documents."""

    def records(self) -> Iterator[Any]: ...


@runtime_checkable
class Tokenizer(Protocol):
    """Built as ``cls(options)``. ``identity`` changes whenever token ids would."""

    vocab_size: int
    eos_id: int
    pad_id: int
    identity: str

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...

    def save(self, directory: str) -> None: ...


@runtime_checkable
class BatchEncodingTokenizer(Protocol):
    """A tokenizer that encodes many texts at once, as the pipeline hands them (one
    sequence of ids per text); without it, ``encode`` is called for each."""

    def encode_batch(self, texts: list[str]) -> list[Any]: ...


@runtime_checkable
class ChatTokenizer(Protocol):
    """A tokenizer that renders a chat record with its template into a
    :class:`~forge_core.api.MaskedDocument` (``data.chat``). Optional beside it:
    ``chat_identity(template) -> str``, what the token cache keys the template by."""

    def encode_chat(
        self, messages: list[dict[str, Any]], *, train_from: int = 0, template: str | None = None
    ) -> Any: ...


@runtime_checkable
class ChatRenderingTokenizer(Protocol):
    """A tokenizer that renders a conversation with its chat template as text
    (``forge-run sample --chat``): ``add_generation_prompt`` appends the header the
    model answers after; ``template`` a file, ``None`` the tokenizer's own."""

    def render_chat(
        self,
        messages: list[dict[str, Any]],
        *,
        add_generation_prompt: bool = False,
        template: str | None = None,
    ) -> str: ...


@runtime_checkable
class SpecialDecodingTokenizer(Protocol):
    """A tokenizer that writes ids out with its special tokens spelled by name
    (``forge-run preview``, ``sample --chat``), where ``decode`` leaves them out."""

    def decode_special(self, ids: Any) -> str: ...


@runtime_checkable
class HFSavingTokenizer(Protocol):
    """A tokenizer that writes itself in Hugging Face form (``export-hf``)."""

    def save_hf(self, directory: str) -> None: ...


@runtime_checkable
class Strategy(Protocol):
    """A parallelism strategy, built as ``cls(options)``. ``apply`` returns the module
    to use in place of ``model`` (often ``model`` itself, changed in place), or a
    :class:`~forge_core.api.parallel.ModelSplit` when it splits the model; it is called
    once per model part (every pipeline stage a process holds).

    Optional (:class:`BatchTransformingStrategy`): ``batch_transform(ctx) -> transform |
    None``, called once after ``apply``
    (whatever the number of parts): ``transform(batch) -> batch`` is applied to every
    batch this process trains or evaluates on, before the model and before a pipeline
    cuts it into microbatches, in the order strategies are applied. ``batch`` maps
    ``input_ids``, ``labels`` and the per-token metadata (``doc_ids``, ``positions``)
    to ``(B, S)`` tensors; a transform may shorten the rows (a context-parallel rank
    keeps its share of every row) or add metadata the model accepts. The labelled
    tokens a step is normalised by are counted before any transform; a strategy whose
    transform splits tokens over its ranks declares it on its dimension
    (:attr:`~forge_core.api.MeshDim.splits_tokens`), so each loss sum is added over them."""

    def apply(self, model: Any, ctx: Any) -> Any: ...


@runtime_checkable
class BatchTransformingStrategy(Protocol):
    """A strategy with a ``batch_transform(ctx)`` (see :class:`Strategy`): a
    ``transform(batch) -> batch`` applied to every batch, or ``None``."""

    def batch_transform(self, ctx: Any) -> Any: ...


@runtime_checkable
class ModelTransform(Protocol):
    """A model transform (adapters), built as ``cls(options)``; see
    :mod:`forge_core.api.transforms`.

    - ``apply(model, ctx)``: change ``model`` in place right after it is built, before
      any strategy (``ctx``: :class:`~forge_core.api.TransformContext`, with the roles
      the model declares). Parameters it adds are created on the device of the weights
      they adapt (the meta device for a model that loads pretrained weights); freezing
      the base is ``requires_grad_(False)``: only parameters that still require a
      gradient reach the optimizer. Modules it adds live inside the blocks they adapt,
      so sharding, pipeline stages, checkpointing and compile take them with the block.
    - ``initialize(module)``: fill the transform's own parameters of ``module`` (the
      model, or a pipeline stage; whole tensors or DTensor shards) from ``ctx.seed`` and
      their names, so that every layout holds the same values.
    - ``detached(module)``: a context manager inside which ``module``'s parameters and
      submodules are the model's own (the transform's taken out); the kernel calls the
      model's ``init_weights`` inside it.
    - ``disabled(module)``: a context manager inside which ``module`` computes as the
      model without the transform (the reference model of preference training).
    - ``merge(module)``: fold the transform into the model's own weights and take its
      parameters out (``export-hf``); called on the whole, unsharded model.
    """

    def apply(self, model: Any, ctx: Any) -> None: ...

    def initialize(self, module: Any) -> None: ...

    def detached(self, module: Any) -> Any: ...

    def disabled(self, module: Any) -> Any: ...

    def merge(self, module: Any) -> None: ...


@runtime_checkable
class AdapterWritingTransform(Protocol):
    """A transform that writes its adapters apart from the model
    (``export-hf --adapter``: a PEFT folder for LoRA)."""

    def write_adapter(self, module: Any, directory: str, hf_key: Any, base: str) -> None: ...


# --- the model contract -----------------------------------------------------------------


@runtime_checkable
class Model(Protocol):
    """What a model's factory returns: a ``torch.nn.Module``, built as ``build(options,
    vocab_size=..., attention=...)`` (the structured ``model.options``, the tokenizer's
    vocabulary size, the constructed attention backend).

    ``forward(input_ids, **metadata)`` returns logits ``(batch, seq, vocab)`` for
    ``input_ids (batch, seq)``. The trainer calls it with keywords: ``input_ids`` and the
    per-token metadata its spec's ``accepts`` lists (``doc_ids``, ``positions``:
    ``(batch, seq)`` integer tensors, present when the packer isolates documents), so
    the forward names each of them (or takes ``**metadata``). ``doc_ids`` go to the
    backend's ``prepare(doc_ids, seq_len, device)``, called once per forward, whose
    result every ``attend(q, k, v, prepared)`` receives; ``positions`` (restarting at
    every document) go to the position encoding. Attention is computed only through
    the backend. The forward also runs without metadata: the trainer's build-time
    forward ``model(torch.zeros(1, 4, dtype=torch.long))`` under ``torch.no_grad()``, on
    a meta-device copy with a probe for a backend, measures the FLOPs.

    The contract grows with what the spec declares (:func:`model_contract_gaps` says
    what a module lacks): :class:`ParallelModule` when ``supports`` names a piece of the
    parallel contract, :class:`PretrainedModel` with a ``pretrained_option``,
    :class:`CachingModel` for a model that decodes with a key/value cache. Optional
    attributes, used when present: ``vocab_size`` (the rows of the output, recorded by
    the run so ``sample`` and ``export-hf`` rebuild a padded vocabulary) and
    ``param_roles() -> dict[str, str]`` (parameter name to role, overriding the weight
    decay decision, see ``forge_optimizers``). ``forge_core.testing.check_model`` checks
    all of this, and the behaviour behind it."""

    def forward(self, input_ids: Any, **metadata: Any) -> Any: ...


@runtime_checkable
class ParallelModule(Protocol):
    """A model that tells the strategies how it is split and sharded:
    ``parallel_contract()`` returns a :class:`~forge_core.api.parallel.ParallelContract`
    (the attribute holding its blocks, its tensor-parallel plan, its pipeline split, its
    output head). Required when the spec's ``supports`` is not empty; the pieces it
    lists are the ones filled in. Strategies know the model only through this."""

    def parallel_contract(self) -> Any: ...


@runtime_checkable
class PretrainedModel(Protocol):
    """A model whose spec has a ``pretrained_option``: it may be built on the meta
    device and is then materialised with ``to_empty(device=...)`` and ``init_weights()``,
    once the strategies that handle the meta device have sharded it. ``init_weights``
    fills every parameter and buffer of the module as this process holds it (DTensor
    shards, a pipeline stage)."""

    def init_weights(self) -> None: ...


@runtime_checkable
class CachingModel(Protocol):
    """A model that decodes with a key/value cache: ``new_cache(batch_size, max_len)``
    returns one, and ``forward(input_ids, cache=cache)`` runs only the new tokens,
    continuing the cached ones and adding them to it. Batched sampling also passes
    ``positions (B, S)`` (each row's own token positions) and ``attention_mask (B, S)``
    (False at left padding: no token may attend to it), so rows of different lengths
    share one cache and each gets the logits it has alone
    (``forge_core.testing.check_cached_decoding`` checks it). ``forge-run sample``
    decodes with it, and re-reads each row's context every token without it."""

    def new_cache(self, batch_size: int, max_len: int) -> Any: ...

    def forward(self, input_ids: Any, cache: Any = None, **metadata: Any) -> Any: ...


@runtime_checkable
class TokenGroupModule(Protocol):
    """A module of the model told, once the strategies are applied, the process group of
    the processes that compute different tokens and the tokens of one optimizer step
    (:mod:`forge_core.train.module_hooks`)."""

    def set_token_group(self, group: Any, step_tokens: int) -> None: ...


@runtime_checkable
class OptimizerStepModule(Protocol):
    """A module of the model called on every process after each optimizer step that
    stepped (a loss-free balancing bias update)."""

    def after_optimizer_step(self) -> None: ...


def _keywords_missing(forward: Any, names: Iterable[str]) -> list[str]:
    """The ``names`` that ``forward`` cannot take as keyword arguments."""
    try:
        parameters = inspect.signature(forward).parameters.values()
    except (TypeError, ValueError):  # no signature to read (a builtin): take it on trust
        return []
    if any(p.kind is p.VAR_KEYWORD for p in parameters):
        return []
    keywords = {p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return sorted(set(names) - keywords)


def model_contract_gaps(module: Any, spec: Any = None) -> list[str]:
    """What ``module`` lacks of the model contract (:class:`Model`, and the protocols its
    ``spec``, a :class:`~forge_core.api.ModelSpec` or ``None``, calls for), one sentence
    each; ``[]`` when nothing is missing. Checks that the methods are there and that
    ``forward`` takes the keywords the trainer passes, not what they compute."""
    accepts = sorted(getattr(spec, "accepts", ()) or ())
    gaps = []
    forward = getattr(module, "forward", None)
    if not callable(forward):
        return ["it has no forward(input_ids, **metadata) (the Model protocol)"]
    missing = _keywords_missing(forward, [INPUT_IDS, *accepts])
    if missing:
        gaps.append(
            f"forward{inspect.signature(forward)} does not take {', '.join(missing)} as keyword argument(s), "
            f"which the trainer passes (forward(input_ids=..., **metadata), the metadata being the spec's "
            f"accepts: {accepts or 'none'})"
        )
    if getattr(spec, "supports", None) and not isinstance(module, ParallelModule):
        gaps.append(
            f"its spec declares supports {sorted(spec.supports)} but it has no parallel_contract() "
            "(the ParallelModule protocol)"
        )
    if getattr(spec, "pretrained_option", None) and not isinstance(module, PretrainedModel):
        gaps.append(
            f"its spec has pretrained_option {spec.pretrained_option!r}, so it may be built on the meta "
            "device, but it has no init_weights() to fill it (the PretrainedModel protocol)"
        )
    missing = _keywords_missing(forward, ["cache", POSITIONS, "attention_mask"])
    if isinstance(module, CachingModel) and missing:
        gaps.append(
            f"it has new_cache() but its forward takes no {', '.join(missing)} keyword, which batched "
            "sampling passes (the CachingModel protocol)"
        )
    return gaps
