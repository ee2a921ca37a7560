"""Compatibility rules of the ``llama`` model: plain check functions over a
:class:`~forge_core.api.Plan` (config only, no torch).

``llama.init-from-hf`` reads the Hugging Face folder's ``config.json`` and safetensors
headers with json only, through the same function the build calls
(:func:`forge_plugins.models.hf_interop.hf_folder_problems`): a folder that ``check``
accepts is one the build loads."""

from __future__ import annotations

from typing import Any

from forge_plugins.models.options import LlamaOptions

HEADS_DIVISIBLE = "llama.heads-divisible"
HEAD_DIM_EVEN = "llama.head-dim-even"
INIT_FROM_HF = "llama.init-from-hf"


def _llama_options(ctx: Any) -> LlamaOptions | None:
    options = ctx.config.model.options
    # Another model family is configured: its options are not ours to judge.
    return options if isinstance(options, LlamaOptions) else None


def heads_problem(options: LlamaOptions) -> str | None:
    if options.n_heads % options.n_kv_heads == 0:
        return None
    return (
        f"n_heads={options.n_heads} is not a multiple of n_kv_heads={options.n_kv_heads}: "
        "grouped-query attention shares each key/value head among an equal number of "
        "query heads"
    )


def head_dim_problem(options: LlamaOptions) -> str | None:
    if options.dim % options.n_heads:
        return (
            f"dim={options.dim} is not a multiple of n_heads={options.n_heads}: every head "
            "needs the same width"
        )
    head_dim = options.dim // options.n_heads
    if head_dim % 2:
        return (
            f"head dim dim/n_heads = {options.dim}/{options.n_heads} = {head_dim} is odd: "
            "rotary embeddings rotate pairs of channels"
        )
    return None


def check_heads_divisible(ctx: Any) -> str | None:
    options = _llama_options(ctx)
    return None if options is None else heads_problem(options)


def check_head_dim_even(ctx: Any) -> str | None:
    options = _llama_options(ctx)
    return None if options is None else head_dim_problem(options)


def check_init_from_hf(ctx: Any) -> list[str]:
    options = _llama_options(ctx)
    if options is None or not options.init_from_hf:
        return []
    # Only meaningful once the shapes themselves are consistent.
    if heads_problem(options) or head_dim_problem(options):
        return []
    from forge_plugins.models.hf_interop import hf_folder_problems

    return hf_folder_problems(options, options.init_from_hf)


def rules() -> list[Any]:
    from forge_core.api import Rule

    return [
        Rule(
            id=HEADS_DIVISIBLE,
            severity="error",
            paths=("model.options.n_heads", "model.options.n_kv_heads"),
            summary="n_heads must be a multiple of n_kv_heads",
            check=check_heads_divisible,
            fix="choose n_kv_heads among the divisors of n_heads (n_kv_heads=n_heads is "
            "plain multi-head attention)",
        ),
        Rule(
            id=HEAD_DIM_EVEN,
            severity="error",
            paths=("model.options.dim", "model.options.n_heads"),
            summary="dim must split into n_heads heads of even width (rotary)",
            check=check_head_dim_even,
            fix="pick dim and n_heads so that dim / n_heads is an even integer "
            "(e.g. dim=256, n_heads=8 gives 32)",
        ),
        Rule(
            id=INIT_FROM_HF,
            severity="error",
            paths=("model.options.init_from_hf",),
            summary="The init_from_hf folder holds a Llama config and safetensors weights that fit the options",
            check=check_init_from_hf,
            fix="set the model options the message names to the checkpoint's values, or point "
            "init_from_hf at a Hugging Face Llama folder written by save_pretrained",
        ),
    ]
