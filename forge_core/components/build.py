"""Build components from a resolved config through the registries only.

Shared by the trainer, ``sample``, ``export-hf`` and ``prepare``: each function takes the
judged :class:`~forge_core.api.Plan` (the chosen spec of each kind, ``plan.specs``, and
the resolved config their options come from) and the registries (which plugin
registered what, for messages; the loggers), and returns the constructed
implementation, exactly as the hook docstrings in :mod:`forge_core.hookspecs` define
their construction.

This is the boundary between the kernel and plugin code: an exception raised while a
component's implementation is imported or constructed becomes a
:class:`~forge_core.errors.ComponentError` naming the component, the plugin that
registered it and the original error (a ForgeError from the plugin passes unchanged).
:mod:`forge_core.components.blame` names the component whose code raised an exception
later, while it was used: every object built here is remembered for it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from forge_core.api import ForgeError, Plan, import_path
from forge_core.components.blame import describe, original_error, remember
from forge_core.errors import TRACEBACK_ENV, ComponentError

if TYPE_CHECKING:
    from forge_core.registry import Registries


def _build(
    plan: Plan, registries: Registries, kind: str, make: Callable[[Any], Any], spec: Any = None
) -> Any:
    """``make(implementation)`` of the plan's chosen ``kind`` (or of ``spec``), with plugin
    failures turned into ComponentError."""
    spec = plan.specs[kind] if spec is None else spec
    what = describe(registries, kind, spec.name)
    try:
        impl = spec.load()
    except Exception as exc:
        raise ComponentError(
            f"{what}: cannot import its implementation {spec.impl!r}: {original_error(exc)}. "
            f"Install what it needs, or choose another {registries[kind].kind.label}."
        ) from exc
    try:
        built = make(impl)
    except ForgeError:
        raise
    except Exception as exc:
        raise ComponentError(
            f"building {what} failed: {original_error(exc)}. The cause is in its options, the "
            f"files they name, or the plugin itself ({TRACEBACK_ENV}=1 shows where it was raised)."
        ) from exc
    remember(built, what)  # its methods' failures name it later, wherever its code lives
    return built


def tokenizer(plan: Plan, registries: Registries) -> Any:
    config = plan.config
    return _build(plan, registries, "tokenizer", lambda cls: cls(config.data.tokenizer_options))


def saved_tokenizer(plan: Plan, registries: Registries, directory: Path) -> Any:
    """The tokenizer of a finished run: a tokenizer class with a ``load(directory)``
    classmethod is loaded from what it saved; otherwise it is built from the config,
    and, when that fails and its options have a ``path``, from the saved directory."""
    options = plan.config.data.tokenizer_options

    def make(cls: Any) -> Any:
        if directory.is_dir() and callable(getattr(cls, "load", None)):
            return cls.load(str(directory))
        try:
            return cls(options)
        except Exception:
            if directory.is_dir() and attrs.has(type(options)) and hasattr(options, "path"):
                return cls(attrs.evolve(options, path=str(directory)))
            raise

    return _build(plan, registries, "tokenizer", make)


def source(plan: Plan, registries: Registries, index: int = 0) -> Any:
    """The ``index``-th source the run reads (``plan.sources``, in config order: the one
    of ``data.source``, or each entry of a ``data.sources`` mixture)."""
    return chosen_source(plan, registries, plan.sources[index])


def chosen_source(plan: Plan, registries: Registries, chosen: Any) -> Any:
    """The source of a :class:`~forge_core.api.ChosenSource` (one of ``plan.sources``, or
    ``plan.eval_source``), constructed."""
    return _build(plan, registries, "source", lambda cls: cls(chosen.options), spec=chosen.spec)


def packer(plan: Plan, registries: Registries, tok: Any) -> Any:
    data = plan.config.data
    eos_id, pad_id = int(tok.eos_id), int(tok.pad_id)
    return _build(
        plan,
        registries,
        "packer",
        lambda cls: cls(data.packer_options, seq_len=data.seq_len, eos_id=eos_id, pad_id=pad_id),
    )


def attention(plan: Plan, registries: Registries) -> Any:
    return _build(plan, registries, "attention", lambda cls: cls(plan.config.attention.options))


def without_pretrained(plan: Plan) -> Any:
    """``plan`` with the model's pretrained option cleared (``ModelSpec.pretrained_option``):
    for commands whose weights come from a Forge checkpoint instead. Kept when a
    transform's checkpoints hold only its own parameters
    (``TransformSpec.saves_trainable_only``): the base weights come from there."""
    name = plan.specs["model"].pretrained_option
    config = plan.config
    options = config.model.options
    if not name or not getattr(options, name, None) or saves_trainable_only(plan):
        return plan
    options = attrs.evolve(options, **{name: ""})
    return attrs.evolve(plan, config=attrs.evolve(config, model=attrs.evolve(config.model, options=options)))


def saves_trainable_only(plan: Plan) -> bool:
    """Whether the run's checkpoints hold only the trainable parameters (a transform's
    ``saves_trainable_only``): the base weights then come from elsewhere."""
    return any(t.spec.saves_trainable_only for t in plan.transforms)


def pretrained_source(plan: Plan) -> str:
    """The model's pretrained option's value (``ModelSpec.pretrained_option``), or ``""``."""
    name = plan.specs["model"].pretrained_option
    return str(getattr(plan.config.model.options, name, "") or "") if name else ""


def pretrained_path(plan: Plan) -> str:
    """The local path of the model's pretrained weights: what the spec's
    ``pretrained_folder`` makes of the option (a Hub id's cached snapshot), else the
    option's value; ``""`` without pretrained weights."""
    spec = plan.specs["model"]
    source = pretrained_source(plan)
    if not source or not spec.pretrained_folder:
        return source
    return str(import_path(spec.pretrained_folder)(plan.config.model.options))


def base_from_seed(plan: Plan) -> bool:
    """Whether the base weights of a run whose checkpoints hold only the trainable
    parameters come from ``run.seed`` (no pretrained weights): the model is then built
    under that seed."""
    return saves_trainable_only(plan) and not pretrained_source(plan)


def model(plan: Plan, registries: Registries, vocab_size: int, attention_backend: Any) -> Any:
    """The model of the plan with its transforms applied (``model.transforms``): the one
    place every command builds a model through, so training, ``eval``, ``sample`` and
    ``export-hf`` see the same module."""
    from forge_core.components.transforms import apply_transforms

    options = plan.config.model.options

    def make(build: Callable[..., Any]) -> Any:
        return build(options, vocab_size=vocab_size, attention=attention_backend)

    if base_from_seed(plan):
        # The checkpoints will not hold this base: it must come out of the seed alone,
        # in every command and every process, whatever used the generator before.
        import torch

        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(plan.config.run.seed)
            built = _build(plan, registries, "model", make)
    else:
        built = _build(plan, registries, "model", make)
    impls = [
        _build(plan, registries, "transform", lambda cls, c=chosen: cls(c.options), spec=chosen.spec)
        for chosen in plan.transforms
    ]
    return apply_transforms(plan, registries, built, impls)


#: The first parameter of an optimizer factory under the current contract.
NAMED_PARAMS = "named_params"


def _takes_named_params(build: Callable[..., Any]) -> bool:
    try:
        parameters = inspect.signature(build).parameters
    except (TypeError, ValueError):  # a builtin or C callable: assume the current contract
        return True
    if NAMED_PARAMS in parameters:
        return True
    # Only keywords (``build(**kwargs)``) can take the new call; anything else is older.
    kinds = {p.kind for p in parameters.values()}
    positional = {
        inspect.Parameter.POSITIONAL_ONLY,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
        inspect.Parameter.VAR_POSITIONAL,
    }
    return inspect.Parameter.VAR_KEYWORD in kinds and not kinds & positional


def optimizer(plan: Plan, registries: Registries, module: Any) -> Any:
    """The optimizer of ``module`` (one model part): its factory is called as
    ``build(named_params=[NamedParameter, ...], lr=..., options=...)``. A factory that
    cannot take that call (a first positional parameter of another name, as in Forge's
    previews) is refused, naming the call it must accept."""
    from forge_core.components.named_params import named_parameters

    named = named_parameters(module)
    name = plan.config.train.optimizer
    train = plan.config.train

    def make(build: Callable[..., Any]) -> Any:
        if not _takes_named_params(build):
            raise ComponentError(
                f"{describe(registries, 'optimizer', name)}: its factory {build.__qualname__}(...) cannot "
                f"take Forge's call build({NAMED_PARAMS}=..., lr=..., options=...), which passes a list of "
                f"NamedParameter (name, param, role; see the forge_optimizers hook) so that a factory can "
                f"keep weight decay off biases, norms and embeddings. Rename its first parameter to "
                f"{NAMED_PARAMS!r} and read .param from each."
            )
        return build(named_params=named, lr=train.lr, options=train.optimizer_options)

    return _build(plan, registries, "optimizer", make)


def schedule(plan: Plan, registries: Registries, total_steps: int) -> Any:
    """``factor(step)``: the multiplier on ``train.lr`` at 0-based ``step`` of a schedule
    spanning ``total_steps``; past its end, its final value (the function is never asked
    about a step at or beyond ``total_steps``)."""
    fn = _build(plan, registries, "schedule", lambda fn: fn)
    train = plan.config.train
    last = max(0, total_steps - 1)
    return lambda step: float(fn(min(step, last), total_steps, train.warmup_steps, train.schedule_options))


def objective(plan: Plan, registries: Registries, token_loss: Callable[..., Any]) -> Any:
    """The training objective ``train.objective`` names, given the run's token loss."""
    options = plan.config.train.objective_options
    return _build(plan, registries, "objective", lambda cls: cls(options, token_loss=token_loss))


def loggers(plan: Plan, registries: Registries) -> list[tuple[str, Any]]:
    """``(name, instance)`` for every logger in ``logging.loggers``."""
    from forge_core.plan import component_options

    out = []
    for name in plan.config.logging.loggers:
        spec = registries["logger"].get(name)
        options = component_options(plan.config, name, registries["logger"])
        out.append((name, _build(plan, registries, "logger", lambda cls: cls(options), spec=spec)))
    return out
