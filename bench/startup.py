"""Start-up: CPU and wall seconds to the end of the first step of ``forge-run``, beside
``python -c "import torch"``.

Each measurement is a fresh ``python -m forge_core.cli CONFIG train.steps=1`` (the
command a user types, in a new run directory each time), alternated with the bare
``import torch`` (A B C A B C ...) so that the load of the shared machine falls on every
side alike. A probe plugin, installed for the children as a distribution in a temporary
directory (its ``forge`` entry point), records at the first step's ``forge_step_end``
the child's CPU seconds since it started (``time.process_time``: every thread) and the
moment, from which the wall time since the parent started it follows. With
``train.steps=1`` the evaluation at the end falls on that step and comes before the hook;
the checkpoint saved at the end and the loss plot come after it, in the whole process's
CPU (its rusage), reported beside. Sides:

- **import torch**: ``python -c "import torch"``, its whole CPU;
- **quickstart**: ``configs/quickstart.yaml`` (``--config``) with ``train.steps=1``,
  evaluation and checkpoints as configured;
- **eval off**: the same with ``eval.enabled=false checkpoint.every=0`` (a run still
  saves its checkpoint at the end).

One untimed run of each side first fills the token cache (``--cache``, a temporary
directory by default) and the OS file cache; its times are printed as the cold start.
Reported: each side's median CPU and wall to the first step and for the whole process,
and the per-round ratio to ``import torch`` (goal: the quickstart's CPU to its first step
within 2x). The load average is printed.

Run: ``python bench/startup.py`` (about a minute on 2 quiet cores; ``--pairs 5``;
``--threads 1``: one torch thread on every side, whose CPU time a busy machine inflates
less; ``--quick``: a tiny model on a tiny corpus, one round, no cold start, no eval-off
line).
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
import alternate  # noqa: E402 - bench/ is not a package

REPO = Path(__file__).resolve().parent.parent
PROBE_ENV = "FORGE_STARTUP_PROBE"

PROBE = '''
"""Records the first step's end for bench/startup.py."""
import json, os, time

from forge_core.api import hookimpl


class Probe:
    done = False

    @hookimpl
    def forge_step_end(self, run, step, metrics):
        if not self.done and os.environ.get("{env}"):
            self.done = True
            with open(os.environ["{env}"], "w") as f:
                json.dump({{"cpu": time.process_time(), "at": time.time()}}, f)


