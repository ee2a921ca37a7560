"""``forge-run export-hf CHECKPOINT_OR_RUN OUT_DIR``: a checkpoint as a Hugging Face
model folder.

The model family's spec names its exporter (``ModelSpec.hf_export``); the kernel calls
it with the full model state dict cast to ``--dtype``, the model options and the
vocabulary size (and the tokenizer's EOS/PAD/BOS ids and ``--max-shard-size`` in bytes when
the exporter takes them). The tokenizer goes with it whenever the run has one: a tokenizer
with ``save_hf(directory)`` writes Hugging Face files itself (the byte tokenizer writes
a ``tokenizers`` JSON), otherwise the run's saved tokenizer files are copied when they
are in Hugging Face format (``tokenizer.json``).

The checkpoint is checked against its manifest's checksums and read without running
code from it (:func:`forge_core.train.checkpoint.load_model`); the model's pretrained
option is cleared (the checkpoint holds every weight), unless the run's model transforms
keep only their own parameters in checkpoints (LoRA): the base then comes from its
pretrained weights, after its identity is checked (:mod:`forge_core.train.restore`).
The model transforms are merged into the base weights, so the folder is a plain model;
``--adapter`` writes the adapters as a PEFT folder instead (``adapter_config.json``,
``adapter_model.safetensors``), by the transform's ``write_adapter``. Everything is
written to a temporary folder beside OUT_DIR that Forge marks as its own
(:func:`~forge_core.api.files.temporary_dir`) and renamed into place when complete: an
existing OUT_DIR is refused unless ``--overwrite``, and then replaced only by a complete
export; a failed export (a full disk included: a clean error, exit 2) leaves nothing
half-written. No other folder is removed: a sibling ``OUT_DIR.old`` or ``OUT_DIR.partial``
is the user's.

The export never destroys a run or what it depends on: an OUT_DIR that is, contains or
lies inside the run exported from, or the pretrained base of a run whose checkpoints
hold only adapters (a Hub id's cached repository included), symlinks resolved, is
refused, and so is ``--overwrite`` of a folder holding any Forge run or checkpoint
(:func:`~forge_core.train.rundir.holds_run`). An OUT_DIR that is a symbolic link means
the folder it points to: that folder is replaced, the link is kept and shows the new
export.
"""

from __future__ import annotations

import inspect
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Any

from forge_core.api import AdapterWritingTransform, ForgeError, HFSavingTokenizer, Plan

DTYPES = {"fp32": "float32", "bf16": "bfloat16"}


def parse_size(text: str) -> int:
    """Bytes in ``"5GB"``, ``"500MB"``, ``"2GiB"`` or a plain number of bytes."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(i?)B?\s*", str(text), re.IGNORECASE)
    if not match or float(match.group(1)) <= 0:
        raise ForgeError(f"--max-shard-size: {text!r} is not a size (examples: 5GB, 500MB, 2GiB, 1000000)")
    number, unit, binary = match.groups()
    return int(float(number) * (1024 if binary else 1000) ** " KMGT".index(unit.upper() or " "))


def _tokenizer_ids(tokenizer: Any, params: Any) -> dict[str, int]:
    kwargs = {}
    for key, attr in (("eos_token_id", "eos_id"), ("pad_token_id", "pad_id"), ("bos_token_id", "bos_id")):
        value = getattr(tokenizer, attr, None)
        if key in params and value is not None:
            kwargs[key] = int(value)
    return kwargs


def write_tokenizer(tokenizer: Any, saved: Path, out: Path) -> bool:
    """The run's tokenizer in Hugging Face form into ``out``; whether there was one."""
    if isinstance(tokenizer, HFSavingTokenizer):
        tokenizer.save_hf(str(out))
        return True
    if (saved / "tokenizer.json").is_file():
        for file in saved.iterdir():
            if file.is_file():
                shutil.copy2(file, out / file.name)
        return True
    return False


def _shown(out_dir: Path, target: Path) -> str:
    return f"{str(out_dir)!r}" + (f" (the link to {str(target)!r})" if target != out_dir.absolute() else "")


def _overlap(target: Path, folder: Path) -> str | None:
    """How ``target`` meets ``folder`` (both resolved): ``is``, ``lies inside``,
    ``contains``, or ``None``."""
    if target == folder:
        return "is"
    if folder in target.parents:
        return "lies inside"
    if target in folder.parents:
        return "contains"
    return None


