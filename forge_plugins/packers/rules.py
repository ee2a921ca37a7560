"""Rules of the built-in packers about chat data: ``concat`` cuts documents across rows
at fixed windows, which would split a preference pair from itself (refused) and start
rows in the middle of a conversation (a warning)."""

from __future__ import annotations

from typing import Any

CONCAT_PAIRS = "concat.pairs"
CONCAT_CHAT = "concat.chat"


def _concat(ctx: Any, pairs: bool) -> str | None:
    data = ctx.config.data
    if data.packer != "concat" or not data.chat.format or (data.chat.format == "preference") != pairs:
        return None
    if pairs:
        return (
            "data.packer is 'concat', which cuts the stream into fixed windows: a preference pair "
            "(data.chat.format: preference) would be split from itself across rows"
        )
    return (
        f"data.packer is 'concat' with chat data (data.chat.format: {data.chat.format}): windows cut "
        "conversations across rows, so a row can start in the middle of one and train on an answer "
        "without its prompt"
    )


def rules() -> list[Any]:
    from forge_core.api import Rule

    return [
        Rule(
            id=CONCAT_PAIRS,
            severity="error",
            paths=("data.packer", "data.chat.format"),
            summary="Preference pairs are not packed by concat, which splits documents across rows.",
            check=lambda ctx: _concat(ctx, pairs=True),
            fix="Set data.packer: bfd (whole pairs, each half its own document).",
        ),
        Rule(
            id=CONCAT_CHAT,
            severity="warning",
            paths=("data.packer", "data.chat.format"),
            summary="Conversations are packed whole (bfd), not cut into concat's windows.",
            check=lambda ctx: _concat(ctx, pairs=False),
            fix="Set data.packer: bfd, which keeps every conversation whole in one row.",
        ),
    ]
