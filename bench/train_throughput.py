"""Training throughput: Forge's loop vs ``transformers.LlamaForCausalLM`` in a plain
PyTorch loop, like with like: eager against eager, compiled against compiled
(``train.compile`` for Forge, ``torch.compile(model)`` for transformers), at the same
model shape, weights, batches, optimizer and precision.

    python bench/train_throughput.py [--shapes quickstart vocab32k] [--precisions fp32 bf16]
                                     [--modes eager compiled] [--pairs 3] [--warmup 2 --steps 4]
                                     [--threads 1]

Every measurement is a fresh process, and the sides alternate (Forge, transformers,
Forge, transformers, ...: ``--pairs`` rounds), so the load of a shared machine falls on
both alike. Each comparison prints the median over the rounds of the per-round ratios,
per CPU-second (process time: what a loaded machine perturbs least) beside per
wall-second, with their range.

- Shapes: ``quickstart`` (dim 256, 4 layers, 4 heads / 2 kv heads, batch 16 x sequence
  256, the byte vocabulary of 258) and ``vocab32k`` (the same blocks, batch 2 x sequence
  1,024, a vocabulary of 32,768: byte tokens, the embedding and output layer padded to
  32,768 rows, so the output layer and the loss cost what a 32k tokenizer's do).
- The headline is full logits against full logits (Forge's ``train.loss.name: full``,
  transformers' ``F.cross_entropy`` over the float logits). At the 32k vocabulary Forge's
  ``chunked`` loss (which never holds the whole logits) runs as a third side of every
  round and gets its own line against the same transformers processes.
- Forge runs its ``adamw`` plugin and its trainer step; transformers the step a user
  writes (forward, loss, backward, ``clip_grad_norm_``, ``torch.optim.AdamW``) with the
  same hyperparameters, ``foreach=True`` (what Forge's ``implementation: auto`` picks on
  CPU) and the same decay groups (Forge's, by parameter name: decay on the matrices and
  the embedding, none on norms and biases). Both start from Forge's initial weights and
  read the same packed rows in the same order (stdlib corpus, byte tokenizer, ``concat``
  without document isolation, so both compute plain causal attention with sdpa).
- Compile granularity differs and is printed: Forge compiles each block on its own
  (``train.compile``), transformers' user compiles the whole model in one call; in both
  the loss and the optimizer run eager.
- Per configuration: tokens/s (median step), CPU seconds per step, peak RSS of the whole
  process and of the measured steps alone (``/proc/self/clear_refs`` resets the
  high-water mark after warm-up; Linux), peak allocated memory on CUDA, the first step's
  loss (the same weights and batch give the same loss up to rounding), Forge's MFU.
- The profile (one more step under ``torch.profiler``, in the first round) splits self
  time into matmul, attention, norms, loss, optimizer (clipping included), data, fused
  (compiled kernels that are not a matmul: norms, rotary, activations fused together) and
  other. Ops are classified by name (matmuls, attention) or by the labelled region they
  run in (data, loss, optimizer, norms: a range around every RMSNorm in eager mode); a
  backward op takes the category of the forward op that created it (the autograd
  sequence number).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from forge_core.api import IGNORE_INDEX, INPUT_IDS, LABELS, TokenizerSpec, hookimpl

SHAPES = {
    "quickstart": {"dim": 256, "layers": 4, "heads": 4, "kv_heads": 2, "seq": 256, "batch": 16, "vocab": 0},
    "vocab32k": {"dim": 256, "layers": 4, "heads": 4, "kv_heads": 2, "seq": 1024, "batch": 2, "vocab": 32768},
}
CATEGORIES = ("matmul", "attention", "norms", "loss", "optimizer", "data", "fused", "other")
LR, BETAS, WEIGHT_DECAY, GRAD_CLIP = 1e-3, (0.9, 0.95), 0.1, 1.0


class PaddedByteTokenizer:
    """The byte tokenizer with its vocabulary padded to ``vocab_size`` rows (ids above
    257 never occur in the data; the model's embedding and output layer are that large)."""

    vocab_size = 258

    def __init__(self, options: Any = None) -> None:
        from forge_plugins.tokenizers.byte import ByteTokenizer

        self.inner = ByteTokenizer()
        self.eos_id, self.pad_id = self.inner.eos_id, self.inner.pad_id
        self.identity = f"{self.inner.identity}:padded={self.vocab_size}"

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class PaddedVocab:
    @hookimpl
    def forge_tokenizers(self):
        return [
            TokenizerSpec(
                name="byte_padded",
                summary="byte tokens, vocabulary padded",
                impl="train_throughput:PaddedByteTokenizer",
            )
        ]


#: What each side compiles (``--modes compiled``); printed with the results.
GRANULARITY = {
    "forge": "train.compile: torch.compile on each block, one by one; embedding, final norm, "
    "output head, loss and optimizer eager",
    "hf": "torch.compile(model): the whole LlamaForCausalLM (embedding, blocks, final norm, "
    "output head) in one call; loss and optimizer eager",
}


def sides(shape: str) -> list[tuple[str, str]]:
    """``(framework, loss)`` of each process of a round, in the order they run: full
    logits against full logits first; at the 32k vocabulary Forge's chunked loss too."""
    out = [("forge", "full"), ("hf", "full")]
    return out + [("forge", "chunked")] if SHAPES[shape]["vocab"] else out


def schedule(shapes, precisions, modes, pairs: int) -> list[dict]:
    """Every process to run, in order: per shape, precision and mode, ``pairs`` rounds of
    :func:`sides` (A B A B ...: alternated, so the machine's load falls on both alike)."""
    runs = []
    for shape in shapes:
        for precision in precisions:
            for mode in modes:
                for round_ in range(pairs):
                    for framework, loss in sides(shape):
                        runs.append(
                            {
                                **SHAPES[shape],
                                "shape": shape,
                                "precision": precision,
                                "mode": mode,
                                "framework": framework,
                                "loss": loss,
                                "round": round_,
                            }
                        )
    return runs


def _median_range(values: list[float]) -> str:
    return f"{statistics.median(values):.2f}x [{min(values):.2f}-{max(values):.2f}]"


def comparisons(results: list[dict]) -> list[dict]:
    """Forge (each loss) against transformers, per shape, precision and mode: the per-round
    ratios (Forge's tokens/s over transformers' by wall clock; transformers' CPU seconds
    per step over Forge's, so above 1 means Forge does a step in less CPU time)."""
    groups: dict[tuple, dict[int, dict[str, dict]]] = {}
    for r in results:
        key = (r["shape"], r["precision"], r["mode"])
        name = "hf" if r["framework"] == "hf" else f"forge {r['loss']}"
        groups.setdefault(key, {}).setdefault(r["round"], {})[name] = r
    out = []
    for (shape, precision, mode), rounds in groups.items():
        for forge in ("forge full", "forge chunked"):
            pairs = [(rd[forge], rd["hf"]) for rd in rounds.values() if forge in rd and "hf" in rd]
            if not pairs:
                continue
            out.append(
                {
                    "shape": shape,
                    "precision": precision,
                    "mode": mode,
                    "forge": forge,
                    "pairs": len(pairs),
                    "cpu": [h["cpu_s_per_step"] / f["cpu_s_per_step"] for f, h in pairs],
                    "wall": [f["tokens_per_s"] / h["tokens_per_s"] for f, h in pairs],
                }
            )
    return out


def forge_config(cfg: dict, out_dir: str) -> dict:
    padded = cfg["vocab"] > 0
    loss = {"name": cfg["loss"]}
    return {
        "run": {"name": "bench", "out_dir": out_dir, "seed": 0, "device": cfg["device"]},
        "model": {
            "name": "llama",
            "options": {
                "dim": cfg["dim"],
                "n_layers": cfg["layers"],
                "n_heads": cfg["heads"],
                "n_kv_heads": cfg["kv_heads"],
                "max_seq_len": cfg["seq"],
            },
        },
        "attention": {"backend": "sdpa"},
        "data": {
            "source": "stdlib",
            "source_options": {"max_bytes": cfg.get("max_bytes", 2_000_000)},
            "tokenizer": "byte_padded" if padded else "byte",
            "packer": "concat",
            "packer_options": {"isolate": False},
            "seq_len": cfg["seq"],
        },
        "train": {
            "steps": 10**6,
            "batch_size": cfg["batch"],
            "lr": LR,
            "warmup_steps": 0,
            "schedule": "constant",
            "optimizer": "adamw",
            "grad_clip": GRAD_CLIP,
            "precision": cfg["precision"],
            "optimizer_options": {"weight_decay": WEIGHT_DECAY, "beta1": BETAS[0], "beta2": BETAS[1]},
            "compile": cfg["mode"] == "compiled" and cfg["framework"] == "forge",
            "peak_tflops": 0.0,
            "loss": loss,
        },
        "checkpoint": {"resume": "never"},
        "logging": {"loggers": []},
    }


def build_forge(cfg: dict, tmp: str):
    import train_throughput  # the module the tokenizer spec names (this file, imported by name)

    from forge_core.distributed.placement import setup
    from forge_core.judge import judge
    from forge_core.train.trainer import Trainer

    train_throughput.PaddedByteTokenizer.vocab_size = cfg["vocab"] or 258
    path = Path(tmp) / "bench.yaml"
    path.write_text(yaml.safe_dump(forge_config(cfg, str(Path(tmp) / "run"))))
    result = judge(str(path), [], 1, extra_plugins=(("bench_vocab", PaddedVocab()),))
    assert not result.errors, result.errors
    trainer = Trainer(result.plan, result.registries, setup(cfg["device"]))
    trainer.build()
    return trainer


def build_hf(trainer, compiled: bool):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from forge_plugins.models.hf_keys import to_hf_key
    from forge_plugins.models.options import ffn_hidden_size

    options = trainer.config.model.options
    part = trainer.parts.pmodel.parts[0]
    config = LlamaConfig(
        vocab_size=part.vocab_size,
        hidden_size=options.dim,
        intermediate_size=ffn_hidden_size(options),
        num_hidden_layers=options.n_layers,
        num_attention_heads=options.n_heads,
        num_key_value_heads=options.n_kv_heads,
        max_position_embeddings=options.max_seq_len,
        rms_norm_eps=options.norm_eps,
        rope_theta=options.rope_theta,
        tie_word_embeddings=options.tie_embeddings,
        attention_bias=False,
        mlp_bias=False,
    )
    config._attn_implementation = "sdpa"
    model = LlamaForCausalLM(config).to(trainer.placement.device)
    mapped = {
        to_hf_key(k): v.detach().clone() for k, v in part.state_dict().items() if not k.startswith("rope")
    }
    missing, unexpected = model.load_state_dict(mapped, strict=False)
    assert not unexpected and all("rotary" in k for k in missing), (missing, unexpected)
    (forge_optimizer,) = trainer.parts.optimizers
    optimizer = torch.optim.AdamW(
        hf_param_groups(part, forge_optimizer, model),
        lr=LR,
        betas=BETAS,
        eps=forge_optimizer.defaults["eps"],
        foreach=True,
    )
    return (torch.compile(model) if compiled else model), model, optimizer


def hf_param_groups(part, forge_optimizer, model) -> list[dict]:
    """Forge's optimizer groups (their weight decay and members, in order) over the
    transformers model's parameters of the same names."""
    from forge_plugins.models.hf_keys import to_hf_key

    names = {id(p): name for name, p in part.named_parameters()}
    hf = dict(model.named_parameters())
    groups = [
        {"params": [hf[to_hf_key(names[id(p)])] for p in g["params"]], "weight_decay": g["weight_decay"]}
        for g in forge_optimizer.param_groups
    ]
    assert sum(len(g["params"]) for g in groups) == len(hf), "every parameter in one group"
    return groups


def hf_step(model, params, optimizer, loader, precision: str, device) -> float:
    """One step as a user writes it (ranges label it for the profile); returns the loss."""
    import torch
    import torch.nn.functional as F
    from torch.profiler import record_function

    with record_function("bench.data"):
        batch = next(loader)
        x, y = batch[INPUT_IDS].to(device), batch[LABELS].to(device)
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
        logits = model(input_ids=x).logits
        with record_function("bench.loss"):
            loss = F.cross_entropy(
                logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1), ignore_index=IGNORE_INDEX
            )
    loss.backward()
    with record_function("bench.optimizer"):
        torch.nn.utils.clip_grad_norm_(params, GRAD_CLIP)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    value = loss.item()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return value


