"""Peak memory saved by activation checkpointing: the same run with and without
``parallel.wrappers: [act_ckpt]``, side by side.

The shape is one where activations dominate: a llama of 8 blocks, dim 256, on rows of
1024 tokens, 8 rows a step (a few million parameters, hundreds of MB of activations per
step). Each run is its own ``forge-run`` process (byte tokenizer on the embedded stdlib
corpus, 3 steps, fp32, CPU); the figure is the trainer's own ``mem_rss_peak_gib``
(the process's resident-memory high-water mark, ``VmHWM``) from ``metrics.jsonl``, and
the ``--every`` k runs checkpoint every k-th block.

Reported: each run's peak RSS, its saving against the run without checkpointing and the
ratio, and the mean step time (recomputation costs about one more forward per step; the
machine is shared, so read the time as a rough figure). The first step is left out of
the time.

Run: ``python bench/activation_memory.py`` (three runs of three steps; measured 10
minutes on a busy 2-core machine; ``--every 1,2`` by default). Measured there: peak RSS
2.28 GB without, 1.28 GB checkpointing every block (0.56), 1.80 GB every second block
(0.79), the same last loss in all three.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent


def config(out_dir: Path, layers: int, dim: int, seq_len: int, rows: int, steps: int) -> dict:
    return {
        "run": {"name": "act-mem", "out_dir": str(out_dir), "seed": 0, "device": "cpu"},
        "model": {
            "name": "llama",
            "options": {
                "dim": dim,
                "n_layers": layers,
                "n_heads": 4,
                "n_kv_heads": 2,
                "max_seq_len": seq_len,
            },
        },
        "attention": {"backend": "sdpa"},
        "data": {
            "source": "stdlib",
            "source_options": {"max_bytes": 2_000_000},
            "tokenizer": "byte",
            "packer": "concat",
            "seq_len": seq_len,
        },
        "train": {"steps": steps, "batch_size": rows, "lr": 1e-3, "warmup_steps": 0, "precision": "fp32"},
        "checkpoint": {"every": 0},
        "logging": {"loggers": ["jsonl"], "every": 1},
    }


def run(work: Path, label: str, overrides: list[str], args: argparse.Namespace) -> dict:
    out = work / label
    path = work / f"{label}.yaml"
    path.write_text(yaml.safe_dump(config(out, args.layers, args.dim, args.seq_len, args.rows, args.steps)))
    proc = subprocess.run(
        [sys.executable, "-m", "forge_core.cli", str(path), *overrides],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    if proc.returncode != 0:
        sys.exit(f"{label}: forge-run exited {proc.returncode}\n{proc.stderr[-3000:]}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [r for r in rows if "mem_rss_peak_gib" in r]
    times = [r["step_time"] for r in steps[1:] if "step_time" in r]
    return {
        "label": label,
        "peak_gib": max(r["mem_rss_peak_gib"] for r in steps),
        "step_s": sum(times) / len(times) if times else float("nan"),
        "loss": steps[-1]["loss"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--every", default="1,2", help="comma-separated k of the checkpointed runs")
    args = parser.parse_args()
    print(
        f"llama {args.layers} blocks, dim {args.dim}, {args.rows} rows x {args.seq_len} tokens, "
        f"{args.steps} steps, fp32 on CPU"
    )
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        base = run(work, "without", [], args)
        results = [base] + [
            run(
                work,
                f"every {k}",
                ["parallel.wrappers=[act_ckpt]", f"parallel.options.act_ckpt.every={k}"],
                args,
            )
            for k in (int(v) for v in args.every.split(","))
        ]
    print(f"{'run':<10} {'peak RSS':>10} {'saved':>10} {'ratio':>7} {'step':>8} {'last loss':>10}")
    for r in results:
        saved = base["peak_gib"] - r["peak_gib"]
        print(
            f"{r['label']:<10} {r['peak_gib']:>8.3f} G {saved:>8.3f} G "
            f"{r['peak_gib'] / base['peak_gib']:>7.3f} "
            f"{r['step_s']:>7.2f}s {r['loss']:>10.4f}"
        )


if __name__ == "__main__":
    main()
