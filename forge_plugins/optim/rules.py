"""Rules of the built-in optimizers: combinations of options that torch refuses when the
optimizer is built, said before anything is."""

from __future__ import annotations

from typing import Any

from forge_plugins.optim.options import SGDOptions

SGD_NESTEROV = "sgd.nesterov-momentum"
MUON_SHARDED = "muon.whole-matrices"


def check_sgd_nesterov(ctx: Any) -> str | None:
    options = ctx.config.train.optimizer_options
    if isinstance(options, SGDOptions) and options.nesterov and options.momentum <= 0:
        return (
            f"nesterov is true with momentum {options.momentum}: Nesterov momentum needs a momentum above 0"
        )
    return None


def sharded_by(ctx: Any) -> list[str]:
    """What would hold the blocks' matrices as DTensors split or wrapped across processes."""
    d = ctx.degrees
    found = []
    if d["tp"] > 1:
        found.append(f"parallel.tp = {d['tp']} splits them by rows or columns")
    if ctx.is_active("fsdp"):
        found.append(f"fsdp (parallel.dp_shard = {d['dp_shard']}) shards them by rows")
    elif d["pp"] > 1 and d["dp_replicate"] > 1:
        found.append(
            f"replicas under pipeline parallelism (parallel.dp_replicate = {d['dp_replicate']}) "
            "hold them as FSDP DTensors"
        )
    return found


def check_muon_sharded(ctx: Any) -> str | None:
    if ctx.config.train.optimizer != "muon":
        return None
    found = sharded_by(ctx)
    if not found:
        return None
    return (
        "train.optimizer = 'muon' orthogonalises the update of each weight matrix of the blocks as a "
        f"whole (Newton-Schulz iterations over the full matrix), but {'; '.join(found)}. "
        "torch.optim.Muon is written for whole tensors and Forge does not gather the matrices for "
        "the update, so what it would apply is not Muon's update"
    )


def rules() -> list[Any]:
    from forge_core.api import Rule

    return [
        Rule(
            id=SGD_NESTEROV,
            severity="error",
            paths=("train.optimizer_options.nesterov", "train.optimizer_options.momentum"),
            summary="SGD's Nesterov momentum needs a momentum above 0.",
            check=check_sgd_nesterov,
            fix="Set train.optimizer_options.momentum above 0, or nesterov: false.",
        ),
        Rule(
            id=MUON_SHARDED,
            severity="error",
            paths=(
                "train.optimizer",
                "parallel.tp",
                "parallel.dp_shard",
                "parallel.dp_replicate",
                "parallel.pp",
            ),
            summary="Muon needs every weight matrix whole on the process that steps it.",
            check=check_muon_sharded,
            fix="Use train.optimizer: adamw under tensor or fully sharded data parallelism, or keep the "
            "matrices whole: parallel.tp: 1 and replicas with ddp (parallel.dp_replicate, dp_shard: 1) "
            "without pipeline parallelism, or pipeline parallelism alone.",
        ),
    ]
