"""Build components from a resolved config through the registries only.

Shared by the trainer, ``sample`` and ``export-hf``: each function takes the resolved
config and the registries and returns the constructed implementation, exactly as the
hook docstrings in :mod:`forge_core.hookspecs` define their construction.

This is the boundary between the kernel and plugin code: an exception raised while a
component's implementation is imported or constructed becomes a
:class:`~forge_core.errors.ComponentError` naming the component, the plugin that
registered it and the original error (a ForgeError from the plugin passes unchanged).
:func:`culprit` names the component whose code raised an exception later, while it was
used, from the exception's traceback.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

from forge_core.config.schema import ForgeConfig
from forge_core.errors import TRACEBACK_ENV, ComponentError, ForgeError

#: Longest original message quoted in a ComponentError.
_MAX_MESSAGE = 1000


def _spec(registries: Any, kind: str, name: str) -> Any:
    return registries[kind].get(name)


def describe(registries: Any, kind: str, name: str) -> str:
    """``tokenizer 'hf' (plugin 'tokenizers')``."""
    registry = registries[kind]
    return f"{registry.kind.label} {name!r} (plugin {registry.plugin_of(name)!r})"


def original_error(exc: BaseException) -> str:
    text = str(exc)
    if len(text) > _MAX_MESSAGE:
        text = text[:_MAX_MESSAGE] + " ..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _build(registries: Any, kind: str, name: str, make: Callable[[Any], Any]) -> Any:
    """``make(implementation)``, with plugin failures turned into ComponentError."""
    spec = _spec(registries, kind, name)
    what = describe(registries, kind, name)
    try:
        impl = spec.load()
    except Exception as exc:
        raise ComponentError(
            f"{what}: cannot import its implementation {spec.impl!r}: {original_error(exc)}. "
            f"Install what it needs, or choose another {registries[kind].kind.label}."
        ) from exc
    try:
        return make(impl)
    except ForgeError:
        raise
    except Exception as exc:
        raise ComponentError(
            f"building {what} failed: {original_error(exc)}. The cause is in its options, the "
            f"files they name, or the plugin itself ({TRACEBACK_ENV}=1 shows where it was raised)."
        ) from exc


def _is_kernel(module: str) -> bool:
    return module == "forge_core" or module.startswith("forge_core.")


def culprit(exc: BaseException, registries: Any) -> str | None:
    """Which plugin code raised ``exc``: ``"model 'llama' (plugin 'models')"``, or
    ``"plugin 'observer'"`` when the code belongs to a plugin but to none of its
    components, or ``None`` when no plugin code is on the traceback.

    The innermost frame in a plugin's package names the plugin. Within it, the innermost
    frame in a component's implementation (its function or class, else its module when
    no other component of the plugin shares it) names the component. The kernel's own
    modules never count."""
    packages: dict[str, str] = {}
    for name, plugin in registries.plugins.pm.list_name_plugin():
        module = plugin.__name__ if inspect.ismodule(plugin) else type(plugin).__module__
        package = module.rpartition(".")[0] or module
        if not _is_kernel(package):
            packages.setdefault(package, name)
    impls = [
        (registry.plugin_of(component), *registry.get(component).impl.partition(":")[::2],
         describe(registries, registry.kind.name, component))
        for registry in registries for component in registry.names()
    ]
    frames = []
    tb = exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        frames.append((str(tb.tb_frame.f_globals.get("__name__", "")), getattr(code, "co_qualname", code.co_name)))
        tb = tb.tb_next
    owner = None
    for module, qualname in reversed(frames):
        if _is_kernel(module):
            continue
        plugin = next((p for pkg, p in packages.items() if module == pkg or module.startswith(pkg + ".")), None)
        owner = owner or plugin
        if owner is None or plugin != owner:
            continue
        here = [(attr, what) for p, mod, attr, what in impls if p == owner and mod == module]
        exact = [what for attr, what in here if qualname == attr or qualname.startswith(attr + ".")]
        if exact or len(here) == 1:
            return (exact or [here[0][1]])[0]
    return None if owner is None else f"plugin {owner!r}"


def tokenizer(config: ForgeConfig, registries: Any) -> Any:
    return _build(registries, "tokenizer", config.data.tokenizer, lambda cls: cls(config.data.tokenizer_options))


def saved_tokenizer(config: ForgeConfig, registries: Any, directory: Path) -> Any:
    """The tokenizer of a finished run: a tokenizer class with a ``load(directory)``
    classmethod is loaded from what it saved; otherwise it is built from the config,
    and, when that fails and its options have a ``path``, from the saved directory."""
    options = config.data.tokenizer_options

    def make(cls: Any) -> Any:
        if directory.is_dir() and callable(getattr(cls, "load", None)):
            return cls.load(str(directory))
        try:
            return cls(options)
        except Exception:
            if directory.is_dir() and attrs.has(type(options)) and hasattr(options, "path"):
                return cls(attrs.evolve(options, path=str(directory)))
            raise

    return _build(registries, "tokenizer", config.data.tokenizer, make)


def source(config: ForgeConfig, registries: Any) -> Any:
    """The one source of ``data.source`` (a mixture's entries: :func:`source_named`)."""
    return source_named(registries, config.data.source, config.data.source_options)


def source_named(registries: Any, name: str, options: Any) -> Any:
    return _build(registries, "source", name, lambda cls: cls(options))


def packer(config: ForgeConfig, registries: Any, tok: Any) -> Any:
    eos_id, pad_id = int(tok.eos_id), int(tok.pad_id)
    return _build(registries, "packer", config.data.packer,
                  lambda cls: cls(config.data.packer_options, seq_len=config.data.seq_len,
                                  eos_id=eos_id, pad_id=pad_id))


def attention(config: ForgeConfig, registries: Any) -> Any:
    return _build(registries, "attention", config.attention.backend, lambda cls: cls(config.attention.options))


def without_pretrained(config: ForgeConfig, registries: Any) -> ForgeConfig:
    """``config`` with the model's pretrained option cleared (``ModelSpec.pretrained_option``):
    for commands whose weights come from a Forge checkpoint instead."""
    name = registries["model"].get(config.model.name).pretrained_option
    options = config.model.options
    if not name or not getattr(options, name, None):
        return config
    return attrs.evolve(config, model=attrs.evolve(config.model, options=attrs.evolve(options, **{name: ""})))


def model(config: ForgeConfig, registries: Any, vocab_size: int, attention_backend: Any) -> Any:
    return _build(registries, "model", config.model.name,
                  lambda build: build(config.model.options, vocab_size=vocab_size, attention=attention_backend))


def optimizer(config: ForgeConfig, registries: Any, params: Any) -> Any:
    return _build(registries, "optimizer", config.train.optimizer,
                  lambda build: build(params, lr=config.train.lr, options=config.train.optimizer_options))


def schedule(config: ForgeConfig, registries: Any) -> Any:
    """``factor(step)``: the multiplier on ``train.lr`` at 0-based ``step``."""
    fn = _build(registries, "schedule", config.train.schedule, lambda fn: fn)
    train = config.train
    return lambda step: float(fn(step, train.steps, train.warmup_steps, train.schedule_options))


def loggers(config: ForgeConfig, registries: Any) -> list[tuple[str, Any]]:
    """``(name, instance)`` for every logger in ``logging.loggers``."""
    from forge_core.config.loader import component_options

    out = []
    for name in config.logging.loggers:
        options = component_options(config, "logging", name, registries["logger"])
        out.append((name, _build(registries, "logger", name, lambda cls: cls(options))))
    return out
