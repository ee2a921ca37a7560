"""``forge-run sample RUN_DIR --prompt "..." [--prompt ...] [--prompts FILE]
[--num-samples N]``: continuations from the run's latest complete checkpoint, sampled
together in batches of ``--batch-size`` rows (:mod:`forge_core.generate.batched`) and
printed in order: each prompt's samples, prompt after prompt, separated by a blank line.

A continuation ends at the tokenizer's end of document, after ``--max-new-tokens`` or at
the first ``--stop`` string (not printed). A single continuation is printed as it comes,
holding back only what may still turn into a stop string or the rest of a character;
with more than one batch, a line on stderr counts the continuations done. Sampling is a
function of ``--seed`` and each continuation's prompt index and sample index, never of
``--batch-size`` or of the prompts sampled beside it.

With ``--chat`` each prompt is a user message (after ``--system``, when given), rendered
by the run's chat template with the generation prompt (:func:`chat_prompt`): the run's
``data.chat.template``, else the tokenizer's own, or ``--template FILE``. The rendered
text is encoded as it is, so special tokens the template writes (``<|im_start|>``) are
read as themselves, and printed as it is. The reply also ends where the template ends an
assistant's turn (``<|im_end|>``: found by rendering a stand-in turn), at that token
when it is one, else at that text.
"""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

from forge_core.api import ChatRenderingTokenizer, ForgeError
from forge_core.api.unstable import INT_MAX, INT_MIN
from forge_core.generate import has_cache, load_for_inference
from forge_core.generate.batched import Completion, Row, Sampling, generate_rows


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


def read_prompts(path: str) -> list[str]:
    """The prompts of ``--prompts FILE``: a ``.jsonl`` file holds one JSON string or
    ``{"prompt": ...}`` object a line, any other file one prompt a line (blank lines
    skipped in both)."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ForgeError(
            f"--prompts {path}: cannot be read ({exc}). Give a UTF-8 text or JSONL file."
        ) from None
    if not path.endswith(".jsonl"):
        return [line for line in lines if line.strip()]
    prompts = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ForgeError(
                f"--prompts {path}:{number}: not JSON ({exc.msg}). Write one JSON value a line."
            ) from None
        if isinstance(value, dict):
            value = value.get("prompt")
        if not isinstance(value, str):
            raise ForgeError(
                f'--prompts {path}:{number}: a JSONL prompt is a string or an object with a "prompt" '
                f"string, got {line.strip()[:60]!r}"
            )
        prompts.append(value)
    return prompts


def chat_messages(args: Any, prompts: list[str]) -> list[list[dict[str, str]]]:
    """One conversation per prompt: ``--system``, then the prompt as the user's."""
    system = [{"role": "system", "content": args.system}] if args.system is not None else []
    return [[*system, {"role": "user", "content": prompt}] for prompt in prompts]


def check_settings(args: Any) -> None:
    """ForgeError for a setting outside its range."""
    if args.chat and not (args.prompt or args.prompts):
        raise ForgeError(
            "sample --chat needs --prompt TEXT: the user's message (repeat for several), or --prompts FILE."
        )
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
    for flag, value in (("--num-samples", args.num_samples), ("--batch-size", args.batch_size)):
        if value < 1:
            raise ForgeError(f"{flag} must be 1 or more, got {value}")


def shown(tokenizer: Any, done: Completion, stops: list[str]) -> str:
    """The text printed for a completion: without the id that ended it, cut before a stop string."""
    ids = list(done.ids[:-1] if done.finish == "eos" else done.ids)
    return continuation(tokenizer, ids, stops)[0]


def main(args: Any) -> int:
    check_settings(args)
    model, tokenizer, config, checkpoint = load_for_inference(args.run_dir)
    prompts = [*(args.prompt or []), *(read_prompts(args.prompts) if args.prompts else [])] or [""]
    template = args.template or config.data.chat.template or None
    if args.chat:
        given = [chat_prompt(tokenizer, chat, template) for chat in chat_messages(args, prompts)]
    else:
        given = [plain_prompt(tokenizer, prompt) for prompt in prompts]
    stops = [s for s in (args.stop or []) if s]
    stops += [s for s in dict.fromkeys(s for g in given for s in g.stops) if s not in stops]
    sampling = Sampling(
        args.max_new_tokens,
        args.temperature,
        args.top_k,
        args.top_p,
        args.seed,
        eos_ids=frozenset({int(tokenizer.eos_id)}).union(*(g.stop_ids for g in given)),
        stops=tuple(stops),
    )
    rows = [Row(tuple(g.ids), p, n) for p, g in enumerate(given) for n in range(args.num_samples)]
    # One continuation alone is streamed as it is sampled; several are printed in order
    # as their batch ends (their tokens come interleaved).
    stream = args.stream and len(rows) == 1
    total, elapsed = 0, 0.0
    for first in range(0, len(rows), args.batch_size):
        batch = rows[first : first + args.batch_size]
        on_token = None
        if stream:
            print(given[0].text, end="", flush=True)
            printer = StreamPrinter(lambda s: print(s, end="", flush=True), stops)
            new: list[int] = []

            def on_token(row: int, token: int) -> None:
                new.append(token)
                if token not in sampling.eos_ids:
                    printer.update(continuation(tokenizer, new, stops)[0])

        t0 = time.perf_counter()
        done = generate_rows(
            model, batch, sampling, context=config.data.seq_len, decode=tokenizer.decode, on_token=on_token
        )
        elapsed += time.perf_counter() - t0
        total += sum(len(d.ids) for d in done)
        for n, (row, completion) in enumerate(zip(batch, done)):
            text = shown(tokenizer, completion, stops)
            if stream:
                printer.update(text, final=True)
                print(flush=True)
                continue
            print(("\n" if first + n else "") + given[row.prompt].text + text, flush=True)
        if len(rows) > args.batch_size:
            print(
                f"forge: sample: {min(first + args.batch_size, len(rows))}/{len(rows)} continuations, "
                f"{total} tokens",
                file=sys.stderr,
                flush=True,
            )
    rate = f", {total / elapsed:.1f} tokens/s" if elapsed > 0 and total else ""
    how = "key/value cache" if has_cache(model) else "no cache: the context is re-read every token"
    print(f"[{checkpoint}] {total} tokens sampled{rate} ({how})", file=sys.stderr)
    return 0
