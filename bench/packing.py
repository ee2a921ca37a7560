"""Packing benchmark: one run, same data, numbers side by side.

- ``concat`` (with isolation): tokens per CPU-second of its rows read as the loader
  reads them (``--batch`` rows a read; each read builds the batch's ids, labels, doc ids
  and positions over the whole batch at once) against the literal per-token Python loop
  (the reference definition) on the same tokens, alternated (loop, rows, loop, rows:
  ``--pairs`` pairs, the median ratio is the headline), and against ``np.copy`` of the
  same tokens (the memory-bandwidth ceiling). The loop's output and the rows are
  compared token for token first. Every row in one read is printed too: arrays of that
  size are fresh memory on every call, and faulting it in costs about as much as
  building the rows. What matters for training, the loader against the model, is
  measured by ``bench/data_scale.py``.
- ``bfd`` on one million documents with log-normal lengths (median 300 tokens, sigma
  1.0) into rows of 2048: fill efficiency, share of tokens kept, and wall time of the
  placement (split + best-fit decreasing), and how its CPU time grows from a tenth of
  the documents (linear: 10x; the test suite checks the work per document without a
  clock). Target: >= 99% fill, every token kept, under 5 s. Materializing every row of
  a million documents at once (~500 M tokens, four int64 arrays: ~16 GB) needs a large
  machine (a run never does: it reads a batch at a time), so layout plus all rows is
  timed on ``--materialize-docs`` documents (all of them with a large value).
- ``trl.pack_dataset(..., strategy="bfd")`` on the same documents when ``trl`` is
  importable (it truncates what overflows a row, so the share kept is printed).

Times are CPU seconds of the (single-threaded) numpy passes: on a shared machine wall
time measures the neighbours, and the first touch of fresh memory can cost more than
the packing (about 2 s per GB on the development VM).

Run: ``python bench/packing.py`` (about a minute; ``--quick`` for a smoke run).
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from forge_core.api import DOC_IDS, IGNORE_INDEX, INPUT_IDS, LABELS, POSITIONS
from forge_core.data.packed_rows import DocumentStream, PackedRows
from forge_plugins.packers.bfd import BfdPacker, place, split_documents
from forge_plugins.packers.concat import ConcatPacker
from forge_plugins.packers.options import ConcatOptions

EOS = 50_256
SEQ_LEN = 2048


def lognormal_lengths(n: int, rng: np.random.Generator) -> np.ndarray:
    """Document lengths (EOS included): log-normal, median 300, sigma 1.0, at least 1."""
    return np.maximum(1, np.rint(rng.lognormal(np.log(300), 1.0, n))).astype(np.int64)


def make_documents(lengths: np.ndarray, rng: np.random.Generator) -> list[np.ndarray]:
    tokens = rng.integers(0, EOS, int(lengths.sum()), dtype=np.int32)
    ends = np.cumsum(lengths)
    tokens[ends - 1] = EOS
    return np.split(tokens, ends[:-1])


def loop_reference(stream: list[int], seq_len: int, eos: int) -> tuple[list, list, list, list]:
    """The per-token definition of isolated ``concat`` on Python lists (the fastest
    form a per-token loop takes: no numpy scalar in the inner loop)."""
    rows = max(len(stream) - 1, 0) // seq_len
    inputs, labels, doc_ids, positions = [], [], [], []
    for r in range(rows):
        w = stream[r * seq_len : r * seq_len + seq_len + 1]
        count, pos = 0, 0
        i_row, l_row, d_row, p_row = [], [], [], []
        for i in range(seq_len):
            i_row.append(w[i])
            d_row.append(count)
            p_row.append(pos)
            if w[i] == eos:
                l_row.append(IGNORE_INDEX)
                count += 1
                pos = 0
            else:
                l_row.append(w[i + 1])
                pos += 1
        inputs.append(i_row)
        labels.append(l_row)
        doc_ids.append(d_row)
        positions.append(p_row)
    return inputs, labels, doc_ids, positions


def loop_to_arrays(stream: np.ndarray, seq_len: int, eos: int) -> dict[str, np.ndarray]:
    """The loop reference with ``concat``'s input and output: int64 arrays."""
    out = loop_reference(stream.tolist(), seq_len, eos)
    keys = (INPUT_IDS, LABELS, DOC_IDS, POSITIONS)
    return {k: np.array(v, dtype=np.int64) for k, v in zip(keys, out)}


