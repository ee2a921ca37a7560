"""The hook reference says what an implementation receives and must return, and says it
truly.

For every hookspec of :mod:`forge_core.hookspecs` (except ``forge_models``, whose
contract the model chapter and its conformance check cover):

- its docstring names what the hook returns: ``Return a list of :class:`~forge_core.api.X```
  for a registration hook annotated ``list[X]``, ``Its return value is ignored`` for a
  lifecycle hook;
- every argument the hook passes is named in its docstring (````run````, ````step````...);
- a registration hook's docstring gives the call its implementation receives
  (``constructed as ``cls(options, seq_len=...)````, ``called as ``build(...)````), and
  that call is the one Forge makes: recording implementations of every kind are built
  through the kernel's own code paths (``forge_core.components``, ``parallelize``,
  the rule engine), and the number of positional arguments and the keyword names they
  received must be those of the documented call.

A new registration hook fails here until it is documented this way and recorded below.
"""

from __future__ import annotations

import ast
import inspect
import re
import types
from typing import Any

import pytest
import torch

from forge_core import docgen
from forge_core.api import (
    AttentionBackendSpec,
    LoggerSpec,
    ObjectiveSpec,
    OptimizerSpec,
    PackerSpec,
    ParallelismSpec,
    Rule,
    ScheduleSpec,
    SourceSpec,
    TokenizerSpec,
    TransformSpec,
    hookimpl,
)

#: Hooks whose contract is documented and checked elsewhere.
EXEMPT = {"forge_models": "the model chapter and check_model cover the model contract"}

#: ``hook name -> (positional arguments, keyword names)`` of each call recorded below.
CALLS: dict[str, tuple[int, frozenset[str]]] = {}


def _record(hook: str, args: tuple, kwargs: dict) -> None:
    CALLS[hook] = (len(args), frozenset(kwargs))


# --- recording implementations (named by import path from the specs below) -----------


class RecordingAttention:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _record("forge_attention_backends", args, kwargs)


class RecordingPacker:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _record("forge_packers", args, kwargs)


class RecordingSource:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _record("forge_sources", args, kwargs)


class RecordingTokenizer:
    vocab_size, eos_id, pad_id, identity = 8, 6, 7, "recording"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _record("forge_tokenizers", args, kwargs)


def recording_optimizer(**kwargs: Any) -> torch.optim.Optimizer:
    _record("forge_optimizers", (), kwargs)
    return torch.optim.SGD([p.param for p in kwargs["named_params"]], lr=kwargs["lr"])


def recording_schedule(*args: Any, **kwargs: Any) -> float:
    _record("forge_schedules", args, kwargs)
    return 1.0


class RecordingObjective:
    needs_reference = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _record("forge_objectives", args, kwargs)


class RecordingLogger:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _record("forge_loggers", args, kwargs)


class RecordingTransform:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _record("forge_transforms", args, kwargs)

    def apply(self, model: Any, ctx: Any) -> None:
        pass

    def initialize(self, module: Any) -> None:
        pass


class RecordingWrapper:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _record("forge_parallelisms", args, kwargs)

    def apply(self, model: Any, ctx: Any) -> Any:
        return model


def recording_check(*args: Any, **kwargs: Any) -> None:
    _record("forge_rules", args, kwargs)


