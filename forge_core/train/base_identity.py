"""The identity of the base weights under a transform whose checkpoints hold only its own
parameters (LoRA): recorded in every checkpoint's train state and checked wherever the
checkpoint is loaded (resume, ``eval``, ``sample``, ``export-hf``), because adapters
loaded onto another base compute something else without any error.

The base is either the model's pretrained weights (``ModelSpec.pretrained_option``: a
Hugging Face folder, or a Hub id's cached snapshot), identified by the SHA-256 of every
byte of its files, or the seeded initialisation, identified by the model's name, its
resolved options and ``run.seed`` (:func:`forge_core.components.build.base_from_seed`).

Beside it every checkpoint records the settings of each transform that change what its
parameters mean (:attr:`~forge_core.api.TransformSpec.weight_options`: LoRA's targets,
rank and alpha), :func:`transform_settings`; :func:`check_settings` refuses a checkpoint
whose settings differ from the config's, naming each, where the adapters would otherwise
be dropped (fewer targets), fail to load (another rank) or be scaled differently
(another alpha).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import attrs

from forge_core.api import ForgeError, Plan, files_fingerprint
from forge_core.components.build import (
    base_from_seed,
    pretrained_path,
    pretrained_source,
    saves_trainable_only,
)

#: The train state's key.
STATE_KEY = "base_identity"
#: The train state's key of :func:`transform_settings`.
SETTINGS_KEY = "transform_settings"


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
    source = Path(pretrained_path(plan))
    return f"pretrained:{source.name}:" + files_fingerprint("forge-base/1", _files(source), {})


def check_base(
    saved: dict[str, Any], plan: Plan, where: Path, expected: str | None = None, fix: str | None = None
) -> None:
    """Refuse a checkpoint (train state ``saved``, written at ``where``) whose adapters
    were trained on another base than the one ``plan`` builds (its identity: ``expected``,
    computed here when not given), saying ``fix`` (by default: how to resume it)."""
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
    fix = fix or (
        "Point the model at the base the run was trained on (its saved config.yaml says which), or start "
        "a new run.out_dir."
    )
    raise ForgeError(
        f"checkpoint {where} holds adapters trained on another base ({found}); the config builds {now}. "
        f"Adapters on another base compute something else. {fix}"
    )


def transform_settings(plan: Plan) -> dict[str, dict[str, Any]] | None:
    """``{transform: {option: value}}`` of the options each of ``plan``'s transforms
    declares as changing what its weights mean (``TransformSpec.weight_options``), as
    JSON values; ``None`` when no transform keeps only its own parameters."""
    if not saves_trainable_only(plan):
        return None
    settings = {
        t.name: {name: getattr(t.options, name) for name in t.spec.weight_options} for t in plan.transforms
    }
    return json.loads(json.dumps(settings, default=str))


def settings_differences(saved: dict[str, Any], plan: Plan) -> list[str]:
    """Each setting of :func:`transform_settings` whose value in the train state ``saved``
    differs from ``plan``'s, as ``path: checkpoint has X, config has Y``; nothing when
    ``saved`` records none (written before they were recorded)."""
    found = saved.get(SETTINGS_KEY)
    expected = transform_settings(plan)
    if not isinstance(found, dict) or expected is None:
        return []
    differences = []
    for name in sorted(set(found) | set(expected)):
        if name not in expected or name not in found:
            where = "config" if name in expected else "checkpoint"
            differences.append(f"model.transforms: only the {where} has {name!r}")
            continue
        mine, theirs = expected[name], found[name] if isinstance(found[name], dict) else {}
        for option in sorted(set(mine) | set(theirs)):
            if mine.get(option) != theirs.get(option):
                differences.append(
                    f"model.transform_options.{name}.{option}: checkpoint has "
                    f"{json.dumps(theirs.get(option))}, config has {json.dumps(mine.get(option))}"
                )
    return differences


def check_settings(saved: dict[str, Any], plan: Plan, where: Path, fix: str | None = None) -> None:
    """Refuse the checkpoint at ``where`` (train state ``saved``) when its transforms'
    settings differ from ``plan``'s (:func:`settings_differences`), saying each and
    ``fix`` (by default: how to resume it)."""
    differences = settings_differences(saved, plan)
    if not differences:
        return
    fix = fix or (
        "Set them back as the checkpoint has them (the run's config.yaml) to resume this run; to "
        "train adapters of another shape, give the config another run.out_dir (a new run)."
    )
    listed = "".join(f"\n  - {d}" for d in differences)
    raise ForgeError(
        f"checkpoint {where} holds adapters made under other settings than the config's, so they "
        f"would be dropped, fail to load or compute something else:{listed}\n{fix}"
    )
