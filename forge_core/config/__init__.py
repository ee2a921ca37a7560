"""Config schema and loading. One module per step: ``yaml_reader`` (the file and its
limits), ``overrides`` (dotted overrides, moved keys), ``structuring`` (strict cattrs
structuring, error paths), ``blocks`` (component option blocks), ``errors`` (the one
:class:`ConfigError`), and ``loader``, which runs them in order."""

from forge_core.config.errors import ConfigError
from forge_core.config.loader import load_config, to_plain
from forge_core.config.overrides import apply_overrides
from forge_core.config.schema import ForgeConfig
from forge_core.config.structuring import structure
from forge_core.config.yaml_reader import read_config_file

__all__ = [
    "ConfigError",
    "ForgeConfig",
    "apply_overrides",
    "load_config",
    "read_config_file",
    "structure",
    "to_plain",
]