def label_forge(trainer) -> None:
    """Labelled ranges around Forge's data, loss and optimizer, for the profile."""
    import attrs
    from torch.profiler import record_function

    import forge_core.train.step as step_module

    def labelled(name, fn):
        def call(*args, **kwargs):
            with record_function(name):
                return fn(*args, **kwargs)

        return call

    parts = trainer.parts
    loader = parts.loader
    trainer.parts = attrs.evolve(
        parts,
        loader=type(
            "Labelled",
            (),
            {
                "__next__": lambda self: labelled("bench.data", loader.__next__)(),
                "__getattr__": lambda self, name: getattr(loader, name),
            },
        )(),
    )
    parts.pmodel.loss_fn = labelled("bench.loss", parts.pmodel.loss_fn)
    objective = parts.pmodel.objective
    if objective is not None and hasattr(objective, "token_loss"):  # the lm objective's loss
        objective.token_loss = labelled("bench.loss", objective.token_loss)
    step_module.clip_grad_norm = labelled("bench.optimizer", step_module.clip_grad_norm)
    for optimizer in parts.optimizers:
        optimizer.step = labelled("bench.optimizer", optimizer.step)
        optimizer.zero_grad = labelled("bench.optimizer", optimizer.zero_grad)


def label_norms(model) -> None:
    """A ``bench.norms`` range around every RMSNorm's forward (eager only: inside a
    compiled graph the norms are fused with their neighbours)."""
    from torch.profiler import record_function

    for module in model.modules():
        if type(module).__name__.endswith("RMSNorm"):
            ranges: list = []
            module.register_forward_pre_hook(
                lambda m, a, r=ranges: r.append(record_function("bench.norms").__enter__())
            )
            module.register_forward_hook(lambda m, a, o, r=ranges: r.pop().__exit__(None, None, None))


