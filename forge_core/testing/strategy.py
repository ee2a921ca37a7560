"""The strategy check of the conformance kit: :func:`check_strategy` proves, in one
process, what a parallelism strategy must keep whatever its degree, at degree 1.

A strategy that breaks its contract usually shows it only in a multi-process run, well
into start-up, or never (a checkpoint that no longer loads, a loss a little off). Much
of the contract holds at degree 1 already, where the strategy must change nothing the
model computes. So the check starts a one-rank ``gloo`` group in the test's own process
(unless one exists), builds a device mesh with every declared dimension of size 1 (in
the registry's mesh order, the strategy's own dimension included), and checks, each
failure an ``AssertionError`` naming the strategy and what to fix:

- **declaration**: the strategy's :class:`~forge_core.api.MeshDim`, if it declares one,
  holds beside every registered strategy's (no name or place taken, one dimension at
  most filling the world, ``shards_with`` naming a declared dimension, a default its
  own degree check accepts), as :func:`forge_core.parallel_dims.mesh_dims` judges it;
- **options**: its options class structures an empty block into its defaults (what a
  config that names no option gets);
- **impl**: ``impl`` loads, ``impl(options)`` builds, and the result has ``apply``;
  ``attention`` (its attention wrapper), when declared, loads;
- **attention**: the model built with the backend its wrapper returns, given an
  :class:`~forge_core.api.AttentionContext` of size 1, computes what the model built
  with the bare backend computes (float64);
- **names**: after ``apply`` (through the kernel's own ``parallelize``, as a run
  applies it), the model parts hold every parameter under the name it had, and no
  other: checkpoints are keyed by these names;
- **batch_transform**: every batch transform it registers returns every key it was
  given, and at degree 1 the model computes the same loss on what it returns;
- **forward**, **gradients**, **evaluate**: one training micro-step and one evaluation
  through the strategy give the loss, the logits (where the strategy leaves a module to
  call; a pipeline does not) and every parameter's gradient (float64) that the model
  gives alone, on packed rows (``doc_ids``, ``positions``) and on plain rows.

A strategy that requires what the model does not supply (``ParallelismSpec.requires``
against ``ModelSpec.supports``) cannot be applied to it: the checks that apply it are
reported as skipped, with that reason, in the returned :class:`StrategyReport`.
"""

from __future__ import annotations

import types
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor

from forge_core.api import (
    DOC_IDS,
    IGNORE_INDEX,
    INPUT_IDS,
    LABELS,
    POSITIONS,
    ActiveStrategy,
    ForgeError,
    ParallelismSpec,
    Plan,
    hookimpl,
    import_path,
)
from forge_core.testing.attention import packed_metadata
from forge_core.testing.isolation import DEFAULT_ROWS
from forge_core.testing.optimizer import one_process_group
from forge_core.testing.resolve import structure_options
from forge_core.testing.tolerance import assert_within_rounding, longest_sum

if TYPE_CHECKING:
    from forge_core.registry import Registries

CHECKS = (
    "declaration",
    "options",
    "impl",
    "attention",
    "names",
    "batch_transform",
    "forward",
    "gradients",
    "evaluate",
)
#: The checks that apply the strategy to a model (skipped together when it cannot be).
APPLIED = CHECKS[3:]

#: The model the check applies strategies to unless told otherwise: the built-in llama,
#: small enough for a test, with grouped-query heads.
TINY_LLAMA = {"dim": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "ffn_hidden": 48, "max_seq_len": 32}

#: The plugin name under which a spec given to the check (not registered) is registered.
KIT_PLUGIN = "conformance_kit_strategy"


@attrs.frozen
class StrategyReport:
    """What :func:`check_strategy` checked: ``checked`` (names from :data:`CHECKS`),
    ``skipped`` (name -> why), ``worst`` (per check, the largest ratio of a difference to
    its float64 rounding tolerance, below 1), ``dims`` (the mesh it was applied on, in
    order, every dimension of size 1)."""

    checked: tuple[str, ...]
    skipped: dict[str, str]
    worst: dict[str, float]
    dims: tuple[str, ...]


