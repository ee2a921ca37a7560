"""Training throughput: Forge's loop vs ``transformers.LlamaForCausalLM`` in a plain
PyTorch loop, same model shape, batch, sequence length, optimizer and data.

    python bench/train_throughput.py [--compile] [--precision bf16] [--rounds 3 --steps 4]

Both models live in this process and run alternately (``--rounds`` blocks of
``--steps`` steps each, after warm-up), so machine noise hits both alike. Both start
from the same weights (Forge's init copied into the Hugging Face model), read the same
packed rows (stdlib corpus, byte tokenizer, ``concat`` without document isolation so
both compute plain causal attention) and use AdamW with the same hyperparameters: the
Hugging Face side is what a user writes (``torch.optim.AdamW(model.parameters(), ...)``,
PyTorch's default implementation for the device), Forge's is its ``adamw`` plugin.

Prints tokens/s of each (median over blocks), the ratio, the first-step losses (equal
up to float noise: same weights, same batch) and Forge's MFU against the measured matmul
peak (``train.peak_tflops: 0``; measured once and cached in ~/.cache/forge).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

from forge_core.api import IGNORE_INDEX, INPUT_IDS, LABELS


def forge_config(args: argparse.Namespace, out_dir: str) -> dict:
    return {
        "run": {"name": "bench", "out_dir": out_dir, "seed": 0, "device": "cpu"},
        "model": {"name": "llama", "options": {"dim": args.dim, "n_layers": args.layers, "n_heads": args.heads,
                                               "n_kv_heads": args.kv_heads, "max_seq_len": args.seq}},
        "attention": {"backend": args.backend},
        "data": {"source": "stdlib", "source_options": {"max_bytes": 2_000_000}, "tokenizer": "byte",
                 "packer": "concat", "packer_options": {"isolate": args.isolate}, "seq_len": args.seq},
        "train": {"steps": 10**6, "batch_size": args.batch, "lr": 1e-3, "warmup_steps": 0, "schedule": "constant",
                  "optimizer": "adamw", "optimizer_options": {"weight_decay": 0.1, "beta1": 0.9, "beta2": 0.95},
                  "grad_clip": 1.0, "precision": args.precision, "compile": args.compile, "peak_tflops": 0.0},
        "checkpoint": {"resume": "never"},
        "logging": {"loggers": []},
    }


def build_forge(args: argparse.Namespace, tmp: str):
    from forge_core.judge import judge
    from forge_core.train.distributed import setup
    from forge_core.train.trainer import Trainer

    path = Path(tmp) / "bench.yaml"
    path.write_text(yaml.safe_dump(forge_config(args, str(Path(tmp) / "run"))))
    result = judge(str(path), [], 1)
    assert not result.errors, result.errors
    trainer = Trainer(result.plan, result.registries, setup("cpu"))
    trainer.build()
    return trainer


def build_hf(args: argparse.Namespace, trainer):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from forge_plugins.models.hf_keys import to_hf_key
    from forge_plugins.models.options import ffn_hidden_size

    options = trainer.config.model.options
    config = LlamaConfig(
        vocab_size=int(trainer.tokenizer.vocab_size), hidden_size=options.dim,
        intermediate_size=ffn_hidden_size(options), num_hidden_layers=options.n_layers,
        num_attention_heads=options.n_heads, num_key_value_heads=options.n_kv_heads,
        max_position_embeddings=options.max_seq_len, rms_norm_eps=options.norm_eps,
        rope_theta=options.rope_theta, tie_word_embeddings=options.tie_embeddings,
        attention_bias=False, mlp_bias=False,
    )
    config._attn_implementation = "sdpa"
    model = LlamaForCausalLM(config)
    forge_state = trainer.pmodel.parts[0].state_dict()
    mapped = {to_hf_key(k): v.detach().clone() for k, v in forge_state.items() if not k.startswith("rope")}
    missing, unexpected = model.load_state_dict(mapped, strict=False)
    assert not unexpected and all("rotary" in k for k in missing), (missing, unexpected)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    return model, optimizer


def hf_step(model, optimizer, batch, precision: str, grad_clip: float) -> tuple[float, float]:
    """One step as a user writes it; returns (loss, seconds)."""
    import torch
    import torch.nn.functional as F

    t0 = time.perf_counter()
    x, y = batch[INPUT_IDS], batch[LABELS]
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
        logits = model(input_ids=x).logits
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1), ignore_index=IGNORE_INDEX)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    value = loss.item()
    return value, time.perf_counter() - t0


def profile_breakdown(name: str, fn) -> None:
    """Where one step's CPU time goes: matmuls, attention, compiled (fused) kernels,
    optimizer, everything else (mostly eager elementwise ops)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    cats: dict[str, float] = {}
    for e in events:
        key = e.key
        if key in ("aten::mm", "aten::addmm", "aten::bmm"):
            cat = "matmul"
        elif "scaled_dot_product" in key or "flash_attention" in key:
            cat = "attention"
        elif "CompiledFxGraph" in key or "cpp_fused" in key:
            cat = "compiled"
        elif "_foreach" in key or "Optimizer" in key or "adam" in key.lower():
            cat = "optimizer"
        else:
            cat = "other"
        cats[cat] = cats.get(cat, 0.0) + e.self_cpu_time_total
    parts = ", ".join(f"{k} {v / total:.0%} ({v / 1e3:,.0f} ms)" for k, v in sorted(cats.items(), key=lambda kv: -kv[1]))
    print(f"profile {name}: {total / 1e3:,.0f} ms CPU: {parts}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--backend", default="sdpa")
    p.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    p.add_argument("--compile", action="store_true", help="train.compile: true for Forge (the HF loop stays eager)")
    p.add_argument("--isolate", action="store_true", help="Forge isolates documents (HF cannot: it attends across)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=2, help="steps per block")
    p.add_argument("--rounds", type=int, default=6, help="alternating blocks per framework")
    p.add_argument("--profile", action="store_true", help="also print where one step of each spends its time")
    p.add_argument("--threads", type=int, default=0,
                   help="torch threads for both (0: PyTorch's default, one per core); 1 is steadier on a busy machine")
    args = p.parse_args()

    import torch

    if args.threads > 0:
        torch.set_num_threads(args.threads)

    with tempfile.TemporaryDirectory() as tmp:
        trainer = build_forge(args, tmp)
        model, optimizer = build_hf(args, trainer)
        rows = trainer.loader.rows
        tokens_per_step = args.batch * args.seq
        # The HF loop reads the same batches in the same order as Forge's loader.
        from forge_core.data.loader import StatefulLoader

        hf_loader = StatefulLoader(rows, args.batch, seed=0, shuffle=True)

        first_forge = trainer.train_step()
        first_hf, _ = hf_step(model, optimizer, next(hf_loader), args.precision, 1.0)
        for _ in range(args.warmup - 1):
            trainer.train_step()
            hf_step(model, optimizer, next(hf_loader), args.precision, 1.0)

        forge_rates, hf_rates, forge_cpu, hf_cpu, mfus = [], [], [], [], []
        for _ in range(args.rounds):
            c0 = time.process_time()
            metrics = [trainer.train_step() for _ in range(args.steps)]
            forge_cpu.append(tokens_per_step * len(metrics) / (time.process_time() - c0))
            forge_rates.append(tokens_per_step * len(metrics) / sum(m["step_time"] for m in metrics))
            mfus.extend(m["mfu"] for m in metrics)
            c0 = time.process_time()
            times = [hf_step(model, optimizer, next(hf_loader), args.precision, 1.0)[1] for _ in range(args.steps)]
            hf_cpu.append(tokens_per_step * len(times) / (time.process_time() - c0))
            hf_rates.append(tokens_per_step * len(times) / sum(times))

        forge, hf = statistics.median(forge_rates), statistics.median(hf_rates)
        cpu_ratio = statistics.median(forge_cpu) / statistics.median(hf_cpu)
        params = sum(p.numel() for p in model.parameters())
        print(f"shape: dim {args.dim}, {args.layers} layers, {args.heads} heads ({args.kv_heads} kv), "
              f"{params / 1e6:.2f}M params; batch {args.batch} x seq {args.seq}; {args.precision}; "
              f"attention {args.backend}{' (documents isolated)' if args.isolate else ''}; "
              f"forge compile {args.compile}; torch threads {torch.get_num_threads()}")
        print(f"first-step loss: forge {first_forge['loss']:.5f}  hf {first_hf:.5f}")
        print(f"forge: {forge:,.0f} tokens/s  (blocks: {', '.join(f'{r:,.0f}' for r in forge_rates)})")
        print(f"hf:    {hf:,.0f} tokens/s  (blocks: {', '.join(f'{r:,.0f}' for r in hf_rates)})")
        print(f"ratio forge/hf: {forge / hf:.2f}x wall-clock; {cpu_ratio:.2f}x per CPU-second "
              f"(forge {statistics.median(forge_cpu):,.0f}, hf {statistics.median(hf_cpu):,.0f} tokens per "
              f"CPU-second: steadier than wall-clock on a shared machine)")
        print(f"forge MFU: {statistics.median(mfus):.1%} of the measured matmul peak "
              f"({trainer.peak / 1e9:,.1f} GFLOP/s)")
        if args.profile:
            profile_breakdown("forge", trainer.train_step)
            profile_breakdown("hf", lambda: hf_step(model, optimizer, next(hf_loader), args.precision, 1.0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
