"""Continuations from a trained model: a finished run loaded for inference, and
token-by-token sampling.

:func:`load_for_inference` works from the run directory alone: its ``config.yaml``
rebuilds the model and the tokenizer (from what the run saved in ``tokenizer/``), the
checkpoint gives the weights, checked against its manifest's checksums and read without
running code from it (:func:`forge_core.train.checkpoint.load_model`). The model's
pretrained option is cleared (``ModelSpec.pretrained_option``): the checkpoint holds
every weight.

Decoding runs the model's own forward. A model that offers a key/value cache
(``model.new_cache(batch, max_len)`` and ``model(ids, cache=cache)``, as the built-in
llama does) reads the prompt once and then one new token per step; any other model
re-reads the whole context every token. The context is the run's trained length
(``data.seq_len``): with a cache, a context that fills up is cut to its second half and
read again (one prompt pass), without, it slides by one token each step.

Sampling (:func:`choose`): temperature, then top-k, then top-p (the smallest set of most
likely tokens whose probability reaches ``top_p``), from a generator seeded with
``seed``; temperature 0 is greedy. A continuation ends at ``eos_id`` or after
``max_new_tokens``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch


def load_for_inference(path: str | Path) -> tuple[Any, Any, Any, Path]:
    """``(model in eval mode, tokenizer, config, checkpoint)`` of a run directory or a
    checkpoint directory, on the run's device (CPU without CUDA)."""
    from forge_core import components
    from forge_core.distributed.placement import choose_device
    from forge_core.train.checkpoint import resolve_checkpoint
    from forge_core.train.restore import restored_model
    from forge_core.train.rundir import TOKENIZER, load_run_config, read_run_info

    checkpoint, run_dir = resolve_checkpoint(path)
    plan, registries = load_run_config(run_dir)
    plan = components.without_pretrained(plan)
    config = plan.config
    tokenizer = components.saved_tokenizer(plan, registries, run_dir / TOKENIZER)
    vocab_size = int(read_run_info(run_dir).get("vocab_size", tokenizer.vocab_size))
    model = restored_model(plan, registries, vocab_size, checkpoint)
    device = choose_device(config.run.device)
    return model.to(device).eval(), tokenizer, config, checkpoint


def has_cache(model: Any) -> bool:
    from forge_core.api import CachingModel

    return isinstance(model, CachingModel)


def choose(
    logits: torch.Tensor, temperature: float, top_k: int, top_p: float, generator: torch.Generator | None
) -> int:
    """One token id from next-token ``logits`` (see the module docstring)."""
    logits = logits.float()
    # A temperature float32 cannot hold is 0 to it: greedy, as 0 is.
    if temperature < torch.finfo(logits.dtype).tiny:
        return int(logits.argmax())
    # Shifted so the largest is 0 first: a tiny temperature then sends the others to -inf
    # (greedy in effect) instead of overflowing every logit to inf and softmax to nan.
    logits = (logits - logits.max()) / temperature
    if 0 < top_k < logits.numel():
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, -1)
    if 0 < top_p < 1:
        ordered, order = probs.sort(descending=True)
        # Keep a token while the tokens above it hold less than top_p: at least one.
        drop = ordered.cumsum(-1) - ordered >= top_p
        probs = probs.scatter(0, order[drop], 0.0)
    return int(torch.multinomial(probs, 1, generator=generator))


@torch.inference_mode()
def next_token_logits(model: Any, ids: list[int], context: int) -> Iterator[torch.Tensor]:
    """Logits for the token after ``ids``, then after each token sent in (a generator:
    ``send(token)`` returns the logits that follow it)."""
    device = next(model.parameters()).device

    def run(tokens: list[int], **kwargs: Any) -> torch.Tensor:
        return model(torch.tensor([tokens], dtype=torch.long, device=device), **kwargs)[0, -1]

    history = list(ids[-context:])
    if not has_cache(model):
        while True:
            history.append((yield run(history[-context:])))
    cache = model.new_cache(1, context)
    logits = run(history, cache=cache)
    while True:
        token = yield logits
        history.append(token)
        if cache.length < context:
            logits = run([token], cache=cache)
        else:  # full: keep the second half and read it again
            history = history[-max(context // 2, 1) :]
            cache.clear()
            logits = run(history, cache=cache)


def sample_tokens(
    model: Any,
    ids: list[int],
    max_new_tokens: int,
    *,
    context: int,
    temperature: float,
    top_k: int,
    top_p: float = 1.0,
    seed: int = 0,
    eos_id: int | None = None,
) -> Iterator[int]:
    """Sampled ids after ``ids``, one at a time, up to ``max_new_tokens`` (ends before
    ``eos_id``)."""
    if max_new_tokens <= 0:
        return
    device = next(model.parameters()).device
    generator = torch.Generator(device=device).manual_seed(seed)
    steps = next_token_logits(model, ids, context)
    logits = next(steps)
    for i in range(max_new_tokens):
        token = choose(logits, temperature, top_k, top_p, generator)
        if eos_id is not None and token == eos_id:
            return
        yield token
        if i + 1 < max_new_tokens:
            logits = steps.send(token)


def generate(model: Any, ids: list[int], max_new_tokens: int, **sampling: Any) -> list[int]:
    """``max_new_tokens`` sampled ids after ``ids`` (stops early at ``eos_id``); the
    keywords are :func:`sample_tokens`'s."""
    return list(sample_tokens(model, ids, max_new_tokens, **sampling))
