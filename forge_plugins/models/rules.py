"""Compatibility rules of the ``llama`` model: plain check functions over a
:class:`~forge_core.api.Plan` (config only, no torch).

The options they see are resolved (:mod:`forge_plugins.models.options`: unset options
come from the ``init_from_hf`` checkpoint or the defaults). ``llama.init-from-hf``
reads the Hugging Face folder's (or cached Hub snapshot's) ``config.json`` and
safetensors headers with json only, through the same function the build calls
(:func:`forge_plugins.models.hf_config.hf_folder_problems`): a folder that ``check``
accepts is one the build loads."""

from __future__ import annotations

from typing import Any

from forge_plugins.models.options import LlamaOptions, RopeScaling, head_dim, with_defaults

HEADS_DIVISIBLE = "llama.heads-divisible"
HEAD_DIM_EVEN = "llama.head-dim-even"
FAMILY_OPTIONS = "llama.family-options"
SLIDING_WINDOW = "llama.sliding-window"
ROPE_SCALING = "llama.rope-scaling"
INIT_FROM_HF = "llama.init-from-hf"
MOE_OPTIONS = "llama.moe-options"
MOE_SEQUENCE_CP = "llama.moe-sequence-scope-cp"
MOE_BIAS_PIPELINE = "llama.moe-bias-pipeline"


def _llama_options(ctx: Any) -> LlamaOptions | None:
    options = ctx.config.model.options
    # Another model family is configured: its options are not ours to judge.
    return with_defaults(options) if isinstance(options, LlamaOptions) else None


def heads_problem(options: LlamaOptions) -> str | None:
    if options.n_heads % options.n_kv_heads == 0:
        return None
    return (
        f"n_heads={options.n_heads} is not a multiple of n_kv_heads={options.n_kv_heads}: "
        "grouped-query attention shares each key/value head among an equal number of "
        "query heads"
    )


def head_dim_problem(options: LlamaOptions) -> str | None:
    if options.head_dim is None and options.dim % options.n_heads:
        return (
            f"dim={options.dim} is not a multiple of n_heads={options.n_heads}: every head "
            "needs the same width (or set head_dim)"
        )
    width = head_dim(options)
    if width % 2 == 0:
        return None
    if options.head_dim is not None:
        return f"head_dim={width} is odd: rotary embeddings rotate pairs of channels"
    return (
        f"head dim dim/n_heads = {options.dim}/{options.n_heads} = {width} is odd: "
        "rotary embeddings rotate pairs of channels"
    )


def family_problems(options: LlamaOptions) -> list[str]:
    """Options the family's Hugging Face architecture has no place for."""
    family = options.family
    problems = []
    if options.attention_bias and family not in ("llama", "qwen3", "olmo2"):
        problems.append(
            f"attention_bias=true with family {family!r}: only llama, qwen3 and olmo2 have biases on every "
            "attention projection (qwen2 always has q/k/v biases and no o bias)"
        )
    if options.mlp_bias and family != "llama":
        problems.append(f"mlp_bias=true with family {family!r}: only llama has MLP biases")
    if options.sliding_window and family != "mistral":
        problems.append(
            f"sliding_window={options.sliding_window} with family {family!r}: only mistral declares one"
        )
    return problems


def sliding_window_problem(options: LlamaOptions) -> str | None:
    window = options.sliding_window
    if not window or window >= options.max_seq_len:
        return None
    return (
        f"sliding_window={window} is shorter than max_seq_len={options.max_seq_len}: the "
        "checkpoint attends to the last sliding_window tokens only, Forge's attention backends "
        "to the whole causal context, so any sequence longer than the window would be computed "
        "differently"
    )


def rope_problem(options: LlamaOptions) -> str | None:
    scaling = options.rope_scaling or RopeScaling()
    original = scaling.original_max_position_embeddings
    if scaling.type in ("llama3", "yarn", "dynamic") and original < 1:
        return f"rope_scaling.type={scaling.type!r} needs rope_scaling.original_max_position_embeddings"
    if scaling.type == "dynamic" and options.max_seq_len > original:
        return (
            f"rope_scaling.type='dynamic' with max_seq_len={options.max_seq_len} beyond "
            f"original_max_position_embeddings={original}: transformers recomputes dynamic NTK "
            "frequencies from the longest sequence it has seen, which no fixed table reproduces"
        )
    if scaling.type == "llama3" and scaling.low_freq_factor >= scaling.high_freq_factor:
        return "rope_scaling.low_freq_factor must be below high_freq_factor (llama3)"
    return None


