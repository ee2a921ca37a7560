"""``forge-run export-hf CHECKPOINT_OR_RUN OUT_DIR``: a checkpoint as a Hugging Face
model folder.

The model family's spec names its exporter (``ModelSpec.hf_export``); the kernel calls
it with the full model state dict, the model options and the vocabulary size (and the
tokenizer's EOS/PAD ids when the exporter takes them), then copies the run's tokenizer
files when they are in Hugging Face format (``tokenizer.json`` present).
"""

from __future__ import annotations

import inspect
import shutil
import sys
from pathlib import Path
from typing import Any

from forge_core.errors import ForgeError


def main(args: Any) -> int:
    from forge_core.specs import import_path
    from forge_core.train import components
    from forge_core.train.checkpoint import load_model, resolve_checkpoint
    from forge_core.train.rundir import TOKENIZER, load_run_config, read_run_info

    checkpoint, run_dir = resolve_checkpoint(args.checkpoint)
    config, registries = load_run_config(run_dir)
    spec = registries["model"].get(config.model.name)
    if not spec.hf_export:
        raise ForgeError(
            f"model {spec.name!r} declares no Hugging Face export (ModelSpec.hf_export is empty); "
            f"its plugin would have to provide one."
        )
    info = read_run_info(run_dir)
    tokenizer = None
    try:
        tokenizer = components.saved_tokenizer(config, registries, run_dir / TOKENIZER)
    except Exception as exc:  # the weights can be exported without it
        print(f"warning: cannot rebuild the run's tokenizer ({exc}); exporting the model only",
              file=sys.stderr)
    vocab_size = int(info.get("vocab_size") or (tokenizer.vocab_size if tokenizer else 0)) or None
    model = components.model(config, registries, vocab_size, components.attention(config, registries))
    load_model(checkpoint, [model])
    exporter = import_path(spec.hf_export)
    kwargs: dict[str, Any] = {"vocab_size": vocab_size}
    params = inspect.signature(exporter).parameters
    if tokenizer is not None:
        for key, attr in (("eos_token_id", "eos_id"), ("pad_token_id", "pad_id")):
            if key in params:
                kwargs[key] = int(getattr(tokenizer, attr))
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    exporter(model.state_dict(), config.model.options, out_dir, **kwargs)
    tok_dir = run_dir / TOKENIZER
    if (tok_dir / "tokenizer.json").is_file():
        for file in tok_dir.iterdir():
            if file.is_file():
                shutil.copy2(file, out_dir / file.name)
        print(f"copied the tokenizer from {tok_dir}", file=sys.stderr)
    else:
        print(f"note: the run's tokenizer ({config.data.tokenizer}) has no Hugging Face files; "
              f"{out_dir} holds the model only", file=sys.stderr)
    print(f"exported {checkpoint} to {out_dir}")
    return 0
