"""Config schema and loading: YAML, dotted overrides, strict structuring."""

from forge_core.config.loader import (
    ConfigError,
    apply_overrides,
    load_config,
    read_config_file,
    structure,
    to_plain,
)
from forge_core.config.schema import ForgeConfig

__all__ = [
    "ConfigError",
    "ForgeConfig",
    "apply_overrides",
    "load_config",
    "read_config_file",
    "structure",
    "to_plain",
]
