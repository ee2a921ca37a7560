"""The example's compatibility rule: a window as long as the row changes nothing.

A rule is data plus a check over the :class:`~forge_core.api.Plan` (the
resolved config and the chosen specs); it runs for ``forge-run check`` before anything
is built, so it imports nothing heavy.
"""

from __future__ import annotations

from forge_core.api import Plan, Rule


def check_window_covers_row(ctx: Plan) -> str | None:
    if ctx.specs["attention"].name != "window":
        return None  # a rule sees every config: stay silent unless our backend is chosen
    window = ctx.config.attention.options.window
    seq_len = ctx.config.data.seq_len
    if window < seq_len:
        return None
    return (
        f"attention.options.window = {window} is not below data.seq_len = {seq_len}, so every "
        "query already sees its whole causal past: the window restricts nothing and the "
        "backend only adds the cost of an explicit mask"
    )


RULES = [
    Rule(
        id="example.window-covers-row",
        severity="warning",
        paths=("attention.options.window", "data.seq_len"),
        summary="A sliding window only matters when it is shorter than data.seq_len.",
        check=check_window_covers_row,
        fix="Lower attention.options.window below data.seq_len, or use attention.backend: sdpa.",
    )
]
