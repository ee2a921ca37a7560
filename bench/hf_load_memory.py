"""Peak resident memory while loading a Hugging Face checkpoint on 2 processes (torchrun,
gloo, FSDP over both), against the checkpoint's size.

    python bench/hf_load_memory.py [--dim 1024 --layers 12 --vocab 32000] [--keep DIR]

Writes a random Llama checkpoint in safetensors shards (float32, ``config.json`` as
transformers writes it; no transformers model is built, so writing is quick), then
launches two processes for each way of loading it:

- ``forge``: ``model.options.init_from_hf`` as a run builds it: the model on the meta
  device, ``fully_shard``, then each process reads its half of every tensor;
- ``whole``: what loading did before (and what a plain script does): every process
  builds the whole model, reads every tensor of the checkpoint, then shards.

Each process reports its resident memory before building (after imports: torch and
the rest), its peak (``VmHWM``) after loading, and the bytes of parameters it holds.
The peak minus the baseline is what loading cost; compare it to the checkpoint's size.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve()


def status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def write_checkpoint(out: Path, dim: int, layers: int, vocab: int, shard_bytes: int) -> int:
    import torch
    from safetensors.torch import save_file

    from forge_plugins.models.hf_keys import expected_hf_shapes
    from forge_plugins.models.options import LlamaOptions

    heads = max(dim // 64, 1)
    options = LlamaOptions(
        family="llama", dim=dim, n_layers=layers, n_heads=heads, n_kv_heads=heads, max_seq_len=2048
    )
    shapes = expected_hf_shapes(options, vocab)
    out.mkdir(parents=True)
    config = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": dim,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": heads,
        "intermediate_size": shapes["model.layers.0.mlp.up_proj.weight"][0],
        "vocab_size": vocab,
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "hidden_act": "silu",
        "dtype": "float32",
    }
    (out / "config.json").write_text(json.dumps(config))
    gen = torch.Generator().manual_seed(0)
    shards, current, size = [], {}, 0
    for name, shape in shapes.items():
        tensor = torch.randn(shape, generator=gen) * 0.02
        if current and size + tensor.numel() * 4 > shard_bytes:
            shards.append(current)
            current, size = {}, 0
        current[name] = tensor
        size += tensor.numel() * 4
    shards.append(current)
    weight_map, total = {}, 0
    for i, tensors in enumerate(shards):
        name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(tensors, str(out / name), metadata={"format": "pt"})
        weight_map.update({key: name for key in tensors})
        total += sum(t.numel() * 4 for t in tensors.values())
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map})
    )
    return total


def worker(mode: str, hf_dir: str, out: str) -> None:
    import torch
    import torch.distributed as dist

    from forge_core import components
    from forge_core import plan as planning
    from forge_core.config.blocks import resolve_components
    from forge_core.config.schema import ForgeConfig
    from forge_core.config.structuring import structure
    from forge_core.distributed.parallelize import parallelize
    from forge_core.registry import load_registries

    dist.init_process_group("gloo")
    registries = load_registries()
    raw = {
        "model": {"name": "llama", "options": {"init_from_hf": hf_dir}},
        "attention": {"backend": "sdpa"},
        "data": {"packer": "none", "seq_len": 128},
        "parallel": {"dp_shard": 2},
        "train": {"batch_size": 2},
    }
    config, issues = structure(raw, ForgeConfig)
    config, more = resolve_components(config, registries)
    assert not issues and not more, issues + more
    plan = planning.make_plan(config, registries, dist.get_world_size())
    vocab = json.loads((Path(hf_dir) / "config.json").read_text())["vocab_size"]
    dist.barrier()
    baseline = status_kib("VmRSS")
    if mode == "forge":
        model = components.model(plan, registries, vocab, components.attention(plan, registries))
        parts = parallelize(model, plan, torch.device("cpu")).parts
    else:
        import attrs
        from safetensors.torch import load_file

        from forge_core.distributed.mesh import build_mesh
        from forge_plugins.models.hf_folder import weight_map
        from forge_plugins.models.hf_keys import from_hf_key
        from forge_plugins.models.llama import build
        from forge_plugins.parallel.fsdp import shard_model

        options = attrs.evolve(config.model.options, init_from_hf="")
        model = build(options, vocab, components.attention(plan, registries))
        state = {}
        for path in sorted(set(weight_map(hf_dir).values())):
            state.update({from_hf_key(k): v for k, v in load_file(str(path)).items()})
        model.load_state_dict(state)
        del state
        mesh = build_mesh({"pp": 1, "dp_replicate": 1, "dp_shard": 2, "tp": 1}, torch.device("cpu"))
        parts = [shard_model(model, mesh["dp_shard"], "fp32", True)]
    held = 0
    for part in parts:
        for param in part.parameters():
            local = param.to_local() if hasattr(param, "to_local") else param
            held += local.numel() * local.element_size()
    report = {
        "rank": dist.get_rank(),
        "baseline_kib": baseline,
        "peak_kib": status_kib("VmHWM"),
        "held_bytes": held,
    }
    every = [None, None]
    dist.all_gather_object(every, report)
    if dist.get_rank() == 0:
        Path(out).write_text(json.dumps(every))
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dim", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--shard-mb", type=int, default=200)
    parser.add_argument("--keep", help="write the checkpoint here and keep it")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        hf_dir = Path(args.keep) if args.keep else Path(tmp) / "hf"
        size = write_checkpoint(hf_dir, args.dim, args.layers, args.vocab, args.shard_mb * 10**6)
        print(
            f"checkpoint: {size / 2**20:,.0f} MiB float32 in "
            f"{len(list(hf_dir.glob('model-*.safetensors')))} files ({hf_dir})"
        )
        for mode in ("forge", "whole"):
            out = Path(tmp) / f"{mode}.json"
            cmd = [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                "--nproc-per-node",
                "2",
                str(HERE),
                "--worker",
                mode,
                str(hf_dir),
                str(out),
            ]
            proc = subprocess.run(
                cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}
            )
            if proc.returncode != 0:
                print(proc.stderr[-3000:])
                raise SystemExit(f"{mode}: torchrun exited {proc.returncode}")
            for r in json.loads(out.read_text()):
                cost = (r["peak_kib"] - r["baseline_kib"]) / 1024
                print(
                    f"  {mode:<5} rank {r['rank']}: peak RSS {r['peak_kib'] / 1024:,.0f} MiB, "
                    f"{cost:,.0f} MiB above its baseline ({cost * 2**20 / size:.2f}x the checkpoint); "
                    f"holds {r['held_bytes'] / 2**20:,.0f} MiB of parameters"
                )


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(*sys.argv[2:5])
    else:
        main()
