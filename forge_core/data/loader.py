"""The stateful, resumable loader over packed rows.

Order: epoch ``e`` visits the rows in ``np.random.default_rng([seed, e]).permutation``
(or in order without ``shuffle``) and cuts that order into *global batches* of
``batch_size * dp_size`` rows; the rows that do not fill a last global batch are
skipped that epoch (a different remainder each epoch when shuffling). Global batch
``b`` goes to every data-parallel rank, each taking its own contiguous
``batch_size`` slice: ranks are disjoint, every rank gets the same number of batches,
and every pipeline stage or tensor-parallel rank that passes the same ``dp_rank``
gets the same batch. The loader never ends; it moves on to the next epoch.

State is ``(epoch, batches consumed in the epoch)``, counted in the training process
as batches are handed out, so prefetching workers cannot desync it: a loader restored
with :meth:`StatefulLoader.load_state_dict` yields exactly the batches the original
would have yielded next, with or without workers. With ``num_workers > 0`` a
``torch.utils.data.DataLoader`` gathers batches in worker processes from a sampler
that starts at the restored position.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from forge_core.api import INPUT_IDS, ForgeError


def epoch_order(num_rows: int, seed: int, epoch: int, shuffle: bool) -> np.ndarray:
    """The order in which epoch ``epoch`` visits the rows."""
    if not shuffle:
        return np.arange(num_rows)
    return np.random.default_rng([seed, epoch]).permutation(num_rows)


class _Rows(torch.utils.data.Dataset):
    """Map-style dataset whose keys are row-index arrays: one key, one collated batch."""

    def __init__(self, rows: dict[str, np.ndarray]) -> None:
        self.rows = rows

    def __getitem__(self, index: np.ndarray) -> dict[str, torch.Tensor]:
        return {
            k: torch.from_numpy(np.ascontiguousarray(v[index], dtype=np.int64))
            for k, v in self.rows.items()
        }

    def __len__(self) -> int:  # only for DataLoader's bookkeeping; keys are not ints
        return len(next(iter(self.rows.values())))


class StatefulLoader:
    """Infinite iterator of ``dict[str, LongTensor (batch_size, seq_len)]``."""

    def __init__(
        self,
        rows: dict[str, np.ndarray],
        batch_size: int,
        *,
        dp_rank: int = 0,
        dp_size: int = 1,
        seed: int = 0,
        shuffle: bool = True,
        num_workers: int = 0,
    ) -> None:
        if not rows or INPUT_IDS not in rows:
            raise ForgeError(f"the loader needs packed rows with at least {INPUT_IDS!r}.")
        if batch_size < 1 or dp_size < 1 or not 0 <= dp_rank < dp_size or num_workers < 0:
            raise ValueError(
                f"bad loader arguments: batch_size={batch_size}, dp_rank={dp_rank}, "
                f"dp_size={dp_size}, num_workers={num_workers}"
            )
        self.rows = rows
        self.num_rows = int(rows[INPUT_IDS].shape[0])
        self.batch_size = batch_size
        self.dp_rank = dp_rank
        self.dp_size = dp_size
        self.seed = seed
        self.shuffle = shuffle
        self.num_workers = num_workers
        self.global_batch = batch_size * dp_size
        self.batches_per_epoch = self.num_rows // self.global_batch
        if self.batches_per_epoch == 0:
            raise ForgeError(
                f"the data packs into {self.num_rows} rows, fewer than one global batch of "
                f"{self.global_batch} (batch size {batch_size} per rank x {dp_size} "
                "data-parallel ranks). Add data, lower train.batch_size or data.seq_len."
            )
        self.epoch = 0
        self.batch = 0  # batches of ``epoch`` already handed out
        self._iter: Iterator[dict[str, torch.Tensor]] | None = None

    # -- iteration -----------------------------------------------------------------

    def keys(self, epoch: int, batch: int) -> Iterator[np.ndarray]:
        """Row indices of this rank's batches, from ``(epoch, batch)`` on, forever."""
        lo = self.dp_rank * self.batch_size
        while True:
            order = epoch_order(self.num_rows, self.seed, epoch, self.shuffle)
            for b in range(batch, self.batches_per_epoch):
                start = b * self.global_batch + lo
                yield order[start : start + self.batch_size]
            epoch, batch = epoch + 1, 0

    def _start(self) -> Iterator[dict[str, torch.Tensor]]:
        dataset = _Rows(self.rows)
        keys = self.keys(self.epoch, self.batch)
        if self.num_workers == 0:
            return (dataset[k] for k in keys)
        loader = torch.utils.data.DataLoader(
            dataset,
            batch_size=None,  # keys are whole batches already
            sampler=keys,
            num_workers=self.num_workers,
        )
        return iter(loader)

    def __iter__(self) -> StatefulLoader:
        return self

    def __next__(self) -> dict[str, torch.Tensor]:
        if self._iter is None:
            self._iter = self._start()
        batch = next(self._iter)
        # Count here, in the training process, not where batches are produced.
        self.batch += 1
        if self.batch == self.batches_per_epoch:
            self.epoch, self.batch = self.epoch + 1, 0
        return batch

    def close(self) -> None:
        """Stop worker processes (they also stop when the loader is garbage collected)."""
        self._iter = None

    # -- resume --------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "batch": self.batch,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "num_rows": self.num_rows,
            "global_batch": self.global_batch,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue exactly where ``state`` was taken. The data, seed, shuffling and
        global batch size must match; the number of workers (and, at a fixed global
        batch, how it is split across data-parallel ranks) may change."""
        for key in ("seed", "shuffle", "num_rows", "global_batch"):
            if state[key] != getattr(self, key):
                raise ForgeError(
                    f"cannot resume the data loader: {key} was {state[key]!r} when the "
                    f"checkpoint was saved and is {getattr(self, key)!r} now. Resume with "
                    "the same data, seed and global batch size, or start a new run."
                )
        self.epoch = int(state["epoch"])
        self.batch = int(state["batch"])
        self._iter = None
