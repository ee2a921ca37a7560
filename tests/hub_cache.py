"""A Hugging Face Hub cache laid out by the tests, as ``huggingface_hub`` writes one
(``models--org--name/refs/<revision>``, ``snapshots/<commit>/<file>`` linking to
``blobs/<sha256>``), so Hub ids resolve with the network off.

What goes into it: a random checkpoint of a (reduced) ``config.json``; a checkpoint of
a real model's ``config.json`` whose safetensors hold only headers (the real shapes, no
tensor data: what ``forge-run check`` reads); a small BPE tokenizer."""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import struct
import tempfile
from pathlib import Path
from typing import Any

from forge_plugins.models.hf_config import options_from_hf_config
from forge_plugins.models.hf_keys import expected_hf_shapes
from forge_plugins.models.hf_moe import with_checkpoint_moe
from forge_plugins.models.options import LlamaOptions, with_defaults

#: The tokenizer's vocabulary; reduced checkpoints have at least this many rows.
TOKENIZER_VOCAB = 300


def put(cache: Path, repo_id: str, folder: Path, revision: str = "main", commit: str | None = None) -> Path:
    """Copy ``folder``'s files into ``cache`` as the snapshot ``commit`` of ``repo_id``
    (derived from the id and revision when not given) and point ``refs/<revision>`` at
    it; returns the snapshot folder."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    commit = commit or hashlib.sha1(f"{repo_id}@{revision}".encode()).hexdigest()
    snapshot = repo / "snapshots" / commit
    for file in sorted(p for p in folder.rglob("*") if p.is_file()):
        data = file.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = snapshot / file.relative_to(folder)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.unlink(missing_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    ref = repo / "refs" / revision
    ref.parent.mkdir(parents=True, exist_ok=True)
    ref.write_text(commit)
    return snapshot


def _shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Every tensor name and shape a ``config.json`` describes (a tied checkpoint stores
    no ``lm_head``)."""
    values, problems = options_from_hf_config(config)
    assert not problems, problems
    options = with_checkpoint_moe(with_defaults(LlamaOptions(), values), values.get("moe"))
    shapes = expected_hf_shapes(options, config["vocab_size"])
    if config.get("tie_word_embeddings"):
        shapes.pop("lm_head.weight", None)
    return shapes


def random_checkpoint(out: Path, config: dict[str, Any], seed: int = 0) -> Path:
    """``config.json`` and a ``model.safetensors`` of random tensors (drawn from ``seed``)
    at the shapes it describes (small sizes only)."""
    import torch
    from safetensors.torch import save_file

    generator = torch.Generator().manual_seed(seed)
    tensors = {
        name: 0.05 * torch.randn(shape, generator=generator) for name, shape in _shapes(config).items()
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config))
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    return out


def header_only_checkpoint(out: Path, config: dict[str, Any]) -> Path:
    """``config.json`` and a ``model.safetensors`` whose header lists every tensor the
    config describes at its real shape, with no tensor data after it."""
    header, offset = {}, 0
    for name, shape in _shapes(config).items():
        size = 2 * math.prod(shape)
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    blob = json.dumps(header).encode()
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config))
    (out / "model.safetensors").write_bytes(struct.pack("<Q", len(blob)) + blob)
    return out


class _Texts:
    def documents(self):
        for i in range(200):
            yield f"def f{i}(x):\n    return x * {i} + {i % 7}\n# the quick brown fox {i}\n"


_TRAINED: list[Path] = []


def tokenizer(out: Path) -> Path:
    """A byte-level BPE tokenizer of :data:`TOKENIZER_VOCAB` tokens with EOS and PAD,
    written into ``out`` beside what is there (trained once per test process)."""
    from forge_core.data.bpe import train_bpe

    if not _TRAINED:
        _TRAINED.append(
            Path(train_bpe(_Texts(), TOKENIZER_VOCAB, tempfile.mkdtemp() + "/tok", progress=False))
        )
    out.mkdir(parents=True, exist_ok=True)
    for file in _TRAINED[0].iterdir():
        shutil.copy(file, out / file.name)
    return out
