"""Options classes of the built-in attention backends (no torch import: read by ``check``)."""

from __future__ import annotations

import attrs

from forge_core.api import at_least, option

_positive = at_least(1)


@attrs.frozen
class SdpaOptions:
    dense_mask_warn_seq_len: int = option(
        4096,
        "Warn when documents are isolated (the packer emits doc_ids) at "
        "data.seq_len at or above this: the dense S x S mask then costs "
        "S^2 bytes per row and disables the flash kernel; `flex` scales better.",
        _positive,
    )


@attrs.frozen
class FlexOptions:
    block_size: int = option(
        128,
        "Tile size of the BlockMask (query and key blocks). The mask costs "
        "about (seq_len / block_size)^2 int32 entries per row.",
        _positive,
    )
