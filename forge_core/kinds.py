"""The kinds of component, listed once: for each, the hook that registers it, its spec
class, how people call it, and where a config chooses it and keeps its options.

Everything else that enumerates kinds derives from :data:`KINDS`: the registries
(:mod:`forge_core.registry`), the config's option blocks
(:data:`forge_core.config.schema.OPTION_BLOCKS` and ``KEYED_BLOCKS``), the objects the
hook reference documents, and a test holds the table of ``docs/architecture.md`` to it.
Imports only the spec classes, so the config schema can use it without loading plugins.
"""

from __future__ import annotations

import attrs

from forge_core.api import specs as S


@attrs.frozen
class Kind:
    """One kind of component.

    ``name_path`` is the config key that chooses components of this kind and
    ``options_path`` the block that holds their options. ``keyed``: several may be
    active at once (the strategies, the loggers), so ``name_path`` is a list of names
    and ``options_path`` maps each name to its options."""

    hook: str
    spec_cls: type
    label: str
    name_path: str
    options_path: str
    keyed: bool = False
    plural: str = ""

    @property
    def name(self) -> str:
        """The kind's name, as its spec class declares it (``spec_cls.kind``)."""
        return self.spec_cls.kind

    @property
    def title(self) -> str:
        return (self.plural or self.label + "s").capitalize()


KINDS: tuple[Kind, ...] = (
    Kind("forge_models", S.ModelSpec, "model", "model.name", "model.options"),
    Kind(
        "forge_transforms",
        S.TransformSpec,
        "model transform",
        "model.transforms",
        "model.transform_options",
        keyed=True,
    ),
    Kind(
        "forge_attention_backends",
        S.AttentionBackendSpec,
        "attention backend",
        "attention.backend",
        "attention.options",
    ),
    Kind("forge_sources", S.SourceSpec, "data source", "data.source", "data.source_options"),
    Kind("forge_tokenizers", S.TokenizerSpec, "tokenizer", "data.tokenizer", "data.tokenizer_options"),
    Kind("forge_packers", S.PackerSpec, "packer", "data.packer", "data.packer_options"),
    # Strategies with a mesh dimension are enabled by their degree (parallel.tp, ...),
    # wrappers by name in parallel.wrappers.
    Kind(
        "forge_parallelisms",
        S.ParallelismSpec,
        "parallelism strategy",
        "parallel.wrappers",
        "parallel.options",
        keyed=True,
        plural="parallelism strategies",
    ),
    Kind("forge_optimizers", S.OptimizerSpec, "optimizer", "train.optimizer", "train.optimizer_options"),
    Kind("forge_schedules", S.ScheduleSpec, "schedule", "train.schedule", "train.schedule_options"),
    Kind("forge_objectives", S.ObjectiveSpec, "objective", "train.objective", "train.objective_options"),
    Kind("forge_loggers", S.LoggerSpec, "logger", "logging.loggers", "logging.options", keyed=True),
)
