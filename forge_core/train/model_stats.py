"""Statistics a model reports about its own training forwards, summed over the
processes and logged with every step (a mixture-of-experts layer's tokens per expert,
its auxiliary losses, the tokens it dropped).

A module of the model's parts reports by having a method ``step_stats() -> dict[str,
Tensor]``: sums accumulated over the training forwards since its last call (every
micro-batch of the step), then reset. Modules are found by that method, never by their
class. The function ``summarize_stats(totals) -> dict[str, float]`` of the module's
Python module turns the totals, summed over processes, into the reported figures;
without one, each one-element total is reported as it is.

Names: ``<group>/<layer>/<figure>``. ``group`` is the module's ``stats_group``
attribute, else the last part of its Python module's name (``forge_plugins.models.moe``
reports under ``moe``). ``layer`` is the path of the block that holds the module
(``layers.3``; the model's parallel contract names the blocks), or the module's own path
when it sits outside the blocks or shares its block with another reporting module. Each
group also gets an all-layer summary: ``<group>/<figure>`` from the totals summed over
its layers (the whole model as one layer, when the layers' totals have the same shapes)
and ``<group>/max/<figure>``, the largest value of any layer.

Over processes, a statistic is summed over those that saw different tokens (the
data-parallel ranks, the ranks a batch's tokens are split over, and any other dimension
that reads its own batch) and not over copies: each process weights its numbers by one
over the degrees of the dimensions that neither read their own batch, split tokens nor
split layers (tensor parallelism: every tensor-parallel rank routes the same tokens).
Pipeline stages hold different layers, so each reports its own and the others add
zeros. Which layers exist, with which keys and shapes, is agreed once at the first step
(one ``all_gather_object``); from then on the numbers travel in the step's all-reduce of
the loss (:func:`~forge_core.train.step.optimizer_step`), so rank 0 logs the sums.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from forge_core.api import ForgeError, contract_of

#: The method a reporting module has, and the function of its Python module.
METHOD = "step_stats"
SUMMARIZE = "summarize_stats"
#: The name of a group's worst-layer summary.
WORST = "max"


def copies(dims: Sequence[Any], degrees: dict[str, int]) -> int:
    """How many processes hold the same layers and saw the same tokens: the product of
    the degrees of the dimensions that neither read their own batch, split tokens nor
    split layers (``tp``)."""
    return math.prod(
        max(degrees.get(d.name, 1), 1)
        for d in dims
        if not (d.reads_own_batch or d.splits_tokens or d.splits_layers)
    )


def _home(module: Any) -> str:
    """The Python module of the class that defines the module's ``step_stats`` (not that
    of a wrapper class a strategy made, such as FSDP's ``FSDP<class>``)."""
    owner = next((c for c in type(module).__mro__ if METHOD in vars(c)), type(module))
    return owner.__module__


def _group(module: Any) -> str:
    own = getattr(module, "stats_group", None)
    return own if isinstance(own, str) and own else _home(module).rpartition(".")[2]


def reporters(parts: Sequence[torch.nn.Module]) -> list[tuple[str, Any]]:
    """``(name, module)`` of every reporting module of ``parts``, named
    ``<group>/<layer>``, in the parts' order."""
    found: list[tuple[str, str, Any]] = []  # (group, path, module)
    block_of: dict[str, str] = {}  # module path -> the path of the block that holds it
    for part in parts:
        contract = contract_of(part)
        blocks = getattr(part, contract.blocks, None) if contract is not None else None
        prefixes = []
        if blocks is not None:
            prefixes = [f"{contract.blocks}.{key}" for key, _ in blocks.named_children()]
        for path, module in part.named_modules():
            if callable(getattr(module, METHOD, None)):
                found.append((_group(module), path, module))
                holder = next((p for p in prefixes if path.startswith(p + ".")), None)
                if holder is not None:
                    block_of[path] = holder
    per_block: dict[tuple[str, str], int] = {}
    for group, path, _ in found:
        if path in block_of:
            per_block[group, block_of[path]] = per_block.get((group, block_of[path]), 0) + 1
    named = []
    for group, path, module in found:
        block = block_of.get(path)
        layer = block if block is not None and per_block[group, block] == 1 else (path or "model")
        named.append((f"{group}/{layer}", module))
    return named


