"""``forge-run sample RUN_DIR --prompt "..." [--prompt ...]``: continuations from the
run's latest complete checkpoint (:mod:`forge_core.generate`), streamed as they are
sampled.

A continuation ends at the tokenizer's end of document, after ``--max-new-tokens`` or at
the first ``--stop`` string (not printed). Text is printed as it comes, holding back only
what may still turn into a stop string or the rest of a character.

With ``--chat`` each prompt is a user message (after ``--system``, when given), rendered
by the run's chat template with the generation prompt (:func:`chat_prompt`): the run's
``data.chat.template``, else the tokenizer's own, or ``--template FILE``. The rendered
text is encoded as it is, so special tokens the template writes (``<|im_start|>``) are
read as themselves, and printed as it is. The reply also ends where the template ends an
assistant's turn (``<|im_end|>``: found by rendering a stand-in turn), at that token
when it is one, else at that text.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from typing import Any

import attrs

from forge_core.api import ChatRenderingTokenizer, ForgeError
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


#: Stand-in contents of a turn, to find the text a template ends an assistant's turn with.
_ASKED, _REPLIED = "FORGE-ASKED", "FORGE-REPLIED"


@attrs.frozen
class Prompt:
    """What a continuation starts from: the text printed, the ids, and where it ends
    besides EOS (a chat template's end-of-turn token, or its text when it is several)."""

    text: str
    ids: list[int]
    stop_ids: frozenset[int]
    stops: tuple[str, ...]


def chat_prompt(tokenizer: Any, messages: list[dict[str, str]], template: str | None) -> Prompt:
    """``messages`` rendered by ``template`` (a file; ``None``: the tokenizer's own) with
    the generation prompt, for the model to answer."""
    if not isinstance(tokenizer, ChatRenderingTokenizer):
        raise ForgeError(
            f"sample --chat: the run's tokenizer ({tokenizer.identity}) cannot render a chat template "
            "(it has no render_chat). Sample without --chat, the template written into --prompt."
        )
    try:
        text = tokenizer.render_chat(messages, add_generation_prompt=True, template=template)
        if text == tokenizer.render_chat(messages, add_generation_prompt=False, template=template):
            print(
                "forge: warning: the chat template writes no generation prompt (no add_generation_prompt "
                "branch): the reply starts right after the last message.",
                file=sys.stderr,
            )
        stand_in = [{"role": "user", "content": _ASKED}, {"role": "assistant", "content": _REPLIED}]
        whole = tokenizer.render_chat(stand_in, add_generation_prompt=False, template=template)
    except ForgeError as exc:
        raise ForgeError(
            f"sample --chat renders the prompt with the run's chat template: {exc} Or give a template "
            "file with --template FILE."
        ) from None
    at = whole.rfind(_REPLIED)
    end = whole[at + len(_REPLIED) :].strip() if at >= 0 else ""
    end_ids = list(tokenizer.encode(end)) if end else []
    return Prompt(
        text,
        [int(i) for i in tokenizer.encode(text)],
        frozenset(end_ids) if len(end_ids) == 1 else frozenset(),
        (end,) if end else (),
    )


def plain_prompt(tokenizer: Any, prompt: str) -> Prompt:
    """``prompt`` as text to continue."""
    ids = [int(i) for i in tokenizer.encode(prompt)] if prompt else []
    # An empty prompt starts where every document starts: after an end of document.
    return Prompt(tokenizer.decode(ids), ids or [int(tokenizer.eos_id)], frozenset(), ())


def chat_messages(args: Any) -> list[list[dict[str, str]]]:
    """One conversation per ``--prompt``: ``--system``, then the prompt as the user's."""
    system = [{"role": "system", "content": args.system}] if args.system is not None else []
    return [[*system, {"role": "user", "content": prompt}] for prompt in args.prompt]


def main(args: Any) -> int:
    if args.chat and not args.prompt:
        raise ForgeError("sample --chat needs --prompt TEXT: the user's message (repeat for several).")
    if not args.chat and (args.system is not None or args.template is not None):
        raise ForgeError("--system and --template render a chat prompt: add --chat.")
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
    chats = chat_messages(args) if args.chat else None
    template = args.template or config.data.chat.template or None
    total, elapsed = 0, 0.0
    for n, prompt in enumerate(prompts):
        if n:
            print()
        given = chat_prompt(tokenizer, chats[n], template) if chats else plain_prompt(tokenizer, prompt)
        turn_stops = [*stops, *given.stops]
        print(given.text, end="", flush=True)
        printer = StreamPrinter(lambda s: print(s, end="", flush=True), turn_stops) if args.stream else None
        new: list[int] = []
        text = ""
        t0 = time.perf_counter()
        for token in sample_tokens(
            model,
            given.ids,
            args.max_new_tokens,
            context=config.data.seq_len,
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
            seed=args.seed,
            eos_id=int(tokenizer.eos_id),
        ):
            if token in given.stop_ids:
                break
            new.append(token)
            text, stopped = continuation(tokenizer, new, turn_stops)
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
