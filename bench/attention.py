"""Attention benchmark: document-isolating attention on packed rows, side by side.

One attention layer, forward plus backward, batch 1, rows of 2048, 4096 and 8192 tokens
packed with documents of log-normal length (median 512, sigma 1.0):

- ``sdpa + dense mask``: the block-diagonal causal ``(1, 1, S, S)`` boolean mask;
- ``flex + BlockMask``: compiled FlexAttention (compile time reported separately; on
  CPU the backward is Forge's block-sparse one, since PyTorch has none);
- ``sdpa causal``: no isolation, ``is_causal=True``: the reference cost of attention.

Each timing covers ``prepare`` (the mask, built once per forward) plus ``attend`` and
its backward. The three run in turns (``--pairs`` rounds of ``--reps`` steps each, after
a warm-up step of each; ``bench/alternate.py``) so that a shared machine's load falls on
all alike; printed are the median wall and CPU (process) time of a step of each and the
medians of the per-round ratios, CPU beside wall (on a shared machine wall time also
measures the neighbours), with the load average.
Mask memory is counted from tensor sizes (the dense mask's bytes against the BlockMask's
tables). Peak memory is measured in a separate process per length (Linux only): the
growth of its peak RSS (``VmHWM``, reset through ``/proc/self/clear_refs``) during one
step after a warm-up, with glibc's mmap threshold fixed at 64 KiB so that freed blocks
leave the RSS (glibc otherwise keeps blocks up to 32 MiB, hiding a step's allocations;
the fixed threshold slows small allocations, hence a separate process).
Targets at 8192: flex at least 3x faster than dense-mask sdpa, mask at least 100x
smaller.

Run: ``python bench/attention.py`` (a few minutes; ``--quick`` for a smoke run).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from forge_core.testing import lognormal_lengths, packed_metadata
from forge_plugins.attention.flex import FlexAttention
from forge_plugins.attention.masks import block_mask_bytes
from forge_plugins.attention.options import FlexOptions, SdpaOptions
from forge_plugins.attention.sdpa import SdpaAttention

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/alternate.py, however loaded
from alternate import load_line, ratio, rounds, status_kib  # noqa: E402


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS
        return True
    except OSError:
        return False


def one_step(backend, doc_ids, q, k, v, grad):
    """prepare + attend + backward; returns the prepared mask (to size it)."""
    prepared = backend.prepare(doc_ids, q.shape[2], q.device)
    out = backend.attend(q, k, v, prepared)
    torch.autograd.backward(out, grad)
    for t in (q, k, v):
        t.grad = None
    return prepared


def first_call(backend, doc_ids, q, k, v, grad) -> float:
    """Wall seconds of the first step (flex compiles in it): also the warm-up."""
    wall = time.perf_counter()
    one_step(backend, doc_ids, q, k, v, grad)
    return time.perf_counter() - wall


def prepare_time(backend, doc_ids, seq_len: int, reps: int) -> tuple[float, object]:
    """Wall seconds of ``prepare`` alone and the mask it builds."""
    wall = time.perf_counter()
    for _ in range(reps):
        prepared = backend.prepare(doc_ids, seq_len, torch.device("cpu"))
    return (time.perf_counter() - wall) / reps, prepared


def peak_growth_mib(backend, doc_ids, q, k, v, grad) -> float | None:
    """Peak RSS growth of one step after a warm-up (see the module docstring)."""
    one_step(backend, doc_ids, q, k, v, grad)
    if not _reset_peak():
        return None
    before = status_kib("VmRSS")
    one_step(backend, doc_ids, q, k, v, grad)
    after = status_kib("VmHWM")
    return None if before is None or after is None else (after - before) / 1024


def mask_bytes(prepared) -> int:
    if prepared is None:
        return 0
    if isinstance(prepared, torch.Tensor):
        return prepared.numel() * prepared.element_size()
    return block_mask_bytes(prepared)


BACKENDS = (
    ("sdpa + dense mask", lambda: SdpaAttention(SdpaOptions()), True),
    ("flex + BlockMask", lambda: FlexAttention(FlexOptions()), True),
    ("sdpa causal (no isolation)", lambda: SdpaAttention(SdpaOptions()), False),
)


def inputs(seq_len: int, args: argparse.Namespace):
    lengths = lognormal_lengths(seq_len, median=args.median_doc, seed=seq_len)
    doc_ids, _ = packed_metadata([lengths])
    gen = torch.Generator().manual_seed(0)

    def leaf(heads):
        # A model's layout: (B, S, H, D) projections viewed as (B, H, S, D).
        x = torch.randn(1, seq_len, heads, args.head_dim, generator=gen)
        return x.transpose(1, 2).requires_grad_(True)

    q, k, v = leaf(args.heads), leaf(args.kv_heads), leaf(args.kv_heads)
    return lengths, doc_ids, q, k, v, torch.randn(q.shape, generator=gen)


def peaks_in_subprocess(seq_len: int, args: argparse.Namespace) -> dict[str, float | None]:
    """Run ``--peaks-for seq_len`` in a fresh process with a fixed mmap threshold."""
    if not sys.platform.startswith("linux"):
        return {}
    argv = [
        sys.executable,
        __file__,
        "--peaks-for",
        str(seq_len),
        "--threads",
        str(args.threads),
        "--heads",
        str(args.heads),
        "--kv-heads",
        str(args.kv_heads),
        "--head-dim",
        str(args.head_dim),
        "--median-doc",
        str(args.median_doc),
    ]
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def print_peaks(seq_len: int, args: argparse.Namespace) -> None:
    _, doc_ids, q, k, v, grad = inputs(seq_len, args)
    peaks = {
        name: peak_growth_mib(make(), doc_ids if isolate else None, q, k, v, grad)
        for name, make, isolate in BACKENDS
    }
    print(json.dumps(peaks))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-lens", type=int, nargs="+", default=[2048, 4096, 8192])
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--median-doc", type=float, default=512)
    parser.add_argument("--reps", type=int, default=1, help="steps per side in a round")
    parser.add_argument("--pairs", type=int, default=3, help="rounds (each backend in turn)")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads (default 1: on a shared machine more threads mostly "
        "measure the neighbours)",
    )
    parser.add_argument("--quick", action="store_true", help="2048 only, 3 rounds of one step")
    parser.add_argument("--peaks-for", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.peaks_for:
        print_peaks(args.peaks_for, args)
        return
    if args.quick:
        args.seq_lens, args.reps, args.pairs = [2048], 1, 3

    print(
        f"one attention layer, fwd+bwd, batch 1, {args.heads} query / {args.kv_heads} kv heads "
        f"of {args.head_dim}, fp32, {torch.get_num_threads()} thread(s); documents log-normal "
        f"(median {args.median_doc:.0f}, sigma 1.0); {args.pairs} rounds of {args.reps} step(s), "
        f"each backend in turn, medians; {load_line()}"
    )
    backends = [(name, make(), isolate) for name, make, isolate in BACKENDS]
    summary = []
    for seq_len in args.seq_lens:
        lengths, doc_ids, q, k, v, grad = inputs(seq_len, args)
        print(
            f"\nS = {seq_len}: {len(lengths)} documents (median length "
            f"{statistics.median(lengths):.0f}, longest {max(lengths)})"
        )
        print(f"  {'':<28} {'wall':>9} {'CPU':>9} {'prepare':>9} {'mask':>11} {'peak RSS':>10}")
        steps = {
            name: (lambda b=backend, d=(doc_ids if isolate else None): one_step(b, d, q, k, v, grad))
            for name, backend, isolate in backends
        }
        first = {
            name: first_call(backend, doc_ids if isolate else None, q, k, v, grad)
            for name, backend, isolate in backends
        }
        times = rounds(steps, args.pairs, args.reps, warmup=0)
        masks = {
            name: prepare_time(backend, doc_ids if isolate else None, seq_len, args.reps)
            for name, backend, isolate in backends
        }
        peaks = peaks_in_subprocess(seq_len, args)
        for name, _, _ in backends:
            peak = peaks.get(name)
            shown = "n/a" if peak is None else f"+{peak:.0f} MiB"
            wall, cpu = (statistics.median(times[name][kind]) for kind in ("wall", "cpu"))
            print(
                f"  {name:<28} {wall * 1e3:>7.0f}ms {cpu * 1e3:>7.0f}ms "
                f"{masks[name][0] * 1e3:>7.2f}ms {mask_bytes(masks[name][1]) / 1024:>8.0f}KiB {shown:>10}"
            )
        dense, flex, causal = (name for name, _, _ in backends)
        speed = ratio(times, dense, flex, "cpu")
        mask_ratio = mask_bytes(masks[dense][1]) / mask_bytes(masks[flex][1])
        peak_dense, peak_flex = peaks.get(dense), peaks.get(flex)
        print(
            f"  flex vs dense sdpa: {speed:.1f}x faster by CPU time "
            f"({ratio(times, dense, flex, 'wall'):.1f}x wall), mask {mask_ratio:.0f}x smaller"
            + (f", peak RSS growth {peak_dense / peak_flex:.1f}x lower" if peak_dense and peak_flex else "")
        )
        print(
            f"  against sdpa causal (CPU time): dense sdpa {ratio(times, dense, causal):.2f}x, "
            f"flex {ratio(times, flex, causal):.2f}x its time; flex first call "
            f"{first[flex]:.1f}s (compile ~{first[flex] - statistics.median(times[flex]['wall']):.1f}s)"
        )
        summary.append((seq_len, speed, mask_ratio))
    for seq_len, speed, mask_ratio in summary:
        if seq_len == 8192:
            verdict = "met" if speed >= 3 and mask_ratio >= 100 else "NOT met"
            print(
                f"\ntarget at 8192 (flex >= 3x faster by CPU time, mask >= 100x smaller): {verdict} "
                f"({speed:.1f}x, {mask_ratio:.0f}x)"
            )


if __name__ == "__main__":
    main()
