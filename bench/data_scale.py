"""Data-path scaling benchmark: corpora of 10 M and 100 M tokens, side by side in one run.

For each corpus (synthetic documents of random lowercase words, log-normal lengths with
median 300 tokens and sigma 1.0, written as JSON Lines under ``--root``, default
``/tmp/forge-data-scale``; byte tokenizer, so one token per byte plus EOS):

- **start-up**: a training process (the quickstart model and packing, ``concat``, 256
  tokens a row, batch 16) is started twice on the same token cache: the first run
  tokenizes the corpus into the cache, the second opens it. Reported: seconds from the
  process start to its first training step (``forge_train_start``), and the data build
  itself (the summary line's time).
- **memory**: the peak resident set size of each process up to the end of its first
  step (``ru_maxrss``), and, split at the end of that step (``/proc/self/status``),
  the anonymous memory (``RssAnon``: the heap, tensors, numpy arrays: what the process
  holds) apart from the file-backed pages (``RssFile``: the memory-mapped token cache
  and the shared libraries, pages the kernel can drop and read back, so not memory
  the process keeps); each one's growth per corpus token between the two corpora. One
  training process's anonymous memory at step 1 varies by about 20 MB from run to run
  (the allocator's arenas), the size of the whole growth at these corpus sizes, so the
  data build is also measured alone: ``RssAnon`` in this process before and after
  :func:`~forge_core.data.build.build_training_data` on the second run's config, and
  exactly, as the ``nbytes`` of the anonymous (not memory-mapped) arrays the built data
  holds (:func:`anonymous_array_bytes`; the allocator does not blur it).
- **loader**: rows per second the loader reads (16-row batches, shuffled, no workers,
  from the cache) against rows per second the quickstart model trains on in this
  process (measured on the same machine: a few steps of ``configs/quickstart.yaml``).

Targets: anonymous memory grows by less than 0.1 byte per corpus token between the
corpora (the peak RSS, file-backed pages included, by less than 1; the eager rows of
before took about 32), the second start-up is under 2 s at 100 M tokens, and the
loader reads at least 20 times what the model consumes. The load average is printed:
the machine is shared and every time depends on it.

Run: ``python bench/data_scale.py`` (4 M and 40 M tokens, about 5 minutes; ``--sizes
1e6,1e7`` for a smoke run).
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import attrs
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/alternate.py, however loaded
from alternate import status_kib  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
WORDS_PER_FILE = 1_000_000  # tokens per JSON Lines file


def make_corpus(directory: Path, tokens: int, seed: int = 0) -> dict:
    """Synthetic documents whose byte lengths (+1 for EOS) add up to about ``tokens``."""
    marker = directory / "done.json"
    if marker.is_file():
        return json.loads(marker.read_text())
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    letters = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz     ", dtype=np.uint8)
    total = docs = files = 0
    out, in_file = None, 0
    while total < tokens:
        lengths = np.maximum(2, np.rint(rng.lognormal(np.log(300), 1.0, 4096))).astype(np.int64)
        text = letters[rng.integers(0, len(letters), int(lengths.sum()))].tobytes().decode()
        pos = 0
        for n in lengths.tolist():
            if total >= tokens:
                break
            if out is None or in_file >= WORDS_PER_FILE:
                if out is not None:
                    out.close()
                out = open(directory / f"part-{files:05d}.jsonl", "w")
                files, in_file = files + 1, 0
            body = "x" + text[pos : pos + n - 2]  # never empty, never only spaces
            pos += n - 2
            out.write(json.dumps({"text": body}) + "\n")
            total += len(body) + 1
            in_file += len(body) + 1
            docs += 1
    out.close()
    info = {"tokens": total, "documents": docs, "files": files}
    marker.write_text(json.dumps(info))
    return info


def config(corpus: Path, cache: Path, run_dir: Path, steps: int) -> dict:
    return {
        "run": {"name": "scale", "out_dir": str(run_dir), "device": "cpu"},
        "model": {
            "name": "llama",
            "options": {"dim": 256, "n_layers": 4, "n_heads": 4, "n_kv_heads": 2, "max_seq_len": 256},
        },
        "attention": {"backend": "sdpa"},
        "data": {
            "source": "text",
            "source_options": {"paths": [str(corpus / "*.jsonl")]},
            "tokenizer": "byte",
            "packer": "concat",
            "seq_len": 256,
            "cache": {"dir": str(cache)},
        },
        "train": {"steps": steps, "batch_size": 16, "lr": 3e-3, "peak_tflops": 1.0},
        "checkpoint": {"every": 0, "keep": 1},
        "logging": {"loggers": []},
    }


CHILD = """
import json, resource, sys, time
from pathlib import Path
t0 = float(sys.argv[2])
from forge_core.api import hookimpl
from forge_core.cli.train import train

