"""Rules of context parallelism (``parallel.cp``): what its sharding and its two
attention modes need, judged before any process starts."""

from __future__ import annotations

from typing import Any

from forge_core.api import DEGREES, POSITIONS, QUERY_SHARDS, Rule

CP_SEQ_LEN = "cp.seq-len-divisible"
CP_ATTENTION_BACKEND = "cp.backend-gathers-queries"
CP_ULYSSES_HEADS = "cp.ulysses-heads-divisible"
CP_POSITIONS = "cp.model-takes-positions"


def _cp(ctx: Any) -> int:
    return ctx.degrees.get("cp", 1) if ctx.is_active("cp") else 1


def check_seq_len(ctx: Any) -> str | None:
    cp, seq_len = _cp(ctx), ctx.config.data.seq_len
    if cp > 1 and seq_len % (2 * cp):
        return (
            f"data.seq_len = {seq_len} does not split into 2 x cp = {2 * cp} equal chunks: every cp "
            "rank holds seq_len / cp tokens, taken as two chunks (head and tail) of one causal row"
        )
    return None


def check_backend(ctx: Any) -> str | None:
    if _cp(ctx) < 2 or ctx.options_of("cp").attention != "allgather":
        return None
    backend = ctx.specs["attention"]
    if QUERY_SHARDS in backend.supports:
        return None
    return (
        f"attention backend {backend.name!r} does not declare {QUERY_SHARDS!r}: under "
        "parallel.options.cp.attention: allgather each rank attends its share of a row's queries "
        "over the whole row's keys, which the backend must build a mask for (prepare_queries)"
    )


def check_ulysses_heads(ctx: Any) -> str | None:
    cp = _cp(ctx)
    if cp < 2 or ctx.options_of("cp").attention != "ulysses" or ctx.facts is None:
        return None
    split = cp * ctx.degrees.get("tp", 1)
    facts = ctx.facts
    if facts.heads % split or facts.kv_heads % split:
        return (
            f"Ulysses gives each of cp x tp = {split} ranks a share of the heads, but the model has "
            f"{facts.heads} query heads and {facts.kv_heads} key/value heads"
        )
    return None


def check_positions(ctx: Any) -> str | None:
    if _cp(ctx) < 2:
        return None
    model = ctx.specs["model"]
    if POSITIONS in model.accepts:
        return None
    return (
        f"model {model.name!r} does not take {POSITIONS!r}: a cp rank's tokens are not the start of "
        "their rows, so their rotary positions must be passed to the model"
    )


def rules() -> list[Rule]:
    return [
        Rule(
            id=CP_SEQ_LEN,
            severity="error",
            paths=("data.seq_len", DEGREES),
            summary="Context parallelism splits every row into 2 x cp equal chunks.",
            check=check_seq_len,
            fix="Make data.seq_len a multiple of 2 x parallel.cp, or change parallel.cp.",
        ),
        Rule(
            id=CP_ATTENTION_BACKEND,
            severity="error",
            paths=("attention.backend", "parallel.options.cp.attention", DEGREES),
            summary=(
                "Context parallelism's allgather attention needs a backend that builds the mask of a "
                "share of the queries over the whole row (QUERY_SHARDS)."
            ),
            check=check_backend,
            fix=(
                "Choose attention.backend: sdpa, flex or eager, or set parallel.options.cp.attention: "
                "ulysses (any backend that honours doc_ids). Backend authors: implement "
                "prepare_queries and declare QUERY_SHARDS in AttentionBackendSpec.supports."
            ),
        ),
        Rule(
            id=CP_ULYSSES_HEADS,
            severity="error",
            paths=("model.name", "parallel.options.cp.attention", DEGREES),
            summary="Ulysses attention splits query and key/value heads over cp x tp ranks.",
            check=check_ulysses_heads,
            fix="Set parallel.options.cp.attention: allgather, or choose cp and tp so that cp x tp "
            "divides both head counts.",
        ),
        Rule(
            id=CP_POSITIONS,
            severity="error",
            paths=("model.name", DEGREES),
            summary="Context parallelism passes every token's position to the model.",
            check=check_positions,
            fix="Choose a model that accepts positions (ModelSpec.accepts), or set parallel.cp: 1.",
        ),
    ]
