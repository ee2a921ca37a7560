"""``forge-run sample RUN_DIR --prompt "..." [--prompt ...]``: continuations from the
run's latest complete checkpoint (:mod:`forge_core.generate`), streamed as they are
sampled.

A continuation ends at the tokenizer's end of document, after ``--max-new-tokens`` or at
the first ``--stop`` string (not printed). Text is printed as it comes, holding back only
what may still turn into a stop string or the rest of a character.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from typing import Any

from forge_core.api import ForgeError
from forge_core.api.unstable import INT_MAX, INT_MIN
from forge_core.generate import has_cache, load_for_inference, sample_tokens


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
            self.write(text[self.shown : end])
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
    if not (math.isfinite(args.temperature) and args.temperature >= 0):
        raise ForgeError(
            f"--temperature must be a finite number, 0 or more (0: greedy), got {args.temperature}"
        )
    if args.top_k < 0:
        raise ForgeError(f"--top-k must be 0 (off) or more, got {args.top_k}")
    if not INT_MIN <= args.seed <= INT_MAX:
        raise ForgeError(f"--seed must fit in 64 bits, got {args.seed}")
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
        for token in sample_tokens(
            model,
            start,
            args.max_new_tokens,
            context=config.data.seq_len,
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
            seed=args.seed,
            eos_id=int(tokenizer.eos_id),
        ):
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
