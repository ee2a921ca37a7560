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

Measured on the shared 2-core development machine (load about 17, so wall time was
about 4x CPU time; the CPU column is the one to read), defaults with ``--ep``, 3 pairs:
CPU per step moe 153 ms against dense 131 ms (x1.15: routing costs 15% over the same
multiplies; wall x1.10); grouped against loop x1.00 CPU (x1.03 wall): on CPU
``torch._grouped_mm`` runs the groups one after another, so it saves no work at 8
experts of 128, only launches; ep=2 against one process x1.44 CPU summed over both ranks
(x0.96 wall, each rank computing half the experts on its own half-batch), 34% of the
busier rank's step inside ``all_to_all_single`` (gloo over localhost TCP; per MoE block
one exchange of counts and two of tokens forward, two of gradients backward). On a GPU the grouped GEMM and
nccl change every ratio; not measured here.

Run: ``python bench/moe.py`` (about a minute on 2 idle cores, 3 to 4 busy); ``--quick``
for a smoke run; ``--ep`` to add the all-to-all share (one torchrun launch).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/alternate.py, however loaded
from alternate import compare, rounds, table, timed  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
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


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The two in-process comparisons (moe vs dense, grouped vs loop), each a row."""
    ids = batch(args)
    tokens = ids.shape[0] * (ids.shape[1] - 1)
    models = {kind: build(kind, args) for kind in ("moe", "loop", "dense")}
    # The loop is the reference: the same weights give the same logits (float32 rounding).
    from forge_core.testing import assert_within_rounding, longest_sum

    with torch.no_grad():
        grouped, loop = models["moe"](ids[:, :-1]), models["loop"](ids[:, :-1])
    assert_within_rounding(
        grouped,
        loop,
        dtype=torch.float32,
        terms=longest_sum(models["loop"], args.seq_len),
        what="grouped and loop experts disagree: logits",
    )
    steps = {kind: step_fn(model, ids) for kind, model in models.items()}
    return [
        compare(name, rounds({a: steps[a], b: steps[b]}, args.pairs, args.steps), a, b, tokens)
        for name, a, b in (("moe vs dense", "moe", "dense"), ("grouped vs loop", "moe", "loop"))
    ]


def build_parallel(args: argparse.Namespace, parallel: dict[str, Any], world: int) -> Any:
    """The ``moe`` model wrapped as the trainer wraps it for ``parallel`` (one process:
    ``{}``), through the plan, the mesh and ``parallelize``."""
    from forge_core import components
    from forge_core.config.blocks import resolve_components
    from forge_core.config.schema import ForgeConfig
    from forge_core.config.structuring import structure
    from forge_core.distributed.mesh import build_mesh
    from forge_core.distributed.parallelize import parallelize, single_process
    from forge_core.plan import make_plan
    from forge_core.registry import load_registries
    from forge_core.train.loss import build_loss, loss_fn

    registries = load_registries()
    moe = {"num_experts": args.experts, "top_k": args.top_k, "expert_hidden": args.expert_hidden}
    raw = {
        "model": {"name": "llama", "options": {**MODEL, "dim": args.dim, "moe": moe}},
        "attention": {"backend": "sdpa"},
        "data": {"seq_len": args.seq_len},
        "parallel": parallel,
        "train": {"batch_size": args.batch},
    }
    config, issues = structure(raw, ForgeConfig)
    assert not issues, issues
    config, issues = resolve_components(config, registries)
    assert not issues, issues
    plan = make_plan(config, registries, world)
    torch.manual_seed(0)
    model = components.model(plan, registries, VOCAB, components.attention(plan, registries))
    if not parallel:
        return single_process(model, loss_fn)
    mesh = build_mesh(plan.degrees, torch.device("cpu"))
    return parallelize(model, plan, torch.device("cpu"), build_loss(model, plan.config), mesh=mesh)


def parallel_step(pmodel: Any, ids: torch.Tensor) -> Any:
    """One training step of a wrapped model on this process's rows of ``ids``."""
    from forge_core.api import INPUT_IDS, LABELS

    batch = {INPUT_IDS: ids[:, :-1], LABELS: ids[:, 1:]}
    local = {k: v.chunk(pmodel.dp_size)[pmodel.dp_rank].contiguous() for k, v in batch.items()}
    tokens = float(batch[LABELS].numel())
    optimizer = torch.optim.SGD(list(pmodel.parameters()), lr=1e-3)

    def step() -> None:
        pmodel.forward_backward(local, None, tokens)
        pmodel.finish_gradients()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