def _registries(strategy: Any, extra_plugins: tuple) -> tuple[Any, ParallelismSpec, str]:
    """The registries with the strategy in them, its spec and its plugin's name."""
    from forge_core.registry import load_registries

    registries = load_registries(extra=extra_plugins)
    registry = registries["parallelism"]
    if isinstance(strategy, str):
        try:
            return registries, registry.get(strategy), registry.plugin_of(strategy)
        except ForgeError as error:
            raise ValueError(str(error)) from None
    if not isinstance(strategy, ParallelismSpec):
        raise ValueError(
            f"check_strategy takes a registered strategy's name or a ParallelismSpec, got {strategy!r}"
        )
    if strategy.name in registry and registry.get(strategy.name) == strategy:
        return registries, strategy, registry.plugin_of(strategy.name)
    # Registered for the check beside the installed plugins; preferred over a
    # registered strategy of the same name (an author's new version of it).
    plugin = types.SimpleNamespace(forge_parallelisms=hookimpl(lambda: [strategy]))
    prefer = {"parallelism": {strategy.name: KIT_PLUGIN}} if strategy.name in registry else None
    registries = load_registries(extra=(*extra_plugins, (KIT_PLUGIN, plugin)), prefer=prefer)
    return registries, strategy, KIT_PLUGIN


def _declaration(spec: ParallelismSpec, registry: Any, label: str) -> tuple[Any, ...]:
    from forge_core.config.blocks import degree_problem
    from forge_core.parallel_dims import mesh_dims

    try:
        dims = mesh_dims(registry)
    except ForgeError as error:
        raise AssertionError(
            f"{label}: its mesh dimension cannot be declared beside those of the registered "
            f"strategies: {error}. Fix the declaration (ParallelismSpec.dim = MeshDim(name, place, "
            "...)): a degree key and a place in the mesh order of its own"
        ) from None
    dim = spec.dim
    if dim is not None:
        problem = degree_problem(dim.default, dim)
        if problem:
            raise AssertionError(
                f"{label}: its mesh dimension {dim.name!r} declares default={dim.default!r}, which its own "
                f"degree check refuses ({problem}): a config that gives no parallel.{dim.name} would not "
                "load. Declare a default of 1 (or -1 with fills_world=True)"
            )
    return dims


def _options(spec: ParallelismSpec, options: Any, label: str) -> Any:
    from forge_core.config.structuring import structure

    where = f"$.parallel.options.{spec.name}"
    try:
        _, issues = structure({}, spec.options, where)
    except Exception as error:
        issues = [(where, f"{type(error).__name__}: {error}")]
    if issues:
        shown = "; ".join(f"{path}: {message}" for path, message in issues)
        raise AssertionError(
            f"{label}: its options class {spec.options.__name__} does not structure an empty block "
            f"({shown}): a config that names none of its options would not load. Give every option a "
            "default (forge_core.api.option(default, doc))"
        )
    return structure_options(spec, options)


def _impl(spec: ParallelismSpec, options: Any, label: str) -> None:
    try:
        impl = spec.load()(options)
    except Exception as error:
        raise AssertionError(
            f"{label}: its impl {spec.impl!r} cannot be loaded and built as impl(options): "
            f"{type(error).__name__}: {error}"
        ) from error
    if not callable(getattr(impl, "apply", None)):
        raise AssertionError(
            f"{label}: {spec.impl!r}(options) has no apply(model, ctx): a strategy returns the module to "
            "use in place of the model (or a ModelSplit)"
        )
    if spec.attention is not None:
        try:
            wrap = import_path(spec.attention)
        except Exception as error:
            raise AssertionError(
                f"{label}: its attention wrapper {spec.attention!r} (ParallelismSpec.attention) cannot be "
                f"loaded: {type(error).__name__}: {error}"
            ) from error
        if not callable(wrap):
            raise AssertionError(
                f"{label}: its attention wrapper {spec.attention!r} is not callable as wrap(backend, ctx)"
            )


