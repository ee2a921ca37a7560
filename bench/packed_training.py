"""Packed training with document isolation, a whole training step: Forge's llama (flex
with its ``BlockMask``, and sdpa with its dense block-diagonal mask) against what a
``transformers`` user writes for packing, on the same weights and the same packed row.

The ways (``--sides``):

- ``forge flex``: the Forge llama with the ``flex`` backend, given ``doc_ids`` and
  ``positions`` (rotary positions restart at every document);
- ``forge sdpa``: the same with the ``sdpa`` backend (a dense ``(1, 1, S, S)`` mask);
- ``hf 4-D mask``: its export (``forge-run export-hf``'s exporter) loaded by
  ``LlamaForCausalLM`` (``attn_implementation="sdpa"``), given ``position_ids`` and a 4-D
  block-diagonal causal boolean mask, which transformers passes to sdpa as it is (the
  packing recipe for any attention implementation);
- ``hf flash varlen`` (CUDA, when ``flash_attn`` is installed; otherwise the bench says
  it is not measured and why): ``attn_implementation="flash_attention_2"`` with
  ``position_ids`` and no mask, from which transformers derives the documents'
  cumulative lengths and calls flash-attention's varlen kernel.

A step is the forward, Forge's loss (:func:`forge_core.train.loss.loss_fn`: the summed
cross-entropy over the labelled tokens over their count; no label crosses a document's
end) on the logits, the backward and ``torch.optim.AdamW(foreach=True)``, the same for
every way. Before timing, the bench asserts that every way computes the same logits and
loss on the row as ``forge sdpa`` (within the rounding of the dtype for the model's
longest sum, :mod:`forge_core.testing.tolerance`): a comparison of different
computations would measure nothing.

Rows: one row of ``S`` tokens (``--seq-lens``, default 2048 and 8192) of documents of
log-normal length (median ``--median-doc`` 512, sigma 1), random tokens. The ways run in
turns (``--pairs`` rounds after a warm-up step of each; ``bench/alternate.py``); printed:
each way's tokens/s over its median wall time, its CPU time, the per-round ratios
against the first way (``forge flex``) by CPU time beside wall time, peak memory, and the load average.
Peak memory is, on CUDA, ``torch.cuda.max_memory_allocated`` during one step above what
was allocated before it; on CPU (Linux) the growth of the peak RSS (``VmHWM``, reset
through ``/proc/self/clear_refs``) during one step, in a fresh process per way and
length with glibc's mmap threshold at 64 KiB so that freed blocks leave the RSS (as
``bench/attention.py``).

Run: ``python bench/packed_training.py`` (CPU, fp32, the default model: dim 256, 2
blocks, 4 heads, 2 key/value heads, vocabulary 258; several minutes on a loaded 2-core
machine, most of it the dense masks at 8192 and flex's compile); ``--quick`` for a smoke
run (512, one round, no peak); ``--device cuda --dtype bf16`` on a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/alternate.py, however loaded
from alternate import load_line, ratio, rounds, status_kib  # noqa: E402

from forge_core.api import DOC_IDS, IGNORE_INDEX, INPUT_IDS, LABELS, POSITIONS  # noqa: E402

SIDES = ("forge flex", "forge sdpa", "hf 4-D mask", "hf flash varlen")
REFERENCE = "forge sdpa"
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def packed_row(seq_len: int, vocab: int, median: float = 512, seed: int = 0) -> dict[str, torch.Tensor]:
    """One packed row ``(1, S)``: random tokens, documents of log-normal length, each
    document's positions from 0, and labels that never cross a document's end (the last
    token of every document but the row's last is ``IGNORE_INDEX``)."""
    from forge_core.testing import lognormal_lengths, packed_metadata

    lengths = lognormal_lengths(seq_len, median=median, seed=seed)
    doc_ids, positions = packed_metadata([lengths])
    ids = torch.randint(0, vocab, (1, seq_len + 1), generator=torch.Generator().manual_seed(seed))
    labels = ids[:, 1:].clone()
    labels[:, :-1][positions[:, 1:] == 0] = IGNORE_INDEX
    return {INPUT_IDS: ids[:, :-1].contiguous(), LABELS: labels, DOC_IDS: doc_ids, POSITIONS: positions}


def block_diagonal_mask(doc_ids: torch.Tensor) -> torch.Tensor:
    """``(B, 1, S, S)`` boolean, True where a query may attend: same document, not later."""
    seq_len = doc_ids.shape[-1]
    same = doc_ids[:, :, None] == doc_ids[:, None, :]
    causal = torch.ones(seq_len, seq_len, dtype=torch.bool, device=doc_ids.device).tril()
    return (same & causal)[:, None]


def model_options(args: argparse.Namespace, seq_len: int) -> Any:
    from forge_plugins.models.options import LlamaOptions

    return LlamaOptions(
        dim=args.dim,
        n_layers=args.layers,
        n_heads=args.heads,
        n_kv_heads=args.kv_heads,
        max_seq_len=seq_len,
    )


def forge_model(args: argparse.Namespace, backend: str, seq_len: int) -> torch.nn.Module:
    """The Forge llama with ``backend`` (``flex`` or ``sdpa``), seed 0: the same weights
    whatever the backend."""
    from forge_plugins.attention.flex import FlexAttention
    from forge_plugins.attention.options import FlexOptions, SdpaOptions
    from forge_plugins.attention.sdpa import SdpaAttention
    from forge_plugins.models.llama import build

    attention = FlexAttention(FlexOptions()) if backend == "flex" else SdpaAttention(SdpaOptions())
    torch.manual_seed(0)
    model = build(model_options(args, seq_len), args.vocab, attention)
    return model.to(device=args.device, dtype=DTYPES[args.dtype]).train()


def hf_model(forge: torch.nn.Module, implementation: str, args: argparse.Namespace) -> torch.nn.Module:
    """``forge``'s weights in ``LlamaForCausalLM`` with ``implementation``."""
    from transformers import AutoModelForCausalLM

    from forge_plugins.models.hf_interop import export

    with tempfile.TemporaryDirectory() as tmp:
        export({k: v.detach().float().cpu() for k, v in forge.state_dict().items()}, forge.options, tmp)
        hf = AutoModelForCausalLM.from_pretrained(tmp, attn_implementation=implementation)
    return hf.to(device=args.device, dtype=DTYPES[args.dtype]).train()


def flash_varlen_missing(device: str) -> str | None:
    """Why ``hf flash varlen`` cannot run here, or None when it can."""
    if not device.startswith("cuda"):
        return "needs CUDA (flash-attention has no CPU kernel)"
    from transformers.utils import is_flash_attn_2_available

    if not is_flash_attn_2_available():
        return "flash_attn is not installed (pip install flash-attn)"
    return None


Forward = Callable[[dict[str, torch.Tensor]], torch.Tensor]


def forwards(args: argparse.Namespace, seq_len: int, sides: list[str]) -> dict[str, tuple[Any, Forward]]:
    """``{side: (model, forward(batch) -> logits)}`` for the ``sides`` that can run."""
    out: dict[str, tuple[Any, Forward]] = {}
    base = forge_model(args, "sdpa", seq_len)
    for side in sides:
        if side == "forge flex":
            model = forge_model(args, "flex", seq_len)
        elif side == "forge sdpa":
            model = base
        elif side == "hf 4-D mask":
            model = hf_model(base, "sdpa", args)
        else:
            model = hf_model(base, "flash_attention_2", args)
        out[side] = (model, forward_of(side, model))
    return out


def forward_of(side: str, model: Any) -> Forward:
    if side.startswith("forge"):
        return lambda b: model(b[INPUT_IDS], doc_ids=b[DOC_IDS], positions=b[POSITIONS])
    if side == "hf 4-D mask":
        # The mask is the user's to build for every batch: it is part of the step.
        return lambda b: (
            model(
                input_ids=b[INPUT_IDS],
                position_ids=b[POSITIONS],
                attention_mask=block_diagonal_mask(b[DOC_IDS]),
            ).logits
        )
    return lambda b: model(input_ids=b[INPUT_IDS], position_ids=b[POSITIONS]).logits


def mean_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    from forge_core.train.loss import loss_fn

    total, count = loss_fn(logits, labels)
    return total / count


def check_same(
    ways: dict[str, tuple[Any, Forward]], batch: dict[str, torch.Tensor], dtype: torch.dtype
) -> dict[str, float]:
    """Every way's loss on ``batch`` (no gradient), asserted equal to the reference's,
    logits and loss, within the rounding of ``dtype``."""
    from forge_core.testing import assert_within_rounding, longest_sum

    with torch.no_grad():
        logits = {side: forward(batch) for side, (_, forward) in ways.items()}
    reference = ways[REFERENCE][0] if REFERENCE in ways else next(iter(ways.values()))[0]
    want = logits.get(REFERENCE, next(iter(logits.values())))
    terms = longest_sum(reference, batch[INPUT_IDS].shape[1])
    losses = {side: mean_loss(value, batch[LABELS]) for side, value in logits.items()}
    for side in ways:
        assert_within_rounding(logits[side], want, dtype=dtype, terms=terms, what=f"{side}: logits")
        assert_within_rounding(
            losses[side], losses.get(REFERENCE, losses[side]), dtype=dtype, terms=terms, what=f"{side}: loss"
        )
    return {side: float(loss) for side, loss in losses.items()}


def train_step(model: Any, forward: Forward, batch: dict[str, torch.Tensor]) -> Callable[[], None]:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1, foreach=True)

    def step() -> None:
        mean_loss(forward(batch), batch[LABELS]).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def peak_mib(step: Callable[[], None], device: str) -> float | None:
    """Memory one step needs above what was there before it (see the module docstring);
    the step has run once before. None where it cannot be measured."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        step()
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - before) / 2**20
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS
    except OSError:
        return None
    before = status_kib("VmRSS")
    step()
    after = status_kib("VmHWM")
    return None if before is None or after is None else (after - before) / 1024


def _passed(args: argparse.Namespace) -> list[str]:
    return [
        *("--dim", str(args.dim), "--layers", str(args.layers), "--heads", str(args.heads)),
        *("--kv-heads", str(args.kv_heads), "--vocab", str(args.vocab), "--median-doc", str(args.median_doc)),
        *("--device", args.device, "--dtype", args.dtype, "--threads", str(args.threads)),
    ]


def cpu_peak_in_child(args: argparse.Namespace, seq_len: int, side: str) -> float | None:
    """:func:`peak_mib` of ``side`` at ``seq_len`` in a fresh process (fixed mmap threshold)."""
    if not sys.platform.startswith("linux"):
        return None
    argv = [sys.executable, str(Path(__file__).resolve()), "--peak-for", str(seq_len), side, *_passed(args)]
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "OMP_NUM_THREADS": str(args.threads)}
    done = subprocess.run(argv, env=env, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"peak of {side} at {seq_len}: exit {done.returncode}\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])["peak_mib"]


def print_peak(args: argparse.Namespace, seq_len: int, side: str) -> None:
    """The ``--peak-for`` child: one way's step, once to warm up, once measured."""
    batch = packed_row(seq_len, args.vocab, args.median_doc, seed=seq_len)
    batch = {k: v.to(args.device) for k, v in batch.items()}
    model, forward = forwards(args, seq_len, [side])[side]
    step = train_step(model, forward, batch)
    step()
    print(json.dumps({"peak_mib": peak_mib(step, args.device)}))


