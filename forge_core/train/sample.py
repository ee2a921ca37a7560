"""``forge-run sample RUN_DIR --prompt "..." [--prompt ...]``: continuations from the
run's latest complete checkpoint, streamed as they are sampled.

Works from the run directory alone: its ``config.yaml`` rebuilds the model and the
tokenizer (from what the run saved in ``tokenizer/``), the checkpoint gives the
weights, checked against its manifest's checksums and read without running code from
it (:func:`forge_core.train.checkpoint.load_model`). The model's pretrained option is
cleared (``ModelSpec.pretrained_option``): the checkpoint holds every weight.

Decoding runs the model's own forward. A model that offers a key/value cache
(``model.new_cache(batch, max_len)`` and ``model(ids, cache=cache)``, as the built-in
llama does) reads the prompt once and then one new token per step; any other model
re-reads the whole context every token. The context is the run's trained length
(``data.seq_len``): with a cache, a context that fills up is cut to its second half and
read again (one prompt pass), without, it slides by one token each step.

Sampling: temperature, then top-k, then top-p (the smallest set of most likely tokens
whose probability reaches ``top_p``), from a generator seeded with ``--seed`` for every
prompt; temperature 0 is greedy. A continuation ends at the tokenizer's end of document,
after ``--max-new-tokens`` or at the first ``--stop`` string (not printed). Text is
printed as it comes, holding back only what may still turn into a stop string or the
rest of a character.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
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
    plan = components.without_pretrained(plan)
    config = plan.config
    tokenizer = components.saved_tokenizer(plan, registries, run_dir / TOKENIZER)
    vocab_size = int(read_run_info(run_dir).get("vocab_size", tokenizer.vocab_size))
    model = components.model(plan, registries, vocab_size, components.attention(plan, registries))
    load_model(checkpoint, [model], verified=True)
    device = choose_device(config.run.device)
    return model.to(device).eval(), tokenizer, config, checkpoint


def has_cache(model: Any) -> bool:
    return callable(getattr(model, "new_cache", None))


def choose(logits: torch.Tensor, temperature: float, top_k: int, top_p: float,
           generator: torch.Generator | None) -> int:
    """One token id from next-token ``logits`` (see the module docstring)."""
    logits = logits.float()
    if temperature <= 0:
        return int(logits.argmax())
    logits = logits / temperature
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
            history = history[-max(context // 2, 1):]
            cache.clear()
            logits = run(history, cache=cache)


def sample_tokens(model: Any, ids: list[int], max_new_tokens: int, *, context: int, temperature: float,
                  top_k: int, top_p: float = 1.0, seed: int = 0, eos_id: int | None = None) -> Iterator[int]:
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


def generate(model: Any, ids: list[int], max_new_tokens: int, *, context: int, temperature: float,
             top_k: int, top_p: float = 1.0, seed: int = 0, eos_id: int | None = None) -> list[int]:
    """``max_new_tokens`` sampled ids after ``ids`` (stops early at ``eos_id``)."""
    return list(sample_tokens(model, ids, max_new_tokens, context=context, temperature=temperature,
                              top_k=top_k, top_p=top_p, seed=seed, eos_id=eos_id))


class StreamPrinter:
    """Writes a growing text as it grows, holding back a tail that may still become one
    of ``stops`` or is a character not yet complete (``U+FFFD`` from a cut byte
    sequence)."""

    def __init__(self, write: Callable[[str], Any], stops: list[str]) -> None:
        self.write, self.stops, self.shown = write, stops, 0

    def _held(self, text: str) -> int:
        held = len(text) - len(text.rstrip("\ufffd"))
        for stop in self.stops:
            for n in range(min(len(stop) - 1, len(text)), 0, -1):
                if text.endswith(stop[:n]):
                    held = max(held, n)
                    break
        return held

    def update(self, text: str, final: bool = False) -> None:
        end = len(text) if final else len(text) - self._held(text)
        if end > self.shown:
            self.write(text[self.shown:end])
            self.shown = end


def continuation(tokenizer: Any, new: list[int], stops: list[str]) -> tuple[str, bool]:
    """``(text of new, whether a stop string ended it)``: the text is cut before the
    first stop string."""
    text = tokenizer.decode(new)
    cuts = [i for i in (text.find(stop) for stop in stops) if i >= 0]
    return (text[: min(cuts)], True) if cuts else (text, False)


def main(args: Any) -> int:
    if args.max_new_tokens < 0:
        raise ForgeError("--max-new-tokens must be 0 or more")
    if not 0 < args.top_p <= 1:
        raise ForgeError(f"--top-p must be in (0, 1], got {args.top_p}")
    stops = [s for s in (args.stop or []) if s]
    model, tokenizer, config, checkpoint = load_for_inference(args.run_dir)
    prompts = args.prompt or [""]
    total, elapsed = 0, 0.0
    for n, prompt in enumerate(prompts):
        if n:
            print()
        prompt_ids = list(tokenizer.encode(prompt)) if prompt else []
        # An empty prompt starts where every document starts: after an end of document.
        start = prompt_ids or [int(tokenizer.eos_id)]
        print(tokenizer.decode(prompt_ids), end="", flush=True)
        printer = StreamPrinter(lambda s: print(s, end="", flush=True), stops) if args.stream else None
        new: list[int] = []
        text = ""
        t0 = time.perf_counter()
        for token in sample_tokens(model, start, args.max_new_tokens, context=config.data.seq_len,
                                   temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                                   seed=args.seed, eos_id=int(tokenizer.eos_id)):
            new.append(token)
            text, stopped = continuation(tokenizer, new, stops)
            if stopped:
                break
            if printer is not None:
                printer.update(text)
        elapsed += time.perf_counter() - t0
        total += len(new)
        if printer is not None:
            printer.update(text, final=True)
        else:
            print(text, end="")
        print(flush=True)
    rate = f", {total / elapsed:.1f} tokens/s" if elapsed > 0 and total else ""
    how = "key/value cache" if has_cache(model) else "no cache: the context is re-read every token"
    print(f"[{checkpoint}] {total} tokens sampled{rate} ({how})", file=sys.stderr)
    return 0
