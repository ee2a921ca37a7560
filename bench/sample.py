"""Sampling speed: ``forge-run sample``'s generation (the llama's key/value cache, through
its own forward) against ``transformers`` ``generate`` (with its cache) on the same
model, prompt and length, and against cache-free sampling (the whole context re-read
for every token, what ``forge-run sample`` did before the cache), in one run.

    OMP_NUM_THREADS=1 python bench/sample.py [--dim 256 --layers 4 --vocab 258 --new-tokens 256]

The model is a random Forge llama (by default the quickstart model's shape: what
``forge-run sample runs/quickstart`` decodes); the transformers model is its export
(``forge-run export-hf``'s exporter, loaded by ``AutoModelForCausalLM``), so both hold the
same weights. Decoding is greedy and never stops early, so the three produce the same
number of tokens (and, greedy on the same weights, the same tokens: checked and
printed). The three run in turns (``--pairs`` rounds, after a warm-up of each;
``bench/alternate.py``); printed are each one's tokens/s over its median wall time, its
median CPU (process) time, and the medians of the per-round ratios by CPU time beside
wall time, with the load average (targets: Forge >= generate, Forge >= 10x cache-free
at 256 new tokens, by CPU time). On a machine shared with other work, run it on one thread:
with two, every OpenMP region waits for a descheduled thread and both libraries' timings
swing by several times between runs.

What bounds the ratios: a cached step multiplies every weight with one token, so it is
bound by reading the weights (and, for small models, by per-operation overhead), while
re-reading the context multiplies them with the whole context at full matmul speed; the
larger the model the closer the two per-token costs, the longer the context the wider.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/alternate.py, however loaded
from alternate import load_line, ratio, rounds  # noqa: E402


def forge_model(args: argparse.Namespace):
    from forge_plugins.attention.options import SdpaOptions
    from forge_plugins.attention.sdpa import SdpaAttention
    from forge_plugins.models.llama import build
    from forge_plugins.models.options import LlamaOptions

    torch.manual_seed(0)
    options = LlamaOptions(
        dim=args.dim,
        n_layers=args.layers,
        n_heads=args.heads,
        n_kv_heads=args.kv_heads,
        max_seq_len=args.prompt_len + args.new_tokens,
    )
    return build(options, args.vocab, SdpaAttention(SdpaOptions())).eval()


def hf_model(model, tmp: str):
    from transformers import AutoModelForCausalLM

    from forge_plugins.models.hf_interop import export

    export(model.state_dict(), model.options, tmp)
    return AutoModelForCausalLM.from_pretrained(
        tmp, attn_implementation="sdpa", trust_remote_code=False
    ).eval()


def forge_cached(model, prompt: list[int], n: int) -> list[int]:
    from forge_core.generate import generate

    return generate(model, prompt, n, context=len(prompt) + n, temperature=0, top_k=0)


@torch.no_grad()
def forge_cache_free(model, prompt: list[int], n: int) -> list[int]:
    """The sampler without a cache: every token re-reads the whole context."""
    out = list(prompt)
    for _ in range(n):
        out.append(int(model(torch.tensor([out]))[0, -1].argmax()))
    return out[len(prompt) :]


@torch.no_grad()
def hf_generate(hf, prompt: list[int], n: int) -> list[int]:
    ids = torch.tensor([prompt])
    out = hf.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=n,
        min_new_tokens=n,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
    )
    return out[0, len(prompt) :].tolist()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=258)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--pairs", type=int, default=3, help="rounds (each way in turn)")
    parser.add_argument("--skip-cache-free", action="store_true", help="the slow baseline: leave it out")
    args = parser.parse_args()

    model = forge_model(args)
    prompt = torch.randint(
        0, args.vocab, (args.prompt_len,), generator=torch.Generator().manual_seed(1)
    ).tolist()
    with tempfile.TemporaryDirectory() as tmp:
        hf = hf_model(model, tmp)
    runs = {
        "forge (kv cache)": lambda: forge_cached(model, prompt, args.new_tokens),
        "transformers generate": lambda: hf_generate(hf, prompt, args.new_tokens),
    }
    if not args.skip_cache_free:
        runs["forge cache-free"] = lambda: forge_cache_free(model, prompt, args.new_tokens)
    # Warm-up: first-call allocations and kernel selection, kept out of the timings.
    forge_cached(model, prompt, 8), hf_generate(hf, prompt, 8), forge_cache_free(model, prompt, 2)
    outputs = {}

    def keep(name, run):
        return lambda: outputs.__setitem__(name, run())

    times = rounds({name: keep(name, run) for name, run in runs.items()}, args.pairs, warmup=0)
    rate = {name: args.new_tokens / statistics.median(t["wall"]) for name, t in times.items()}
    params = sum(p.numel() for p in model.parameters())
    print(
        f"model: dim {args.dim}, {args.layers} layers, vocab {args.vocab} ({params / 1e6:.1f}M parameters); "
        f"prompt {args.prompt_len} tokens, {args.new_tokens} new (greedy); "
        f"{torch.get_num_threads()} threads; "
        f"{args.pairs} rounds, medians; {load_line()}"
    )
    for name, value in rate.items():
        cpu = statistics.median(times[name]["cpu"])
        print(f"  {name:<24} {value:9.1f} tokens/s  {1e3 * cpu / args.new_tokens:7.2f} CPU ms/token")
    forge = "forge (kv cache)"
    for other, target in (("transformers generate", 1), ("forge cache-free", 10)):
        if other in times:
            print(
                f"forge / {other + ':':<22} {ratio(times, other, forge):5.2f}x by CPU time, "
                f"{ratio(times, other, forge, 'wall'):5.2f}x wall (target >= {target})"
            )
    same = {name: out == outputs["forge (kv cache)"] for name, out in outputs.items()}
    print(f"same greedy tokens as forge (kv cache): {same}")


if __name__ == "__main__":
    main()