out = {}

class Probe:
    @hookimpl
    def forge_train_start(self, run):
        out["to_first_step"] = time.time() - t0
    @hookimpl
    def forge_step_end(self, step, metrics):
        if step == 1:
            out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            for line in Path("/proc/self/status").read_text().splitlines():
                key = line.split(":")[0]
                if key in ("RssAnon", "RssFile", "RssShmem"):
                    out[key] = int(line.split()[1]) / 1024  # kB -> MB
        out.setdefault("step_times", []).append(metrics["step_time"])

train(sys.argv[1], [], extra_plugins=(("probe", Probe()),))
json.dump(out, open(sys.argv[3], "w"))
"""


def growth(small: dict, large: dict, tokens: int) -> dict[str, float]:
    """Bytes per corpus token each memory figure (MB) grew by from the ``small`` run to the
    ``large`` one, ``tokens`` more tokens: the peak RSS, and, where both runs read them,
    the anonymous and file-backed memory at step 1."""
    keys = ["peak_rss_mb"] + [k for k in ("RssAnon", "RssFile") if k in small and k in large]
    return {key: (large[key] - small[key]) * 2**20 / tokens for key in keys}


def run_child(cfg: dict, tmp: Path, name: str) -> dict:
    path = tmp / f"{name}.json"
    path.write_text(json.dumps(cfg))
    result = tmp / f"{name}.result.json"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(path), repr(time.time()), str(result)],
        capture_output=True,
        text=True,
        env=env,
        timeout=3600,
    )
    if done.returncode != 0:
        raise SystemExit(f"{name} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    out = json.loads(result.read_text())
    line = next((line for line in done.stdout.splitlines() if line.startswith("forge: data:")), "")
    out["data_line"] = line
    out["data_s"] = float(line.split(" in ")[1].split("s")[0]) if " in " in line else float("nan")
    return out


def rss_anon_mb() -> float:
    """This process's anonymous resident memory now (``RssAnon``), MB; NaN without /proc."""
    kib = status_kib("RssAnon")
    return float("nan") if kib is None else kib / 1024


def _file_backed(array: np.ndarray) -> bool:
    """Whether ``array``'s memory is a memory map (its base chain ends in one)."""
    base = array
    while isinstance(base, np.ndarray):
        if isinstance(base, np.memmap):
            return True
        base = base.base
    return isinstance(base, mmap.mmap)


def anonymous_array_bytes(root: object) -> int:
    """``nbytes`` of every distinct array reachable from ``root`` (through attributes,
    attrs fields, lists, tuples and dicts) whose memory is not a memory map; an array
    counted once however many objects (or views) hold it."""
    seen: set[int] = set()
    buffers: dict[int, int] = {}
    todo = [root]
    while todo:
        obj = todo.pop()
        if id(obj) in seen or obj is None or isinstance(obj, (int, float, str, bytes, bool)):
            continue
        seen.add(id(obj))
        if isinstance(obj, np.ndarray):
            if not _file_backed(obj):
                owner = obj
                while isinstance(owner.base, np.ndarray):
                    owner = owner.base
                buffers[id(owner)] = owner.nbytes
            continue
        if isinstance(obj, dict):
            todo.extend(obj.values())
        elif isinstance(obj, (list, tuple)):
            todo.extend(obj)
        elif attrs.has(type(obj)):  # frozen slotted classes have no __dict__
            todo.extend(getattr(obj, f.name) for f in attrs.fields(type(obj)))
        elif hasattr(obj, "__dict__"):
            todo.extend(vars(obj).values())
    return sum(buffers.values())


