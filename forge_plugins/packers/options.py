"""Options of the built-in packers. Light on purpose: imported by ``forge-run check``."""

from __future__ import annotations

import attrs

from forge_core.api import option


@attrs.frozen
class ConcatOptions:
    isolate: bool = option(
        True,
        "Keep documents apart: emit `doc_ids` and `positions` and take no loss "
        "where a label would cross into the next document. false gives classic "
        "concatenated pretraining (documents attend to each other, plain shifted labels).",
    )
