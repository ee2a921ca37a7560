"""``forge-run sample RUN_DIR --prompt "..."``: print a continuation from the run's
latest complete checkpoint, so a person can see what the model learned.

Works from the run directory alone: its ``config.yaml`` rebuilds the model and the
tokenizer (from what the run saved in ``tokenizer/``), the checkpoint gives the
weights, checked against its manifest's checksums and read without running code from
it (:func:`forge_core.train.checkpoint.load_model`). Sampling is plain: temperature and top-k, a fixed seed, no KV cache (the
context is re-read every token, cropped to the trained sequence length).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

from forge_core.api import ForgeError


def load_for_inference(path: str | Path) -> tuple[Any, Any, Any, Path]:
    """``(model in eval mode, tokenizer, config, checkpoint)`` of a run directory or a
    checkpoint directory, on the run's device (CPU without CUDA)."""
    from forge_core.train import components
    from forge_core.train.checkpoint import load_model, resolve_checkpoint
    from forge_core.train.distributed import choose_device
    from forge_core.train.rundir import TOKENIZER, load_run_config, read_run_info

    checkpoint, run_dir = resolve_checkpoint(path)
    plan, registries = load_run_config(run_dir)
    config = plan.config
    tokenizer = components.saved_tokenizer(plan, registries, run_dir / TOKENIZER)
    vocab_size = int(read_run_info(run_dir).get("vocab_size", tokenizer.vocab_size))
    model = components.model(plan, registries, vocab_size, components.attention(plan, registries))
    load_model(checkpoint, [model], verified=True)
    device = choose_device(config.run.device)
    return model.to(device).eval(), tokenizer, config, checkpoint


@torch.no_grad()
def generate(model: Any, ids: list[int], max_new_tokens: int, *, context: int, temperature: float,
             top_k: int, seed: int, eos_id: int | None = None) -> list[int]:
    """``max_new_tokens`` sampled ids after ``ids`` (stops early at ``eos_id``)."""
    device = next(model.parameters()).device
    generator = torch.Generator(device=device).manual_seed(seed)
    out = list(ids)
    new: list[int] = []
    for _ in range(max_new_tokens):
        window = torch.tensor([out[-context:]], dtype=torch.long, device=device)
        logits = model(window)[0, -1].float()
        if temperature <= 0:
            token = int(logits.argmax())
        else:
            logits = logits / temperature
            if 0 < top_k < logits.numel():
                kth = torch.topk(logits, top_k).values[-1]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            token = int(torch.multinomial(torch.softmax(logits, -1), 1, generator=generator))
        if eos_id is not None and token == eos_id:
            break
        out.append(token)
        new.append(token)
    return new


def main(args: Any) -> int:
    if args.max_new_tokens < 0:
        raise ForgeError("--max-new-tokens must be 0 or more")
    model, tokenizer, config, checkpoint = load_for_inference(args.run_dir)
    prompt_ids = list(tokenizer.encode(args.prompt)) if args.prompt else []
    # An empty prompt starts where every document starts: after an end of document.
    start = prompt_ids or [int(tokenizer.eos_id)]
    new = generate(model, start, args.max_new_tokens, context=config.data.seq_len,
                   temperature=args.temperature, top_k=args.top_k, seed=args.seed,
                   eos_id=int(tokenizer.eos_id))
    print(f"[{checkpoint}]", file=sys.stderr)
    print(tokenizer.decode(prompt_ids + new))
    return 0