def _refuse_run_folder(out_dir: Path, target: Path, run_dir: Path, overwrite: bool) -> None:
    """Refuse an output that would replace (part of) the run exported from, or, with
    ``--overwrite``, a folder holding any run or checkpoint. ``target`` is ``out_dir``
    with symlinks resolved."""
    run = run_dir.resolve()
    shown = _shown(out_dir, target)
    where = _overlap(target, run)
    if where:
        raise ForgeError(
            f"export-hf OUT_DIR: {shown} {where} the run directory {str(run_dir)!r} being exported; "
            f"writing there would replace its checkpoints, config and metrics. Give a folder outside "
            f"the run (for example {str(run.parent / (run.name + '-hf'))!r})."
        )
    if overwrite and target.is_dir():
        from forge_core.train.rundir import holds_run

        found = holds_run(target)
        if found is not None:
            raise ForgeError(
                f"export-hf OUT_DIR: {shown} holds a Forge run or checkpoint ({str(found)!r}); "
                f"--overwrite would delete it. Give another folder, or remove what is there yourself "
                f"if it is no longer needed."
            )


def base_folders(plan: Plan) -> list[Path]:
    """The folders the checkpoints of ``plan``'s run cannot do without, resolved: the
    pretrained base of a run whose checkpoints hold only the adapters (and, for a Hub id,
    its whole cached repository, ``models--org--name``); none otherwise."""
    from forge_core import components

    if not components.saves_trainable_only(plan) or not components.pretrained_source(plan):
        return []
    base = Path(components.pretrained_path(plan)).resolve()
    folders = [base]
    if base.parent.name == "snapshots":  # a Hub cache snapshot: its blobs live beside
        folders.append(base.parent.parent)
    return folders


def _refuse_base_folder(out_dir: Path, target: Path, run_dir: Path, plan: Plan) -> None:
    """Refuse an output that would replace the base model the run's adapters were trained
    on (every checkpoint of the run would become unusable)."""
    from forge_core import components

    for folder in base_folders(plan):
        where = _overlap(target, folder)
        if where:
            raise ForgeError(
                f"export-hf OUT_DIR: {_shown(out_dir, target)} {where} {str(folder)!r}, the base model "
                f"of the run {str(run_dir)!r} (model.options: {components.pretrained_source(plan)!r}); "
                "its checkpoints hold only the adapters, so replacing the base would make every one of "
                f"them unusable. Give a folder outside the base (for example "
                f"{str(run_dir.resolve().parent / (run_dir.name + '-hf'))!r})."
            )


def _export_adapter(model: Any, plan: Plan, checkpoint: Path, given: Path, out_dir: Path) -> int:
    """``--adapter``: the run's adapters as a PEFT folder, written by the transform that
    has them (``write_adapter(module, directory, hf_key, base)``), into place atomically."""
    from forge_core import components
    from forge_core.api import import_path
    from forge_core.api.files import move_into_place, remove_temporary, temporary_dir
    from forge_core.api.unstable import applied_transforms
    from forge_core.train.run_lock import ensure_out_dir

    writers = [t for t in applied_transforms(model) if isinstance(t.impl, AdapterWritingTransform)]
    listed = list(plan.config.model.transforms)
    if len(writers) != 1:
        raise ForgeError(
            f"export-hf --adapter: the run's model.transforms {listed} "
            f"{'have no transform that writes' if not writers else 'have several transforms that write'} "
            "an adapter folder; export the merged model instead (leave out --adapter)."
        )
    spec = plan.specs["model"]
    if not spec.hf_key:
        raise ForgeError(
            f"export-hf --adapter: model {spec.name!r} declares no Hugging Face parameter names "
            "(ModelSpec.hf_key is empty), so the adapted modules cannot be named for PEFT; export the "
            "merged model instead (leave out --adapter)."
        )
    ensure_out_dir(out_dir.parent, "export-hf OUT_DIR", "Give export-hf a directory you can write.")
    tmp = temporary_dir(out_dir)
    try:
        writers[0].impl.write_adapter(
            model, str(tmp), import_path(spec.hf_key), components.pretrained_source(plan)
        )
        move_into_place(tmp, out_dir)
    finally:
        remove_temporary(tmp)
    print(f"exported the {writers[0].name} adapters of {checkpoint} to {given} (a PEFT adapter folder)")
    return 0


