"""The stateful, resumable loader over packed rows.

Rows are anything with ``num_rows``, ``seq_len`` and ``read(indices) -> dict of int64
arrays``: :class:`~forge_core.data.packed_rows.PackedRows` materializes them from
memory-mapped tokens as each batch is read, :class:`~forge_core.data.packed_rows.ArrayRows`
holds them in memory (a plain dict of arrays is wrapped in one).

Order of one row set: epoch ``e`` visits the rows in ``np.random.default_rng([seed, e]).permutation``
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

A :class:`~forge_core.data.mixture.MixedRows` (several sources with weights) is read in
its own order instead (:mod:`forge_core.data.mixture`): global batch ``b`` is slots
``b * global_batch`` onwards of the mixture, each rank again taking its contiguous
slice; there are no epochs over the whole, each source runs through its own. Its state
is the number of global batches consumed; a checkpoint resumes under a schedule
(``data.phases``) that gives every slot already read the same row, so phases after the
resume point may change. ``last_sources`` says which source each row
of the batch last handed out came from (computed from the mixture's closed form, so it
holds with workers too): what the trainer counts the realized mixture with.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from forge_core.api import ForgeError
from forge_core.data.mixture import source_order


def epoch_order(num_rows: int, seed: int, epoch: int, shuffle: bool) -> np.ndarray:
    """The order in which epoch ``epoch`` visits the rows. Kept for the whole epoch, so
    int32 while the row numbers fit (half the memory of int64); the shuffle is the same
    permutation either way (its draws depend on the number of rows, not their dtype)."""
    order = np.arange(num_rows, dtype=np.int32 if num_rows <= np.iinfo(np.int32).max else np.int64)
    if shuffle:
        np.random.default_rng([seed, epoch]).shuffle(order)
    return order


class _Rows(torch.utils.data.Dataset):
    """Map-style dataset whose keys are row-index arrays: one key, one collated batch."""

    def __init__(self, rows: Any) -> None:
        self.rows = rows

    def __getitem__(self, index: np.ndarray) -> dict[str, torch.Tensor]:
        return {
            k: torch.from_numpy(np.ascontiguousarray(v, dtype=np.int64))
            for k, v in self.rows.read(index).items()
        }

    def __len__(self) -> int:  # only for DataLoader's bookkeeping; keys are not ints
        return self.rows.num_rows


class StatefulLoader:
    """Infinite iterator of ``dict[str, LongTensor (batch_size, seq_len)]``."""

    def __init__(
        self,
        rows: Any,
        batch_size: int,
        *,
        dp_rank: int = 0,
        dp_size: int = 1,
        seed: int = 0,
        shuffle: bool = True,
        num_workers: int = 0,
    ) -> None:
        from forge_core.data.mixture import MixedRows
        from forge_core.data.packed_rows import ArrayRows

        if isinstance(rows, dict):
            rows = ArrayRows(rows)
        if batch_size < 1 or dp_size < 1 or not 0 <= dp_rank < dp_size or num_workers < 0:
            raise ValueError(
                f"bad loader arguments: batch_size={batch_size}, dp_rank={dp_rank}, "
                f"dp_size={dp_size}, num_workers={num_workers}"
            )
        self.rows = rows
        self.mixture = rows if isinstance(rows, MixedRows) else None
        self.num_rows = int(rows.num_rows)
        self.batch_size = batch_size
        self.dp_rank = dp_rank
        self.dp_size = dp_size
        self.seed = seed
        self.shuffle = shuffle
        self.num_workers = num_workers
        self.global_batch = batch_size * dp_size
        self.batches_per_epoch = self.num_rows // self.global_batch
        if self.mixture is not None:
            self.batches_per_epoch = 0  # a mixture has no epochs over the whole
        elif self.batches_per_epoch == 0:
            raise ForgeError(
                f"the data packs into {self.num_rows} rows, fewer than one global batch of "
                f"{self.global_batch} (batch size {batch_size} per rank x {dp_size} "
                "data-parallel ranks). Add data, lower train.batch_size or data.seq_len."
            )
        self.epoch = 0
        self.batch = 0  # batches of ``epoch`` already handed out
        #: For a mixture: the source index of every row of the batch last handed out.
        self.last_sources: np.ndarray | None = None
        self._iter: Iterator[dict[str, torch.Tensor]] | None = None

    # -- iteration -----------------------------------------------------------------

    def keys(self, epoch: int, batch: int) -> Iterator[np.ndarray]:
        """Row indices of this rank's batches, from ``(epoch, batch)`` on, forever."""
        lo = self.dp_rank * self.batch_size
        if self.mixture is not None:
            yield from self._mixture_keys(batch, lo)
            return
        while True:
            order = epoch_order(self.num_rows, self.seed, epoch, self.shuffle)
            for b in range(batch, self.batches_per_epoch):
                start = b * self.global_batch + lo
                yield order[start : start + self.batch_size].astype(np.int64)  # keys stay int64
            epoch, batch = epoch + 1, 0

    def _mixture_keys(self, batch: int, lo: int) -> Iterator[np.ndarray]:
        mix = self.mixture
        orders: dict[int, tuple[int, np.ndarray]] = {}  # source -> (epoch, its order)
        while True:
            source, taken = mix.schedule.slots(batch * self.global_batch + lo, self.batch_size)
            keys = np.empty(self.batch_size, np.int64)
            for j, (i, k) in enumerate(zip(source.tolist(), taken.tolist())):
                epoch, at = divmod(k, mix.sizes[i])
                if orders.get(i, (None,))[0] != epoch:
                    orders[i] = (epoch, source_order(mix.sizes[i], self.seed, i, epoch, self.shuffle))
                keys[j] = mix.base[i] + orders[i][1][at]
            yield keys
            batch += 1

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
        if self.mixture is not None:
            first = self.batch * self.global_batch + self.dp_rank * self.batch_size
            self.last_sources = self.mixture.schedule.slots(first, self.batch_size)[0]
        # Count here, in the training process, not where batches are produced.
        self.batch += 1
        if self.batch == self.batches_per_epoch:  # never for a mixture (0)
            self.epoch, self.batch = self.epoch + 1, 0
        return batch

    def close(self) -> None:
        """Stop worker processes (they also stop when the loader is garbage collected)."""
        self._iter = None

    # -- resume --------------------------------------------------------------------

    def _identity(self) -> dict[str, Any]:
        """What must match for a saved position to mean the same batches."""
        out: dict[str, Any] = {
            "seed": self.seed,
            "shuffle": self.shuffle,
            "num_rows": self.num_rows,
            "global_batch": self.global_batch,
        }
        if self.mixture is not None:
            out["mixture"] = {
                "sources": self.mixture.labels,
                "rows": self.mixture.sizes,
                "schedule": self.mixture.schedule.describe(),
            }
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "batch": self.batch, **self._identity()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue exactly where ``state`` was taken. The data, seed, shuffling and
        global batch size must match; the number of workers (and, at a fixed global
        batch, how it is split across data-parallel ranks) may change."""
        identity = self._identity()
        if self.mixture is not None and isinstance(state.get("mixture"), dict):
            state = {**state, "mixture": self._saved_mixture(state)}
        for key, now in identity.items():
            if state.get(key) != now:
                raise ForgeError(
                    f"cannot resume the data loader: {key} was {state.get(key)!r} when the "
                    f"checkpoint was saved and is {now!r} now. Resume with "
                    "the same data, mixture, seed and global batch size, or start a new run."
                )
        if self.mixture is None and "mixture" in state:
            raise ForgeError(
                "cannot resume the data loader: the checkpoint was saved reading a mixture "
                f"({state['mixture']['sources']}), the config now reads one source. Resume "
                "with the same data.sources, or start a new run."
            )
        self.epoch = int(state["epoch"])
        self.batch = int(state["batch"])
        self._iter = None

    def _saved_mixture(self, state: dict[str, Any]) -> dict[str, Any]:
        """The saved mixture's identity, its schedule taken as today's when the two give
        every slot read so far the same row (a phase may be added after the resume
        point). A checkpoint from before phases kept its one plan's slot counts."""
        from forge_core.data.mix_schedule import same_prefix

        saved = dict(state["mixture"])
        if "slots_per_period" in saved:
            saved["schedule"] = [{"from": 0, "to": None, "counts": saved.pop("slots_per_period")}]
        schedule = self.mixture.schedule
        if any(saved.get(k) != v for k, v in self._identity()["mixture"].items() if k != "schedule"):
            return saved  # other sources: the caller says which
        read = int(state.get("batch", 0)) * self.global_batch
        if not (
            isinstance(saved.get("schedule"), list)
            and same_prefix(saved["schedule"], schedule.describe(), read)
        ):
            raise ForgeError(
                f"cannot resume the data loader: the checkpoint has read {read // schedule.step_slots:,} "
                "steps of a mixture whose weights over those steps (data.sources' weights, "
                "data.phases) the config now changes. Keep the weights and phases of the steps "
                "already trained (later phases may be added or changed), or start a new run."
            )
        saved["schedule"] = schedule.describe()
        return saved
