"""Packing benchmark: one run, same data, numbers side by side.

- ``concat`` (with isolation): tokens/s of its layout plus every row materialized
  (what the loader does batch by batch, here all rows at once) against the literal
  per-token Python loop (the reference definition, timed on a prefix of the same
  tokens) and against ``np.copy`` of the same tokens (the memory-bandwidth ceiling).
  The eager packer of before built whole arrays (views of one joined stream) at about
  30x the loop; reading lazily adds a per-token document lookup (EOS is appended on
  the fly, documents need not be adjacent on disk), so it is a few times the loop.
  What matters for training, the loader against the model, is measured by
  ``bench/data_scale.py``.
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

Times are CPU seconds of the (single-threaded) numpy passes, best of a few calls after
a first one: on a shared machine wall time measures the neighbours, and the first
touch of fresh memory can cost more than the packing (about 2 s per GB on the
development VM). The first call is printed too.

Run: ``python bench/packing.py`` (about a minute; ``--quick`` for a smoke run).
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from forge_core.api import DOC_IDS, IGNORE_INDEX, INPUT_IDS, LABELS, POSITIONS
from forge_core.data.packed_rows import DocumentStream, PackedRows, pack_documents
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


def bench_concat(docs: list[np.ndarray], loop_tokens: int, repeats: int) -> None:
    stream = np.concatenate(docs)
    n = stream.size
    iso = ConcatPacker(ConcatOptions(isolate=True), seq_len=SEQ_LEN, eos_id=EOS, pad_id=0)
    plain = ConcatPacker(ConcatOptions(isolate=False), seq_len=SEQ_LEN, eos_id=EOS, pad_id=0)
    _, cold, _ = timed(lambda: pack_documents(iso, docs))  # first call: fresh memory is faulted in
    t_iso = best_of(repeats, lambda: pack_documents(iso, docs))
    t_plain = best_of(repeats, lambda: pack_documents(plain, docs))
    t_copy = best_of(repeats, lambda: np.copy(stream))
    prefix = stream[: loop_tokens + 1]
    prefix_list = prefix.tolist()
    t_lists = best_of(2, lambda: loop_reference(prefix_list, SEQ_LEN, EOS))
    t_loop = best_of(2, lambda: loop_to_arrays(prefix, SEQ_LEN, EOS))
    looped = (loop_tokens // SEQ_LEN) * SEQ_LEN  # tokens in whole rows

    # The bench is only worth printing if the two agree.
    ref = loop_to_arrays(stream[: 4 * SEQ_LEN + 1], SEQ_LEN, EOS)
    got = pack_documents(iso, [stream[: 4 * SEQ_LEN + 1]])
    assert all(np.array_equal(got[k], ref[k]) for k in ref)

    print(
        f"concat: {n / 1e6:.1f} M tokens ({len(docs):,} documents), seq_len {SEQ_LEN}; "
        f"CPU time, best of {repeats} after a first call"
    )
    rates = [
        ("np.copy (bandwidth ceiling)", n / t_copy),
        ("concat isolate=True", n / t_iso),
        ("concat isolate=True, first call", n / cold),
        ("concat isolate=False", n / t_plain),
        (f"per-token loop -> int64 arrays ({looped / 1e6:.1f} M)", looped / t_loop),
        ("  of which the loop on lists alone", looped / t_lists),
    ]
    for name, rate in rates:
        print(f"  {name:<42} {rate / 1e6:>9.1f} M tokens/s")
    print(
        f"  concat isolate=True: {t_loop / looped * n / t_iso:.0f}x the loop with the same output "
        f"({t_lists / looped * n / t_iso:.0f}x the bare list loop); "
        f"{n / t_iso / 1e6:.0f} M tokens/s; {t_copy / t_iso:.1%} of np.copy"
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
    parser.add_argument("--concat-tokens", type=float, default=20e6)
    parser.add_argument("--loop-tokens", type=float, default=1e6)
    parser.add_argument("--bfd-docs", type=int, default=1_000_000)
    parser.add_argument("--materialize-docs", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.quick:
        args.concat_tokens, args.loop_tokens, args.bfd_docs, args.materialize_docs = 1e6, 1e5, 50_000, 5_000
    rng = np.random.default_rng(args.seed)
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs (wall times suffer when busy)")
    lengths = lognormal_lengths(int(args.concat_tokens / 495) + 1, rng)
    bench_concat(make_documents(lengths, rng), int(args.loop_tokens), args.repeats)
    bench_bfd(args.bfd_docs, args.materialize_docs, rng)


if __name__ == "__main__":
    main()
