"""Options classes of the example components.

Forge structures the config's option blocks (``attention.options``,
``logging.options.csv``) against these classes: unknown keys and wrong types are
reported by ``forge-run check`` with the config path. This module imports only attrs
and the plugin contract (``option``: a field with its meaning, which ``forge-run plugins``
shows), because ``check`` reads it without building anything.
"""

from __future__ import annotations

import attrs

from forge_core.api import option


@attrs.frozen
class WindowOptions:
    window: int = option(
        128,
        "Tokens each query sees: itself and the window - 1 before it (within its document).",
        attrs.validators.ge(1),
    )


@attrs.frozen
class CsvOptions:
    filename: str = option("metrics.csv", "File in the run directory that receives one row per logged step.")
