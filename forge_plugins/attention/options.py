"""Options classes of the built-in attention backends (no torch import: read by ``check``)."""

from __future__ import annotations

import attrs

from forge_core.api import at_least

_positive = at_least(1)


@attrs.frozen
class SdpaOptions:
    dense_mask_warn_seq_len: int = attrs.field(
        default=4096,
        validator=_positive,
        metadata={
            "doc": "Warn when documents are isolated (the packer emits doc_ids) at "
            "data.seq_len at or above this: the dense S x S mask then costs "
            "S^2 bytes per row and disables the flash kernel; `flex` scales better."
        },
    )


@attrs.frozen
class FlexOptions:
    block_size: int = attrs.field(
        default=128,
        validator=_positive,
        metadata={
            "doc": "Tile size of the BlockMask (query and key blocks). The mask costs "
            "about (seq_len / block_size)^2 int32 entries per row."
        },
    )