def moe_problems(options: LlamaOptions) -> list[str]:
    """Mixture-of-experts options that cannot work, or make no sense together."""
    moe, at = options.moe, "model.options.moe"
    if moe is None:
        return []
    problems = []
    if moe.top_k > moe.num_experts:
        problems.append(
            f"{at}.top_k={moe.top_k} exceeds {at}.num_experts={moe.num_experts}: each token goes to "
            "top_k distinct experts; lower top_k or add experts"
        )
    if moe.layers is not None:
        outside = [i for i in moe.layers if not 0 <= i < options.n_layers]
        if outside:
            problems.append(
                f"{at}.layers={moe.layers} names {outside}, outside the blocks 0..{options.n_layers - 1} "
                f"(n_layers={options.n_layers}); list block indices from 0"
            )
        if len(set(moe.layers)) != len(moe.layers):
            problems.append(f"{at}.layers={moe.layers} names a block twice; list each block once")
        if not moe.layers:
            problems.append(f"{at}.layers=[] makes no block MoE; list the blocks, or set {at}: null (dense)")
    elif moe.every > options.n_layers:
        problems.append(
            f"{at}.every={moe.every} exceeds n_layers={options.n_layers}, so no block is MoE; "
            f"lower every (1: every block), or set {at}: null (dense)"
        )
    if moe.shared_hidden is not None and not moe.shared_experts:
        problems.append(
            f"{at}.shared_hidden={moe.shared_hidden} with shared_experts=0: there are no shared experts "
            "to size; set shared_experts, or drop shared_hidden"
        )
    if moe.aux_loss_scope == "sequence" and moe.aux_loss == 0:
        problems.append(
            f"{at}.aux_loss_scope='sequence' with aux_loss=0: the scope of a loss that is off; set "
            "aux_loss (a coefficient such as 0.001), or drop aux_loss_scope"
        )
    return problems


def option_problems(options: LlamaOptions) -> list[str]:
    """Every shape and family problem of (resolved) ``options``: what the rules above
    report, raised by the build when it is called directly."""
    found = [
        heads_problem(options),
        head_dim_problem(options),
        sliding_window_problem(options),
        rope_problem(options),
    ]
    return [p for p in found if p] + family_problems(options) + moe_problems(options)


def _check(problem: Any) -> Any:
    def check(ctx: Any) -> Any:
        options = _llama_options(ctx)
        return None if options is None else problem(options)

    return check


check_heads_divisible = _check(heads_problem)
check_head_dim_even = _check(head_dim_problem)
check_family_options = _check(family_problems)
check_sliding_window = _check(sliding_window_problem)
check_rope_scaling = _check(rope_problem)
check_moe_options = _check(moe_problems)


def check_moe_bias_pipeline(ctx: Any) -> str | None:
    options = _llama_options(ctx)
    moe = None if options is None else options.moe
    pp = ctx.degrees.get("pp", 1) if ctx.is_active("pp") else 1
    if moe is None or moe.bias_update_rate == 0 or pp < 2:
        return None
    return (
        f"model.options.moe.bias_update_rate={moe.bias_update_rate} with parallel.pp={pp}: torch's "
        "pipeline runs every stage's forward once more to infer shapes (at the first step and after "
        "each evaluation), on placeholder inputs, and those routings count in the loads the bias "
        "update follows; measured on 2 stages: the gradient norm of step 2 0.2% off one process"
    )


