"""Conformance check for a model's key/value cache as batched sampling uses it
(:class:`~forge_core.api.CachingModel`).

:func:`check_cached_decoding`: rows of different lengths left-padded into one cache
(``positions`` counting each row's own tokens, ``attention_mask`` False at padding),
then decoded a token per row per step, give every row the logits of one forward over
that row alone, in float64. A cache that lets real tokens attend to padding, or a
forward that drops the mask, fails here with the row and the step.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch

from forge_core.testing.tolerance import ROUNDING_FACTOR, assert_within_rounding, longest_sum


@torch.no_grad()
def check_cached_decoding(
    model: Any,
    *,
    vocab_size: int | None = None,
    lengths: Sequence[int] = (3, 7, 1),
    steps: int = 4,
    seed: int = 0,
    rounding_factor: float = ROUNDING_FACTOR,
) -> float:
    """AssertionError naming the row and step where a batched, left-padded cache gives a
    row other logits than the row alone; else the worst difference as a share of the
    rounding tolerance. ``model`` is a built module (copied to float64, not changed);
    ``vocab_size`` defaults to its ``vocab_size``."""
    from forge_core.api import CachingModel

    if not isinstance(model, CachingModel):
        raise ValueError(f"{type(model).__name__} has no new_cache(): there is no cache to check")
    m = copy.deepcopy(model).double().eval()
    vocab = vocab_size or int(m.vocab_size)
    gen = torch.Generator().manual_seed(seed)
    rows = [torch.randint(0, vocab, (n + steps,), generator=gen) for n in lengths]
    width, batch = max(lengths), len(lengths)
    ids = torch.zeros(batch, width, dtype=torch.long)
    mask = torch.zeros(batch, width, dtype=torch.bool)
    for i, (row, n) in enumerate(zip(rows, lengths)):
        ids[i, width - n :], mask[i, width - n :] = row[:n], True
    cache = m.new_cache(batch, width + steps)
    positions = (mask.cumsum(1) - 1).clamp(min=0)
    got = [m(ids, positions=positions, attention_mask=mask, cache=cache)[:, -1]]
    for t in range(steps):
        tokens = torch.stack([row[n + t] for row, n in zip(rows, lengths)])[:, None]
        at = torch.tensor([[n + t] for n in lengths])
        got.append(
            m(tokens, positions=at, attention_mask=torch.ones_like(tokens, dtype=torch.bool), cache=cache)[
                :, -1
            ]
        )
    decoded = torch.stack(got, 1)
    worst = 0.0
    for i, (row, n) in enumerate(zip(rows, lengths)):
        alone = m(row[None])[0, n - 1 : n + steps]
        try:
            ratio = assert_within_rounding(
                decoded[i],
                alone,
                dtype=torch.float64,
                terms=longest_sum(m, n + steps),
                what=f"row {i} ({n} tokens, left-padded by {width - n}) decoded in a batch against alone",
                dims=("step", "vocab"),
                factor=rounding_factor,
            )
        except AssertionError as error:
            raise AssertionError(
                f"{type(model).__name__}: batched cached decoding: {error}. With cache=, the forward "
                "must take positions (each row's own) and attention_mask (False at padding, which no "
                "token may attend to) (the CachingModel protocol)"
            ) from error
        worst = max(worst, ratio)
    return worst
