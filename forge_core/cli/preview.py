"""``forge-run preview CONFIG [key=value ...] [--rows N] [--json]``: the first rows a
config trains on, token by token, with the tokens that take a loss marked (what
axolotl's ``preprocess --debug`` shows).

The rows are the trainer's own: built by the path a run takes
(:func:`~forge_core.data.build.build_training_data`: the source, the chat template's
masks, the token cache, the packer) and read in the trainer's order (the loader of
:mod:`forge_core.data.loader` with ``run.seed`` and ``data.shuffle``), so ``--rows N``
shows the rows of the run's first ``N / train.batch_size`` steps. A token is marked
when a label names it: the label at ``i`` is the token at ``i + 1``, and a row's last
label names the token after the row, shown at its end. The marked tokens are therefore
exactly the ``labels != IGNORE_INDEX`` that the loss, and a step's ``tokens`` metric,
count (before any strategy's batch transform, as the trainer counts them).

Special tokens are written out when the tokenizer offers ``decode_special(ids)`` (the
built-ins do); a row's trailing padding is counted, not printed. On a terminal the
marked text is coloured; elsewhere it is wrapped in ``[[`` ``]]``. Nothing is trained
and no model is built; the token cache is filled as a run fills it, once.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs
import numpy as np

from forge_core.api import IGNORE_INDEX, INPUT_IDS, LABELS, ForgeError, Plan, SpecialDecodingTokenizer

if TYPE_CHECKING:
    from forge_core.registry import Registries

OPEN, CLOSE = "[[", "]]"
GREEN, DIM, RESET = "\x1b[32m", "\x1b[2m", "\x1b[0m"


@attrs.frozen
class RowPreview:
    """One row as the trainer reads it: ``ids`` (the row's tokens, then the token after
    the row when its last label names it) and, per id, whether it takes a loss."""

    row: int  # its number in the packed layout
    ids: list[int]
    trained: list[bool]
    length: int  # tokens in the row (data.seq_len)
    padding: int  # untrained PAD tokens at its end

    @property
    def labelled(self) -> int:
        return sum(self.trained)


def row_preview(row: int, input_ids: np.ndarray, labels: np.ndarray, pad_id: int) -> RowPreview:
    """The preview of one row from its batch tensors (see the module docstring)."""
    input_ids, labels = np.asarray(input_ids).tolist(), np.asarray(labels)
    named = (labels != IGNORE_INDEX).tolist()
    ids, trained = list(input_ids), [False, *named[:-1]]
    if named and named[-1]:
        ids.append(int(labels[-1]))
        trained.append(True)
    padding = 0
    while padding < len(input_ids) and ids[len(input_ids) - 1 - padding] == pad_id:
        if trained[len(input_ids) - 1 - padding]:
            break
        padding += 1
    return RowPreview(row, ids, trained, len(input_ids), padding)


def load_plan(config_path: str, overrides: list[str]) -> tuple[Plan, Any]:
    """``(plan, registries)`` of the config laid out for one process (the rows do not
    depend on the layout), refused with ``forge-run check``'s report on errors."""
    from forge_core.cli.report import render
    from forge_core.config.schema import ParallelSection
    from forge_core.judge import judge_config
    from forge_core.resolve import load_resolved

    config, registries = load_resolved(config_path, overrides)
    config = attrs.evolve(config, parallel=ParallelSection(), train=attrs.evolve(config.train, compile=False))
    judged = judge_config(config, registries, world_size=1)
    if judged.errors:
        raise ForgeError(
            f"{render(judged.errors)}\n{config_path}: invalid: {len(judged.errors)} error(s); nothing to "
            "preview until they are fixed."
        )
    return judged.plan, registries