def _category(event, labels_by_seq: dict[int, str]) -> str:
    name = event.name
    if (
        name in ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_weight_int8pack_mm")
        or name.startswith("mkldnn::")
        or "linear" in name
        and name.startswith("aten::")
    ):
        return "matmul"
    if "scaled_dot_product" in name or "flash_attention" in name or "flex_attention" in name:
        return "attention"
    node = event
    while node is not None:
        if node.name.startswith("bench."):
            return node.name[len("bench.") :]
        if node.name.startswith("autograd::engine::evaluate_function"):
            return labels_by_seq.get(node.sequence_nr, "other")
        if (
            "CompiledFxGraph" in node.name
            or "Torch-Compiled Region" in node.name
            or "CompiledFunction" in node.name
        ):
            return "fused"
        node = node.cpu_parent
    return "other"


def _forward_label(event) -> str | None:
    node = event.cpu_parent
    while node is not None:
        if node.name.startswith("bench."):
            return node.name[len("bench.") :]
        node = node.cpu_parent
    return None


def profile_step(step) -> dict[str, float]:
    """Self CPU milliseconds per category for one call of ``step``."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    events = list(prof.events())
    labels_by_seq = {}
    for event in events:
        if event.sequence_nr >= 0 and not event.name.startswith("autograd::"):
            label = _forward_label(event)
            if label is not None:
                labels_by_seq.setdefault(event.sequence_nr, label)
    times = dict.fromkeys(CATEGORIES, 0.0)
    for event in events:
        times[_category(event, labels_by_seq)] += event.self_cpu_time_total / 1e3
    return times


def _rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def worker(cfg: dict) -> dict:
    """Build and measure one configuration in this process."""
    import torch
    import transformers  # noqa: F401 - both frameworks' processes carry the same imports

    if cfg["threads"] > 0:
        torch.set_num_threads(cfg["threads"])
    device = torch.device(cfg["device"])
    with tempfile.TemporaryDirectory() as tmp:
        trainer = build_forge(cfg, tmp)
        forge = cfg["framework"] == "forge"
        if forge:
            if cfg["mode"] == "eager":
                label_norms(trainer.parts.pmodel.parts[0])
            step = lambda: trainer.train_step()  # noqa: E731
            first = trainer.train_step()["loss"]
        else:
            from forge_core.data.loader import StatefulLoader

            # The same batches in the same order as Forge's loader.
            loader = StatefulLoader(trainer.parts.loader.rows, cfg["batch"], seed=0, shuffle=True)
            run_model, model, optimizer = build_hf(trainer, cfg["mode"] == "compiled")
            params = list(model.parameters())
            trainer.parts = None  # Forge's model is not part of this measurement
            if cfg["mode"] == "eager":
                label_norms(model)

            def step():
                return hf_step(run_model, params, optimizer, loader, cfg["precision"], device)

            first = step()
        for _ in range(cfg["warmup"] - 1):
            step()
        if forge:
            label_forge(trainer)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        try:
            Path("/proc/self/clear_refs").write_text("5")  # reset the peak RSS to the current RSS
            steady = _rss_kib("VmRSS")
        except OSError:
            steady = None
        walls, cpus, mfus = [], [], []
        for _ in range(cfg["steps"]):
            c0, t0 = time.process_time(), time.perf_counter()
            out = step()
            walls.append(time.perf_counter() - t0)
            cpus.append(time.process_time() - c0)
            if forge:
                mfus.append(out["mfu"])
        steps_peak = _rss_kib("VmHWM") if steady is not None else None
        profile = profile_step(step) if cfg.get("profile", True) else None
    tokens = cfg["batch"] * cfg["seq"]
    return {
        **cfg,
        "tokens_per_s": tokens / statistics.median(walls),
        "cpu_s_per_step": statistics.median(cpus),
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "steps_peak_rss_mib": None if steps_peak is None else steps_peak / 1024,
        "steps_rss_rise_mib": None if steps_peak is None else (steps_peak - steady) / 1024,
        "cuda_peak_mib": torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None,
        "first_loss": float(first),
        "mfu": statistics.median(mfus) if mfus else None,
        "profile_ms": profile,
    }


def run_config(cfg: dict) -> dict:
    proc = subprocess.run(
        [sys.executable, __file__, "--worker", json.dumps(cfg)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"configuration {cfg} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(lines[-1])


def _mib(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.0f}"


def _side(r: dict) -> str:
    return "hf" if r["framework"] == "hf" else f"forge {r['loss']}"


def report(results: list[dict], load: tuple[float, float]) -> None:
    """Per shape and precision: each side's medians over its rounds, then the ratios of
    the alternated rounds, then where one profiled step's CPU time goes."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in results:
        groups.setdefault((r["shape"], r["precision"]), []).append(r)
    ratios = comparisons(results)
    for (shape, precision), rows in groups.items():
        s = SHAPES[shape]
        print(
            f"\n## {shape}: dim {s['dim']}, {s['layers']} layers, batch {s['batch']} x seq {s['seq']}, vocab "
            f"{s['vocab'] or 258}; {precision}; medians over the rounds"
        )
        print(
            "| config | rounds | tokens/s | CPU s/step | peak RSS MiB "
            "| steps' peak RSS MiB (rise) | first loss | MFU |"
        )
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        by: dict[tuple[str, str], list[dict]] = {}
        for r in rows:
            by.setdefault((r["mode"], _side(r)), []).append(r)
        for (mode, side), rs in by.items():

            def med(key, rs=rs):
                values = [r[key] for r in rs if r[key] is not None]
                return statistics.median(values) if values else None

            mfu = med("mfu")
            print(
                f"| {side} {mode} | {len(rs)} | {med('tokens_per_s'):,.0f} | {med('cpu_s_per_step'):.3f} "
                f"| {_mib(med('peak_rss_mib'))} | {_mib(med('steps_peak_rss_mib'))} "
                f"({_mib(med('steps_rss_rise_mib'))}) | {rs[0]['first_loss']:.4f} | "
                f"{'' if mfu is None else f'{mfu:.1%}'} |"
            )
        for c in ratios:
            if (c["shape"], c["precision"]) == (shape, precision):
                print(
                    f"{c['forge']} / hf {c['mode']}: {_median_range(c['cpu'])} per CPU-second, "
                    f"{_median_range(c['wall'])} per wall-second ({c['pairs']} alternated pairs)"
                )
        if any(r["mode"] == "compiled" for r in rows):
            for framework, what in GRANULARITY.items():
                print(f"compiled {framework}: {what}")
    print(
        "\n## Where a step's time goes (self time, one profiled step of round 1; % of the step; the "
        "profiler times each op by the clock, so on a loaded machine read the shares, not the ms)"
    )
    print("| config | ms | " + " | ".join(CATEGORIES) + " |")
    print("| --- | ---: | " + " | ".join("---:" for _ in CATEGORIES) + " |")
    for r in results:
        if r["profile_ms"] is None:
            continue
        total = sum(r["profile_ms"].values())
        cells = " | ".join(f"{100 * r['profile_ms'][c] / total:.0f}%" for c in CATEGORIES)
        print(f"| {r['shape']} {r['precision']} {_side(r)} {r['mode']} | {total:,.0f} | {cells} |")
    print(f"\nload average (1 min) {load[0]:.2f} at the start, {load[1]:.2f} at the end")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), default=["quickstart", "vocab32k"])
    p.add_argument("--precisions", nargs="+", choices=("fp32", "bf16"), default=["fp32", "bf16"])
    p.add_argument("--modes", nargs="+", choices=("eager", "compiled"), default=["eager", "compiled"])
    p.add_argument("--pairs", type=int, default=3, help="alternated rounds (each side a fresh process)")
    p.add_argument("--warmup", type=int, default=2, help="steps before measuring (the first compiles)")
    p.add_argument("--steps", type=int, default=4, help="measured steps per process")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument(
        "--threads", type=int, default=0, help="torch threads (0: PyTorch's default, one per core)"
    )
    p.add_argument("--json", help="also write every process's results here")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))), flush=True)
        return 0
    if args.warmup < 1 or args.steps < 1 or args.pairs < 1:
        p.error("--warmup, --steps and --pairs must be at least 1")
    if "bf16" in args.precisions and args.device == "cpu":
        from forge_core.train.precision import cpu_has_bf16

        if not cpu_has_bf16():
            print("note: this CPU has no native bf16 (AVX512_BF16/AMX): bf16 skipped", file=sys.stderr)
            args.precisions = [x for x in args.precisions if x != "bf16"]
    results = []
    started, load = time.perf_counter(), os.getloadavg()[0]
    for run in schedule(args.shapes, args.precisions, args.modes, args.pairs):
        cfg = {
            **run,
            "warmup": args.warmup,
            "steps": args.steps,
            "device": args.device,
            "threads": args.threads,
            "profile": run["round"] == 0,
        }
        t0 = time.perf_counter()
        results.append(run_config(cfg))
        print(
            f"[{time.perf_counter() - started:5.0f}s] {run['shape']} {run['precision']} {run['mode']} "
            f"round {run['round'] + 1} {_side(run)}: {results[-1]['tokens_per_s']:,.0f} tokens/s, "
            f"{results[-1]['cpu_s_per_step']:.3f} CPU s/step ({time.perf_counter() - t0:.0f}s)",
            file=sys.stderr,
            flush=True,
        )
    report(results, (load, os.getloadavg()[0]))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