def main(args: Any) -> int:
    import torch

    from forge_core import components
    from forge_core.api import import_path
    from forge_core.api.files import leftover_temporaries, move_into_place, remove_temporary, temporary_dir
    from forge_core.api.transforms import merge_transforms
    from forge_core.train.checkpoint import is_disk_full, no_space_message, resolve_checkpoint
    from forge_core.train.restore import restored_model
    from forge_core.train.run_lock import ensure_out_dir
    from forge_core.train.rundir import TOKENIZER, load_run_config, read_run_info

    given = Path(args.out_dir)
    # A symlink means the folder it points to (kept as a link, showing the new export).
    out_dir = Path(os.path.realpath(given))
    overwrite = bool(getattr(args, "overwrite", False))
    if out_dir.exists() and not overwrite:
        raise ForgeError(
            f"export-hf OUT_DIR: {str(given)!r} already exists. Choose another directory or "
            "pass --overwrite (it is replaced only once the new export is complete)."
        )
    if out_dir.exists() and not out_dir.is_dir():
        raise ForgeError(f"export-hf OUT_DIR: {str(given)!r} is an existing file, not a directory.")
    dtype = getattr(torch, DTYPES[getattr(args, "dtype", "fp32")])
    max_shard_size = getattr(args, "max_shard_size", None)
    max_shard_size = parse_size(max_shard_size) if max_shard_size else None
    checkpoint, run_dir = resolve_checkpoint(args.checkpoint)
    plan, registries = load_run_config(run_dir)  # first: it proves run_dir is a run directory
    _refuse_run_folder(given, out_dir, run_dir, overwrite)
    _refuse_base_folder(given, out_dir, run_dir, plan)
    config, spec = plan.config, plan.specs["model"]
    if not spec.hf_export:
        raise ForgeError(
            f"model {spec.name!r} declares no Hugging Face export (ModelSpec.hf_export is empty); "
            f"its plugin would have to provide one."
        )
    plan = components.without_pretrained(plan)
    config = plan.config
    exporter = import_path(spec.hf_export)
    params = inspect.signature(exporter).parameters
    if max_shard_size and "max_shard_size" not in params:
        max_shard_size = None  # this exporter writes one file
    info = read_run_info(run_dir)
    tokenizer = None
    try:
        tokenizer = components.saved_tokenizer(plan, registries, run_dir / TOKENIZER)
    except Exception as exc:  # the weights can be exported without it
        print(
            f"warning: cannot rebuild the run's tokenizer ({exc}); exporting the model only", file=sys.stderr
        )
    vocab_size = int(info.get("vocab_size") or (tokenizer.vocab_size if tokenizer else 0)) or None
    model = restored_model(plan, registries, vocab_size, checkpoint)
    if getattr(args, "adapter", False):
        return _export_adapter(model, plan, checkpoint, given, out_dir)
    merge_transforms(model)  # the adapters folded into the base weights: a plain model
    kwargs: dict[str, Any] = {
        "vocab_size": vocab_size,
        **(_tokenizer_ids(tokenizer, params) if tokenizer else {}),
    }
    if max_shard_size:
        kwargs["max_shard_size"] = max_shard_size
    state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in model.state_dict().items()}
    ensure_out_dir(out_dir.parent, "export-hf OUT_DIR", "Give export-hf a directory you can write.")
    for leftover in leftover_temporaries(out_dir):  # an interrupted export's, marked by Forge
        remove_temporary(leftover)
    tmp = temporary_dir(out_dir)
    try:
        exporter(state, config.model.options, tmp, **kwargs)
        with_tokenizer = tokenizer is not None and write_tokenizer(tokenizer, run_dir / TOKENIZER, tmp)
        move_into_place(tmp, out_dir)
    except Exception as exc:
        if not is_disk_full(exc, out_dir.parent):
            raise
        raise ForgeError(
            f"{no_space_message(out_dir, 'the exported model')} Free some space or export to another disk."
        ) from None
    finally:  # an error or an interruption leaves nothing half-written
        remove_temporary(tmp)
    if not with_tokenizer:
        print(
            f"note: the run's tokenizer ({config.data.tokenizer}) cannot be written in Hugging Face form; "
            f"{given} holds the model only",
            file=sys.stderr,
        )
    print(
        f"exported {checkpoint} to {given} ({DTYPES[getattr(args, 'dtype', 'fp32')]}"
        f"{', with its tokenizer' if with_tokenizer else ''})"
    )
    return 0