class AllToAllTime:
    """Wall seconds spent inside ``torch.distributed.all_to_all_single`` (every call:
    the dispatch and combine of the forward, their transposes in the backward, the
    exchange of counts) while installed."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.calls = 0

    def __enter__(self) -> AllToAllTime:
        import torch.distributed as dist

        self._original = original = dist.all_to_all_single

        def timed_call(*a: Any, **k: Any) -> Any:
            start = time.perf_counter()
            try:
                return original(*a, **k)
            finally:
                self.seconds += time.perf_counter() - start
                self.calls += 1

        dist.all_to_all_single = timed_call
        return self

    def __exit__(self, *exc: Any) -> None:
        import torch.distributed as dist

        dist.all_to_all_single = self._original


def ep_worker(args: argparse.Namespace) -> None:
    """Under torchrun (2 processes): ep=2 steps alternated with the one-process step on
    rank 0 (rank 1 waits), each ep step timed with the all-to-all time inside it."""
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.set_num_threads(1)
    ids = batch(args)
    ep = parallel_step(build_parallel(args, {"ep": 2}, 2), ids)
    one = parallel_step(build_parallel(args, {}, 1), ids) if rank == 0 else None
    rows: dict[str, list[float]] = {"ep_wall": [], "ep_cpu": [], "a2a": [], "one_wall": [], "one_cpu": []}

    def ep_timed() -> tuple[float, float, float]:
        dist.barrier()
        with AllToAllTime() as a2a:
            wall, cpu = timed(ep, args.steps)
        dist.barrier()
        return wall, cpu, a2a.seconds / args.steps

    ep_timed()  # warm-up
    if one is not None:
        one()
    for _ in range(args.pairs):
        wall, cpu, a2a = ep_timed()
        values = torch.tensor([wall, cpu, a2a], dtype=torch.float64)
        gathered = [torch.zeros_like(values) for _ in range(2)]
        dist.all_gather(gathered, values)
        rows["ep_wall"].append(max(float(g[0]) for g in gathered))
        rows["ep_cpu"].append(sum(float(g[1]) for g in gathered))
        rows["a2a"].append(max(float(g[2] / g[0]) for g in gathered))
        if one is not None:
            one_wall, one_cpu = timed(one, args.steps)
            rows["one_wall"].append(one_wall)
            rows["one_cpu"].append(one_cpu)
        dist.barrier()
    if rank == 0:
        Path(args.out).write_text(json.dumps(rows))
    dist.barrier()
    dist.destroy_process_group()


def ep_row(rows: dict[str, list[float]], tokens: int) -> dict[str, Any]:
    """The ep=2 table row (A: ep=2, B: one process) and the all-to-all share."""
    times = {side: {"wall": rows[f"{side}_wall"], "cpu": rows[f"{side}_cpu"]} for side in ("ep", "one")}
    row = compare("ep=2 vs 1 process", times, "ep", "one", tokens)
    row["a2a_share"] = statistics.median(rows["a2a"])
    return row


def launch_ep(args: argparse.Namespace) -> dict[str, Any] | None:
    """The ep=2 measurement in two processes, or ``None`` (said why) without the
    expert-parallel strategy."""
    from forge_core.registry import load_registries

    if "ep" not in load_registries()["parallelism"].names():
        print("ep=2: not measured: no expert-parallel strategy (parallel.ep) is installed")
        return None
    with tempfile.TemporaryDirectory() as tmp:
        out = f"{tmp}/ep.json"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
        cmd += [str(Path(__file__).resolve()), "--ep-worker", "--out", out]
        for flag in ("dim", "experts", "top_k", "expert_hidden", "batch", "seq_len", "pairs", "steps"):
            cmd += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=REPO)
        if proc.returncode:
            sys.exit(f"ep=2: torchrun exited {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
        return ep_row(json.loads(Path(out).read_text()), args.batch * args.seq_len)


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
    parser.add_argument("--ep-worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.batch, args.seq_len, args.steps = 2, 128, 1
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    if args.ep_worker:
        return ep_worker(args)
    torch.set_num_threads(args.threads)
    print(
        f"dim {args.dim}, {MODEL['n_layers']} blocks, {args.experts} experts of {args.expert_hidden}, "
        f"top {args.top_k}; dense SwiGLU {args.top_k * args.expert_hidden}; batch {args.batch} x "
        f"{args.seq_len}; {args.threads} thread(s)"
    )
    rows = run(args)
    ep = launch_ep(args) if args.ep else None
    print(table(rows + ([ep] if ep else [])))
    if ep:
        print(
            f"ep=2: {100 * ep['a2a_share']:.0f}% of a step's wall time inside all_to_all_single (the busier "
            "rank, median over the pairs); CPU summed over both ranks; the one process ran one thread, "
            "as each ep rank did"
        )


if __name__ == "__main__":
    main()
