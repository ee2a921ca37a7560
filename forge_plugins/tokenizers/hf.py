"""The ``hf`` tokenizer: any Hugging Face tokenizer from a local directory.

Loaded with ``transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)``.
``encode`` adds no special tokens (no BOS; the pipeline appends EOS itself).
``vocab_size`` is ``len(tokenizer)`` (added tokens included); ``eos_id`` is the
tokenizer's EOS (an error if it has none); ``pad_id`` its PAD, or EOS when it has no
PAD. ``identity`` is a hash of everything that decides token ids: the full serialized
fast tokenizer (vocabulary, merges, normalizer, pre-tokenizer, added tokens) or, for a
slow tokenizer, its vocabulary; plus the EOS and PAD ids.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

from forge_core.api import ForgeError
from forge_plugins.tokenizers.options import HFOptions


#: Files that hold a tokenizer's vocabulary; a folder needs one of them.
VOCABULARY_FILES = ("tokenizer.json", "vocab.json", "vocab.txt", "tokenizer.model", "spiece.model",
                    "sentencepiece.bpe.model")


def tokenizer_dir_problem(path: str) -> str | None:
    """Why ``path`` cannot hold a Hugging Face tokenizer, from its file names alone (no
    transformers import), or ``None``. Shared by the build and ``forge-run check``."""
    if not path:
        return (
            "data.tokenizer_options.path is empty: give the directory of a Hugging Face "
            "tokenizer (for example one trained by `forge-run prepare`)."
        )
    if not os.path.isdir(path):
        what = "it is a file" if os.path.exists(path) else "it does not exist"
        return f"data.tokenizer_options.path: {path!r} is not a directory ({what})."
    names = sorted(os.listdir(path))
    if not any(name in names for name in VOCABULARY_FILES):
        holds = f"it holds {', '.join(names[:6])}{' ...' if len(names) > 6 else ''}" if names else "it is empty"
        return (
            f"data.tokenizer_options.path: {path!r} holds no tokenizer ({holds}): expected "
            "tokenizer.json (what save_pretrained and `forge-run prepare --train-bpe` write) or "
            "a vocabulary file (vocab.json with merges.txt, vocab.txt, tokenizer.model)."
        )
    return None


class HFTokenizer:
    def __init__(self, options: Any) -> None:
        path = options.path
        problem = tokenizer_dir_problem(path)
        if problem:
            raise ForgeError(problem)
        from transformers import AutoTokenizer

        try:
            tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
        except (OSError, ValueError) as exc:
            raise ForgeError(f"{path}: cannot load a Hugging Face tokenizer ({exc}).") from None
        if tok.eos_token_id is None:
            raise ForgeError(
                f"{path}: the tokenizer has no EOS token; Forge ends every document with "
                "one. Set `eos_token` in its tokenizer_config.json."
            )
        self.path = path
        self.tokenizer = tok
        self.vocab_size = len(tok)
        self.eos_id = int(tok.eos_token_id)
        self.pad_id = int(tok.pad_token_id) if tok.pad_token_id is not None else self.eos_id
        self.identity = f"hf:{_fingerprint(tok)}:eos={self.eos_id}:pad={self.pad_id}"

    @classmethod
    def load(cls, directory: str) -> HFTokenizer:
        """The tokenizer ``save`` wrote to ``directory`` (a run keeps its own copy)."""
        return cls(HFOptions(path=str(directory)))

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False, verbose=False)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        # verbose=False: documents longer than the model's max length are expected here.
        return self.tokenizer(texts, add_special_tokens=False, verbose=False)["input_ids"]

    def decode(self, ids: Any) -> str:
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=True)

    def save(self, directory: str) -> None:
        self.tokenizer.save_pretrained(directory)


def _fingerprint(tok: Any) -> str:
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is not None:
        blob = backend.to_str()
    else:
        blob = json.dumps(sorted(tok.get_vocab().items()))
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:16]
