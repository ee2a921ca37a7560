"""The step stall of a checkpoint save, synchronous against ``checkpoint.async: true``.

A model of ``--layers`` square linear layers of width ``--width`` (50 M parameters by
default: 600 MB of checkpoint with AdamW's two moments) trains on random data; after
``--warmup`` steps and ``--base`` timed plain steps, one save goes through
:class:`~forge_core.train.checkpoint.CheckpointManager` (the trainer's own path:
DCP, train state, SHA-256 manifest, ``latest``), then ``--after`` more steps run
(collecting a background save at each step boundary, as the trainer does) and the
save is waited for. Reported for each way, in its own fresh process, alternated
(A sync, B async, A B ...) so that the load of the shared machine falls on both alike:

- **call**: the save call at the step boundary, wall and CPU (process time, every
  thread): what the step that saves waits for (async: the copy in memory);
- **wait**: the wait for the save after those steps (async: the rest of the background
  write; what the next save or the end of the run waits for when it comes sooner);
- **stall**: the wall and CPU of the save call, the ``--after`` steps and the wait, minus
  as many plain steps (the median of the timed ones): what the save cost the run in
  all, background writing that slowed the steps included;
- **landed**: for async, how many of the steps after the save ran before it was
  complete (``--after``: only at the wait).

Run: ``python bench/checkpoint_stall.py`` (about a minute on 2 cores at a load of 2, 8 at
a load of 14; ``--pairs 3``,
``--threads 1``; ``--dir`` where checkpoints are written, removed after each child).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
WAYS = ("sync", "async")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--batch", type=int, default=32, help="rows of width inputs per step")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--base", type=int, default=3, help="plain steps timed before the save")
    parser.add_argument("--after", type=int, default=8, help="steps timed after the save")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--dir", default=tempfile.gettempdir())
    return parser.parse_args(argv)


def _timed(fn) -> tuple[float, float]:
    w, c = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - w, time.process_time() - c


def measure(args: argparse.Namespace, way: str, run_dir: Path) -> dict:
    """One way in this process: the times of the plain steps, the save call and the
    steps after it (see the module's docstring)."""
    import torch

    from forge_core.train.checkpoint import CheckpointManager

    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    model = torch.nn.Sequential(*(torch.nn.Linear(args.width, args.width) for _ in range(args.layers)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    x = torch.randn(args.batch, args.width)
    manager = CheckpointManager(run_dir, keep=1, rank=0, world_size=1, background=way == "async")

    def step() -> None:
        model(x).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        manager.poll()

    for _ in range(args.warmup):
        step()
    base = [_timed(step) for _ in range(args.base)]
    after: list[tuple[float, float]] = []
    landed: list[int] = []  # the steps after the save that ran before it was complete
    call = _timed(
        lambda: manager.save(1, [model], [optimizer], {"step": 1}, saved=lambda p: landed.append(len(after)))
    )
    for _ in range(args.after):
        after.append(_timed(step))
    wait = _timed(manager.wait)
    plain_wall = statistics.median(w for w, _ in base)
    plain_cpu = statistics.median(c for _, c in base)
    return {
        "way": way,
        "params": sum(p.numel() for p in model.parameters()),
        "step_wall": plain_wall,
        "step_cpu": plain_cpu,
        "call_wall": call[0],
        "call_cpu": call[1],
        "wait_wall": wait[0],
        "wait_cpu": wait[1],
        "stall_wall": call[0] + sum(w for w, _ in after) + wait[0] - len(after) * plain_wall,
        "stall_cpu": call[1] + sum(c for _, c in after) + wait[1] - len(after) * plain_cpu,
        "landed": landed[0] if way == "async" else 0,
    }


def _child(args: argparse.Namespace, way: str) -> dict:
    run_dir = Path(tempfile.mkdtemp(prefix="forge-ckpt-stall-", dir=args.dir))
    argv = [f"--{k}={v}" for k, v in vars(args).items()]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": str(args.threads)}
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); import checkpoint_stall as b; "
        "from pathlib import Path; "
        "print(json.dumps(b.measure(b.parse(sys.argv[4:]), sys.argv[2], Path(sys.argv[3]))))"
    )
    try:
        done = subprocess.run(
            [sys.executable, "-c", code, str(REPO / "bench"), way, str(run_dir), *argv],
            capture_output=True,
            text=True,
            env=env,
            timeout=1800,
        )
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    if done.returncode != 0:
        raise SystemExit(f"{way} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def summary(rows: list[dict]) -> dict[str, dict[str, float]]:
    """Medians of each way's figures over its runs."""
    keys = (
        "step_wall",
        "step_cpu",
        "call_wall",
        "call_cpu",
        "wait_wall",
        "wait_cpu",
        "stall_wall",
        "stall_cpu",
    )
    return {
        way: {k: statistics.median(r[k] for r in rows if r["way"] == way) for k in keys}
        for way in WAYS
        if any(r["way"] == way for r in rows)
    }


def table(rows: list[dict]) -> str:
    med = summary(rows)
    lines = [
        f"{'way':>6}  {'step wall/cpu s':>16}  {'save call wall/cpu s':>21}  {'wait wall/cpu s':>17}"
        f"  {'stall wall/cpu s':>17}"
    ]
    for way, m in med.items():
        lines.append(
            f"{way:>6}  {m['step_wall']:7.3f} / {m['step_cpu']:6.3f}"
            f"  {m['call_wall']:10.3f} / {m['call_cpu']:8.3f}"
            f"  {m['wait_wall']:8.3f} / {m['wait_cpu']:6.3f}"
            f"  {m['stall_wall']:8.3f} / {m['stall_cpu']:6.3f}"
        )
    if set(med) == set(WAYS):
        a, b = med["sync"], med["async"]
        lines.append(
            f"async / sync: save call {b['call_wall'] / a['call_wall']:.3f} wall, "
            f"{b['call_cpu'] / a['call_cpu']:.3f} cpu; stall {b['stall_wall'] / a['stall_wall']:.3f} wall, "
            f"{b['stall_cpu'] / a['stall_cpu']:.3f} cpu"
        )
    return "\n".join(lines)


def main() -> None:
    args = parse()
    rows = []
    for _ in range(args.pairs):
        for way in WAYS:
            rows.append(_child(args, way))
    print(
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; {rows[0]['params'] / 1e6:.1f} M "
        f"parameters; {args.pairs} A B pairs (A sync, B async), medians"
    )
    print(table(rows))
    print("async landed after steps:", [r["landed"] for r in rows if r["way"] == "async"])


if __name__ == "__main__":
    main()
