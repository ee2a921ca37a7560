"""Options of the ``cp`` strategy (``parallel.options.cp``); torch-free, for ``forge-run check``."""

from __future__ import annotations

from typing import Literal

import attrs

from forge_core.api import option


@attrs.frozen
class ContextParallelOptions:
    attention: Literal["allgather", "ulysses"] = option(
        "allgather",
        "How attention sees the whole row: allgather gathers every rank's keys and values "
        "(exact for any mask; needs a backend that declares query_shards); ulysses exchanges "
        "heads for sequence with two all-to-alls (query and key/value heads must divide "
        "by cp x tp; any backend honouring doc_ids).",
    )
    balance: Literal["documents", "zigzag"] = option(
        "documents",
        "How a row's tokens are split over the cp ranks: documents balances the causal "
        "attention work of the packed documents; zigzag gives each rank chunks r and "
        "2cp-1-r of 2cp (balanced for one causal sequence). Rows without doc_ids use zigzag.",
    )
