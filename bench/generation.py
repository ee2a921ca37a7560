"""Rollout speed: the batched engine (:func:`forge_core.generate.batched.generate_rows`,
the llama's key/value cache with left-padded rows) against ``transformers``' batched
``generate`` on the same model, prompts, dtype and decoding setting.

    OMP_NUM_THREADS=1 nice python bench/generation.py [--prompts 16 --new-tokens 64 --sample]

The model is a random Forge llama (dim 256, 4 layers, 258 tokens by default) and its
export loaded by ``AutoModelForCausalLM`` (sdpa attention), both float32. The prompts are
random, of lengths drawn between ``--min-len`` and ``--max-len``; transformers gets them
left-padded with an attention mask, as it asks. Every row decodes ``--new-tokens``
tokens (no EOS, ``min_new_tokens`` on transformers' side), greedy unless ``--sample``
(temperature 1, no top-k or top-p, on both sides). The sides run in turns (``--pairs``
rounds after a warm-up; ``bench/alternate.py``); printed are each one's rollout tokens/s
over its median wall time, CPU time beside wall time, the per-round ratios' medians
and the load average. Greedy, the share of rows whose tokens agree is printed: a row
may part ways at a near tie, since the two libraries round differently.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/alternate.py, however loaded
from alternate import compare, load_line, rounds, table  # noqa: E402


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=258)
    parser.add_argument("--prompts", type=int, default=16, help="rows decoded together")
    parser.add_argument("--min-len", type=int, default=8)
    parser.add_argument("--max-len", type=int, default=48)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--sample", action="store_true", help="temperature 1 on both sides (default: greedy)")
    parser.add_argument("--pairs", type=int, default=3, help="rounds (each side in turn)")
    return parser.parse_args(argv)


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
        max_seq_len=args.max_len + args.new_tokens,
    )
    return build(options, args.vocab, SdpaAttention(SdpaOptions())).eval()


def hf_model(model):
    from transformers import AutoModelForCausalLM

    from forge_plugins.models.hf_interop import export

    with tempfile.TemporaryDirectory() as tmp:
        export(model.state_dict(), model.options, tmp)
        return AutoModelForCausalLM.from_pretrained(tmp, attn_implementation="sdpa").eval()


def prompts(args: argparse.Namespace) -> list[list[int]]:
    gen = torch.Generator().manual_seed(1)
    lengths = torch.randint(args.min_len, args.max_len + 1, (args.prompts,), generator=gen).tolist()
    return [torch.randint(0, args.vocab, (n,), generator=gen).tolist() for n in lengths]


def forge_rollout(model, given: list[list[int]], args: argparse.Namespace) -> list[list[int]]:
    from forge_core.generate.batched import Row, Sampling, generate_rows

    sampling = Sampling(args.new_tokens, 1.0 if args.sample else 0.0)
    rows = [Row(tuple(p), i) for i, p in enumerate(given)]
    done = generate_rows(model, rows, sampling, context=args.max_len + args.new_tokens)
    return [list(d.ids) for d in done]


@torch.no_grad()
def hf_rollout(hf, given: list[list[int]], args: argparse.Namespace) -> list[list[int]]:
    width = max(map(len, given))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in given])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in given])
    sampling = {"temperature": 1.0, "top_k": 0, "top_p": 1.0}
    out = hf.generate(
        ids,
        attention_mask=mask,
        max_new_tokens=args.new_tokens,
        min_new_tokens=args.new_tokens,
        do_sample=args.sample,
        eos_token_id=None,
        pad_token_id=0,
        **(sampling if args.sample else {}),
    )
    return out[:, width:].tolist()


def run(args: argparse.Namespace) -> tuple[list[dict], float]:
    """``([the comparison's row], share of rows whose tokens agree)``."""
    model = forge_model(args)
    hf = hf_model(model)
    given = prompts(args)
    outputs: dict[str, list[list[int]]] = {}
    sides = {
        "forge": lambda: outputs.__setitem__("forge", forge_rollout(model, given, args)),
        "transformers": lambda: outputs.__setitem__("transformers", hf_rollout(hf, given, args)),
    }
    times = rounds(sides, args.pairs, warmup=1)
    tokens = args.prompts * args.new_tokens
    assert all(len(row) == args.new_tokens for side in outputs.values() for row in side)
    same = sum(a == b for a, b in zip(outputs["forge"], outputs["transformers"])) / args.prompts
    return [compare("forge vs transformers", times, "forge", "transformers", tokens)], same


def main() -> None:
    args = parse()
    rows, same = run(args)
    print(
        f"model: dim {args.dim}, {args.layers} layers, vocab {args.vocab}, float32; "
        f"{args.prompts} prompts of {args.min_len}-{args.max_len} tokens, {args.new_tokens} new each "
        f"({'sampled, temperature 1' if args.sample else 'greedy'}); {torch.get_num_threads()} threads; "
        f"{args.pairs} pairs, medians; {load_line()}"
    )
    print(table(rows, "A vs B (rollout)"))
    if not args.sample:
        print(f"rows with the same greedy tokens on both sides: {same:.0%}")


if __name__ == "__main__":
    main()