def best_of(repeats: int, fn) -> float:
    """Best CPU time (``time.process_time``: the bench often shares its cores, and CPU
    time of a single-threaded pass is what it costs on one core) of ``repeats`` calls."""
    times = []
    for _ in range(repeats):
        start = time.process_time()
        fn()
        times.append(time.process_time() - start)
    return min(times)


def timed(fn) -> tuple[float, float, object]:
    """``(wall seconds, CPU seconds, result)`` of one call."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn()
    return time.perf_counter() - wall, time.process_time() - cpu, result


def read_in_batches(rows: PackedRows, batch: int) -> dict[str, np.ndarray]:
    """Every row, ``batch`` rows a read (as the loader reads them), joined at the end
    for the comparison (the join is outside the timed reads)."""
    parts = [
        rows.read(np.arange(lo, min(lo + batch, rows.num_rows))) for lo in range(0, rows.num_rows, batch)
    ]
    return {k: np.concatenate([p[k] for p in parts]) for k in rows.keys} if parts else {}


def bench_concat(docs: list[np.ndarray], batch: int, pairs: int, repeats: int) -> None:
    stream = DocumentStream.from_documents(docs)
    iso = ConcatPacker(ConcatOptions(isolate=True), seq_len=SEQ_LEN, eos_id=EOS, pad_id=0)
    plain = ConcatPacker(ConcatOptions(isolate=False), seq_len=SEQ_LEN, eos_id=EOS, pad_id=0)
    rows = PackedRows(iso.layout(stream.lengths), stream, eos_id=EOS, pad_id=0)
    plain_rows = PackedRows(plain.layout(stream.lengths), stream, eos_id=EOS, pad_id=0)
    n = rows.num_rows * SEQ_LEN  # tokens in whole rows: what both sides produce
    same = np.concatenate(docs)[: n + 1]  # the loop reads the same tokens (and one label past them)
    batches = range(0, rows.num_rows, batch)

    def read_all(r: PackedRows = rows) -> None:
        for lo in batches:
            r.read(np.arange(lo, min(lo + batch, r.num_rows)))

    # The bench is only worth printing if the two agree, on every token.
    ref = loop_to_arrays(same, SEQ_LEN, EOS)
    got = read_in_batches(rows, batch)
    assert all(np.array_equal(got[k], ref[k]) for k in ref)
    del got, ref

    # A B A B: the loop and the batched reads alternate, so load on the shared machine
    # falls on both; each pair gives a ratio and the median of them is the headline.
    loop_s, rows_s = [], []
    for _ in range(pairs):
        loop_s.append(best_of(1, lambda: loop_to_arrays(same, SEQ_LEN, EOS)))
        rows_s.append(best_of(1, read_all))
    ratios = sorted(a / b for a, b in zip(loop_s, rows_s))
    listed = same.tolist()
    t_lists = best_of(1, lambda: loop_reference(listed, SEQ_LEN, EOS))
    t_once = best_of(repeats, lambda: rows.read(np.arange(rows.num_rows)))
    t_plain = best_of(repeats, lambda: read_all(plain_rows))
    t_copy = best_of(repeats, lambda: np.copy(same))

    print(
        f"concat: {n / 1e6:.1f} M tokens in {rows.num_rows:,} rows ({len(docs):,} documents), "
        f"seq_len {SEQ_LEN}, reads of {batch} rows; CPU time"
    )
    print(f"  {'':<46} {'M tokens/CPU-s':>15}   per pair (A B A B, {pairs} pairs)")
    lines = [
        ("np.copy of the tokens (bandwidth ceiling)", n / t_copy, ""),
        (
            "concat isolate=True, reads of the batch",
            n / min(rows_s),
            " ".join(f"{n / t / 1e6:.1f}" for t in rows_s),
        ),
        (
            "per-token loop -> int64 arrays, same tokens",
            n / min(loop_s),
            " ".join(f"{n / t / 1e6:.1f}" for t in loop_s),
        ),
        ("  of which the loop on lists alone", n / t_lists, ""),
        ("concat isolate=False, reads of the batch", n / t_plain, f"best of {repeats}"),
        ("concat isolate=True, every row in one read", n / t_once, f"best of {repeats} (fresh memory)"),
    ]
    for name, rate, detail in lines:
        print(f"  {name:<46} {rate / 1e6:>15.1f}   {detail}")
    print(
        f"  concat isolate=True: {ratios[len(ratios) // 2]:.1f}x the loop with the same output "
        f"(median of {pairs} pairs; {ratios[0]:.1f}x-{ratios[-1]:.1f}x); "
        f"{t_copy / min(rows_s):.1%} of np.copy"
    )


def bench_bfd(n_docs: int, materialize_docs: int, rng: np.random.Generator) -> None:
    lengths = lognormal_lengths(n_docs, rng)
    offsets = np.zeros(n_docs + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    total = int(offsets[-1])

    def plan(offsets=offsets):
        _, piece_len = split_documents(offsets, SEQ_LEN)
        return place(piece_len, SEQ_LEN)[2]

    wall, cpu, rows = timed(plan)
    tenth = offsets[: n_docs // 10 + 1]
    _, cpu_tenth, _ = timed(lambda: plan(tenth))
    fill = total / (rows * SEQ_LEN)
    print(
        f"\nbfd: {n_docs:,} documents, log-normal lengths (median 300, sigma 1.0), "
        f"{total / 1e6:.0f} M tokens, rows of {SEQ_LEN}"
    )
    print(f"  {'':<30} {'fill':>8} {'kept':>7} {'wall':>7} {'CPU':>7}")
    print(
        f"  {'forge bfd placement':<30} {fill:>8.3%} {1.0:>7.1%} {wall:>6.2f}s {cpu:>6.2f}s"
        f"   {rows:,} rows (target < 5 s)"
    )
    print(
        f"  {'':<30} 10x the documents of {len(tenth) - 1:,}: {cpu / cpu_tenth:.1f}x the CPU time "
        "(linear: about 10)"
    )

    m = min(materialize_docs, n_docs)
    docs = make_documents(lengths[:m], rng)
    tokens = int(lengths[:m].sum())
    packer = BfdPacker(None, seq_len=SEQ_LEN, eos_id=EOS, pad_id=0)
    stream = DocumentStream.from_documents(docs)

    def layout_and_rows():
        rows = PackedRows(packer.layout(stream.lengths), stream, eos_id=EOS, pad_id=0)
        rows.read(np.arange(rows.num_rows))
        return rows.stats

    for label in ("layout + rows, first call", "layout + rows, again"):
        wall, cpu, stats = timed(layout_and_rows)
        print(
            f"  {'forge bfd ' + label:<30} {stats['fill']:>8.3%} {stats['kept']:>7.1%} "
            f"{wall:>6.2f}s {cpu:>6.2f}s   first {m:,} documents, {tokens / 1e6:.0f} M tokens: "
            f"{tokens / cpu / 1e6:.0f} M tokens/CPU-s"
        )

    try:
        import datasets
        from trl import pack_dataset
    except ImportError:
        print("  trl: not installed, skipped (pip install trl to compare with pack_dataset(strategy='bfd'))")
        return
    # trl packs the column named "input_ids" (its convention, not a Forge batch key).
    dataset = datasets.Dataset.from_dict({"input_ids": [d.tolist() for d in docs]})
    start = time.perf_counter()
    packed = pack_dataset(dataset, SEQ_LEN, strategy="bfd")
    t_trl = time.perf_counter() - start
    kept = sum(len(x) for x in packed["input_ids"])
    print(
        f"  {'trl pack_dataset bfd':<30} {kept / (len(packed) * SEQ_LEN):>8.3%} {kept / tokens:>7.1%} "
        f"{t_trl:>6.2f}s {'':>7}   same {m:,} documents"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concat-tokens", type=float, default=2e6)
    parser.add_argument("--batch", type=int, default=16, help="rows a read, as the loader reads them")
    parser.add_argument("--pairs", type=int, default=3, help="alternated loop/rows pairs")
    parser.add_argument("--bfd-docs", type=int, default=1_000_000)
    parser.add_argument("--materialize-docs", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.quick:
        args.concat_tokens, args.bfd_docs, args.materialize_docs = 2e5, 50_000, 5_000
    rng = np.random.default_rng(args.seed)
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs (wall times suffer when busy)")
    lengths = lognormal_lengths(int(args.concat_tokens / 495) + 1, rng)
    bench_concat(make_documents(lengths, rng), args.batch, args.pairs, args.repeats)
    bench_bfd(args.bfd_docs, args.materialize_docs, rng)


if __name__ == "__main__":
    main()