probe = Probe()
'''


def install_probe(site: Path) -> Path:
    """A distribution ``forge-startup-probe`` under ``site``, found by importlib.metadata
    when ``site`` is on ``PYTHONPATH``: its plugin records the first step's end."""
    site.mkdir(parents=True, exist_ok=True)
    (site / "forge_startup_probe.py").write_text(PROBE.format(env=PROBE_ENV))
    info = site / "forge_startup_probe-0.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: forge-startup-probe\nVersion: 0\n")
    (info / "entry_points.txt").write_text("[forge]\nstartup_probe = forge_startup_probe:probe\n")
    return site


def run(cmd: list[str], env: dict[str, str], mark: Path | None = None) -> dict[str, float]:
    """One fresh process: its whole wall and CPU seconds (rusage of the child), and with
    ``mark`` (the probe's file) the CPU and wall seconds to its first step's end."""
    if mark is not None:
        mark.unlink(missing_ok=True)
        env = {**env, PROBE_ENV: str(mark)}
    start = time.time()
    wall = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - wall
    err = proc.stderr.read().decode(errors="replace")
    proc.stderr.close()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{err[-3000:]}")
    out = {"wall": wall, "cpu": usage.ru_utime + usage.ru_stime}
    if mark is not None:
        first = json.loads(mark.read_text())
        out.update(first_cpu=first["cpu"], first_wall=first["at"] - start)
    return out


def tiny_config(root: Path) -> Path:
    """The quick mode's config: the quickstart's shape at a tiny size, on a tiny corpus."""
    import yaml

    docs = root / "docs.jsonl"  # one document per line
    docs.write_text(
        "".join(json.dumps({"text": f"def f{i}(x):\n    return x + {i}\n"}) + "\n" for i in range(100))
    )
    config = yaml.safe_load((REPO / "configs" / "quickstart.yaml").read_text())
    config["model"]["options"] = {"dim": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "max_seq_len": 64}
    config["data"].update(
        source="text",
        source_options={"paths": [str(docs)]},
        seq_len=32,
        heldout={"fraction": 0.2},
    )
    config["train"].update(batch_size=4, warmup_steps=1, peak_tflops=1.0)
    config["eval"]["max_batches"] = 2
    path = root / "tiny.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def sides(config: Path, root: Path, cache: Path, quick: bool) -> dict[str, tuple[list[str], bool]]:
    """``{name: (command, probed)}``; each run of a training side gets a new directory."""
    train = [sys.executable, "-m", "forge_core.cli", str(config), "train.steps=1", f"data.cache.dir={cache}"]
    out = {
        "import torch": ([sys.executable, "-c", "import torch"], False),
        "quickstart": (train, True),
    }
    if not quick:
        out["eval off"] = ([*train, "eval.enabled=false", "checkpoint.every=0"], True)
    return out


def measure(args: argparse.Namespace, root: Path) -> tuple[dict[str, list[dict[str, float]]], dict]:
    """The cold start (unless ``--quick``) and ``--pairs`` rounds of every side."""
    site = install_probe(root / "site")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(site), str(REPO), os.environ.get("PYTHONPATH")])),
    }
    if args.threads:  # every side alike: torch reads it when it starts
        env["OMP_NUM_THREADS"] = str(args.threads)
    config = tiny_config(root) if args.quick else Path(args.config).resolve()
    cache = Path(args.cache) if args.cache else root / "cache"
    todo = sides(config, root, cache, args.quick)
    count = iter(range(10**6))

    def once(name: str) -> dict[str, float]:
        cmd, probed = todo[name]
        if probed:
            cmd = [*cmd, f"run.out_dir={root / 'runs' / str(next(count))}"]
        return run(cmd, env, root / "first.json" if probed else None)

    cold = {} if args.quick else {name: once(name) for name in todo}
    times: dict[str, list[dict[str, float]]] = {name: [] for name in todo}
    for _ in range(args.pairs):
        for name in todo:
            times[name].append(once(name))
    return times, cold


def table(times: dict[str, list[dict[str, float]]], cold: dict[str, dict[str, float]]) -> str:
    """Median seconds per side (to the first step, whole process) and the median per-round
    ratio of the CPU to the first step over ``import torch``'s."""
    median = statistics.median
    base = times["import torch"]
    head = (
        f"{'side':<14}{'first CPU':>10}{'first wall':>11}{'CPU':>8}{'wall':>8}"
        f"{'first CPU / torch':>19}{'runs':>6}"
    )
    lines = [head]
    for name, runs in times.items():
        first = [r.get("first_cpu", r["cpu"]) for r in runs]
        first_wall = [r.get("first_wall", r["wall"]) for r in runs]
        ratio = median(f / b["cpu"] for f, b in zip(first, base))
        lines.append(
            f"{name:<14}{median(first):>10.2f}{median(first_wall):>11.2f}"
            f"{median(r['cpu'] for r in runs):>8.2f}{median(r['wall'] for r in runs):>8.2f}"
            f"{ratio:>19.2f}{len(runs):>6}"
        )
    for name, r in cold.items():
        lines.append(
            f"cold start, {name}: {r.get('first_cpu', r['cpu']):.2f} s CPU to the first step, "
            f"{r['cpu']:.2f} s in all"
        )
    return "\n".join(lines)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(REPO / "configs" / "quickstart.yaml"))
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--cache", default=None, help="token cache directory (default: a temporary one)")
    parser.add_argument("--threads", type=int, default=None, help="OMP_NUM_THREADS of every side")
    parser.add_argument("--quick", action="store_true", help="tiny model, one round, no cold start")
    args = parser.parse_args(argv)
    if args.quick:
        args.pairs = 1
    return args


def main(argv: list[str] | None = None) -> str:
    args = parse(argv)
    print(alternate.load_line(), flush=True)
    with tempfile.TemporaryDirectory(prefix="forge-startup-") as tmp:
        times, cold = measure(args, Path(tmp))
    text = table(times, cold)
    print(text)
    return text


if __name__ == "__main__":
    main()
