"""Parallelism overhead on CPU: each strategy on 2 processes (gloo) against one process
on the same global batch, with the time collectives spend in flight.

For every strategy (``ddp``, ``fsdp``, ``tp``, ``tp+sp``, ``pp`` with GPipe and with
1F1B, and ``pp`` on rows packed with isolated documents under each of the seven
schedules: ``doc_ids``/``positions`` go to every stage, documents of 1 to 128 tokens)
the same llama (dim 256, 4 layers, 8 heads, vocab 256, rows of 256, 8 rows per
step) trains a few SGD steps through :func:`forge_core.distributed.parallelize.parallelize`
exactly as the trainer drives it. The baseline is one process on the whole batch, with
one thread (the same work per core as each of the two 1-thread processes) and with two
threads (the same machine), on rank 0. The three run in turns (``--pairs`` rounds of
``--steps`` steps each after a warm-up; ``bench/alternate.py``) so that the load of a
shared machine hits every side of a ratio alike; printed are the median step of each
and the medians of the per-round ratios: wall time (the slower rank's) against each
baseline, and CPU time (both ranks' summed) against the one-thread baseline's, which
is what the second process costs in work. The load average is printed.

"comm" is the wall time collective and point-to-point operations (``gloo:*`` /
``nccl:*`` profiler spans, recorded on the communication thread) were in flight per
step, from ``torch.profiler`` on rank 0. Asynchronous ones overlap compute and each
other, so it is an upper bound on what communication costs, not a share of the step.
"blocked" is the time the training thread waited on them (``wait``/``wait_tensor``
events plus the synchronous enqueue calls), which the step really pays. For the
pipeline rows "bubble" is blocked / step: the share of rank 0's step spent waiting on
its peer (pipeline bubble plus transfer), the fraction the profiler shows.

This is a record for later GPU runs, not a target: two CPU processes share the cores
that one process would use, and gloo copies through TCP on localhost.

Run: ``python bench/parallel_overhead.py`` (a few minutes; ``--quick`` for a smoke run).
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
from typing import Any

from forge_core.api import DOC_IDS, INPUT_IDS, LABELS, POSITIONS

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/alternate.py, however loaded
from alternate import load_line, measured, ratio, timed  # noqa: E402

STRATEGIES: dict[str, dict[str, Any]] = {
    "ddp": {"dp_replicate": 2},
    "fsdp": {"dp_shard": 2},
    "tp": {"tp": 2},
    "tp+sp": {"tp": 2, "options": {"tp": {"sequence_parallel": True}}},
    "pp gpipe": {"pp": 2, "options": {"pp": {"schedule": "gpipe", "microbatches": 4}}},
    "pp 1f1b": {"pp": 2, "options": {"pp": {"schedule": "1f1b", "microbatches": 4}}},
}
#: Packed rows under every pipeline schedule (two stages per rank for the multi-stage ones).
PACKED_SCHEDULES = {
    "gpipe": 1,
    "1f1b": 1,
    "interleaved_1f1b": 2,
    "looped_bfs": 2,
    "interleaved_zero_bubble": 2,
    "zbv_zero_bubble": 2,
    "dualpipev": 2,
}
for _schedule, _virtual in PACKED_SCHEDULES.items():
    STRATEGIES[f"packed {_schedule}"] = {
        "pp": 2,
        "options": {"pp": {"schedule": _schedule, "virtual_stages": _virtual, "microbatches": 4}},
    }
COMM_PREFIXES = ("gloo:", "nccl:")
BLOCKING = ("c10d::", "_c10d_functional::wait_tensor", "aten::wait")


def packed(name: str) -> bool:
    return name.startswith("packed")


def setup(args: argparse.Namespace, parallel: dict[str, Any], packing: bool = False) -> tuple[Any, Any, list]:
    import torch

    from forge_core import components
    from forge_core.config.blocks import resolve_components
    from forge_core.config.schema import ForgeConfig
    from forge_core.config.structuring import structure
    from forge_core.plan import make_plan
    from forge_core.registry import load_registries

    registries = load_registries()
    raw = {
        "model": {
            "name": "llama",
            "options": {
                "dim": args.dim,
                "n_layers": args.layers,
                "n_heads": 8,
                "n_kv_heads": 4,
                "max_seq_len": args.seq,
            },
        },
        "data": {"packer": "bfd" if packing else "none", "seq_len": args.seq},
        "parallel": parallel,
        "train": {"batch_size": args.rows},
    }
    config, issues = structure(raw, ForgeConfig)
    assert not issues, issues
    config, issues = resolve_components(config, registries)
    assert not issues, issues
    plan = make_plan(config, registries, int(os.environ.get("WORLD_SIZE", "1")) if parallel else 1)
    torch.manual_seed(0)
    model = components.model(plan, registries, args.vocab, components.attention(plan, registries))
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, args.vocab, (args.rows, args.seq + 1), generator=gen)
    batch = {INPUT_IDS: ids[:, :-1].contiguous(), LABELS: ids[:, 1:].contiguous()}
    if packing:
        starts = torch.rand(args.rows, args.seq, generator=gen) < 1 / 64
        starts[:, 0] = True
        index = torch.arange(args.seq).expand(args.rows, args.seq)
        batch[DOC_IDS] = starts.long().cumsum(1) - 1
        batch[POSITIONS] = index - torch.where(starts, index, torch.zeros_like(index)).cummax(1).values
    return plan, registries, [model, batch]


def step_fn(pmodel: Any, batch: dict) -> Any:
    import torch

    from forge_core.distributed.parallelize import clip_grad_norm
    from forge_core.train.loss import loss_fn

    optimizer = torch.optim.SGD(list(pmodel.parameters()), lr=1e-3)
    local = {k: v.chunk(pmodel.dp_size)[pmodel.dp_rank] for k, v in batch.items()}
    tokens = float(batch[LABELS].numel())

    def step() -> None:
        pmodel.forward_backward(local, loss_fn, tokens)
        pmodel.finish_gradients()
        clip_grad_norm(pmodel, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def comm_times(step: Any, args: argparse.Namespace) -> dict[str, float]:
    """Per step, seconds collectives were in flight and seconds the training thread was
    blocked on them, from ``--profiled`` profiled steps."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(args.profiled):
            step()
    comm = blocked = 0.0
    for event in prof.key_averages():
        if event.key.startswith(COMM_PREFIXES):
            comm += event.cpu_time_total
        elif event.key.startswith(BLOCKING):
            blocked += event.self_cpu_time_total
    n = max(args.profiled, 1)
    return {"comm": comm / 1e6 / n, "blocked": blocked / 1e6 / n}


