"""The read-only view a lifecycle plugin has of the running trainer (``run.view``).

Lifecycle hooks receive a :class:`~forge_core.api.RunContext`; its ``view`` is a
:class:`RunView` over the trainer (or over ``forge-run eval``'s model), so a third party
can write, for example, a downstream-task evaluator without reaching into trainer
internals. Everything is a property or a method that reads; nothing can be assigned.
The objects it hands out are the live ones (the model's parameters are the ones being
trained): use them under :meth:`RunView.inference` and change none of them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch


class RunView:
    """What a lifecycle plugin may read of the run:

    - ``step``: optimizer steps taken so far (the step the hook is about);
    - ``parts``: the model parts this process holds (one, or several pipeline stages);
    - ``model``: the module to call for logits, ``model(input_ids, **metadata)``, or
      ``None`` when the model is split across pipeline stages (use ``evaluate``);
    - ``evaluate(batch) -> (loss_sum, tokens)``: the forward-only training loss of
      this process's rows under every parallel layout (``batch``: ``input_ids``,
      ``labels`` and the packer's metadata, on ``device``); call it on every process;
    - ``inference()``: a context in which the model is in eval mode with gradients off;
      every module gets its mode back afterwards;
    - ``device``, ``dp_rank``, ``dp_size``: where this process runs, and which
      data-parallel slice of a batch it reads (``batch[dp_rank::dp_size]`` style
      splits are the plugin's to choose);
    - ``tokenizer``, ``seq_len``;
    - ``train_rows``: the training rows (``num_rows``, ``seq_len``, ``read(indices) ->
      dict of int64 arrays``), ``None`` outside training and under a stream (its rows
      exist a window at a time);
    - ``heldout_documents()``: ``[(source label, DocumentStream)]``, the documents held
      out of training (``data.heldout``), read from the run's memory-mapped tokens
      (none under a stream, which has no held-out split).
    """

    __slots__ = ("_pmodel", "_step", "_device", "_tokenizer", "_seq_len", "_train_rows", "_heldout")

    def __init__(
        self,
        *,
        pmodel: Any,
        step: Callable[[], int],
        device: torch.device,
        tokenizer: Any,
        seq_len: int,
        train_rows: Any = None,
        heldout: Callable[[], list[tuple[str, Any]]] | None = None,
    ) -> None:
        for name, value in (
            ("_pmodel", pmodel),
            ("_step", step),
            ("_device", device),
            ("_tokenizer", tokenizer),
            ("_seq_len", seq_len),
            ("_train_rows", train_rows),
            ("_heldout", heldout),
        ):
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"the run view is read-only: {name!r} cannot be set")

    @property
    def step(self) -> int:
        return int(self._step())

    @property
    def parts(self) -> tuple[torch.nn.Module, ...]:
        return tuple(self._pmodel.parts)

    @property
    def model(self) -> torch.nn.Module | None:
        return self._pmodel.forward

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def dp_rank(self) -> int:
        return self._pmodel.dp_rank

    @property
    def dp_size(self) -> int:
        return self._pmodel.dp_size

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    @property
    def seq_len(self) -> int:
        return self._seq_len

    @property
    def train_rows(self) -> Any:
        return self._train_rows

    def heldout_documents(self) -> list[tuple[str, Any]]:
        return self._heldout() if self._heldout is not None else []

    @contextmanager
    def inference(self) -> Iterator[None]:
        from forge_core.train.evaluate import eval_mode

        with eval_mode([*self._pmodel.parts, self._pmodel.forward]):
            yield

    def evaluate(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        with self.inference():
            return self._pmodel.evaluate(batch)
