"""The ``byte`` tokenizer: a document's UTF-8 bytes are its token ids.

Ids 0-255 are bytes, 256 is EOS, 257 is PAD; ``vocab_size`` is 258. It needs no file,
so ``save`` writes nothing. ``decode`` skips EOS and PAD and replaces byte sequences
that are not valid UTF-8 (a window may cut a character in half).

``encode_chat`` renders a conversation with a chat template file (the byte tokenizer has
no template of its own) and marks the assistant's bytes trainable
(:mod:`forge_plugins.tokenizers.chat`); ``render_chat`` gives the rendered text (a prompt
for ``forge-run sample --chat``). ``decode_special`` writes EOS and PAD out by the names
``save_hf`` gives them (``forge-run preview``).

``save_hf`` writes the same tokenizer in Hugging Face form (for ``export-hf``): a
``tokenizers`` byte-level BPE with no merges, whose 256 tokens are the bytes in
GPT-2's printable byte alphabet, plus ``<|endoftext|>`` (EOS, 256) and ``<|pad|>``
(PAD, 257), so ``AutoTokenizer`` gives the same ids and text.
"""

from __future__ import annotations

from typing import Any

import numpy as np

EOS = 256
PAD = 257


class ByteTokenizer:
    vocab_size = 258
    eos_id = EOS
    pad_id = PAD
    identity = "byte:utf-8:eos=256:pad=257"

    def __init__(self, options: Any = None) -> None:
        pass

    @classmethod
    def load(cls, directory: str) -> ByteTokenizer:
        """The tokenizer ``save`` wrote to ``directory`` (it needs nothing from it)."""
        return cls()

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def encode_batch(self, texts: list[str]) -> list[np.ndarray]:
        # np.frombuffer avoids a Python int per byte: tens of MB/s instead of a few.
        return [np.frombuffer(t.encode("utf-8"), dtype=np.uint8) for t in texts]

    def decode(self, ids: Any) -> str:
        data = bytes(int(i) for i in ids if 0 <= int(i) < 256)
        return data.decode("utf-8", errors="replace")

    def decode_special(self, ids: Any) -> str:
        """The text of ``ids`` with EOS and PAD written out (``<|endoftext|>``, ``<|pad|>``)."""
        names = {EOS: EOS_TOKEN, PAD: PAD_TOKEN}
        out, run = [], bytearray()
        for i in map(int, ids):
            if 0 <= i < 256:
                run.append(i)
                continue
            out += [run.decode("utf-8", errors="replace"), names.get(i, "")]
            run = bytearray()
        return "".join(out) + run.decode("utf-8", errors="replace")

    def encode_chat(
        self, messages: list[dict[str, Any]], *, train_from: int = 0, template: str | None = None
    ) -> Any:
        """``messages`` rendered by the template file ``template``, as a MaskedDocument
        whose trainable bytes are the assistant's."""
        from forge_plugins.tokenizers.chat import encode_chat

        return encode_chat(self._template(template), messages, train_from, _bytes_and_starts)

    def render_chat(
        self,
        messages: list[dict[str, Any]],
        *,
        add_generation_prompt: bool = False,
        template: str | None = None,
    ) -> str:
        """``messages`` as the template file ``template`` renders them."""
        return self._template(template).render(messages, add_generation_prompt)[0]

    def chat_identity(self, template: str | None = None) -> str:
        """A hash of the chat template ``encode_chat`` renders with (it keys the token cache)."""
        import hashlib

        return hashlib.sha256(self._template(template).source.encode()).hexdigest()[:16]

    def _template(self, template: str | None) -> Any:
        from forge_core.api import ForgeError
        from forge_plugins.tokenizers.chat import ChatTemplate, read_template

        if not template:
            raise ForgeError(
                "data.chat.template is empty, and the byte tokenizer has no chat template of its own: "
                "give a Jinja chat template file."
            )
        cached = getattr(self, "_chat", None)
        if cached is None or cached[0] != template:
            cached = self._chat = (template, ChatTemplate(read_template(template), template))
        return cached[1]

    def save(self, directory: str) -> None:
        """Nothing to save: the byte tokenizer is fully described by its identity."""

    def save_hf(self, directory: str) -> None:
        """``tokenizer.json`` and ``tokenizer_config.json`` that ``AutoTokenizer`` loads."""
        from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
        from transformers import PreTrainedTokenizerFast

        alphabet = byte_alphabet()
        bpe = models.BPE(vocab={alphabet[b]: b for b in range(256)}, merges=[])
        tokenizer = Tokenizer(bpe)
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        tokenizer.decoder = decoders.ByteLevel()
        tokenizer.add_special_tokens(
            [AddedToken(EOS_TOKEN, special=True), AddedToken(PAD_TOKEN, special=True)]
        )
        PreTrainedTokenizerFast(
            tokenizer_object=tokenizer,
            eos_token=EOS_TOKEN,
            pad_token=PAD_TOKEN,
            clean_up_tokenization_spaces=False,
        ).save_pretrained(directory)


EOS_TOKEN, PAD_TOKEN = "<|endoftext|>", "<|pad|>"


def _bytes_and_starts(text: str) -> tuple[np.ndarray, np.ndarray]:
    """The UTF-8 bytes of ``text`` and, for each, the index of the character it is part of."""
    points = np.frombuffer(text.encode("utf-32-le"), np.uint32)
    widths = 1 + (points >= 0x80) + (points >= 0x800) + (points >= 0x10000)
    data = np.frombuffer(text.encode("utf-8"), np.uint8)
    return data, np.repeat(np.arange(len(points)), widths)


def byte_alphabet() -> list[str]:
    """The printable character standing for each byte in byte-level BPE (GPT-2's
    table): printable Latin-1 bytes stand for themselves, the others for the code points
    from 256 up, in byte order."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("\u00a1"), ord("\u00ac") + 1),
        *range(ord("\u00ae"), ord("\u00ff") + 1),
    ]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]
