"""Context-parallel load balance: how evenly each split shares a packed row's attention.

Rows of 8192 and 32768 tokens packed with documents of log-normal length (median 512,
sigma 1.0; ``forge_core.testing.lognormal_lengths``, one seed per row), split over
cp = 2, 4, 8 ranks by the contiguous split (the baseline), ``zigzag`` and ``documents``
(``forge_plugins.context_parallel.balance``). Per split, over all rows, the mean and the
worst of:

- ``imbalance``: the busiest rank's causal attention work (keys attended, summed over
  its queries) over the mean rank's; the step waits for the busiest rank. 1.0 is perfect.
- ``flex``: the busiest rank's non-empty 128 x 128 (query, key) blocks of a block-sparse
  document mask over one process's count / cp: what block-sparse attention (flex) costs
  the busiest rank against a perfect split of one process's blocks. (Dense-mask sdpa and
  eager compute every (query, key) pair, so no split changes their work.)

Then the CPU time of ``shard_index(..., "documents")`` for a batch of 8 rows of 32768
(it runs every step on every rank; best of a few calls, one thread).

Run: ``python bench/context_parallel_balance.py`` (about a minute; ``--quick`` for a
smoke run).
"""

from __future__ import annotations

import argparse
import time

import torch

from forge_core.testing import lognormal_lengths, packed_metadata
from forge_plugins.context_parallel.balance import (
    contiguous_index,
    imbalance,
    shard_index,
    splits,
    token_work,
)

BLOCK = 128


def lognormal_rows(rows: int, seq_len: int, median: float = 512, sigma: float = 1.0) -> torch.Tensor:
    """``(rows, seq_len)`` doc_ids of rows packed with log-normal documents (seed = row)."""
    lengths = [lognormal_lengths(seq_len, median, sigma, seed=row) for row in range(rows)]
    return packed_metadata(lengths)[0]


def flex_blocks(doc_ids: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``(B, cp)``: non-empty ``BLOCK`` x ``BLOCK`` (query, key) blocks of each rank's
    queries under the causal document mask, its query blocks being ``BLOCK`` consecutive
    local queries. Needs every query block to be one aligned run of the row (true for
    all three splits when ``seq_len // (2 * cp)`` is a multiple of ``BLOCK``): its keys
    are then one run of key blocks, from its first token's document start to itself."""
    B, S = doc_ids.shape
    cp = index.shape[1]
    q = index.expand(B, cp, S // cp).reshape(B, cp, -1, BLOCK)
    if not bool((q[..., 0] % BLOCK == 0).all() and (q.diff(dim=-1) == 1).all()):
        raise ValueError("a query block is not one aligned run of the row")
    start = torch.arange(S) - token_work(doc_ids) + 1  # each token's document start
    first = start.gather(1, q[..., 0].reshape(B, -1)).view(B, cp, -1)
    return (q[..., 0] // BLOCK - first // BLOCK + 1).sum(-1)


def measure(seq_len: int, cp: int, rows: int) -> dict[str, dict[str, float]]:
    """Mean and worst ``imbalance`` and ``flex`` (module docstring) per split."""
    doc_ids = lognormal_rows(rows, seq_len)
    one = flex_blocks(doc_ids, contiguous_index(seq_len, 1)[None])[:, 0].double()
    out = {}
    for name, index in splits(doc_ids, cp).items():
        ratio = imbalance(doc_ids, index)
        flex = flex_blocks(doc_ids, index).max(dim=1).values / (one / cp)
        out[name] = {
            "mean": ratio.mean().item(),
            "worst": ratio.max().item(),
            "flex_mean": flex.mean().item(),
            "flex_worst": flex.max().item(),
        }
    return out


def documents_cpu_ms(batch: int = 8, seq_len: int = 32768, cp: int = 8, reps: int = 10) -> float:
    doc_ids = lognormal_rows(batch, seq_len)
    best = float("inf")
    for _ in range(reps + 1):
        start = time.process_time()
        shard_index(doc_ids, seq_len, cp, "documents")
        best = min(best, time.process_time() - start)
    return best * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few rows, one length")
    args = parser.parse_args()
    torch.set_num_threads(1)
    lengths = (8192,) if args.quick else (8192, 32768)
    print("imbalance: busiest rank's attention work / mean rank's")
    print("flex: busiest rank's non-empty mask blocks / (one process's / cp)")
    head = ("seq_len", "cp", "rows", "split", "imbalance mean", "worst", "flex mean", "worst")
    print("{:>7} {:>2} {:>4} {:>10}  {:>14} {:>6}  {:>9} {:>6}".format(*head))
    for seq_len in lengths:
        rows = 8 if args.quick else max(64, 2**21 // seq_len)
        for cp in (2, 4, 8):
            for name, r in measure(seq_len, cp, rows).items():
                print(
                    f"{seq_len:>7} {cp:>2} {rows:>4} {name:>10}  {r['mean']:>14.4f} {r['worst']:>6.4f}"
                    f"  {r['flex_mean']:>9.4f} {r['flex_worst']:>6.4f}"
                )
    ms = documents_cpu_ms(reps=2 if args.quick else 10)
    print(f"shard_index(documents), batch 8 x 32768, cp 8: {ms:.1f} ms CPU time (one thread)")


if __name__ == "__main__":
    main()
