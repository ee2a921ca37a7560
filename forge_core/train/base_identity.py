"""The identity of the base weights under a transform whose checkpoints hold only its own
parameters (LoRA): recorded in every checkpoint's train state and checked wherever the
checkpoint is loaded (resume, ``eval``, ``sample``, ``export-hf``), because adapters
loaded onto another base compute something else without any error.

The base is either the model's pretrained weights (``ModelSpec.pretrained_option``: a
Hugging Face folder), identified by the SHA-256 of every byte of its files, or the
seeded initialisation, identified by the model's name, its resolved options and
``run.seed`` (:func:`forge_core.components.build.base_from_seed`).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import attrs

from forge_core.api import ForgeError, Plan, files_fingerprint
from forge_core.components.build import base_from_seed, pretrained_source, saves_trainable_only

#: The train state's key.
STATE_KEY = "base_identity"


def _files(source: Path) -> list[str]:
    if source.is_file():
        return [str(source)]
    if not source.is_dir():
        return []
    return sorted(str(p) for p in source.iterdir() if p.is_file() and not p.name.startswith("."))


def base_identity(plan: Plan) -> str | None:
    """The identity of the run's base weights, or ``None`` when its checkpoints hold
    every weight (no transform saves only its own)."""
    if not saves_trainable_only(plan):
        return None
    config = plan.config
    if base_from_seed(plan):
        options = attrs.asdict(config.model.options) if attrs.has(type(config.model.options)) else {}
        blob = json.dumps(
            {"model": config.model.name, "options": options, "seed": config.run.seed},
            sort_keys=True,
            default=str,
        )
        digest = hashlib.sha256(blob.encode()).hexdigest()
        return f"init:{config.model.name}:seed={config.run.seed}:sha256:{digest}"
    source = Path(pretrained_source(plan))
    return f"pretrained:{source.name}:" + files_fingerprint("forge-base/1", _files(source), {})


def check_base(saved: dict[str, Any], plan: Plan, where: Path, expected: str | None = None) -> None:
    """Refuse a checkpoint (train state ``saved``, written at ``where``) whose adapters
    were trained on another base than the one ``plan`` builds (its identity: ``expected``,
    computed here when not given)."""
    expected = expected if expected is not None else base_identity(plan)
    found = saved.get(STATE_KEY)
    if expected is None or found == expected:
        return
    pretrained = pretrained_source(plan)
    now = (
        f"the pretrained weights at {pretrained!r}"
        if pretrained
        else f"the seeded initialisation ({expected})"
    )
    if found is None:
        raise ForgeError(
            f"checkpoint {where} records no base identity, but model.transforms "
            f"{list(plan.config.model.transforms)} keep only the adapters in checkpoints: it was written "
            "by a run without them. Use that run's own config, or a new run.out_dir."
        )
    raise ForgeError(
        f"checkpoint {where} holds adapters trained on another base ({found}); the config builds {now}. "
        "Adapters on another base compute something else. Point the model at the base the run was trained "
        "on (its saved config.yaml says which), or start a new run.out_dir."
    )