def first_rows(plan: Plan, registries: Registries, tokenizer: Any, count: int) -> list[RowPreview]:
    """The first ``count`` rows the trainer reads (fewer when the data has fewer)."""
    from forge_core.data.build import build_training_data
    from forge_core.data.loader import StatefulLoader

    config = plan.config
    data = build_training_data(plan, registries, tokenizer)
    print(data.summary, file=sys.stderr, flush=True)
    if data.rows is None:
        raise ForgeError(
            "data.stream.enabled: a streamed source is packed while training runs, so there are no rows "
            "to preview before. Preview with data.stream.enabled=false: the same records, masks and packer."
        )
    # One row a batch, in the loader's order: row k is the k-th of the run's global batches.
    loader = StatefulLoader(data.rows, 1, seed=config.run.seed, shuffle=config.data.shuffle)
    keys = loader.keys(0, 0)
    out = []
    for _ in range(min(count, int(data.rows.num_rows))):
        key = next(keys)
        batch = data.rows.read(key)
        out.append(row_preview(int(key[0]), batch[INPUT_IDS][0], batch[LABELS][0], int(tokenizer.pad_id)))
    return out


def spelling(tokenizer: Any) -> Callable[[list[int]], str]:
    """How ids are written: special tokens spelled out where the tokenizer can."""
    return tokenizer.decode_special if isinstance(tokenizer, SpecialDecodingTokenizer) else tokenizer.decode


def runs(preview: RowPreview) -> list[tuple[bool, list[int]]]:
    """The row's printed ids (padding left out) in runs of the same mark."""
    ids = preview.ids[: preview.length - preview.padding] + preview.ids[preview.length :]
    trained = preview.trained[: preview.length - preview.padding] + preview.trained[preview.length :]
    out: list[tuple[bool, list[int]]] = []
    for i, mark in zip(ids, trained):
        if out and out[-1][0] == mark:
            out[-1][1].append(i)
        else:
            out.append((mark, [i]))
    return out


def render_row(preview: RowPreview, text: Callable[[list[int]], str], colour: bool) -> str:
    """The row's text, the trained runs coloured (a terminal) or bracketed."""
    parts = []
    for mark, ids in runs(preview):
        piece = text(ids)
        if colour:
            parts.append(f"{GREEN if mark else DIM}{piece}{RESET}")
        else:
            parts.append(f"{OPEN}{piece}{CLOSE}" if mark else piece)
    return "".join(parts)


def header(n: int, preview: RowPreview) -> str:
    pad = f", {preview.padding} padding (not shown)" if preview.padding else ""
    return (
        f"--- row {n + 1} (layout row {preview.row}): {preview.labelled} of {preview.length} tokens "
        f"take a loss{pad}"
    )


def as_json(previews: list[RowPreview], text: Callable[[list[int]], str]) -> dict[str, Any]:
    return {
        "rows": [
            {
                "row": p.row,
                "length": p.length,
                "labelled": p.labelled,
                "padding": p.padding,
                "tokens": [{"id": i, "text": text([i]), "trained": t} for i, t in zip(p.ids, p.trained)],
            }
            for p in previews
        ],
        "labelled": sum(p.labelled for p in previews),
        "tokens": sum(p.length for p in previews),
    }


def main(args: Any) -> int:
    from forge_core import components

    if args.rows < 1:
        raise ForgeError(f"--rows must be 1 or more, got {args.rows}")
    plan, registries = load_plan(args.config, list(args.overrides))
    tokenizer = components.tokenizer(plan, registries)
    previews = first_rows(plan, registries, tokenizer, args.rows)
    text = spelling(tokenizer)
    if args.json:
        print(json.dumps(as_json(previews, text)))
        return 0
    colour = sys.stdout.isatty() and not os.environ.get("NO_COLOR")
    for n, preview in enumerate(previews):
        print(header(n, preview))
        print(render_row(preview, text, colour))
    labelled, total = sum(p.labelled for p in previews), sum(p.length for p in previews)
    legend = "green" if colour else f"marked {OPEN} {CLOSE}"
    print(
        f"{len(previews)} row(s): {labelled:,} of {total:,} tokens ({labelled / max(total, 1):.1%}) take a "
        f"loss ({legend}); a row's last label names the token after it, shown at its end"
    )
    return 0
