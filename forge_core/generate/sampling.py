"""Choosing the next token of many rows at once, as a function of where each row is and
never of which rows share its batch.

Filtering is the one :func:`filtered_probabilities` does for every row alike:
temperature, then top-k, then top-p (the smallest set of most likely tokens whose
probability reaches ``top_p``); temperature 0 is greedy. The draw is by inverse
distribution function: the first token whose cumulative probability exceeds ``u`` times
the total, with ``u`` in ``[0, 1)`` from :func:`uniform`.

``u`` is counter-based: a hash (splitmix64's finaliser, on Python integers, so exact and
the same on every machine and device) of ``(seed, step, prompt, sample, position)``.
There is no generator state, so a row's draws do not depend on the rows beside it, on
how many draws other rows took, on the order rows are batched in, on the rank that runs
them, or on the device; a row can be resumed, split off or moved to another process and
draws what it would have drawn. Per-row ``torch.Generator`` objects would give the first
three but not the device (CPU and CUDA streams differ) and carry state to hand over.

The log-probability reported with each token is the model's, at the sampling
temperature and before top-k/top-p (1 when greedy): ``log_softmax(logits / T)`` of the
chosen token, the quantity a trainer recomputes for the same token.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


def _mix(x: int) -> int:
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9 & _MASK
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB & _MASK
    return x ^ (x >> 31)


def uniform(*key: int) -> float:
    """A number in ``[0, 1)`` that is a function of the integers ``key`` alone (53 bits)."""
    h = 0
    for part in key:
        h = _mix((h + _GOLDEN + (part & _MASK)) & _MASK)
    return (h >> 11) * 2.0**-53


def filtered_probabilities(
    logits: torch.Tensor, temperature: float, top_k: int, top_p: float
) -> torch.Tensor:
    """``(rows, vocab)`` probabilities to draw from, after temperature, top-k and top-p."""
    logits = logits.float()
    # Shifted so the largest is 0 first: a tiny temperature then sends the others to -inf
    # (greedy in effect) instead of overflowing every logit to inf and softmax to nan.
    logits = (logits - logits.amax(-1, keepdim=True)) / temperature
    if 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, -1)
    if 0 < top_p < 1:
        ordered, order = probs.sort(-1, descending=True)
        # Keep a token while the tokens above it hold less than top_p: at least one.
        drop = ordered.cumsum(-1) - ordered >= top_p
        probs = probs.scatter(-1, order, ordered.masked_fill(drop, 0.0))
    return probs


def is_greedy(temperature: float) -> bool:
    # A temperature float32 cannot hold is 0 to it: greedy, as 0 is.
    return temperature < torch.finfo(torch.float32).tiny


def choose(
    logits: torch.Tensor, temperature: float, top_k: int, top_p: float, draws: Sequence[float]
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(token ids, their log-probabilities)`` for next-token ``logits (rows, vocab)``,
    row ``i`` drawn with ``draws[i]`` (from :func:`uniform`; unused when greedy)."""
    if is_greedy(temperature):
        tokens = logits.argmax(-1)
        scaled = logits.float()
    else:
        cdf = filtered_probabilities(logits, temperature, top_k, top_p).double().cumsum(-1)
        u = torch.tensor(draws, dtype=torch.float64, device=logits.device)[:, None]
        tokens = torch.searchsorted(cdf, u * cdf[:, -1:], right=True)[:, 0].clamp(max=logits.shape[-1] - 1)
        scaled = logits.float() / temperature
    logprobs = torch.log_softmax(scaled, -1).gather(-1, tokens[:, None])[:, 0]
    return tokens, logprobs
