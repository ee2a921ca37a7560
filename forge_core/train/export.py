"""``forge-run export-hf CHECKPOINT_OR_RUN OUT_DIR``: a checkpoint as a Hugging Face
model folder.

The model family's spec names its exporter (``ModelSpec.hf_export``); the kernel calls
it with the full model state dict, the model options and the vocabulary size (and the
tokenizer's EOS/PAD ids when the exporter takes them), then copies the run's tokenizer
files when they are in Hugging Face format (``tokenizer.json`` present). The checkpoint
is checked against its manifest's checksums and read without running code from it
(:func:`forge_core.train.checkpoint.load_model`); an OUT_DIR that cannot be created or
a disk that fills up is a clean error (exit 2).
"""

from __future__ import annotations

import inspect
import shutil
import sys
from pathlib import Path
from typing import Any

from forge_core.api import ForgeError


def main(args: Any) -> int:
    from forge_core.api import import_path
    from forge_core.train import components
    from forge_core.train.checkpoint import is_disk_full, load_model, no_space_message, resolve_checkpoint
    from forge_core.train.run_lock import ensure_out_dir
    from forge_core.train.rundir import TOKENIZER, load_run_config, read_run_info

    checkpoint, run_dir = resolve_checkpoint(args.checkpoint)
    plan, registries = load_run_config(run_dir)
    config, spec = plan.config, plan.specs["model"]
    if not spec.hf_export:
        raise ForgeError(
            f"model {spec.name!r} declares no Hugging Face export (ModelSpec.hf_export is empty); "
            f"its plugin would have to provide one."
        )
    info = read_run_info(run_dir)
    tokenizer = None
    try:
        tokenizer = components.saved_tokenizer(plan, registries, run_dir / TOKENIZER)
    except Exception as exc:  # the weights can be exported without it
        print(f"warning: cannot rebuild the run's tokenizer ({exc}); exporting the model only",
              file=sys.stderr)
    vocab_size = int(info.get("vocab_size") or (tokenizer.vocab_size if tokenizer else 0)) or None
    model = components.model(plan, registries, vocab_size, components.attention(plan, registries))
    load_model(checkpoint, [model], verified=True)
    exporter = import_path(spec.hf_export)
    kwargs: dict[str, Any] = {"vocab_size": vocab_size}
    params = inspect.signature(exporter).parameters
    if tokenizer is not None:
        for key, attr in (("eos_token_id", "eos_id"), ("pad_token_id", "pad_id")):
            if key in params:
                kwargs[key] = int(getattr(tokenizer, attr))
    out_dir = Path(args.out_dir)
    ensure_out_dir(out_dir, "export-hf OUT_DIR", "Give export-hf a directory you can write.")
    tok_dir = run_dir / TOKENIZER
    hf_tokenizer = (tok_dir / "tokenizer.json").is_file()
    try:
        exporter(model.state_dict(), config.model.options, out_dir, **kwargs)
        if hf_tokenizer:
            for file in tok_dir.iterdir():
                if file.is_file():
                    shutil.copy2(file, out_dir / file.name)
    except Exception as exc:
        if not is_disk_full(exc, out_dir):
            raise
        raise ForgeError(f"{no_space_message(out_dir, 'the exported model')} Free some space or export "
                         f"to another disk.") from None
    if hf_tokenizer:
        print(f"copied the tokenizer from {tok_dir}", file=sys.stderr)
    else:
        print(f"note: the run's tokenizer ({config.data.tokenizer}) has no Hugging Face files; "
              f"{out_dir} holds the model only", file=sys.stderr)
    print(f"exported {checkpoint} to {out_dir}")
    return 0