def _plan(
    registries: Registries, spec: ParallelismSpec, options: Any, plugin: str, model: str, model_options: Any
) -> Plan:
    from forge_core.config.loader import structure_config
    from forge_core.parallel_dims import mesh_dims
    from forge_core.plan import make_plan

    dims = mesh_dims(registries["parallelism"])
    seq_len = sum(DEFAULT_ROWS[0])
    raw = {
        "model": {"name": model, "options": model_options},
        "data": {"seq_len": seq_len},
        "parallel": {d.name: 1 for d in dims},
    }
    try:
        config = structure_config(raw, lambda plugins: registries)
    except ForgeError as error:
        raise ValueError(
            f"check_strategy: the model {model!r} with options {model_options!r}: {error}"
        ) from None
    plan = make_plan(config, registries, 1)
    return attrs.evolve(plan, strategies=(ActiveStrategy(spec, options, plugin),))


def _batches(vocab: int, seed: int) -> list[tuple[str, dict[str, torch.Tensor]]]:
    doc_ids, positions = packed_metadata(DEFAULT_ROWS)
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, doc_ids.shape, generator=gen)
    labels = torch.randint(0, vocab, doc_ids.shape, generator=gen)
    labels[positions == 0] = IGNORE_INDEX  # some tokens without a label, as packers give them
    return [
        ("packed rows", {INPUT_IDS: ids, LABELS: labels, DOC_IDS: doc_ids, POSITIONS: positions}),
        ("plain rows", {INPUT_IDS: ids, LABELS: labels}),
    ]


