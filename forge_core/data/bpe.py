"""Train a byte-level BPE tokenizer on a source and save it in Hugging Face format.

The result loads with ``transformers.AutoTokenizer.from_pretrained(out_dir)`` (so an
exported model opens in ``transformers`` with its tokenizer) and with Forge's ``hf``
tokenizer (``data.tokenizer: hf``, ``data.tokenizer_options.path: out_dir``).

What is trained: the ``tokenizers`` library's BPE model over a byte-level
pre-tokenizer (GPT-2 style: every byte has a token, so no text is unknown), with two
special tokens, ``<|endoftext|>`` (EOS, id 0) and ``<|pad|>`` (PAD, id 1). The output
directory appears atomically (written in a temporary beside it,
:func:`~forge_core.api.files.temporary_dir`, then renamed).
``tokenizers`` and ``transformers`` are imported only when this runs.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from forge_core.api import ForgeError
from forge_core.api.files import move_into_place, remove_temporary, temporary_dir

EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"
#: 256 byte tokens + the two special tokens: a smaller vocabulary cannot hold them.
MIN_VOCAB = 258


def train_bpe(
    source: Any,
    vocab_size: int,
    out_dir: str | os.PathLike,
    *,
    min_frequency: int = 2,
    overwrite: bool = False,
    progress: bool = True,
) -> str:
    """Train on every text document of ``source``; returns ``out_dir``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if vocab_size < MIN_VOCAB:
        raise ForgeError(
            f"BPE vocab_size must be at least {MIN_VOCAB} (256 bytes + EOS + PAD), got {vocab_size}."
        )
    out = Path(out_dir)
    if out.exists() and not overwrite:
        raise ForgeError(f"{out} already exists. Choose another directory or pass --overwrite.")

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=[EOS_TOKEN, PAD_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=progress,
    )
    tok.train_from_iterator(_texts(source), trainer=trainer)
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS_TOKEN, pad_token=PAD_TOKEN)

    tmp = temporary_dir(out)
    try:
        wrapped.save_pretrained(str(tmp))
        move_into_place(tmp, out)
    finally:
        remove_temporary(tmp)
    return str(out)


def _texts(source: Any) -> Iterator[str]:
    for doc in source.documents():
        if not isinstance(doc, str):
            raise ForgeError(f"{source.describe()}: is pre-tokenized; BPE training needs a text source.")
        yield doc
