"""Batched generation: many prompts of different lengths decoded together, each row's
result independent of the rows beside it.

:func:`generate_rows` decodes :class:`Row` s (a prompt's ids, its prompt index and sample
index) under one :class:`Sampling` and returns a :class:`Completion` per row: the new
ids, the log-probability of each under the sampler (see :mod:`.sampling`) and why it
stopped (``eos``: an id of ``Sampling.eos_ids``, kept as the last id; ``stop``: a stop
string appeared in the decoded text, the ids kept up to the one that completed it;
``length``: ``max_new_tokens``). Rows stop separately; the batch ends when all have.

A model with a key/value cache (the :class:`~forge_core.api.CachingModel` protocol)
decodes every row at once (:class:`CachedRows`): prompts are left-padded to one width,
``positions`` count each row's own tokens from 0 and ``attention_mask`` tells the cache
which slots are padding, so that no real token attends to one; a row's logits are those
it has alone, up to rounding. Any other model re-reads each row's context alone every
token (:class:`RereadRows`).

The context is ``context`` tokens per row (a run's ``data.seq_len``). A row whose cached
tokens fill it is cut to its last half and read again, as a single sequence is; this is
done for a row when *its own* count reaches the context, never because another row's
did, so cutting, too, is the row's alone. While prompt and completion fit the context,
a row's log-probabilities are those of a full forward over the two, up to rounding (a
decoding step multiplies one token per row, the full forward the whole sequence).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import attrs
import torch

from forge_core.generate.sampling import choose, is_greedy, uniform


def _check(field: Any, value: float, fine: bool) -> None:
    if not fine:
        ranges = {"temperature": "a finite number, 0 or more (0: greedy)", "top_p": "in (0, 1]"}
        raise ValueError(f"Sampling.{field.name} must be {ranges[field.name]}, got {value}")


@attrs.frozen
class Sampling:
    """How rows are sampled. ``temperature`` 0 is greedy; ``top_k`` 0 and ``top_p`` 1 are
    off. ``seed`` and ``step`` (a training step; 0 outside training) with each row's
    prompt and sample index and the position decide every draw. ``stops`` need a
    ``decode`` given to :func:`generate_rows`."""

    max_new_tokens: int = attrs.field(validator=attrs.validators.ge(0))
    temperature: float = attrs.field(default=1.0, validator=lambda _, a, v: _check(a, v, 0 <= v < math.inf))
    top_k: int = attrs.field(default=0, validator=attrs.validators.ge(0))
    top_p: float = attrs.field(default=1.0, validator=lambda _, a, v: _check(a, v, 0 < v <= 1))
    seed: int = 0
    step: int = 0
    eos_ids: frozenset[int] = frozenset()
    stops: tuple[str, ...] = ()


@attrs.frozen
class Row:
    """One continuation to sample: ``ids`` (the prompt), which prompt and which sample of it."""

    ids: tuple[int, ...]
    prompt: int = 0
    sample: int = 0


@attrs.frozen
class Completion:
    """``ids`` sampled after a row's prompt, ``logprobs`` of each, and ``finish``:
    ``eos``, ``stop`` or ``length``."""

    ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish: str


def _device(model: Any) -> torch.device:
    return next(model.parameters()).device


class CachedRows:
    """Rows decoded together through a model's key/value cache (module docstring)."""

    def __init__(self, model: Any, context: int, windows: list[list[int]]) -> None:
        self.model, self.context, self.device = model, context, _device(model)
        self.logits = self._read([w[-context:] for w in windows])

    def _read(self, windows: list[list[int]]) -> torch.Tensor:
        """Read ``windows`` into a new cache, left-padded; the next-token logits."""
        self.windows = windows
        width = max(len(w) for w in windows)
        ids = torch.zeros(len(windows), width, dtype=torch.long)
        mask = torch.zeros(len(windows), width, dtype=torch.bool)
        for i, window in enumerate(windows):
            ids[i, width - len(window) :] = torch.tensor(window, dtype=torch.long)
            mask[i, width - len(window) :] = True
        positions = (mask.cumsum(1) - 1).clamp(min=0)
        self.cache = self.model.new_cache(len(windows), self.context)
        self.width = width
        return self._forward(ids, positions, mask)

    def _forward(self, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        to = {"device": self.device}
        out = self.model(
            ids.to(**to), positions=positions.to(**to), attention_mask=mask.to(**to), cache=self.cache
        )
        return out[:, -1]

    def step(self, tokens: list[int], done: list[bool]) -> torch.Tensor:
        """Logits after each row's ``tokens``; rows ``done`` are carried, not kept."""
        if self.width < self.context:
            counts = torch.tensor([[len(w)] for w in self.windows])
            for window, token in zip(self.windows, tokens):
                window.append(token)
            self.width += 1
            ids = torch.tensor(tokens, dtype=torch.long)[:, None]
            return self._forward(ids, counts, torch.ones_like(ids, dtype=torch.bool))
        # The cache is full: read every row again, cutting those whose own context is full.
        half = max(self.context // 2, 1)
        windows = []
        for window, token, finished in zip(self.windows, tokens, done):
            full = len(window) == self.context
            windows.append([token] if finished else [*window, token][-half:] if full else [*window, token])
        return self._read(windows)


class RereadRows:
    """Rows decoded one at a time by a model without a cache: each token re-reads the
    row's last ``context`` tokens."""

    def __init__(self, model: Any, context: int, windows: list[list[int]]) -> None:
        self.model, self.context, self.device = model, context, _device(model)
        self.windows = windows
        self.logits = self._read([False] * len(windows))

    def _read(self, done: list[bool]) -> torch.Tensor:
        rows = [w[-1:] if finished else w[-self.context :] for w, finished in zip(self.windows, done)]
        return torch.cat([self.model(torch.tensor([r], device=self.device))[:, -1] for r in rows])

    def step(self, tokens: list[int], done: list[bool]) -> torch.Tensor:
        for window, token in zip(self.windows, tokens):
            window.append(token)
        return self._read(done)


def _stopped(text: str, stops: Sequence[str]) -> bool:
    return any(stop in text for stop in stops)


@contextlib.contextmanager
def evaluating(model: Any) -> Iterator[None]:
    """``model`` in eval mode (no dropout: a LoRA adapter's, say, on the model being
    trained), every module that was training put back after."""
    training = [m for m in model.modules() if m.training]
    model.eval()
    try:
        yield
    finally:
        for module in training:
            module.training = True


@torch.inference_mode()
def generate_rows(
    model: Any,
    rows: Sequence[Row],
    sampling: Sampling,
    *,
    context: int,
    decode: Callable[[list[int]], str] | None = None,
    on_token: Callable[[int, int], Any] | None = None,
) -> list[Completion]:
    """A :class:`Completion` for each of ``rows``, decoded together (module docstring).
    ``on_token(row, token)`` sees each token as it is kept. The model decodes in eval
    mode (:func:`evaluating`) and is given back in the mode it came in."""
    if sampling.stops and decode is None:
        raise ValueError("stop strings need decode: the text is where they are found")
    if not rows or sampling.max_new_tokens <= 0:
        return [Completion((), (), "length") for _ in rows]
    empty = [i for i, row in enumerate(rows) if not row.ids]
    if empty:
        raise ValueError(f"rows {empty} have no prompt ids: give at least one (an end of document)")
    with evaluating(model):
        return _decode(model, rows, sampling, context, decode, on_token)


def _decode(
    model: Any,
    rows: Sequence[Row],
    sampling: Sampling,
    context: int,
    decode: Callable[[list[int]], str] | None,
    on_token: Callable[[int, int], Any] | None,
) -> list[Completion]:
    from forge_core.api import CachingModel

    runner_type = CachedRows if isinstance(model, CachingModel) else RereadRows
    runner = runner_type(model, context, [list(row.ids) for row in rows])
    logits = runner.logits
    ids: list[list[int]] = [[] for _ in rows]
    logprobs: list[list[float]] = [[] for _ in rows]
    finish: list[str | None] = [None] * len(rows)
    s = sampling
    for t in range(s.max_new_tokens):
        draws = (
            [] if is_greedy(s.temperature) else [uniform(s.seed, s.step, r.prompt, r.sample, t) for r in rows]
        )
        chosen, chosen_logprobs = choose(logits, s.temperature, s.top_k, s.top_p, draws)
        tokens, values = chosen.tolist(), chosen_logprobs.tolist()
        for i, token in enumerate(tokens):
            if finish[i] is not None:
                continue
            ids[i].append(token)
            logprobs[i].append(values[i])
            if on_token is not None:
                on_token(i, token)
            if token in s.eos_ids:
                finish[i] = "eos"
            elif s.stops and _stopped(decode(ids[i]), s.stops):
                finish[i] = "stop"
            elif t + 1 == s.max_new_tokens:
                finish[i] = "length"
        if all(f is not None for f in finish):
            break
        logits = runner.step(tokens, [f is not None for f in finish])
    return [Completion(tuple(i), tuple(p), str(f)) for i, p, f in zip(ids, logprobs, finish)]
