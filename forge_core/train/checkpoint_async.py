"""Checkpoints written in the background (``checkpoint.async: true``).

A save copies the model and optimizer state in memory (:func:`stage`, DCP's
``DefaultStager``: the step after it may change the parameters in place) and hands
the copy to ``torch.distributed.checkpoint.async_save``, which writes it from a thread
of its own, every file flushed to disk (``fsync``) before it reports done. A thread of
this module then waits for that, and does what completes a checkpoint exactly as a
synchronous save does, in the same order: the processes agree that every one of them
wrote its part, rank 0 hashes the files into the manifest, renames the directory and
moves ``latest``, and the processes agree again (:class:`InFlight`). Until then the
checkpoint is a ``.tmp-step-N`` directory, which resume never picks.

The threads of several processes talk over a process group of their own (gloo), made
once by every process at its first background save: collectives of the training
loop's group, issued by the main thread meanwhile, can then never interleave with them.

At most one save is in flight: :meth:`InFlight.wait` is called before the next save,
after the last one (the end of training, SIGTERM/SIGINT) and when a run fails, so a
process never exits with a checkpoint half written by its own threads.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from torch.distributed.checkpoint.staging import AsyncStager, DefaultStager, StagingOptions

from forge_core.distributed.placement import is_distributed


def stage(state: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``state`` in CPU memory that later steps cannot change: every tensor
    copied (local shards of distributed tensors), the other values deep-copied."""
    # No pinned or shared memory and no staging thread: those need an accelerator, and
    # the copy must be complete before the next step anyway.
    stager = DefaultStager(StagingOptions(False, False, False, False))
    try:
        return stager.stage(state)
    finally:
        stager.close()  # forgets its cache of copies; the copy returned stays alive


class Staged(AsyncStager):
    """Hands ``async_save`` a state :func:`stage` already copied: copying it again would
    double the stall and the memory."""

    _synchronize_after_execute = False

    def stage(self, state_dict: Any) -> Any:
        return state_dict


_group: Any = None


def process_group() -> Any:
    """The process group the background saves of this process use (``None`` alone).
    Made on first use; every process makes it at the same save, as a new group must be."""
    global _group
    if _group is None and is_distributed():
        import torch.distributed as dist

        _group = dist.new_group(backend="gloo")
    return _group


class InFlight:
    """One checkpoint being completed in the background: ``complete()`` runs in a thread
    of its own (it raises what failed the save); ``saved()`` runs on the caller's thread
    once it succeeded, from :meth:`poll` or :meth:`wait`."""

    def __init__(self, complete: Callable[[], None], saved: Callable[[], None]) -> None:
        self._saved = saved
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="forge-checkpoint")
        self._future: Future = self._pool.submit(complete)
        self._pool.shutdown(wait=False)  # the thread ends with its one job

    def failed(self) -> bool:
        """Whether the save has ended in an error (without waiting: no collective, no sync)."""
        return self._future.done() and self._future.exception() is not None

    def poll(self) -> bool:
        """Without waiting: whether the save has succeeded (``saved()`` is then called); a
        failure is kept for :meth:`wait` to raise."""
        if not self._future.done() or self._future.exception() is not None:
            return False
        self._finish()
        return True

    def wait(self) -> None:
        """Until the checkpoint is durable, or raise what failed it."""
        self._future.result()
        self._finish()

    def _finish(self) -> None:
        saved, self._saved = self._saved, None
        if saved is not None:
            saved()