def _recorder_plugin() -> types.SimpleNamespace:
    here = __name__

    def spec(cls: type, name: str, attr: str, **extra: Any) -> Any:
        return cls(name=name, summary="records its call", impl=f"{here}:{attr}", **extra)

    @hookimpl
    def forge_attention_backends():
        return [spec(AttentionBackendSpec, "rec_attention", "RecordingAttention")]

    @hookimpl
    def forge_packers():
        return [spec(PackerSpec, "rec_packer", "RecordingPacker")]

    @hookimpl
    def forge_sources():
        return [spec(SourceSpec, "rec_source", "RecordingSource")]

    @hookimpl
    def forge_tokenizers():
        return [spec(TokenizerSpec, "rec_tokenizer", "RecordingTokenizer")]

    @hookimpl
    def forge_optimizers():
        return [spec(OptimizerSpec, "rec_optimizer", "recording_optimizer")]

    @hookimpl
    def forge_schedules():
        return [spec(ScheduleSpec, "rec_schedule", "recording_schedule")]

    @hookimpl
    def forge_objectives():
        return [spec(ObjectiveSpec, "rec_objective", "RecordingObjective")]

    @hookimpl
    def forge_loggers():
        return [spec(LoggerSpec, "rec_logger", "RecordingLogger")]

    @hookimpl
    def forge_transforms():
        return [spec(TransformSpec, "rec_transform", "RecordingTransform")]

    @hookimpl
    def forge_parallelisms():
        return [spec(ParallelismSpec, "rec_wrapper", "RecordingWrapper", order=250)]

    @hookimpl
    def forge_rules():
        return [
            Rule(
                id="rec.rule",
                severity="warning",
                paths=("train.lr",),
                summary="records its call",
                check=recording_check,
                fix="nothing to fix",
            )
        ]

    return types.SimpleNamespace(
        **{
            f.__name__: f
            for f in (
                forge_attention_backends,
                forge_packers,
                forge_sources,
                forge_tokenizers,
                forge_optimizers,
                forge_schedules,
                forge_objectives,
                forge_loggers,
                forge_transforms,
                forge_parallelisms,
                forge_rules,
            )
        }
    )


_CONFIG = """
model:
  options: {dim: 8, n_layers: 1, n_heads: 2, n_kv_heads: 1, max_seq_len: 8, multiple_of: 8}
  transforms: [rec_transform]
attention: {backend: rec_attention}
data: {source: rec_source, tokenizer: rec_tokenizer, packer: rec_packer}
train: {optimizer: rec_optimizer, schedule: rec_schedule, objective: rec_objective}
parallel: {wrappers: [rec_wrapper]}
logging: {loggers: [rec_logger]}
"""


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> dict[str, tuple[int, frozenset[str]]]:
    """Every kind built once, through the code the trainer runs."""
    from forge_core import components
    from forge_core.distributed.parallelize import parallelize
    from forge_core.judge import judge_config
    from forge_core.plan import make_plan
    from forge_core.resolve import load_resolved
    from forge_core.train.loss import loss_fn

    path = tmp_path_factory.mktemp("hooks") / "recorded.yaml"
    path.write_text(_CONFIG)
    CALLS.clear()
    config, registries = load_resolved(str(path), extra_plugins=(("recorder", _recorder_plugin()),))
    judge_config(config, registries, world_size=1)  # evaluates every rule
    plan = make_plan(config, registries, 1)
    tokenizer = components.tokenizer(plan, registries)
    components.source(plan, registries, 0)
    components.packer(plan, registries, tokenizer)
    components.model(plan, registries, 8, components.attention(plan, registries))
    components.optimizer(plan, registries, torch.nn.Linear(2, 2))
    components.schedule(plan, registries, 10)(3)
    components.objective(plan, registries, loss_fn)
    components.loggers(plan, registries)
    parallelize(torch.nn.Linear(2, 2), plan, torch.device("cpu"), loss_fn=loss_fn)
    return dict(CALLS)


# --- what a docstring says -------------------------------------------------------------

_CALL = re.compile(r"(?:constructed|called) as ``(\w+\([^`]*?\))``")


def documented_call(doc: str) -> tuple[int, frozenset[str]] | None:
    """``(positional arguments, keyword names)`` of the first call the docstring gives
    for the implementation (``constructed as ``cls(...)````/``called as ``f(...)````)."""
    match = _CALL.search(doc)
    if match is None:
        return None
    call = ast.parse(match.group(1), mode="eval").body
    assert isinstance(call, ast.Call), match.group(1)
    return len(call.args), frozenset(k.arg for k in call.keywords)