class ModelStatistics:
    """Collects the reporting modules' statistics of one step (:meth:`local`, this
    process's weighted numbers for the step's all-reduce) and turns their sums over the
    processes into metrics (:meth:`metrics`). ``gather(obj) -> [obj of every process]``
    (identity in one process) agrees the layout at the first step."""

    def __init__(
        self,
        parts: Sequence[torch.nn.Module],
        weight: float,
        gather: Callable[[Any], list[Any]] = lambda obj: [obj],
    ) -> None:
        self.modules = reporters(parts)
        self.weight = weight
        self.gather = gather
        #: ``(name, key, shape)`` of every total of every process, in a fixed order;
        #: ``None`` until the first step.
        self.layout: list[tuple[str, str, tuple[int, ...]]] | None = None
        self.summarizers: dict[str, Callable[[dict[str, torch.Tensor]], dict[str, float]] | None] = {}

    def _read(self) -> dict[tuple[str, str], torch.Tensor]:
        read: dict[tuple[str, str], torch.Tensor] = {}
        for name, module in self.modules:
            stats = getattr(module, METHOD)()
            if not isinstance(stats, dict):
                raise ForgeError(
                    f"{type(module).__name__}.{METHOD}() ({name}) returned {type(stats).__name__}; it must "
                    "return a dict of statistic name to tensor."
                )
            for key, value in stats.items():
                try:
                    read[name, key] = torch.as_tensor(value).detach().to("cpu", torch.float64)
                except (TypeError, ValueError, RuntimeError):
                    raise ForgeError(
                        f"{type(module).__name__}.{METHOD}() ({name}) returned {key!r} = {value!r}; a "
                        "statistic is a number or a tensor of numbers."
                    ) from None
        return read

    def _agree(self, read: dict[tuple[str, str], torch.Tensor]) -> None:
        mine = sorted({(name, key, tuple(t.shape)) for (name, key), t in read.items()})
        # Where each layer's summary comes from travels too: a pipeline stage summarises
        # the layers of the other stages as well.
        homes = {name: _home(module) for name, module in self.modules}
        layout: dict[tuple[str, str], tuple[int, ...]] = {}
        for entries, their_homes in self.gather((mine, homes)):
            homes = {**their_homes, **homes}
            for name, key, shape in entries:
                if layout.setdefault((name, key), shape) != shape:
                    raise ForgeError(
                        f"statistic {name}/{key} has shape {list(layout[name, key])} on one process and "
                        f"{list(shape)} on another; every copy of a layer must report the same shapes."
                    )
        self.layout = [(name, key, shape) for (name, key), shape in sorted(layout.items())]
        self.summarizers = {
            name: getattr(importlib.import_module(home), SUMMARIZE, None) for name, home in homes.items()
        }

    def local(self) -> list[float]:
        """This process's statistics of the step (read and reset), weighted, flattened in
        the agreed layout: layers this process does not hold add zeros."""
        read = self._read()
        if self.layout is None:
            self._agree(read)
        known = {(name, key) for name, key, _ in self.layout}
        new = sorted(set(read) - known)
        if new:
            name, key = new[0]
            raise ForgeError(
                f"statistic {name}/{key} was not reported at the first step; {METHOD}() must return the "
                "same keys at every step."
            )
        out: list[float] = []
        for name, key, shape in self.layout:
            value = read.get((name, key))
            size = math.prod(shape)
            out += [0.0] * size if value is None else (value.reshape(-1) * self.weight).tolist()
        return out

    def totals(self, summed: Sequence[float]) -> dict[str, dict[str, torch.Tensor]]:
        """``{layer name: {key: total}}`` from the sums of :meth:`local` over every process."""
        totals: dict[str, dict[str, torch.Tensor]] = {}
        at = 0
        for name, key, shape in self.layout or ():
            size = math.prod(shape)
            flat = torch.tensor(list(summed[at : at + size]), dtype=torch.float64)
            totals.setdefault(name, {})[key] = flat.reshape(shape)
            at += size
        return totals

    def metrics(self, summed: Sequence[float]) -> dict[str, float]:
        """The step's metrics from the sums of :meth:`local` over every process."""
        totals = self.totals(summed)
        if not totals:
            return {}
        figures = {name: self._summarize(name, layer) for name, layer in totals.items()}
        out = {f"{name}/{figure}": v for name, layer in figures.items() for figure, v in layer.items()}
        groups: dict[str, list[str]] = {}
        for name in totals:
            groups.setdefault(name.partition("/")[0], []).append(name)
        for group, names in groups.items():
            for figure in sorted({f for n in names for f in figures[n]}):
                values = [figures[n][figure] for n in names if figure in figures[n]]
                out[f"{group}/{WORST}/{figure}"] = max(values)
            out.update({f"{group}/{figure}": v for figure, v in self._whole(names, totals).items()})
        return out

    def _summarize(self, name: str, totals: dict[str, torch.Tensor]) -> dict[str, float]:
        summarize = self.summarizers.get(name)
        if summarize is None:
            return {key: float(t) for key, t in totals.items() if t.numel() == 1}
        return {figure: float(value) for figure, value in summarize(totals).items()}

    def _whole(self, names: list[str], totals: dict[str, dict[str, torch.Tensor]]) -> dict[str, float]:
        """A group's layers as one: their totals summed (when their keys and shapes agree)."""
        first = totals[names[0]]
        shapes = {k: t.shape for k, t in first.items()}
        if any({k: t.shape for k, t in totals[n].items()} != shapes for n in names):
            return {}
        return self._summarize(names[0], {k: sum(totals[n][k] for n in names) for k in first})
