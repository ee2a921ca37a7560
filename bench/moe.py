"""Mixture of experts: training tokens/s of an MoE llama against the dense llama with the
same active parameters, the grouped-GEMM experts against the per-expert loop, and (with
two processes) the share of an ep=2 step spent in all-to-all; ratios in one run.

The models (fp32, vocab 256, dim 128, 2 blocks, 4 heads, 2 key/value heads, sdpa):

- ``moe``: every block's feed-forward has ``--experts`` routed experts (default 8) of
  hidden size ``--expert-hidden`` (128), ``--top-k`` (2) per token, softmax router,
  dropless, the grouped kernel (``torch._grouped_mm``);
- ``dense``: the same llama with one SwiGLU of ``top_k * expert_hidden`` per block: each
  token multiplies by as many feed-forward weights as in ``moe`` (the router's
  ``dim x experts`` matrix aside), so the difference is what routing costs: the router,
  sorting tokens by expert, the gathers and the weighted sum back;
- ``loop``: ``moe`` with ``model.options.moe.kernel: loop`` (one matmul per expert), the
  same weights (same seed), whose loss is checked equal to the grouped one's first.

A step is forward, cross-entropy over every position, backward and an SGD update, on
``--batch`` rows of ``--seq-len`` random tokens. Each comparison alternates its two
sides (A B A B ..., ``--pairs`` pairs of ``--steps`` steps each, after a warm-up step of
each) so that a shared machine's load falls on both alike; it prints the median wall and
CPU (``time.process_time``) time of a step of each side and the median of the per-pair
ratios. Tokens/s is the batch's tokens over the median wall time. ``--threads`` (default
1) torch threads.

``--ep`` (two processes, gloo): the ``moe`` model with ``parallel.ep: 2`` through the
trainer's path, each rank timing its step and the time inside
``torch.distributed.all_to_all_single`` (forward and backward), alternated with the
one-process step on rank 0; it needs the expert-parallel strategy (``parallel.ep``),
and says so when it is not installed.

Run: ``python bench/moe.py`` (about a minute on 2 busy cores); ``--quick`` for a smoke
run; ``--ep`` to add the all-to-all share.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch

VOCAB = 256
MODEL = {"dim": 128, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "max_seq_len": 1024}


def build(kind: str, args: argparse.Namespace) -> Any:
    """The ``moe``, ``loop`` or ``dense`` llama of the module docstring (seed 0)."""
    from forge_plugins.attention.options import SdpaOptions
    from forge_plugins.attention.sdpa import SdpaAttention
    from forge_plugins.models.llama import build as build_llama
    from forge_plugins.models.options import LlamaOptions, MoEOptions

    model = {**MODEL, "dim": args.dim}
    if kind == "dense":
        options = LlamaOptions(**model, ffn_hidden=args.top_k * args.expert_hidden)
    else:
        moe = MoEOptions(
            num_experts=args.experts,
            top_k=args.top_k,
            expert_hidden=args.expert_hidden,
            kernel="loop" if kind == "loop" else "grouped",
        )
        options = LlamaOptions(**model, moe=moe)
    torch.manual_seed(0)
    return build_llama(options, VOCAB, SdpaAttention(SdpaOptions())).train()


def batch(args: argparse.Namespace) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1)
    return torch.randint(0, VOCAB, (args.batch, args.seq_len + 1), generator=generator)


def step_fn(model: Any, ids: torch.Tensor) -> Any:
    """One training step (returns its loss): forward, loss, backward, SGD."""
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)

    def step() -> float:
        logits = model(ids[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(loss.detach())

    return step


def timed(step: Any, steps: int) -> tuple[float, float]:
    """Wall and CPU seconds of one step, over ``steps`` steps."""
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(steps):
        step()
    return (time.perf_counter() - wall) / steps, (time.process_time() - cpu) / steps


def alternate(a: Any, b: Any, pairs: int, steps: int) -> dict[str, list[float]]:
    """``pairs`` alternations A B of ``steps`` steps each, after one warm-up step of
    each: the wall and CPU time of a step of each side, per pair."""
    a(), b()
    out: dict[str, list[float]] = {"a_wall": [], "a_cpu": [], "b_wall": [], "b_cpu": []}
    for _ in range(pairs):
        for side, step in (("a", a), ("b", b)):
            wall, cpu = timed(step, steps)
            out[f"{side}_wall"].append(wall)
            out[f"{side}_cpu"].append(cpu)
    return out


def summary(name: str, times: dict[str, list[float]], tokens: int) -> dict[str, Any]:
    """A table row: medians of each side and of the per-pair ratios A / B."""
    median = statistics.median
    return {
        "comparison": name,
        "a_wall": median(times["a_wall"]),
        "b_wall": median(times["b_wall"]),
        "a_cpu": median(times["a_cpu"]),
        "b_cpu": median(times["b_cpu"]),
        "wall_ratio": median(a / b for a, b in zip(times["a_wall"], times["b_wall"])),
        "cpu_ratio": median(a / b for a, b in zip(times["a_cpu"], times["b_cpu"])),
        "a_tokens_s": tokens / median(times["a_wall"]),
        "b_tokens_s": tokens / median(times["b_wall"]),
        "pairs": len(times["a_wall"]),
    }


def table(rows: list[dict[str, Any]]) -> str:
    head = (
        f"{'A vs B':<22}{'A ms':>9}{'B ms':>9}{'A/B wall':>10}{'A CPU ms':>10}{'B CPU ms':>10}"
        f"{'A/B CPU':>9}{'A tok/s':>10}{'B tok/s':>10}{'pairs':>7}"
    )
    lines = [head]
    for r in rows:
        lines.append(
            f"{r['comparison']:<22}{1e3 * r['a_wall']:>9.1f}{1e3 * r['b_wall']:>9.1f}{r['wall_ratio']:>10.2f}"
            f"{1e3 * r['a_cpu']:>10.1f}{1e3 * r['b_cpu']:>10.1f}{r['cpu_ratio']:>9.2f}"
            f"{r['a_tokens_s']:>10.0f}{r['b_tokens_s']:>10.0f}{r['pairs']:>7}"
        )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The two in-process comparisons (moe vs dense, grouped vs loop), each a row."""
    ids = batch(args)
    tokens = ids.shape[0] * (ids.shape[1] - 1)
    models = {kind: build(kind, args) for kind in ("moe", "loop", "dense")}
    steps = {kind: step_fn(model, ids) for kind, model in models.items()}
    # The loop is the reference: the same weights give the same first loss.
    grouped, loop = steps["moe"](), steps["loop"]()
    if abs(grouped - loop) > 1e-4 * abs(loop):
        raise AssertionError(f"grouped and loop experts disagree: loss {grouped} vs {loop}")
    rows = [
        summary("moe vs dense", alternate(steps["moe"], steps["dense"], args.pairs, args.steps), tokens),
        summary("grouped vs loop", alternate(steps["moe"], steps["loop"], args.pairs, args.steps), tokens),
    ]
    return rows


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dim", type=int, default=MODEL["dim"])
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument("--expert-hidden", type=int, default=128)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="a smoke run (small batch, 3 pairs of 1 step)")
    parser.add_argument("--ep", action="store_true", help="also the all-to-all share at ep=2 (two processes)")
    args = parser.parse_args(argv)
    if args.quick:
        args.batch, args.seq_len, args.steps = 2, 128, 1
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    torch.set_num_threads(args.threads)
    print(
        f"dim {args.dim}, {MODEL['n_layers']} blocks, {args.experts} experts of {args.expert_hidden}, "
        f"top {args.top_k}; dense SwiGLU {args.top_k * args.expert_hidden}; batch {args.batch} x "
        f"{args.seq_len}; {args.threads} thread(s)"
    )
    print(table(run(args)))


if __name__ == "__main__":
    main()
