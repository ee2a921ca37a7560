"""The conformance kit: checks a plugin author runs against their components.

- :func:`check_attention_backend`: agreement with an explicit-softmax reference
  (:func:`reference_attention`), with and without ``doc_ids``, forward and backward,
  grouped-query shapes; and document isolation for backends that honour ``doc_ids``;
  in the dtype asked for and again in float64, where it is a proof.
- :func:`assert_within_rounding`, :func:`rounding_tolerance`, :func:`longest_sum`,
  :func:`assert_exactly_zero`:
  comparisons whose tolerance is derived from the dtype and the size of what is
  compared (:mod:`forge_core.testing.tolerance`), for a plugin's own equivalence tests.
- :func:`check_packer`: the layout the kernel accepts, token accounting,
  ``doc_ids``/``positions`` invariants, and that the declared ``emits`` (and
  ``emits_when``) match the rows; :func:`pack_documents` materializes a packer's rows
  of in-memory documents exactly as a run reads them (for a packer's own tests).
- :func:`check_optimizer`: an optimizer factory steps DTensor parameters, laid out as
  FSDP and tensor parallelism lay them out, on one process, and lands where it does on
  plain tensors; an in-place update DTensor cannot keep is named with its fix
  (:mod:`forge_core.testing.optimizer`).
- :func:`check_strategy`: a parallelism strategy at degree 1 in one process: its mesh
  dimension holds beside the registered ones, its options and impl load, and applied to
  a small model it keeps every parameter name, every batch key its transforms are given,
  and the loss and gradients (float64), through its attention wrapper too
  (:mod:`forge_core.testing.strategy`).
- :func:`check_transform`: a model transform keeps the model's parameter names,
  initialises its own from the seed, and its ``detached``, ``disabled`` and ``merge``
  give the model's own parameters, the model's logits and the transformed logits
  (float64) (:mod:`forge_core.testing.transform`).
- :func:`check_rule`: a rule fires on a config that breaks it and not on one that
  does not.
- :func:`check_model`: a model computes attention through the backend it is given,
  packed rows give every document what it gets alone (forward and backward, float64),
  its tensor-parallel plan covers every parameter, its pipeline stages run in sequence
  reproduce it, and its spec's facts agree with it (:mod:`forge_core.testing.model`);
  :func:`check_document_isolation` is its isolation part, for a built model;
  :func:`check_cached_decoding`: a model with a key/value cache gives every row of a
  left-padded batch the logits it has alone (:mod:`forge_core.testing.cache`).
- :func:`train_in_process`: trains a config in the test's process (for lifecycle hooks,
  loggers, a model's first steps); :func:`registered_spec`: a spec the installed
  plugins register; :func:`run_context`: a RunContext to call lifecycle hooks with
  (:mod:`forge_core.testing.runs`).
- :func:`forge_run`: runs a ``forge-run`` command in the test's process and returns its
  :class:`CliResult` (exit status, stdout, stderr), with the environment variables and
  import paths given for the call undone afterwards (:mod:`forge_core.testing.cli_runner`).

Each raises ``AssertionError`` with a specific message when the component breaks its
contract (``ValueError`` when the kit itself is misused). The same functions are
available in tests as the ``forge_conformance`` fixture of the pytest plugin
(:mod:`forge_core.testing.pytest_plugin`, registered through the ``pytest11`` entry
point).

Importing this package does not import torch: the attention and tolerance names below
are loaded on first use.
"""

from __future__ import annotations

from typing import Any

from forge_core.data.packed_rows import pack_documents
from forge_core.testing.cli_runner import CliResult, forge_run
from forge_core.testing.packers import PackerReport, check_packer, conformance_documents
from forge_core.testing.rules import check_rule
from forge_core.testing.runs import registered_spec, run_context, train_in_process

_ATTENTION_NAMES = (
    "check_attention_backend",
    "reference_attention",
    "reference_mask",
    "available_devices",
    "doc_ids_from_lengths",
    "packed_metadata",
    "lognormal_lengths",
    "ReferenceBackend",
)
_MODEL_NAMES = ("check_model", "ModelReport")
_ISOLATION_NAMES = ("check_document_isolation",)
_CACHE_NAMES = ("check_cached_decoding",)
_OPTIMIZER_NAMES = ("check_optimizer", "OptimizerReport")
_STRATEGY_NAMES = ("check_strategy", "StrategyReport")
_TRANSFORM_NAMES = ("check_transform", "TransformReport")
_TOLERANCE_NAMES = (
    "assert_within_rounding",
    "assert_exactly_zero",
    "rounding_tolerance",
    "longest_sum",
    "ROUNDING_FACTOR",
)

__all__ = [
    "CliResult",
    "PackerReport",
    "check_packer",
    "check_rule",
    "conformance_documents",
    "forge_run",
    "pack_documents",
    "registered_spec",
    "run_context",
    "train_in_process",
    *_ATTENTION_NAMES,
    *_TOLERANCE_NAMES,
    *_MODEL_NAMES,
    *_ISOLATION_NAMES,
    *_CACHE_NAMES,
    *_OPTIMIZER_NAMES,
    *_STRATEGY_NAMES,
    *_TRANSFORM_NAMES,
]


def __getattr__(name: str) -> Any:
    if name in _ATTENTION_NAMES:
        from forge_core.testing import attention

        return getattr(attention, name)
    if name in _TOLERANCE_NAMES:
        from forge_core.testing import tolerance

        return getattr(tolerance, name)
    if name in _MODEL_NAMES:
        from forge_core.testing import model

        return getattr(model, name)
    if name in _ISOLATION_NAMES:
        from forge_core.testing import isolation

        return getattr(isolation, name)
    if name in _CACHE_NAMES:
        from forge_core.testing import cache

        return getattr(cache, name)
    if name in _OPTIMIZER_NAMES:
        from forge_core.testing import optimizer

        return getattr(optimizer, name)
    if name in _STRATEGY_NAMES:
        from forge_core.testing import strategy

        return getattr(strategy, name)
    if name in _TRANSFORM_NAMES:
        from forge_core.testing import transform

        return getattr(transform, name)
    if name == "assert_close":
        raise AttributeError(
            "forge_core.testing.assert_close (fixed atol/rtol) was replaced by "
            "assert_within_rounding(got, want, dtype=, terms=, what=), whose tolerance is derived from "
            "the dtype and the size of what is compared, and assert_exactly_zero for what must vanish"
        )
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(
        set(globals())
        | set(_ATTENTION_NAMES)
        | set(_TOLERANCE_NAMES)
        | set(_MODEL_NAMES)
        | set(_ISOLATION_NAMES)
        | set(_OPTIMIZER_NAMES)
        | set(_STRATEGY_NAMES)
        | set(_TRANSFORM_NAMES)
    )
