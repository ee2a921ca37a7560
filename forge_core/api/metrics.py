"""How metrics are spelled when printed: one format for each kind of number, shared by
the kernel's commands and the console logger, so the same run reads the same in both."""

from __future__ import annotations

import math


def format_perplexity(value: float) -> str:
    """``"14.59"``, ``"20.00"``: always two decimals, so consecutive values line up and
    a round one does not lose its decimals (``:.4g`` gave ``20`` beside ``14.59``);
    ``"inf"``/``"nan"`` as they are."""
    return f"{value:.2f}" if math.isfinite(value) else str(value)
