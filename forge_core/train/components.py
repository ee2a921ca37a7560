"""Build components from a resolved config through the registries only.

Shared by the trainer, ``sample`` and ``export-hf``: each function takes the resolved
config and the registries and returns the constructed implementation, exactly as the
hook docstrings in :mod:`forge_core.hookspecs` define their construction.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs

from forge_core.config.schema import ForgeConfig


def _spec(registries: Any, kind: str, name: str) -> Any:
    return registries[kind].get(name)


def tokenizer(config: ForgeConfig, registries: Any) -> Any:
    return _spec(registries, "tokenizer", config.data.tokenizer).load()(config.data.tokenizer_options)


def saved_tokenizer(config: ForgeConfig, registries: Any, directory: Path) -> Any:
    """The tokenizer of a finished run: a tokenizer class with a ``load(directory)``
    classmethod is loaded from what it saved; otherwise it is built from the config,
    and, when that fails and its options have a ``path``, from the saved directory."""
    cls = _spec(registries, "tokenizer", config.data.tokenizer).load()
    options = config.data.tokenizer_options
    if directory.is_dir() and callable(getattr(cls, "load", None)):
        return cls.load(str(directory))
    try:
        return cls(options)
    except Exception:
        if directory.is_dir() and attrs.has(type(options)) and hasattr(options, "path"):
            return cls(attrs.evolve(options, path=str(directory)))
        raise


def source(config: ForgeConfig, registries: Any) -> Any:
    return _spec(registries, "source", config.data.source).load()(config.data.source_options)


def packer(config: ForgeConfig, registries: Any, tok: Any) -> Any:
    cls = _spec(registries, "packer", config.data.packer).load()
    return cls(config.data.packer_options, seq_len=config.data.seq_len, eos_id=int(tok.eos_id),
               pad_id=int(tok.pad_id))


def attention(config: ForgeConfig, registries: Any) -> Any:
    return _spec(registries, "attention", config.attention.backend).load()(config.attention.options)


def model(config: ForgeConfig, registries: Any, vocab_size: int, attention_backend: Any) -> Any:
    build = _spec(registries, "model", config.model.name).load()
    return build(config.model.options, vocab_size=vocab_size, attention=attention_backend)


def optimizer(config: ForgeConfig, registries: Any, params: Any) -> Any:
    build = _spec(registries, "optimizer", config.train.optimizer).load()
    return build(params, lr=config.train.lr, options=config.train.optimizer_options)


def schedule(config: ForgeConfig, registries: Any) -> Any:
    """``factor(step)``: the multiplier on ``train.lr`` at 0-based ``step``."""
    fn = _spec(registries, "schedule", config.train.schedule).load()
    train = config.train
    return lambda step: float(fn(step, train.steps, train.warmup_steps, train.schedule_options))


def loggers(config: ForgeConfig, registries: Any) -> list[tuple[str, Any]]:
    """``(name, instance)`` for every logger in ``logging.loggers``."""
    from forge_core.config.loader import component_options

    out = []
    for name in config.logging.loggers:
        spec = registries["logger"].get(name)
        options = component_options(config, "logging", name, registries["logger"])
        out.append((name, spec.load()(options)))
    return out
