"""Continuations from a trained model: a finished run loaded for inference, and batched
sampling.

:func:`load_for_inference` works from the run directory alone: its ``config.yaml``
rebuilds the model and the tokenizer (from what the run saved in ``tokenizer/``), the
checkpoint gives the weights, checked against its manifest's checksums and read without
running code from it (:func:`forge_core.train.checkpoint.load_model`). The model's
pretrained option is cleared (``ModelSpec.pretrained_option``): the checkpoint holds
every weight.

Decoding runs the model's own forward, many rows at once (:mod:`.batched`), choosing
each token as a function of the seed and the row's place, never of its batch
(:mod:`.sampling`). :func:`generate` is the one-prompt shorthand.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def load_for_inference(path: str | Path) -> tuple[Any, Any, Any, Path]:
    """``(model in eval mode, tokenizer, config, checkpoint)`` of a run directory or a
    checkpoint directory, on the run's device (CPU without CUDA)."""
    from forge_core import components
    from forge_core.distributed.placement import choose_device
    from forge_core.train.checkpoint import resolve_checkpoint
    from forge_core.train.restore import restored_model
    from forge_core.train.rundir import TOKENIZER, load_run_config, read_run_info

    checkpoint, run_dir = resolve_checkpoint(path)
    plan, registries = load_run_config(run_dir)
    plan = components.without_pretrained(plan)
    config = plan.config
    tokenizer = components.saved_tokenizer(plan, registries, run_dir / TOKENIZER)
    vocab_size = int(read_run_info(run_dir).get("vocab_size", tokenizer.vocab_size))
    model = restored_model(plan, registries, vocab_size, checkpoint)
    device = choose_device(config.run.device)
    return model.to(device).eval(), tokenizer, config, checkpoint


def has_cache(model: Any) -> bool:
    from forge_core.api import CachingModel

    return isinstance(model, CachingModel)


def generate(
    model: Any,
    ids: list[int],
    max_new_tokens: int,
    *,
    context: int,
    temperature: float,
    top_k: int,
    top_p: float = 1.0,
    seed: int = 0,
    eos_id: int | None = None,
) -> list[int]:
    """Up to ``max_new_tokens`` ids sampled after ``ids``, ending before ``eos_id``: one
    row of :func:`~forge_core.generate.batched.generate_rows`."""
    from forge_core.generate.batched import Row, Sampling, generate_rows

    eos = frozenset() if eos_id is None else frozenset({eos_id})
    sampling = Sampling(max_new_tokens, temperature, top_k, top_p, seed, eos_ids=eos)
    (done,) = generate_rows(model, [Row(tuple(ids))], sampling, context=context)
    return list(done.ids[:-1] if done.finish == "eos" else done.ids)