def _loss(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    from forge_core.train.loss import loss_fn

    inputs = {k: v for k, v in batch.items() if k != LABELS}
    return loss_fn(model(**inputs), batch[LABELS])


def _grads(named: Iterable[tuple[str, torch.nn.Parameter]]) -> dict[str, torch.Tensor]:
    out = {}
    for name, param in named:
        if param.grad is not None:
            out[name] = param.grad.full_tensor() if isinstance(param.grad, DTensor) else param.grad
    return out


def _clear(named: Iterable[tuple[str, torch.nn.Parameter]]) -> None:
    for _, param in named:
        param.grad = None


def check_strategy(
    strategy: Any,
    *,
    options: Any = None,
    model: str = "llama",
    model_options: Any = None,
    seed: int = 0,
    extra_plugins: Sequence[tuple[str, Any]] = (),
) -> StrategyReport:
    """Check a parallelism strategy at degree 1 in one process (module docstring); raise
    AssertionError naming the strategy and what is wrong.

    ``strategy`` is a registered name or a :class:`~forge_core.api.ParallelismSpec`
    (registered for the check beside the installed plugins, in place of a registered
    strategy of the same name); ``options`` a mapping (structured against its options
    class), an options instance, or ``None`` (the defaults). ``model`` is the registered
    model it is applied to (``extra_plugins`` may register it) with ``model_options``
    (default: :data:`TINY_LLAMA` for the built-in llama; keep the model small)."""
    extra_plugins = tuple(extra_plugins)
    registries, spec, plugin = _registries(strategy, extra_plugins)
    label = f"strategy {spec.name!r}" + ("" if plugin == KIT_PLUGIN else f" (plugin {plugin!r})")
    checked: list[str] = []
    worst: dict[str, float] = {}
    dims = _declaration(spec, registries["parallelism"], label)
    checked.append("declaration")
    structured = _options(spec, options, label)
    checked.append("options")
    _impl(spec, structured, label)
    checked.append("impl")
    names = tuple(d.name for d in dims)
    if model_options is None:
        model_options = TINY_LLAMA if model == "llama" else {}
    try:
        model_spec = registries["model"].get(model)
    except ForgeError as error:
        raise ValueError(f"check_strategy(model=...): {error}") from None
    missing = sorted(set(spec.requires) - set(model_spec.supports))
    if missing:
        why = f"the model {model!r} does not supply {missing}, which the strategy requires"
        return StrategyReport(tuple(checked), dict.fromkeys(APPLIED, why), worst, names)
    plan = _plan(registries, spec, structured, plugin, model, model_options)
    with one_process_group():
        mesh = init_device_mesh("cpu", (1,) * len(dims), mesh_dim_names=names)
        worst.update(_apply(plan, registries, mesh, spec, label, seed, checked))
    return StrategyReport(tuple(checked), {}, worst, names)


@attrs.define
class _Degree1:
    """What the checks at degree 1 share: the plan and its mesh, the model alone in
    float64 (the reference), the batches, and the worst deviation seen per check."""

    plan: Plan
    registries: Registries
    mesh: Any
    label: str
    seed: int
    vocab: int
    alone: Any
    batches: list[tuple[str, dict[str, torch.Tensor]]]
    terms: int
    worst: dict[str, float] = attrs.field(factory=dict)

    def close(self, got: Any, want: Any, what: str, check: str) -> None:
        self.worst[check] = max(
            self.worst.get(check, 0.0),
            assert_within_rounding(
                got, want, dtype=torch.float64, terms=self.terms, what=f"{self.label}: {what}"
            ),
        )


def _apply(
    plan: Plan,
    registries: Registries,
    mesh: Any,
    spec: ParallelismSpec,
    label: str,
    seed: int,
    checked: list[str],
) -> dict[str, float]:
    from forge_core import components

    backend = components.attention(plan, registries)
    vocab = 61  # small, and not a power of two: a shape mix-up shows
    torch.manual_seed(seed)
    alone = components.model(plan, registries, vocab, backend).double()
    terms = longest_sum(alone, sum(DEFAULT_ROWS[0])) * len(DEFAULT_ROWS)
    run = _Degree1(plan, registries, mesh, label, seed, vocab, alone, _batches(vocab, seed), terms)
    model = _check_attention_wrapper(run, spec, backend, checked)
    pmodel, trained = _check_names(run, model, checked)
    _check_batch_transforms(run, pmodel, checked)
    for where, batch in run.batches:
        _check_micro_step(run, pmodel, trained, where, batch)
    checked += ["forward", "gradients", "evaluate"]
    return run.worst


def _check_attention_wrapper(run: _Degree1, spec: ParallelismSpec, backend: Any, checked: list[str]) -> Any:
    """attention: the wrapped backend computes what the bare one does (size 1). Returns
    the model built with the wrapped backend, the one the strategy is applied to."""
    from forge_core import components
    from forge_core.distributed.parallelize import wrap_attention

    try:
        wrapped = wrap_attention(backend, run.plan, run.mesh)
    except ForgeError as error:
        raise AssertionError(f"{run.label}: {error}") from error
    torch.manual_seed(run.seed)
    model = components.model(run.plan, run.registries, run.vocab, wrapped).double()
    if spec.attention is not None:
        for where, batch in run.batches:
            with torch.no_grad():
                got, want = _loss(model, batch)[0], _loss(run.alone, batch)[0]
            run.close(
                got,
                want,
                f"its attention wrapper {spec.attention!r}, given an AttentionContext of size 1, changes "
                f"the loss on {where}: with one rank in its group it must attend exactly as the backend "
                "it wraps",
                "attention",
            )
        checked.append("attention")
    return model


def _check_names(run: _Degree1, model: Any, checked: list[str]) -> tuple[Any, list[tuple[str, Any]]]:
    """names: the parts keep every parameter's name. Returns the parallel model and its
    parameters as the optimizer gets them."""
    from forge_core.distributed.parallelize import parallelize
    from forge_core.train.loss import loss_fn

    before = [name for name, _ in run.alone.named_parameters()]
    try:
        pmodel = parallelize(model, run.plan, torch.device("cpu"), loss_fn=loss_fn, mesh=run.mesh)
    except Exception as error:
        raise AssertionError(
            f"{run.label}: applying it at degree 1 in one process (every mesh dimension of size 1) raised "
            f"{type(error).__name__}: {error}"
        ) from error
    # The parameters as the optimizer gets them, now: FSDP registers unsharded ones on a
    # module between its forward and its backward.
    trained = [(name, p) for part in pmodel.parts for name, p in part.named_parameters()]
    after = [name for name, _ in trained]
    lost, new = sorted(set(before) - set(after)), sorted(set(after) - set(before))
    if lost or new:
        raise AssertionError(
            f"{run.label}: after apply the model parts name their parameters differently: lost {lost[:6]}, "
            f"new {new[:6]}. Checkpoints are keyed by parameter names, so a checkpoint written with the "
            "strategy would not load without it, nor the reverse. Change modules in place, or wrap the "
            "module that is called (the part keeps its names) rather than the part"
        )
    checked.append("names")
    return pmodel, trained


def _check_batch_transforms(run: _Degree1, pmodel: Any, checked: list[str]) -> None:
    """batch_transform: every key kept, and the same loss at degree 1."""
    if not pmodel.batch_transforms:
        return
    for where, batch in run.batches:
        out = _transformed(run.label, pmodel.batch_transforms, where, batch)
        with torch.no_grad():
            got, want = _loss(run.alone, out)[0], _loss(run.alone, batch)[0]
        run.close(
            got,
            want,
            f"its batch transform(s), at degree 1, change the loss of the model on {where}: with one "
            "rank along its dimension a transform must keep every token, its label and its metadata",
            "batch_transform",
        )
    checked.append("batch_transform")


def _transformed(label: str, transforms: list[Any], where: str, batch: dict[str, Any]) -> dict[str, Any]:
    """``batch`` through every transform in turn, each of which must return every key."""
    out = batch
    for n, transform in enumerate(transforms):
        given = out
        try:
            out = transform(dict(given))
        except Exception as error:
            raise AssertionError(
                f"{label}: its batch transform #{n} (batch_transform(ctx)) raised "
                f"{type(error).__name__}: {error} on {where} ({sorted(given)}) at degree 1"
            ) from error
        dropped = sorted(set(given) - set(out))
        if dropped:
            raise AssertionError(
                f"{label}: its batch transform #{n} (batch_transform(ctx)) dropped {dropped} of "
                f"{sorted(given)} on {where}: every key it is given must come back (sharded or "
                "whole), or the model and the loss lose it (doc_ids: packed documents would attend "
                "to each other)"
            )
    return out


def _check_micro_step(
    run: _Degree1, pmodel: Any, trained: list[tuple[str, Any]], where: str, batch: dict[str, Any]
) -> None:
    """forward, gradients, evaluate: the strategy's micro-step is the model's alone."""
    _clear(run.alone.named_parameters())
    want_sum, tokens = _loss(run.alone, batch)
    (want_sum / tokens).backward()
    want_grads = _grads(run.alone.named_parameters())
    _clear(trained)
    got_sum, got_tokens = pmodel.forward_backward(dict(batch), None, tokens)
    pmodel.finish_gradients()
    if int(got_tokens) != int(tokens):
        raise AssertionError(
            f"{run.label}: a training micro-step on {where} counted {int(got_tokens)} labelled tokens, the "
            f"model alone {int(tokens)}"
        )
    run.close(
        got_sum, want_sum.detach(), f"the training loss on {where} differs from the model's alone", "forward"
    )
    if pmodel.forward is not None:
        # The logits too: a change the loss cannot see (a constant added to every
        # logit of a token) would still change what the model generates.
        inputs = {k: v for k, v in pmodel.transform(dict(batch)).items() if k != LABELS}
        with torch.no_grad():
            got, want = pmodel.forward(**inputs), run.alone(**inputs)
        run.close(got, want, f"the logits on {where} differ from the model's alone", "forward")
    _check_gradients(run, _grads(trained), want_grads, where)
    with torch.no_grad():
        eval_sum, _ = pmodel.evaluate(dict(batch))
    run.close(
        eval_sum,
        want_sum.detach(),
        f"the evaluation loss on {where} differs from the model's alone",
        "evaluate",
    )


def _check_gradients(
    run: _Degree1, got_grads: dict[str, Any], want_grads: dict[str, Any], where: str
) -> None:
    missing = sorted(set(want_grads) - set(got_grads))
    if missing:
        raise AssertionError(f"{run.label}: after a micro-step on {where}, {missing[:6]} have no gradient")
    for name, want in want_grads.items():
        run.close(
            got_grads[name],
            want,
            f"the gradient of {name!r} after a micro-step on {where} differs from the model's alone "
            "(the gradient convention: each micro-step back-propagates loss_sum / global_tokens, and "
            "strategies sum gradients, never average them)",
            "gradients",
        )