def check_moe_sequence_cp(ctx: Any) -> str | None:
    options = _llama_options(ctx)
    moe = None if options is None else options.moe
    if moe is None or moe.aux_loss == 0 or moe.aux_loss_scope != "sequence":
        return None
    cp = ctx.degrees.get("cp", 1) if ctx.is_active("cp") else 1
    if cp < 2:
        return None
    return (
        f"model.options.moe.aux_loss_scope='sequence' with parallel.cp={cp}: each context-parallel "
        "rank holds a share of every row, so the per-document balancing statistics would be taken "
        "over shares of documents, not the documents"
    )


def check_init_from_hf(ctx: Any) -> list[str]:
    options = _llama_options(ctx)
    if options is None or not options.init_from_hf:
        return []
    # Only meaningful once the shapes themselves are consistent.
    if heads_problem(options) or head_dim_problem(options):
        return []
    from forge_plugins.models.hf_config import init_problems

    return init_problems(options)


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
            paths=("model.options.dim", "model.options.n_heads", "model.options.head_dim"),
            summary="Heads must have one even width (rotary): dim / n_heads, or head_dim",
            check=check_head_dim_even,
            fix="pick dim and n_heads so that dim / n_heads is an even integer "
            "(e.g. dim=256, n_heads=8 gives 32), or set an even head_dim",
        ),
        Rule(
            id=FAMILY_OPTIONS,
            severity="error",
            paths=(
                "model.options.family",
                "model.options.attention_bias",
                "model.options.mlp_bias",
                "model.options.sliding_window",
            ),
            summary="Biases and sliding windows only where the family's architecture has them",
            check=check_family_options,
            fix="drop the option, or choose the family whose architecture has it (export-hf writes "
            "that architecture)",
        ),
        Rule(
            id=SLIDING_WINDOW,
            severity="error",
            paths=("model.options.sliding_window", "model.options.max_seq_len"),
            summary="A sliding window shorter than max_seq_len is refused (no backend masks it)",
            check=check_sliding_window,
            fix="set model.options.max_seq_len (and data.seq_len) to at most the sliding window: "
            "within it, full causal attention is exactly the windowed one",
        ),
        Rule(
            id=ROPE_SCALING,
            severity="error",
            paths=("model.options.rope_scaling", "model.options.max_seq_len"),
            summary="Rotary scaling Forge reproduces exactly",
            check=check_rope_scaling,
            fix="for dynamic scaling keep max_seq_len within the original context; give llama3/yarn "
            "their original_max_position_embeddings",
        ),
        Rule(
            id=MOE_OPTIONS,
            severity="error",
            paths=(
                "model.options.moe.top_k",
                "model.options.moe.num_experts",
                "model.options.moe.layers",
                "model.options.moe.every",
                "model.options.moe.shared_hidden",
                "model.options.moe.aux_loss_scope",
            ),
            summary="Mixture-of-experts options that fit the model and each other",
            check=check_moe_options,
            fix="change the option the message names as it says",
        ),
        Rule(
            id=MOE_SEQUENCE_CP,
            severity="error",
            paths=("model.options.moe.aux_loss_scope", "parallel.cp"),
            summary="Per-document balancing statistics need whole documents on each process",
            check=check_moe_sequence_cp,
            fix="use model.options.moe.aux_loss_scope: batch (summed over every process, exact under "
            "cp), or parallel.cp: 1",
        ),
        Rule(
            id=MOE_BIAS_PIPELINE,
            severity="warning",
            paths=("model.options.moe.bias_update_rate", "parallel.pp"),
            summary="Under pipeline parallelism the bias update also follows torch's shape-inference passes",
            check=check_moe_bias_pipeline,
            fix="accept the small drift, or balance by model.options.moe.aux_loss instead (exact under pp "
            "with aux_loss_scope: sequence)",
        ),
        Rule(
            id=INIT_FROM_HF,
            severity="error",
            paths=("model.options.init_from_hf",),
            summary=(
                "The init_from_hf folder holds a supported config and safetensors weights that fit "
                "the options"
            ),
            check=check_init_from_hf,
            fix="remove the model options the message names (they are read from the checkpoint), correct "
            "the config.json field or folder file it names, or point init_from_hf at a Llama, Qwen2, "
            "Qwen3, Mistral, OLMo 2, Qwen3-MoE or Mixtral folder written by save_pretrained",
        ),
    ]
