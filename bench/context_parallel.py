"""Context parallelism (``parallel.cp``): activation memory per rank and step time
against one process, at cp = 1, 2, 4, for both attention modes, in one run.

A small llama (dim 128, 2 layers, 8 heads, 4 key/value heads, vocab 256, fp32) trains on
rows packed with log-normal documents (median 512, sigma 1.0;
``forge_core.testing.lognormal_lengths``, one seed per row; labels -100 at each
document's last token), one row per step by default, through the trainer's path: the
plan, the mesh, the cp-wrapped attention backend (sdpa by default), ``parallelize``,
``forward_backward``, plain SGD. The launcher starts ``torchrun`` once per cp degree
(gloo on CPU, nccl with ``--device cuda``); in each launch rank 0 also runs the
one-process baseline (the other ranks wait in a barrier), alternating the sides
(baseline, cp, baseline, cp, ...) so that a shared machine's load hits both alike.

Measured per rank, per step:

- ``saved MiB``: the bytes of every tensor autograd saves for backward during the step
  (``torch.autograd.graph.saved_tensors_hooks``), each storage counted once,
  parameters and views of them left out (they are weights, not activations; under fsdp
  the gathered weights are left out too). Nothing saved is freed before its backward
  runs, so this is the peak of what the forward keeps for backward: every layer's
  inputs, the attention's mask as the backend saves it and, under ``allgather``, the
  gathered keys and values, the logits. The operators' transient workspace is not in
  it. The largest rank's figure is shown (their shapes are equal).
- ``cuda peak MiB`` (``--device cuda`` only): ``torch.cuda.max_memory_allocated``
  during the step over what was allocated before it (the weights, the optimizer).
- ``step ms``: the median wall time of the timed steps (rank 0, barrier to barrier);
  ``CPU ms``: the median process CPU time of a step summed over the cp ranks, against
  the one process's. Every process runs one thread, the baseline too (so on CPU cp = 2
  has twice the baseline's cores; the CPU column compares the work).
- ``imbalance``: the busiest cp rank's causal attention work over the mean rank's under
  the balancer, on the rows the step trains on (``bench/context_parallel_balance.py``
  measures the balancers on many rows).

The point of context parallelism is the memory column: it falls about as 1/cp
(``x cp`` near 1). What does not fall: ``allgather`` keeps the whole row's keys and
values per layer (a few MiB here), and ``ulysses`` builds the backend's mask of the
whole row on every rank. With sdpa on CPU that mask dominates: torch converts the
boolean ``(B, 1, S, S)`` mask to float32 in every layer's call and saves that copy
(4 S^2 bytes per row per layer: 128 of one process's 223 MiB at 4096), so under
``ulysses`` a rank keeps the whole row's; under ``allgather`` its ``S/cp`` query rows.
On CPU the times are a record, not a target: with 2 cores, cp = 4 runs 4 one-thread
processes on 2 cores, and gloo copies through TCP on localhost.

Measured on a shared 2-core machine (the default run, 4 to 5.5 minutes), saved MiB per
rank against one process: allgather 0.51 / 0.26 at cp = 2 / 4 for every seq_len from
1024 to 8192 (x cp 1.01 to 1.10); ulysses 0.64 / 0.45 at 1024 rising to 0.87 / 0.80 at
8192 (the whole row's mask); with ``--backend flex --seq-lens 4096,8192`` (its block
mask is about 64 KiB at 8192; 3 minutes) both modes 0.52 / 0.26 to 0.28. CPU time summed
over the ranks against one process (sdpa; two runs): allgather 1.4 to 1.5 / 1.9 to 2.3
at 1024, 1.0 / 0.9 to 1.1 at 8192 (the dense S^2 attention dominates there, and it is
split, not repeated), ulysses 1.1 / 1.7 to 1.8 at 8192.
The ``--device cuda`` path (nccl, ``torch.cuda.max_memory_allocated``) is written but
was not run here (no GPU).

Run: ``python bench/context_parallel.py`` (seq_len 1024 to 8192, 3 pairs; 4 to 5.5
minutes on 2 busy cores); ``--quick`` for a one-minute version; ``--seq-lens``,
``--rows``, ``--pairs``, ``--cps``, ``--modes``, ``--backend``, ``--device cuda``.
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

REPO = Path(__file__).resolve().parent.parent
VOCAB = 256
MODEL = {"dim": 128, "n_layers": 2, "n_heads": 8, "n_kv_heads": 4}
MIB = 2**20


class SavedBytes:
    """Bytes of the tensors autograd saves for backward inside the ``with`` block, each
    storage once, parameters (and views of them) left out: ``with SavedBytes() as s:
    ...; s.bytes``. The tensors themselves are saved unchanged."""

    def __init__(self) -> None:
        self.storages: dict[tuple[str, int], int] = {}
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda x: x)

    def _pack(self, x: torch.Tensor) -> torch.Tensor:
        base = x._base if x._base is not None else x
        if not (base.is_leaf and base.requires_grad):  # a parameter: weights, not activations
            storage = x.untyped_storage()
            self.storages.setdefault((str(x.device), storage.data_ptr()), storage.nbytes())
        return x

    @property
    def bytes(self) -> int:
        return sum(self.storages.values())

    def __enter__(self) -> SavedBytes:
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._hooks.__exit__(*exc)


def packed_batch(rows: int, seq_len: int, median: float = 512, seed: int = 0) -> dict[str, torch.Tensor]:
    """``rows`` rows of ``seq_len`` random tokens packed with log-normal documents (one
    seed per row): ``input_ids``, ``labels`` (-100 at each document's last token),
    ``doc_ids`` and ``positions`` as a packer that isolates documents emits them."""
    from forge_core.api import DOC_IDS, IGNORE_INDEX, INPUT_IDS, LABELS, POSITIONS
    from forge_core.testing import lognormal_lengths, packed_metadata

    doc_ids, positions = packed_metadata(
        [lognormal_lengths(seq_len, median, seed=seed + row) for row in range(rows)]
    )
    ids = torch.randint(0, VOCAB, (rows, seq_len + 1), generator=torch.Generator().manual_seed(seed))
    labels = ids[:, 1:].clone()
    labels[:, :-1][doc_ids[:, 1:] != doc_ids[:, :-1]] = IGNORE_INDEX
    return {INPUT_IDS: ids[:, :-1].contiguous(), LABELS: labels, DOC_IDS: doc_ids, POSITIONS: positions}


def ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}" if a is not None and b else "-"


def table(results: list[dict[str, Any]], cuda: bool = False) -> str:
    """The report: one row per (seq_len, cp, attention), the cp = 1 row first for each
    seq_len; memory against cp = 1, times against the baseline measured beside them."""
    head = ["seq_len", "cp", "attention", "saved MiB", "vs cp1", "x cp"]
    head += ["cuda peak MiB", "vs cp1"] if cuda else []
    head += ["step ms", "1-proc ms", "vs 1-proc", "CPU ms", "1-proc CPU", "vs 1-proc", "imbalance"]
    lines = [head]
    one = {r["seq_len"]: r for r in results if r["cp"] == 1}
    for r in sorted(results, key=lambda r: (r["seq_len"], r["cp"], r["attention"])):
        base = one.get(r["seq_len"], {})
        mem = r["saved"] / MIB
        line = [str(r["seq_len"]), str(r["cp"]), r["attention"], f"{mem:.1f}"]
        line += [ratio(r["saved"], base.get("saved")), ratio(r["saved"] * r["cp"], base.get("saved"))]
        if cuda:
            peak = r.get("cuda_peak")
            line += [f"{peak / MIB:.1f}" if peak else "-", ratio(peak, base.get("cuda_peak"))]
        if r["cp"] == 1:
            line += [f"{r['wall'] * 1e3:.0f}", "", "", f"{r['cpu'] * 1e3:.0f}", "", "", ""]
        else:
            line += [
                f"{r['wall'] * 1e3:.0f}",
                f"{r['base_wall'] * 1e3:.0f}",
                ratio(r["wall"], r["base_wall"]),
            ]
            line += [f"{r['cpu'] * 1e3:.0f}", f"{r['base_cpu'] * 1e3:.0f}", ratio(r["cpu"], r["base_cpu"])]
            line += [f"{r['imbalance']:.3f}"]
        lines.append(line)
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    return "\n".join(
        "  ".join(cell.rjust(w) if i != 2 else cell.ljust(w) for i, (cell, w) in enumerate(zip(line, widths)))
        for line in lines
    )


# -- one torchrun launch: cp = ``--cp`` for every seq_len and mode, beside one process


def build(args: argparse.Namespace, seq_len: int, parallel: dict[str, Any], world: int, device: torch.device):
    """The model, wrapped as the trainer wraps it for ``parallel`` (one process: ``{}``)."""
    from forge_core import components
    from forge_core.config.blocks import resolve_components
    from forge_core.config.schema import ForgeConfig
    from forge_core.config.structuring import structure
    from forge_core.distributed.mesh import build_mesh
    from forge_core.distributed.parallelize import parallelize, single_process, wrap_attention
    from forge_core.plan import make_plan
    from forge_core.registry import load_registries
    from forge_core.train.loss import build_loss, loss_fn

    registries = load_registries()
    raw = {
        "model": {"name": "llama", "options": {**MODEL, "max_seq_len": seq_len}},
        "attention": {"backend": args.backend},
        "data": {"packer": "bfd", "seq_len": seq_len},
        "parallel": parallel,
        "train": {"batch_size": args.rows},
    }
    config, issues = structure(raw, ForgeConfig)
    assert not issues, issues
    config, issues = resolve_components(config, registries)
    assert not issues, issues
    plan = make_plan(config, registries, world)
    torch.manual_seed(0)
    if not parallel:
        model = components.model(plan, registries, VOCAB, components.attention(plan, registries))
        return single_process(model.to(device), loss_fn)
    mesh = build_mesh(plan.degrees, device)
    attention = wrap_attention(components.attention(plan, registries), plan, mesh)
    model = components.model(plan, registries, VOCAB, attention).to(device)
    return parallelize(model, plan, device, build_loss(model, plan.config), mesh=mesh)


def step_fn(pmodel: Any, batch: dict[str, torch.Tensor], device: torch.device):
    from forge_core.api import IGNORE_INDEX, LABELS

    optimizer = torch.optim.SGD(list(pmodel.parameters()), lr=1e-3)
    local = {k: v.chunk(pmodel.dp_size)[pmodel.dp_rank].to(device) for k, v in batch.items()}
    tokens = float((batch[LABELS] != IGNORE_INDEX).sum())

    def step() -> None:
        pmodel.forward_backward(local, None, tokens)
        pmodel.finish_gradients()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def memory(step: Any, device: torch.device) -> dict[str, int]:
    """One step under :class:`SavedBytes` (and the CUDA allocator's peak)."""
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    with SavedBytes() as saved:
        step()
    out = {"saved": saved.bytes}
    if cuda:
        torch.cuda.synchronize()
        out["cuda_peak"] = torch.cuda.max_memory_allocated() - before
    return out


def timed(step: Any, device: torch.device, barrier: Any) -> tuple[float, float]:
    """``(wall, CPU)`` seconds of one step, barrier to barrier (this process's CPU)."""
    barrier()
    wall, cpu = time.perf_counter(), time.process_time()
    step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    cpu = time.process_time() - cpu
    barrier()
    return time.perf_counter() - wall, cpu


def worker(args: argparse.Namespace) -> None:
    import torch.distributed as dist

    from forge_core.api import DOC_IDS
    from forge_plugins.context_parallel.balance import imbalance, shard_index

    device = torch.device(args.device)
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    torch.set_num_threads(1)
    rank, cp = dist.get_rank(), dist.get_world_size()

    def reduce(values: list[float], op: Any) -> list[float]:
        t = torch.tensor(values, dtype=torch.float64, device=device)
        dist.all_reduce(t, op=op)
        return t.tolist()

    out = []
    for seq_len in args.seq_lens:
        batch = packed_batch(args.rows, seq_len)
        base_step = None
        if rank == 0:
            base_step = step_fn(build(args, seq_len, {}, 1, device), batch, device)
            base = memory(base_step, device)  # also the baseline's warm-up step
        for mode in args.modes:
            parallel = {"cp": cp, "options": {"cp": {"attention": mode, "balance": args.balance}}}
            step = step_fn(build(args, seq_len, parallel, cp, device), batch, device)
            mem = memory(step, device)  # also the warm-up step
            mem = dict(zip(mem, reduce(list(mem.values()), dist.ReduceOp.MAX)))
            sides: dict[str, list[tuple[float, float]]] = {"base": [], "cp": []}
            for _ in range(args.pairs):
                if rank == 0:
                    sides["base"].append(timed(base_step, device, lambda: None))
                dist.barrier()
                wall, cpu = timed(step, device, dist.barrier)
                sides["cp"].append((wall, reduce([cpu], dist.ReduceOp.SUM)[0]))
            if rank:
                continue
            index = shard_index(batch[DOC_IDS], seq_len, cp, args.balance)
            median = {
                side: [statistics.median(t[i] for t in ts) for i in (0, 1)] for side, ts in sides.items()
            }
            if mode == args.modes[0]:
                out.append(
                    {"seq_len": seq_len, "cp": 1, "attention": "-", **base}
                    | dict(zip(("wall", "cpu"), median["base"]))
                )
            out.append(
                {"seq_len": seq_len, "cp": cp, "attention": mode, **mem}
                | dict(zip(("wall", "cpu"), median["cp"]))
                | dict(zip(("base_wall", "base_cpu"), median["base"]))
                | {"imbalance": imbalance(batch[DOC_IDS], index).max().item()}
            )
    if rank == 0:
        Path(args.out).write_text(json.dumps(out))
    dist.barrier()
    dist.destroy_process_group()


def launch(args: argparse.Namespace, cp: int, out: str) -> list[dict[str, Any]]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(cp)]
    cmd += [str(Path(__file__).resolve()), "--worker", "--out", out, "--device", args.device]
    cmd += ["--seq-lens", ",".join(map(str, args.seq_lens)), "--modes", ",".join(args.modes)]
    cmd += ["--rows", str(args.rows), "--pairs", str(args.pairs), "--backend", args.backend]
    cmd += ["--balance", args.balance]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=REPO)
    if proc.returncode:
        sys.exit(
            f"cp = {cp}: torchrun exited {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
        )
    return json.loads(Path(out).read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seq-lens", default="1024,2048,4096,8192", help="comma-separated row lengths")
    parser.add_argument("--cps", default="2,4", help="comma-separated cp degrees (one launch each)")
    parser.add_argument("--modes", default="allgather,ulysses", help="comma-separated cp attention modes")
    parser.add_argument("--rows", type=int, default=1, help="rows per step")
    parser.add_argument("--pairs", type=int, default=3, help="timed (one process, cp) pairs")
    parser.add_argument("--backend", default="sdpa", help="attention.backend")
    parser.add_argument("--balance", default="documents", help="parallel.options.cp.balance")
    parser.add_argument("--device", default="cpu", help="cpu (gloo) or cuda (nccl, one GPU per rank)")
    parser.add_argument("--quick", action="store_true", help="seq_len 512 and 1024, cp 2 and 4, 3 pairs")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.seq_lens = "512,1024"
    args.seq_lens = [int(s) for s in args.seq_lens.split(",")]
    args.modes = args.modes.split(",")
    if args.worker:
        return worker(args)

    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for cp in (int(c) for c in args.cps.split(",")):
            got = launch(args, cp, f"{tmp}/cp{cp}.json")
            # The one-process rows of the first launch stand for cp = 1.
            results += [r for r in got if r["cp"] != 1 or not any(o["cp"] == 1 for o in results)]
    print(
        f"llama dim {MODEL['dim']}, {MODEL['n_layers']} layers, {MODEL['n_heads']} heads "
        f"({MODEL['n_kv_heads']} kv), vocab {VOCAB}, fp32; {args.rows} row(s) per step packed with "
        f"log-normal documents (median 512); attention {args.backend}, balance {args.balance}; "
        f"{args.device} ({'nccl' if args.device == 'cuda' else 'gloo'}), one thread per process"
    )
    print(
        "saved MiB: bytes autograd saves for backward per rank (each storage once, weights left out); "
        "x cp: (saved / cp=1's) x cp, 1.0 = memory falls as 1/cp"
    )
    print(
        f"step ms / CPU ms: medians of {args.pairs} alternated pairs (one process, cp); CPU summed over the "
        "cp ranks; 1-proc: the one-process baseline timed beside them"
    )
    print("imbalance: busiest cp rank's attention work / mean rank's, on these rows")
    if args.device != "cuda":
        print(
            f"caveat: {len(os.sched_getaffinity(0))} CPU core(s) here; cp = 4 runs 4 one-thread processes "
            "on them, so wall ratios above 1 at cp > cores mean shared cores, not cp overhead"
        )
    print(table(results, cuda=args.device == "cuda"))


if __name__ == "__main__":
    main()
