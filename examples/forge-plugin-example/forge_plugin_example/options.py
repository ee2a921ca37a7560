"""Options classes of the example components.

Forge structures the config's option blocks (``attention.options``,
``logging.options.csv``) against these classes: unknown keys and wrong types are
reported by ``forge-run check`` with the config path. This module imports only attrs,
because ``check`` reads it without building anything.
"""

from __future__ import annotations

import attrs


@attrs.frozen
class WindowOptions:
    window: int = attrs.field(
        default=128,
        validator=attrs.validators.ge(1),
        metadata={"doc": "Tokens each query sees: itself and the window - 1 before it (within its document)."},
    )


@attrs.frozen
class CsvOptions:
    filename: str = attrs.field(
        default="metrics.csv",
        metadata={"doc": "File in the run directory that receives one row per logged step."},
    )
