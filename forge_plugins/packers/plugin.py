"""Registers the built-in packers. Imports nothing heavy: it runs for ``forge-run check``."""

from __future__ import annotations

from forge_core.api import DOC_IDS, POSITIONS, PackerSpec, hookimpl
from forge_plugins.packers.options import ConcatOptions


@hookimpl
def forge_packers() -> list[PackerSpec]:
    return [
        PackerSpec(
            name="none",
            summary="One document per row, truncated or padded (labels -100 on padding)",
            impl="forge_plugins.packers.none:NonePacker",
        ),
        PackerSpec(
            name="concat",
            summary="Documents joined and cut into seq_len windows; doc_ids/positions when isolating",
            impl="forge_plugins.packers.concat:ConcatPacker",
            options=ConcatOptions,
            emits={DOC_IDS, POSITIONS},
            emits_when="isolate",
        ),
        PackerSpec(
            name="bfd",
            summary="Best-fit-decreasing bin packing of whole documents; pads the rest of a row",
            impl="forge_plugins.packers.bfd:BfdPacker",
            emits={DOC_IDS, POSITIONS},
        ),
    ]


@hookimpl
def forge_rules() -> list:
    from forge_plugins.packers.rules import rules

    return rules()