def _returns_phrase(func: Any) -> str:
    annotation = inspect.signature(func).return_annotation
    if annotation in (None, "None"):
        return "Its return value is ignored"
    if str(annotation).startswith("dict["):
        return "Return a ``dict``"
    inner = re.fullmatch(r"list\[(\w+)\]", str(annotation))
    assert inner, f"{func.__name__}: unexpected return annotation {annotation!r}"
    return f"Return a list of :class:`~forge_core.api.{inner.group(1)}`"


def contract_problems(func: Any, recorded: dict[str, tuple[int, frozenset[str]]]) -> list[str]:
    """What the docstring of hookspec ``func`` fails to say, or says wrongly."""
    name, doc = func.__name__, " ".join((inspect.getdoc(func) or "").split())
    problems = []
    phrase = _returns_phrase(func)
    if phrase not in doc:
        problems.append(f"{name}: its docstring does not say what it returns ({phrase!r})")
    for arg in inspect.signature(func).parameters:
        if f"``{arg}``" not in doc:
            problems.append(f"{name}: its docstring does not name its argument ``{arg}``")
    if inspect.signature(func).parameters:  # a lifecycle hook: its signature is its call
        return problems
    said = documented_call(doc)
    made = recorded.get(name)
    if said is None:
        problems.append(
            f"{name}: its docstring does not give the implementation's call "
            "(``constructed as ``cls(...)```` or ``called as ``f(...)````)"
        )
    elif made is None:
        problems.append(
            f"{name}: no recorded call; add a recording implementation to tests/test_hook_contract.py"
        )
    elif said != made:
        problems.append(
            f"{name}: the docstring gives a call with {said[0]} positional argument(s) and keywords "
            f"{sorted(said[1])}, Forge makes one with {made[0]} and {sorted(made[1])}"
        )
    return problems


def _hookspecs() -> list[Any]:
    return [f for f in docgen.hookspec_functions() if f.__name__ not in EXEMPT]


def test_every_hook_docstring_says_what_the_implementation_receives_and_returns(recorded):
    problems = [p for func in _hookspecs() for p in contract_problems(func, recorded)]
    assert not problems, "\n".join(problems)


def test_every_registration_hook_was_recorded(recorded):
    registration = {f.__name__ for f in _hookspecs() if not inspect.signature(f).parameters}
    assert registration == set(recorded), (registration, set(recorded))


# --- the check can fail -------------------------------------------------------------


def _doctored(func: Any, doc: str) -> Any:
    def forge_sources() -> Any: ...

    forge_sources.__name__ = func.__name__
    forge_sources.__signature__ = inspect.signature(func)  # type: ignore[attr-defined]
    forge_sources.__doc__ = doc
    return forge_sources


@pytest.mark.parametrize(
    ("old", "new", "complaint"),
    [
        (
            "constructed as ``cls(options, seq_len=..., eos_id=..., pad_id=...)``",
            "constructed as ``cls(options, seq_len=..., eos_id=...)``",
            "keywords ['eos_id', 'seq_len'], Forge makes one with 1 and ['eos_id', 'pad_id', 'seq_len']",
        ),
        (
            "constructed as ``cls(options, seq_len=..., eos_id=..., pad_id=...)``",
            "constructed somehow",
            "does not give the implementation's call",
        ),
        (
            "Return a list of :class:`~forge_core.api.PackerSpec`",
            "Return specs",
            "does not say what it returns",
        ),
    ],
)
def test_a_docstring_that_lies_or_is_silent_is_caught(recorded, old, new, complaint):
    from forge_core.hookspecs import forge_packers

    doc = inspect.getdoc(forge_packers)
    assert old in doc
    problems = contract_problems(_doctored(forge_packers, doc.replace(old, new)), recorded)
    assert any(complaint in p for p in problems), problems


def test_a_lifecycle_argument_left_unnamed_is_caught(recorded):
    from forge_core.hookspecs import forge_checkpoint_saved

    doc = inspect.getdoc(forge_checkpoint_saved).replace("``path``", "the path")
    problems = contract_problems(_doctored(forge_checkpoint_saved, doc), recorded)
    assert "forge_checkpoint_saved: its docstring does not name its argument ``path``" in problems
