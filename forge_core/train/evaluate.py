"""Held-out evaluation: the loss and perplexity of a model on rows it does not train on.

What is evaluated (:func:`build_eval_data`): the held-out split of the training data
(``data.heldout``: every source's held-out documents, read from the same memory-mapped
tokens), or every document of ``eval.source``. Whatever the training packer, the rows
hold every document whole (:mod:`forge_core.data.whole_documents`): several to a row
with ``doc_ids`` and ``positions`` when the run can isolate documents, else one to a
row; a document longer than ``seq_len`` is scored in windows and counted in the summary.
So every target token is scored once and the loss is the mean over the target tokens of
each document's loss alone: perplexity is per document, never across a boundary.

How (:func:`run_eval`): the rows are read in order (no shuffling) and cut into global
batches of ``eval.batch_size`` rows; every data-parallel rank takes its contiguous slice
of each, exactly as the training loader does, so every layout scores the same rows. A
last batch that the rows do not fill is completed with copies of the last row whose
labels are all -100: every rank keeps the same shapes (collectives and pipeline
microbatches stay aligned) and the copies add nothing. Each batch goes through
:meth:`~forge_core.distributed.parallelize.ParallelModel.evaluate` (forward only, under
``torch.no_grad``, the training loss function), which returns the batch's loss *sum*
and its count of labelled tokens; only those two numbers are kept, so memory does not
grow with the number of batches and no logits outlive the batch that made them. The
sums are added over processes with the weights the training step uses (every process
of one data-parallel slice holds the same sums). The model's parts are switched to
eval mode for the duration and each module is put back in the mode it had.

The loss is the token-weighted mean of the per-token cross-entropy, the perplexity its
exponential. Under another objective (``train.objective``) the batches go through it
instead: the loss is its mean over what it counts (the pairs of ``dpo``), reported with
that count (``eval/pairs``) and its metrics' means (``eval/dpo/reward_accuracy``), and
no perplexity.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import attrs
import numpy as np
import torch

from forge_core.api import DOC_IDS, IGNORE_INDEX, LABELS, POSITIONS, ForgeError, Plan

if TYPE_CHECKING:
    from forge_core.registry import Registries

#: Metric names, as loggers receive them (``eval/<source>/loss`` per source of a mixture).
LOSS, PERPLEXITY, TOKENS = "eval/loss", "eval/perplexity", "eval/tokens"


def _stderr(message: str) -> None:
    print(f"forge: {message}", file=sys.stderr, flush=True)


@attrs.frozen
class EvalSet:
    """The rows of one source to evaluate on: ``rows`` has ``num_rows``, ``seq_len`` and
    ``read(indices) -> dict of int64 arrays`` (like the training rows)."""

    label: str
    rows: Any
    documents: int
    tokens: int
    #: Documents longer than seq_len, scored in windows of it (each without the context
    #: before it).
    windowed: int = 0


@attrs.frozen
class EvalData:
    """Everything one evaluation reads, and the limit on how many rows it reads."""

    sets: tuple[EvalSet, ...]
    batch_rows: int  # rows per global batch
    max_rows: int  # rows evaluated in all (the limits applied)
    what: str  # "the held-out split" or "source 'text'"

    @property
    def num_batches(self) -> int:
        return sum(math.ceil(rows / self.batch_rows) for _, rows in self.row_counts())

    def row_counts(self) -> list[tuple[EvalSet, int]]:
        """``(set, rows of it evaluated)``: the sets in order until ``max_rows`` is spent."""
        out, left = [], self.max_rows
        for s in self.sets:
            take = min(s.rows.num_rows, left)
            if take > 0:
                out.append((s, take))
            left -= take
        return out

    @property
    def summary(self) -> str:
        rows = sum(n for _, n in self.row_counts())
        total = sum(s.rows.num_rows for s in self.sets)
        docs = sum(s.documents for s in self.sets)
        seq_len = self.sets[0].rows.seq_len
        limited = f" (limited to {rows:,} of {total:,} rows)" if rows < total else ""
        windowed = sum(s.windowed for s in self.sets)
        whole = (
            f"each whole but {windowed:,} longer than {seq_len} tokens, scored in windows of {seq_len} "
            "without the context before each"
            if windowed
            else "each whole"
        )
        return (
            f"eval: {what_rows(rows)} of {seq_len} tokens from {docs:,} documents of {self.what} "
            f"({whole}){limited}, {self.num_batches} batch(es) of {self.batch_rows} rows"
        )


def what_rows(n: int) -> str:
    return f"{n:,} row{'s' if n != 1 else ''}"


def row_limit(config: Any) -> int:
    """Rows one evaluation reads at most: ``eval.max_batches`` batches, ``eval.max_tokens``
    tokens rounded up to whole rows; without either, no limit."""
    ev = config.eval
    limits = []
    if ev.max_batches:
        limits.append(ev.max_batches * ev.batch_rows(config.train))
    if ev.max_tokens:
        limits.append(math.ceil(ev.max_tokens / config.data.seq_len))
    return min(limits) if limits else sys.maxsize


def isolates_documents(plan: Plan) -> bool:
    """Whether the run can keep documents apart in a row: its attention backend honours
    ``doc_ids``, its model takes ``doc_ids`` and ``positions``, and every active strategy
    forwards both to every layer."""
    backend, model = plan.specs.get("attention"), plan.specs.get("model")
    return (
        backend is not None
        and DOC_IDS in backend.honours
        and model is not None
        and {DOC_IDS, POSITIONS} <= model.accepts
        and all(s.spec.forwards_key(DOC_IDS) and s.spec.forwards_key(POSITIONS) for s in plan.strategies)
    )


def build_eval_data(
    plan: Plan,
    registries: Registries,
    tokenizer: Any,
    *,
    is_main: bool = True,
    report: Callable[[str], None] = _stderr,
) -> EvalData:
    """The rows of the judged ``plan``'s evaluation (module docstring). An evaluation
    with nothing to read is a ForgeError saying which source and why."""
    from forge_core import components
    from forge_core.data.build import heldout_documents, source_shards
    from forge_core.data.packed_rows import PackedRows
    from forge_core.data.shards import stream as document_stream
    from forge_core.data.whole_documents import whole_documents

    config = plan.config
    data = config.data
    eos, pad, vocab = int(tokenizer.eos_id), int(tokenizer.pad_id), int(tokenizer.vocab_size)
    chosen = plan.eval_source
    if chosen is None:
        streams = heldout_documents(plan, registries, tokenizer, is_main=is_main)
        what = "the held-out split"
        empty = (
            f"data.heldout.fraction {data.heldout.fraction} (seed {data.heldout.seed}) "
            "holds out no document: "
            if not any(len(s) for _, s in streams)
            else ""
        )
    else:
        source = components.chosen_source(plan, registries, chosen)
        shards, _ = source_shards(
            source, tokenizer, data.cache, f"eval source {chosen.name!r}", is_main=is_main, report=report
        )
        streams = [(chosen.name, document_stream(shards, eos, vocab))]
        what = f"source {chosen.name!r} ({source.describe()})"
        empty = ""
    sets = []
    isolate = isolates_documents(plan)
    for label, stream in streams:
        if not len(stream):
            continue
        laid = whole_documents(stream.lengths, data.seq_len, isolate=isolate)
        rows = PackedRows(laid.layout, stream, eos_id=eos, pad_id=pad)
        if rows.num_rows:
            sets.append(EvalSet(label, rows, len(stream), int(stream.total), laid.windowed))
    if not sets:
        if chosen is None:
            why = empty or "it holds no document: "
            fix = "raise data.heldout.fraction, or evaluate on another source with eval.source"
        else:
            why = "it has no document: "
            fix = (
                "point eval.source_options at documents, or evaluate on the held-out split (eval.source: '')"
            )
        raise ForgeError(f"nothing to evaluate on in {what}: {why}{fix}.")
    return EvalData(tuple(sets), config.eval.batch_rows(config.train), row_limit(config), what)


def rank_batches(
    rows: Any, num_rows: int, batch_rows: int, dp_rank: int, dp_size: int
) -> Iterator[dict[str, torch.Tensor]]:
    """This rank's slice of each global batch of the first ``num_rows`` rows, in order;
    the slots past ``num_rows`` hold the last row with every label -100."""
    if batch_rows % dp_size:
        raise ForgeError(
            f"the evaluation batch of {batch_rows} rows cannot be split over {dp_size} "
            "data-parallel ranks: make eval.batch_size a multiple of their number"
        )
    per = batch_rows // dp_size
    for start in range(0, num_rows, batch_rows):
        wanted = np.arange(start + dp_rank * per, start + (dp_rank + 1) * per)
        filler = wanted >= num_rows
        batch = rows.read(np.minimum(wanted, num_rows - 1))
        tensors = {k: torch.from_numpy(np.ascontiguousarray(v, dtype=np.int64)) for k, v in batch.items()}
        if filler.any():
            tensors[LABELS][torch.from_numpy(filler)] = IGNORE_INDEX
        yield tensors


def perplexity(loss: float) -> float:
    """``exp(loss)``; infinite where it overflows, NaN for a NaN loss."""
    try:
        return math.exp(loss)
    except OverflowError:
        return math.inf


@attrs.frozen
class EvalResult:
    loss: float
    tokens: int
    rows: int
    batches: int
    seconds: float
    by_source: dict[str, tuple[float, int]]  # label -> (loss, tokens)
    #: What ``tokens`` counts (the objective's unit) and whether the loss is the token
    #: cross-entropy (``ObjectiveSpec.per_token``: only then is there a perplexity).
    unit: str = "tokens"
    per_token: bool = True
    #: The objective's metrics, each a mean over the count (``dpo/reward_accuracy``).
    extra: dict[str, float] = attrs.field(factory=dict)

    @property
    def perplexity(self) -> float:
        return perplexity(self.loss)

    def metrics(self) -> dict[str, Any]:
        """``eval/loss``, ``eval/perplexity``, ``eval/tokens``; with several sources also
        ``eval/<source>/loss`` and ``eval/<source>/perplexity``. Under an objective that
        is not per token: ``eval/loss``, ``eval/<unit>`` and ``eval/<metric>`` of each of
        its metrics (``eval/<source>/loss`` per source)."""
        if not self.per_token:
            out: dict[str, Any] = {LOSS: self.loss, f"eval/{self.unit}": self.tokens}
            out.update({f"eval/{name}": value for name, value in self.extra.items()})
            if len(self.by_source) > 1:
                out.update({f"eval/{label}/loss": loss for label, (loss, _) in self.by_source.items()})
            return out
        out = {LOSS: self.loss, PERPLEXITY: self.perplexity, TOKENS: self.tokens}
        if len(self.by_source) > 1:
            for label, (loss, _) in self.by_source.items():
                out[f"eval/{label}/loss"] = loss
                out[f"eval/{label}/perplexity"] = perplexity(loss)
        return out

    def to_json(self) -> dict[str, Any]:
        def clean(x: float) -> float | None:
            return x if math.isfinite(x) else None

        return {
            "loss": clean(self.loss),
            "perplexity": clean(self.perplexity),
            "tokens": self.tokens,
            "rows": self.rows,
            "batches": self.batches,
            "seconds": round(self.seconds, 3),
            "sources": {
                k: {"loss": clean(v[0]), "perplexity": clean(perplexity(v[0])), "tokens": v[1]}
                for k, v in self.by_source.items()
            },
        }


class eval_mode:
    """``with eval_mode(modules):`` every module (and submodule) in eval mode and
    gradients off; afterwards each one back in the mode it had."""

    def __init__(self, modules: list[torch.nn.Module]) -> None:
        self.tops = [module for module in modules if module is not None]
        self.modules = [m for module in self.tops for m in module.modules()]
        self.no_grad = torch.no_grad()

    def __enter__(self) -> None:
        self.modes = [m.training for m in self.modules]
        for top in self.tops:
            top.eval()  # through eval(), which a module may override
        self.no_grad.__enter__()

    def __exit__(self, *exc: Any) -> None:
        self.no_grad.__exit__(*exc)
        for m, mode in zip(self.modules, self.modes):
            m.training = mode


def run_eval(
    pmodel: Any,
    data: EvalData,
    loss_fn: Callable | None = None,
    *,
    device: torch.device,
    precision: str = "fp32",
    slice_weight: float = 1.0,
    progress: Callable[[int, int], None] | None = None,
    objective: Any = None,
) -> EvalResult:
    """Evaluate ``pmodel`` (a :class:`~forge_core.distributed.parallelize.ParallelModel`) on
    ``data`` with ``loss_fn`` (``None``: the model's own objective, else its training
    loss). Every process of the run calls it; ``slice_weight`` is ``dp_size / world_size``
    (how much one process's sums count). ``progress(batches done, batches in all)`` is
    called after every batch. ``objective``: the :class:`~forge_core.api.ObjectiveSpec`
    of the model's objective (its unit, whether it is per token); ``None``: the token
    cross-entropy's."""
    from forge_core.distributed.placement import all_reduce_sum, to_device
    from forge_core.train.precision import autocast as precision_autocast

    t0 = time.perf_counter()
    total_batches, done = data.num_batches, 0
    autocast = precision_autocast(precision, device)
    by_source: dict[str, tuple[float, int]] = {}
    rows, loss_total, tokens_total = 0, 0.0, 0.0
    extra: dict[str, float] = {}
    pmodel.take_objective_sums()  # what a training step left is not this evaluation's
    with eval_mode([*pmodel.parts, pmodel.forward]):
        for eval_set, num_rows in data.row_counts():
            sums = torch.zeros(2, dtype=torch.float64, device=device)  # loss sum, tokens
            for batch in rank_batches(
                eval_set.rows, num_rows, data.batch_rows, pmodel.dp_rank, pmodel.dp_size
            ):
                batch = to_device(batch, device)
                with autocast:
                    loss_sum, tokens = pmodel.evaluate(batch, loss_fn)
                sums[0] += loss_sum.double()
                sums[1] += torch.as_tensor(tokens, device=device).double()
                done += 1
                if progress is not None:
                    progress(done, total_batches)
            # Under a token split (cp) each process's sums cover its share of the rows' tokens.
            weight = slice_weight * pmodel.token_split
            objective_sums = pmodel.take_objective_sums()
            loss_sum, tokens, *metric_sums = all_reduce_sum(
                [float(x) * weight for x in [*sums.tolist(), *objective_sums.values()]], device
            )
            by_source[eval_set.label] = (loss_sum / tokens if tokens else math.nan, round(tokens))
            rows, loss_total, tokens_total = rows + num_rows, loss_total + loss_sum, tokens_total + tokens
            for name, value in zip(objective_sums, metric_sums):
                extra[name] = extra.get(name, 0.0) + value
    loss = loss_total / tokens_total if tokens_total else math.nan
    extra = {name: value / tokens_total if tokens_total else math.nan for name, value in extra.items()}
    unit, per_token = ("tokens", True) if objective is None else (objective.unit, objective.per_token)
    return EvalResult(
        loss, round(tokens_total), rows, done, time.perf_counter() - t0, by_source, unit, per_token, extra
    )
