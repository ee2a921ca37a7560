"""Rows of preference pairs, laid out as the packed data gives them: each pair
``(prompt, chosen, rejected)`` is ``prompt+chosen, EOS, prompt+rejected, EOS`` in one
row, the prompt untrainable and the completions (and their EOS) trainable; ``labels[i]``
is the next token when that token is trainable and in the same document, else -100;
``doc_ids`` counts the EOS tokens strictly before each token and ``positions`` restart
after each; the rest of the row is padding, never labelled. Shared by the DPO tests
and their distributed worker."""

from __future__ import annotations

import torch

IGNORE = -100
EOS, PAD = 1, 0


def pair_row(pairs: list[tuple[list[int], list[int], list[int]]], seq_len: int) -> dict[str, torch.Tensor]:
    """One row (batch of 1) holding ``pairs`` in order, chosen first."""
    stream: list[int] = []
    trainable: list[bool] = []
    for prompt, chosen, rejected in pairs:
        for completion in (chosen, rejected):
            stream += [*prompt, *completion, EOS]
            trainable += [False] * len(prompt) + [True] * len(completion) + [bool(completion)]
    if len(stream) > seq_len:
        raise ValueError(f"{len(stream)} tokens do not fit a row of {seq_len}")
    ids = stream + [PAD] * (seq_len - len(stream))
    labels, doc_ids, positions = [], [], []
    doc = pos = 0
    for i in range(seq_len):
        follows = i + 1 < len(stream) and trainable[i + 1] and stream[i] != EOS
        labels.append(stream[i + 1] if follows else IGNORE)
        doc_ids.append(doc)
        positions.append(pos)
        pos += 1
        if i < len(stream) and stream[i] == EOS:
            doc, pos = doc + 1, 0
    as_row = lambda xs: torch.tensor([xs], dtype=torch.long)  # noqa: E731
    return {
        "input_ids": as_row(ids),
        "labels": as_row(labels),
        "doc_ids": as_row(doc_ids),
        "positions": as_row(positions),
    }


def stack(rows: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    return {key: torch.cat([row[key] for row in rows]) for key in rows[0]}


def random_pairs(
    n: int, vocab: int, generator: torch.Generator, longest: int = 4
) -> list[tuple[list[int], list[int], list[int]]]:
    """``n`` pairs of random tokens (never EOS or PAD): prompts and completions of 1 to
    ``longest`` tokens, the chosen and the rejected completion different."""

    def tokens() -> list[int]:
        size = int(torch.randint(1, longest + 1, (1,), generator=generator))
        return torch.randint(2, vocab, (size,), generator=generator).tolist()

    out = []
    for _ in range(n):
        prompt, chosen, rejected = tokens(), tokens(), tokens()
        while rejected == chosen:
            rejected = tokens()
        out.append((prompt, chosen, rejected))
    return out