def loader_rate(cfg_path: Path, seconds: float = 3.0) -> tuple[float, float, int]:
    """Rows/s the loader reads from the cache (data built in this process), the
    anonymous memory (MB) the data build added to this process, and the bytes of the
    anonymous arrays the built data holds (:func:`anonymous_array_bytes`: exact)."""
    from forge_core import components
    from forge_core.data.build import build_training_data
    from forge_core.data.loader import StatefulLoader
    from forge_core.plan import make_plan
    from forge_core.resolve import load_resolved

    cfg, registries = load_resolved(str(cfg_path))
    plan = make_plan(cfg, registries, 1)
    tokenizer = components.tokenizer(plan, registries)
    before = rss_anon_mb()
    data = build_training_data(plan, registries, tokenizer, report=lambda m: None)
    built = rss_anon_mb() - before
    arrays = anonymous_array_bytes(data)
    loader = StatefulLoader(data.rows, 16, seed=0, shuffle=True)
    next(loader)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        next(loader)
        n += 1
    return n * 16 / (time.perf_counter() - t0), built, arrays


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--root", default="/tmp/forge-data-scale", help="where corpora and caches go (not the repo)"
    )
    p.add_argument("--sizes", default="4e6,4e7", help="corpus sizes in tokens")
    p.add_argument(
        "--model-steps", type=int, default=6, help="quickstart steps timed for the consumption rate"
    )
    args = p.parse_args()
    root = Path(args.root)
    sizes = [int(float(s)) for s in args.sizes.split(",")]
    print(f"load average at start: {', '.join(f'{x:.2f}' for x in os.getloadavg())} ({os.cpu_count()} CPUs)")
    results = {}
    for size in sizes:
        name = f"{size / 1e6:g}M"
        corpus = root / f"corpus-{name}"
        t = time.perf_counter()
        info = make_corpus(corpus, size)
        print(
            f"{name}: {info['tokens']:,} tokens, {info['documents']:,} documents, {info['files']} files "
            f"({time.perf_counter() - t:.1f}s to make or find)",
            flush=True,
        )
        cache = root / f"cache-{name}"
        shutil.rmtree(cache, ignore_errors=True)
        tmp = root / f"runs-{name}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        first = run_child(config(corpus, cache, tmp / "first", 1), tmp, "first")
        second = run_child(config(corpus, cache, tmp / "second", 1), tmp, "second")
        cfg_path = tmp / "second.json"
        rate, built, arrays = loader_rate(cfg_path)
        results[name] = {
            "info": info,
            "first": first,
            "second": second,
            "loader": rate,
            "build": {"RssAnon": built, "arrays": arrays},
        }
        print(
            f"  first:  {first['to_first_step']:.1f}s to the first step (data {first['data_s']:.1f}s), "
            f"peak RSS {first['peak_rss_mb']:.0f} MB",
            flush=True,
        )
        print(
            f"  second: {second['to_first_step']:.1f}s to the first step (data {second['data_s']:.2f}s), "
            f"peak RSS {second['peak_rss_mb']:.0f} MB",
            flush=True,
        )
        print(f"  {second['data_line']}", flush=True)
        print(f"  loader: {results[name]['loader']:,.0f} rows/s", flush=True)

    # What the quickstart model consumes here: its own config, a few steps.
    qs = root / "quickstart"
    shutil.rmtree(qs, ignore_errors=True)
    qs.mkdir(parents=True)
    import yaml

    quick = yaml.safe_load((REPO / "configs" / "quickstart.yaml").read_text())
    quick["run"]["out_dir"] = str(qs / "run")
    quick["run"]["device"] = "cpu"
    quick["train"].update(steps=args.model_steps, peak_tflops=1.0)
    quick["checkpoint"] = {"every": 0, "keep": 1}
    quick["logging"] = {"loggers": []}
    quick["data"]["cache"] = {"dir": str(qs / "cache")}
    measured = run_child(quick, qs, "quickstart")
    step = float(np.median(measured["step_times"][1:]))
    consumed = quick["train"]["batch_size"] / step

    print()
    print(f"load average at end: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"quickstart model consumes {consumed:,.1f} rows/s ({step:.3f} s a step of 16 rows of 256 tokens)")
    header = f"{'':24}" + "".join(f"{name:>16}" for name in results)
    print(header)
    for label, get in (
        ("tokens", lambda r: f"{r['info']['tokens']:,}"),
        ("1st start (s)", lambda r: f"{r['first']['to_first_step']:.1f}"),
        ("1st data build (s)", lambda r: f"{r['first']['data_s']:.1f}"),
        ("2nd start (s)", lambda r: f"{r['second']['to_first_step']:.2f}"),
        ("2nd data build (s)", lambda r: f"{r['second']['data_s']:.2f}"),
        ("1st peak RSS (MB)", lambda r: f"{r['first']['peak_rss_mb']:.0f}"),
        ("2nd peak RSS (MB)", lambda r: f"{r['second']['peak_rss_mb']:.0f}"),
        ("2nd anon at step 1 (MB)", lambda r: f"{r['second'].get('RssAnon', float('nan')):.1f}"),
        ("2nd file at step 1 (MB)", lambda r: f"{r['second'].get('RssFile', float('nan')):.1f}"),
        ("data build anon (MB)", lambda r: f"{r['build']['RssAnon']:.1f}"),
        ("data arrays (B/token)", lambda r: f"{r['build']['arrays'] / r['info']['tokens']:.3f}"),
        ("loader rows/s", lambda r: f"{r['loader']:,.0f}"),
        ("loader / consumed", lambda r: f"{r['loader'] / consumed:,.0f}x"),
    ):
        print(f"{label:24}" + "".join(f"{get(r):>16}" for r in results.values()))
    if len(results) >= 2:
        (a, ra), (b, rb) = list(results.items())[0], list(results.items())[-1]
        dt = rb["info"]["tokens"] - ra["info"]["tokens"]
        for run in ("first", "second"):
            grow = growth(ra[run], rb[run], dt)
            print(
                f"peak RSS growth {a} -> {b}, {run} run: {grow['peak_rss_mb']:.3f} bytes/token (target < 1; "
                "eager: ~32)"
            )
            if "RssAnon" in grow:
                print(
                    f"  at step 1: anonymous {grow['RssAnon']:.3f} bytes/token (target < 0.1), file-backed "
                    f"{grow['RssFile']:.3f} bytes/token (mapped pages the kernel may drop)"
                )
        built = (rb["build"]["RssAnon"] - ra["build"]["RssAnon"]) * 2**20 / dt
        print(
            f"data build alone (in this process, RssAnon before and after): anonymous {built:.3f} "
            "bytes/token (target < 0.1)"
        )
        arrays = (rb["build"]["arrays"] - ra["build"]["arrays"]) / dt
        print(
            f"  the anonymous arrays the built data holds, counted (not RSS): {arrays:.3f} bytes/token "
            "(target < 0.1)"
        )
        print(
            f"second start at {b}: {rb['second']['to_first_step']:.2f} s to the first step, of which "
            f"{rb['second']['data_s']:.2f} s data (target < 2 s)"
        )
        print(f"loader at {b}: {rb['loader'] / consumed:,.0f}x what the model consumes (target >= 20x)")


if __name__ == "__main__":
    main()