def measure(args: argparse.Namespace, seq_len: int, sides: list[str]) -> dict[str, Any]:
    """One length: the equality check, then the timed rounds and each way's peak."""
    batch = packed_row(seq_len, args.vocab, args.median_doc, seed=seq_len)
    batch = {k: v.to(args.device) for k, v in batch.items()}
    ways = forwards(args, seq_len, sides)
    losses = check_same(ways, batch, DTYPES[args.dtype])
    steps = {side: train_step(model, forward, batch) for side, (model, forward) in ways.items()}
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    times = rounds(steps, args.pairs, args.steps, warmup=1, sync=sync)
    peaks: dict[str, float | None] = {}
    for side, step in steps.items():
        if args.no_peak:
            peaks[side] = None
        elif args.device.startswith("cuda"):
            peaks[side] = peak_mib(step, args.device)
        else:
            peaks[side] = cpu_peak_in_child(args, seq_len, side)
    documents = int(batch[DOC_IDS].max()) + 1
    return {"seq_len": seq_len, "documents": documents, "losses": losses, "times": times, "peaks": peaks}


def report(result: dict[str, Any], tokens: int) -> list[str]:
    """The lines printed for one length."""
    times, peaks = result["times"], result["peaks"]
    first = next(iter(times))
    lines = [
        f"S = {result['seq_len']}: {result['documents']} documents; loss {result['losses'][REFERENCE]:.6f} "
        f"on every way (checked); A = {first}",
        f"  {'':<18}{'tokens/s':>10}{'ms':>9}{'CPU ms':>9}{'/A CPU':>9}{'/A wall':>9}{'peak MiB':>10}",
    ]
    for side, t in times.items():
        wall, cpu = statistics.median(t["wall"]), statistics.median(t["cpu"])
        peak = "n/a" if peaks.get(side) is None else f"{peaks[side]:.0f}"
        lines.append(
            f"  {side:<18}{tokens / wall:>10.0f}{1e3 * wall:>9.0f}{1e3 * cpu:>9.0f}"
            f"{ratio(times, side, first):>9.2f}{ratio(times, side, first, 'wall'):>9.2f}{peak:>10}"
        )
    return lines


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seq-lens", type=int, nargs="+", default=[2048, 8192])
    parser.add_argument("--sides", nargs="+", default=list(SIDES), choices=SIDES, metavar="SIDE")
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=258)
    parser.add_argument("--median-doc", type=float, default=512)
    parser.add_argument("--pairs", type=int, default=3, help="rounds (every way in turn)")
    parser.add_argument("--steps", type=int, default=1, help="steps per way in a round")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="fp32")
    parser.add_argument("--threads", type=int, default=1, help="torch threads on CPU")
    parser.add_argument("--no-peak", action="store_true", help="leave peak memory out")
    parser.add_argument(
        "--quick", action="store_true", help="S = 512 (documents of median 128), one round, no peak"
    )
    parser.add_argument("--peak-for", nargs=2, metavar=("SEQ", "SIDE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.seq_lens, args.median_doc, args.pairs, args.no_peak = [512], 128, 1, True
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    torch.set_num_threads(args.threads)
    if args.peak_for:
        return print_peak(args, int(args.peak_for[0]), args.peak_for[1])
    sides = list(args.sides)
    if "hf flash varlen" in sides:
        missing = flash_varlen_missing(args.device)
        if missing:
            print(f"hf flash varlen: not measured: {missing}")
            sides.remove("hf flash varlen")
    print(
        f"llama dim {args.dim}, {args.layers} blocks, {args.heads} heads / {args.kv_heads} kv, vocab "
        f"{args.vocab}, {args.dtype} on {args.device}, {torch.get_num_threads()} thread(s); one packed row, "
        f"documents log-normal (median {args.median_doc:.0f}); AdamW (foreach); {args.pairs} rounds of "
        f"{args.steps} step(s), every way in turn, medians; ratios: per-round medians; {load_line()}"
    )
    for seq_len in args.seq_lens:
        result = measure(args, seq_len, sides)
        print("\n".join(report(result, seq_len)), flush=True)


if __name__ == "__main__":
    main()
