"""Weighted mixing of several row sets: which source every training row comes from.

The rows a run trains on are a sequence of *slots*; slot ``n`` (counted over the whole
run, all data-parallel ranks together) is taken from one source. Which one is fixed by
a pattern of ``PERIOD`` slots that repeats:

- each source ``i`` gets ``n_i`` slots of every period: its weight's share of
  ``PERIOD`` (weights divided by their sum), rounded by largest remainder so the shares
  add up to ``PERIOD`` exactly;
- inside the period the slots are interleaved as evenly as possible: source ``i``'s
  ``k``-th slot sits at ``(k + 1/2) / n_i`` of the period (ties: the lower source).

A source's ``k``-th slot takes its ``k``-th row in its own endless order: epoch ``e``
of source ``i`` visits its rows in ``np.random.default_rng([seed, i, e]).permutation``
(in order without shuffling), epochs following each other, so a small source with a
large weight is repeated and a large one is sampled.

Everything is a closed-form function of the slot number: no state beyond the number of
slots consumed is needed to resume, and how many rows each source has given after ``N``
slots (:meth:`MixturePlan.taken`) is computed, not simulated. Over any first ``N``
slots source ``i`` has given ``w_i * N`` rows up to ``(k + 1) / 2 + N / PERIOD`` rows
(``k`` sources): rounding the weights to the period and the interleave.

Weights that change by step (``data.phases``) are a
:class:`~forge_core.data.mix_schedule.MixtureSchedule` of such plans, still a closed
form of the slot number; :class:`MixedRows` always reads through one (a single phase
without ``data.phases``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from forge_core.api import ForgeError

PERIOD = 1 << 16


def shares(weights: Any) -> np.ndarray:
    """``weights`` divided by their sum (float64), for any finite weights: they are first
    scaled by the power of two that brings the largest into [0.5, 1), so that weights
    near the float maximum (1e308 each) cannot sum to infinity. Scaling by a power of
    two is exact, so ordinary weights give the very shares ``w / w.sum()`` gives."""
    w = np.asarray(weights, dtype=np.float64)
    top = float(w.max()) if w.size else 0.0
    if top > 0:
        w = np.ldexp(w, -math.frexp(top)[1])
    return w / w.sum()


def apportion(weights: np.ndarray, total: int) -> np.ndarray:
    """Integers proportional to ``weights`` that add up to ``total`` (largest remainder,
    ties to the lower index)."""
    quota = shares(weights) * total
    counts = np.floor(quota).astype(np.int64)
    short = total - int(counts.sum())
    counts[np.argsort(-(quota - counts), kind="stable")[:short]] += 1
    return counts


class MixturePlan:
    """Slot -> (source, that source's row count so far), for weights ``weights``. A
    weight of 0 leaves its source out (a phase of a schedule that does not read it);
    ``where`` names each weight's config path for the error of one too small to count."""

    def __init__(self, weights: list[float], labels: list[str], where: list[str] | None = None) -> None:
        w = np.asarray(weights, dtype=np.float64)
        self.weights = shares(w)
        self.counts = apportion(w, PERIOD)
        lost = (self.counts == 0) & (w > 0)
        if lost.any():
            i = int(np.flatnonzero(lost)[0])
            at = where[i] if where else f"data.sources[{i}] ({labels[i]})"
            raise ForgeError(
                f"{at}: weight {weights[i]:g} is less than 1/{PERIOD} of "
                "the total: it would never be read. Raise it or remove the source."
            )
        source = np.repeat(np.arange(len(w)), self.counts)
        rank = np.concatenate([np.arange(c) for c in self.counts])
        position = (rank + 0.5) / self.counts[source]
        order = np.argsort(position, kind="stable")  # stable: ties go to the lower source
        self.pattern = source[order].astype(np.int32)
        self.rank = rank[order].astype(np.int64)
        #: Where each source's slots sit in the pattern (to count them before any slot).
        self.places = [np.flatnonzero(self.pattern == i) for i in range(len(w))]

    def at(self, n: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For slots ``n`` (an array): the source of each, and how many rows that source
        had given before it (the row's index in the source's order)."""
        period, at = np.divmod(np.asarray(n, dtype=np.int64), PERIOD)
        source = self.pattern[at]
        return source, period * self.counts[source] + self.rank[at]

    def slots(self, first: int, count: int) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`at` for slots ``first .. first + count - 1``."""
        return self.at(np.arange(first, first + count, dtype=np.int64))

    def taken(self, slots: int) -> np.ndarray:
        """Rows each source has given in the first ``slots`` slots."""
        period, rest = divmod(int(slots), PERIOD)
        return period * self.counts + np.bincount(self.pattern[:rest], minlength=len(self.counts))

    def describe(self) -> dict[str, Any]:
        """What must match for saved slot counts to mean the same rows (a schedule's
        steady segment: :meth:`~forge_core.data.mix_schedule.MixtureSchedule.describe`)."""
        return {"counts": self.counts.tolist()}

    def taken_of(self, source: np.ndarray, slots: np.ndarray) -> np.ndarray:
        """For each pair: rows ``source[j]`` has given in the first ``slots[j]`` slots."""
        period, rest = np.divmod(np.asarray(slots, dtype=np.int64), PERIOD)
        out = period * self.counts[source]
        for i, places in enumerate(self.places):
            mine = source == i
            out[mine] += np.searchsorted(places, rest[mine])
        return out


def source_order(size: int, seed: int, source: int, epoch: int, shuffle: bool) -> np.ndarray:
    """The order in which ``epoch`` of ``source`` visits its ``size`` rows."""
    if not shuffle:
        return np.arange(size)
    return np.random.default_rng([seed, source, epoch]).permutation(size)


class MixedRows:
    """Several row sets read as one: key ``base[i] + r`` is row ``r`` of part ``i``.
    Which part each slot of the run reads is ``schedule``'s
    (:class:`~forge_core.data.mix_schedule.MixtureSchedule`)."""

    def __init__(self, parts: list[Any], labels: list[str], schedule: Any) -> None:
        self.parts = parts
        self.labels = labels
        self.schedule = schedule
        self.sizes = [int(p.num_rows) for p in parts]
        self.base = np.concatenate([[0], np.cumsum(self.sizes)]).astype(np.int64)
        self.num_rows = int(self.base[-1])
        self.seq_len = parts[0].seq_len
        keys = {tuple(p.keys) for p in parts}
        if len(keys) != 1:
            raise ForgeError(
                f"the mixture's sources give rows with different keys ({sorted(keys)}); "
                "every source is packed by the same packer, so this is a bug"
            )
        self.keys = parts[0].keys

    def __len__(self) -> int:
        return self.num_rows

    def read(self, keys: Any) -> dict[str, np.ndarray]:
        keys = np.asarray(keys, dtype=np.int64).reshape(-1)
        part = np.searchsorted(self.base, keys, side="right") - 1
        out: dict[str, np.ndarray] = {}
        for i in np.unique(part):
            where = np.flatnonzero(part == i)
            rows = self.parts[i].read(keys[where] - self.base[i])
            for key, value in rows.items():
                if key not in out:
                    out[key] = np.empty((len(keys), value.shape[1]), np.int64)
                out[key][where] = value
        return out

    def realized(self, slots: int, first: int = 0) -> np.ndarray:
        """The share of training rows ``first .. slots - 1`` each source gives."""
        taken = self.schedule.taken(slots) - self.schedule.taken(first)
        return taken / max(int(taken.sum()), 1)