def worker(args: argparse.Namespace) -> None:
    """Per strategy, rounds in turns (``bench/alternate.py``): the two processes' step,
    then rank 0 alone on the whole batch with 1 and with 2 threads (rank 1 waits in a
    barrier), so a shared machine's load hits every side of a ratio alike. The two
    processes' wall time is the slower rank's, their CPU time the sum of both."""
    import torch
    import torch.distributed as dist

    from forge_core.distributed.parallelize import parallelize, single_process

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.set_num_threads(1)

    def two_timed(step: Any) -> tuple[float, float]:
        dist.barrier()
        wall, cpu = timed(step, args.steps)
        both = torch.tensor([wall, cpu], dtype=torch.float64)
        gathered = [torch.zeros_like(both) for _ in range(2)]
        dist.all_gather(gathered, both)
        return max(float(g[0]) for g in gathered), sum(float(g[1]) for g in gathered)

    def alone_timed(step: Any, threads: int) -> tuple[float, float]:
        out = (0.0, 0.0)
        if step is not None:
            torch.set_num_threads(threads)
            try:
                out = timed(step, args.steps)
            finally:
                torch.set_num_threads(1)
        dist.barrier()
        return out

    results = {}
    for name, parallel in STRATEGIES.items():
        alone = {1: None, 2: None}
        if rank == 0:
            for threads in alone:
                _, _, (model, batch) = setup(args, {}, packed(name))
                alone[threads] = step_fn(single_process(model), batch)
        plan, _, (model, batch) = setup(args, parallel, packed(name))
        two = step_fn(parallelize(model, plan, torch.device("cpu")), batch)
        for _ in range(args.warmup):
            two_timed(two)
            for threads, step in alone.items():
                alone_timed(step, threads)
        sides = {
            "two": lambda: two_timed(two),
            "1x1": lambda: alone_timed(alone[1], 1),
            "1x2": lambda: alone_timed(alone[2], 2),
        }
        times = measured(sides, args.pairs)
        results[name] = {"times": times, **comm_times(two, args)}
    if rank == 0:
        Path(args.out).write_text(json.dumps(results))
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=256)
    parser.add_argument("--warmup", type=int, default=1, help="untimed rounds")
    parser.add_argument("--steps", type=int, default=2, help="steps per side in a round")
    parser.add_argument("--pairs", type=int, default=3, help="timed rounds (each side in turn)")
    parser.add_argument("--profiled", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="a tiny model, one step each")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.dim, args.seq, args.warmup, args.steps, args.pairs, args.profiled = 64, 32, 1, 1, 3, 1
    if args.worker:
        return worker(args)

    shape = [
        "--dim",
        str(args.dim),
        "--layers",
        str(args.layers),
        "--seq",
        str(args.seq),
        "--rows",
        str(args.rows),
        "--vocab",
        str(args.vocab),
        "--warmup",
        str(args.warmup),
        "--steps",
        str(args.steps),
        "--pairs",
        str(args.pairs),
        "--profiled",
        str(args.profiled),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        out = f"{tmp}/two.json"
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            str(Path(__file__).resolve()),
            "--worker",
            "--out",
            out,
            *shape,
        ]
        proc = subprocess.run(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True)
        if proc.returncode:
            sys.exit(f"torchrun failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
        two = json.loads(Path(out).read_text())

    print(
        f"llama dim {args.dim}, {args.layers} layers, {args.rows} rows x {args.seq} tokens per step, "
        f"vocab {args.vocab}; CPU, gloo; {args.pairs} rounds of {args.steps} steps per side after "
        f"{args.warmup} warm-up, medians; {load_line()}"
    )
    print("1x1 / 1x2: one process on the whole batch with 1 / 2 threads, in turns with the two processes")
    print("vs 1x1, vs 1x2: medians of the per-round wall ratios; CPU vs 1x1: both ranks' CPU over 1x1's")
    print("packed <schedule>: pp = 2 on packed rows (baselines on the same packed rows)")
    print(
        f"{'2 processes':<30} {'ms/step':>9} {'1x1 ms':>8} {'1x2 ms':>8} {'vs 1x1':>7} {'vs 1x2':>7} "
        f"{'CPU vs 1x1':>11} {'comm ms':>8} {'blocked ms':>11} {'bubble':>7}"
    )
    for name, r in two.items():
        t = r["times"]
        step = statistics.median(t["two"]["wall"])
        bubble = f"{r['blocked'] / step:7.2f}" if "pp" in STRATEGIES[name] else f"{'':>7}"
        print(
            f"{name:<30} {step * 1e3:9.1f} {statistics.median(t['1x1']['wall']) * 1e3:8.1f} "
            f"{statistics.median(t['1x2']['wall']) * 1e3:8.1f} {ratio(t, 'two', '1x1', 'wall'):7.2f} "
            f"{ratio(t, 'two', '1x2', 'wall'):7.2f} {ratio(t, 'two', '1x1', 'cpu'):11.2f} "
            f"{r['comm'] * 1e3:8.1f} {r['blocked'] * 1e3:11.1f} {bubble}"
        )


if __name__ == "__main__":
    main()
