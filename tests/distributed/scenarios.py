"""Run under ``torchrun``: train a tiny llama (or a variant of it, :data:`VARIANTS`) for
a few steps under several parallel layouts in ONE launch (each scenario builds its own
mesh on the same process group), and record per-step losses and gradient norms next to
a single-process reference run of the same model on the same global batches. A
scenario whose model must be refused at build records the error instead. ``test_*.py`` in this folder launch it and assert.

Usage: ``torchrun --standalone --nproc-per-node N scenarios.py OUT.json NAME [NAME ...]``

Every scenario trains the model the way the trainer does (:mod:`forge_core.train`):
the loss is the token-summed cross-entropy that ``train.loss`` names (``build_loss``:
the full logits, or the chunked loss for the ``*_chunked`` layouts, compared with the
full-logits single-process run), each data-parallel rank reads its
own slice of the global batch (``pmodel.dp_rank``), back-propagates through
``pmodel.forward_backward`` (the gradient convention of
:mod:`forge_core.train.parallelize`), clips with ``clip_grad_norm`` and steps plain SGD
(so a wrong gradient scale or a wrong norm changes the next losses, which Adam would
hide). The clipping threshold is below the gradient norm, so every step clips. After
training, the loss of the first batch is evaluated (``pmodel.evaluate``, forward only)
where the layout offers it.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import torch
import torch.distributed as dist

import variants
from forge_core import judge
from forge_core.api import IGNORE_INDEX, INPUT_IDS, LABELS, ForgeError, Plan
from forge_core.config.loader import resolve_components, structure
from forge_core.config.schema import ForgeConfig
from forge_core.registry import load_registries
from forge_core.train import components
from forge_core.train.loss import build_loss, loss_fn
from forge_core.train.parallelize import clip_grad_norm, parallelize, single_process

VOCAB = 64
SEQ = 16
ROWS = 8  # global batch rows per optimizer step
STEPS = 3
LR = 0.5
MAX_NORM = 0.05
MODEL = {"dim": 32, "n_layers": 4, "n_heads": 4, "n_kv_heads": 2, "ffn_hidden": 64, "max_seq_len": SEQ}

#: Models a scenario may train: name -> (model.name, options over MODEL). Each gets its
#: own single-process reference run.
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("llama", {}),
    "tied": ("llama", {"tie_embeddings": True}),
    "qknorm": ("qknorm", {}),  # per-head q/k norms declared partial (variants.py)
    "qknorm_undeclared": ("qknorm_undeclared", {}),  # ... left out of the plan: refused
}

SP = {"options": {"tp": {"sequence_parallel": True}}}
#: train overrides: the chunked loss, in chunks that do not divide a microbatch's tokens.
CHUNKED = {"loss": {"name": "chunked", "chunk_tokens": 24}}


def pp_options(**options: Any) -> dict[str, Any]:
    return {"options": {"pp": options}}


#: name -> (parallel overrides, train overrides[, model variant])
SCENARIOS: dict[str, tuple[Any, ...]] = {
    "ddp": ({"dp_replicate": 2}, {}),
    "fsdp": ({"dp_shard": 2}, {}),
    "fsdp_accum": ({"dp_shard": 2}, {"grad_accum": 2}),
    "tp": ({"tp": 2}, {}),
    "tp_sp": ({"tp": 2, **SP}, {}),
    "pp_gpipe": ({"pp": 2, **pp_options(schedule="gpipe", microbatches=4)}, {}),
    "pp_1f1b": ({"pp": 2, **pp_options(schedule="1f1b", microbatches=2)}, {"grad_accum": 2}),
    "pp_interleaved": ({"pp": 2, **pp_options(schedule="interleaved_1f1b", virtual_stages=2, microbatches=4)}, {}),
    "tp_tied": ({"tp": 2}, {}, "tied"),
    "tp_qknorm": ({"tp": 2}, {}, "qknorm"),
    "tp_sp_qknorm": ({"tp": 2, **SP}, {}, "qknorm"),
    "tp_uncovered": ({"tp": 2}, {}, "qknorm_undeclared"),
    "ddp_chunked": ({"dp_replicate": 2}, CHUNKED),
    "fsdp_chunked": ({"dp_shard": 2}, {**CHUNKED, "grad_accum": 2}),
    "tp_chunked": ({"tp": 2}, CHUNKED),  # vocabulary-sharded: loss parallelism
    "tp_sp_chunked": ({"tp": 2, **SP}, CHUNKED),
    "tp_tied_chunked": ({"tp": 2}, CHUNKED, "tied"),
    "pp_chunked": ({"pp": 2, **pp_options(schedule="gpipe", microbatches=4)}, CHUNKED),  # the last stage's loss
    # four processes
    "fsdp_tp": ({"dp_shard": 2, "tp": 2}, {}),
    "hsdp": ({"dp_replicate": 2, "dp_shard": 2}, {}),
    "pp_tp": ({"pp": 2, "tp": 2, **pp_options(schedule="1f1b")}, {}),
    "pp_fsdp": ({"pp": 2, "dp_shard": 2, **pp_options(schedule="1f1b")}, {}),
    "pp_ddp": ({"pp": 2, "dp_replicate": 2, **pp_options(schedule="gpipe")}, {}),
    "fsdp_tp_tied": ({"dp_shard": 2, "tp": 2}, {}, "tied"),
    "fsdp_tp_qknorm": ({"dp_shard": 2, "tp": 2}, {}, "qknorm"),
    "fsdp_tp_chunked": ({"dp_shard": 2, "tp": 2}, CHUNKED),
    "pp_tp_chunked": ({"pp": 2, "tp": 2, **pp_options(schedule="1f1b")}, CHUNKED),
}


def make_plan(registries: Any, parallel: dict[str, Any], train: dict[str, Any], variant: str = "llama",
              world_size: int = 1) -> Plan:
    """The judged plan of a scenario's config, as ``forge-run train`` hands it to the
    trainer (the rules are not evaluated: these layouts are valid by construction)."""
    model, options = VARIANTS[variant]
    raw = {
        "model": {"name": model, "options": {**MODEL, **options}},
        "attention": {"backend": "sdpa"},
        "data": {"packer": "none", "seq_len": SEQ},
        "parallel": parallel,
        "train": {"batch_size": ROWS, "grad_clip": MAX_NORM, **train},
    }
    config, issues = structure(raw, ForgeConfig)
    assert not issues, issues
    config, issues = resolve_components(config, registries)
    assert not issues, issues
    return judge.make_plan(config, registries, world_size)


def batches() -> list[dict[str, torch.Tensor]]:
    """The global batch of every step; about a fifth of the labels are -100, unevenly
    spread over rows, so ranks hold different token counts."""
    gen = torch.Generator().manual_seed(1234)
    out = []
    for _ in range(STEPS):
        ids = torch.randint(0, VOCAB, (ROWS, SEQ + 1), generator=gen)
        labels = ids[:, 1:].clone()
        labels[torch.rand(labels.shape, generator=gen) < 0.2] = IGNORE_INDEX
        out.append({INPUT_IDS: ids[:, :-1].contiguous(), LABELS: labels})
    return out


def build_model(plan: Plan, registries: Any) -> torch.nn.Module:
    torch.manual_seed(0)
    return components.model(plan, registries, VOCAB, components.attention(plan, registries))


def train(pmodel: Any, plan: Plan, data: list[dict[str, torch.Tensor]]) -> dict[str, list[float]]:
    """The trainer's step, in miniature. Returns per-step losses and gradient norms."""
    accum = plan.config.train.grad_accum
    rows = ROWS // pmodel.dp_size // accum
    optimizer = torch.optim.SGD(list(pmodel.parameters()), lr=LR)
    losses, norms, times = [], [], []
    for batch in data:
        start = time.perf_counter()
        global_tokens = float((batch[LABELS] != IGNORE_INDEX).sum())
        loss_sum = torch.zeros((), dtype=torch.float64)
        local = {k: v.chunk(pmodel.dp_size)[pmodel.dp_rank] for k, v in batch.items()}
        for micro in range(accum):
            part = {k: v[micro * rows:(micro + 1) * rows] for k, v in local.items()}
            loss, _ = pmodel.forward_backward(part, None, global_tokens)  # the model's own loss
            loss_sum += loss.double()
        if pmodel.dp_group is not None:
            dist.all_reduce(loss_sum, group=pmodel.dp_group)
        pmodel.finish_gradients()
        norm = clip_grad_norm(pmodel, MAX_NORM)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
        losses.append(float(loss_sum) / global_tokens)
        norms.append(float(norm))
    return {"loss": losses, "norm": norms, "time": times, "eval": evaluate(pmodel, data[0])}


def evaluate(pmodel: Any, batch: dict[str, torch.Tensor]) -> float | None:
    """The mean loss of ``batch`` by ``pmodel.evaluate`` (forward only, the model's own
    loss), or ``None`` for a layout without a forward-only step."""
    if pmodel.train_step is not None and pmodel.eval_step is None:
        return None
    local = {k: v.chunk(pmodel.dp_size)[pmodel.dp_rank] for k, v in batch.items()}
    loss_sum, _ = pmodel.evaluate(local)
    total = loss_sum.detach().double().reshape(1)
    if pmodel.dp_group is not None:
        dist.all_reduce(total, group=pmodel.dp_group)
    return float(total) / float((batch[LABELS] != IGNORE_INDEX).sum())


def qk_norms(pmodel: Any) -> list[float]:
    """Every q/k norm weight this process holds (whole: they are not sharded)."""
    return [float(v) for part in pmodel.parts for name, p in sorted(part.named_parameters())
            if name.endswith(("q_norm.weight", "k_norm.weight"))
            for v in (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().reshape(-1)]


def vocab_shard(pmodel: Any) -> list[int] | None:
    """``[first row, rows]`` of the output head's vocabulary this rank computes logits
    for under the chunked loss (``None`` for the full loss)."""
    from forge_core.train.chunked_loss import _vocab_shard

    head = getattr(pmodel.loss_fn, "head", None)
    if head is None:
        return None
    _, offset, weight, _ = _vocab_shard(head.weight, None)
    return [offset, weight.shape[0]]


def probe_logits(pmodel: Any, data: list[dict[str, torch.Tensor]]) -> list:
    with torch.no_grad():
        return pmodel.forward(data[0][INPUT_IDS][:2]).tolist()


def main() -> None:
    out_path, names = sys.argv[1], sys.argv[2:]
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo")
    registries = load_registries(extra=(("variants", variants),))
    data = batches()
    results: dict[str, Any] = {"world": world}
    for name in names:
        parallel, train_over, variant = (*SCENARIOS[name], "llama")[:3]
        reference = "reference" if variant == "llama" else f"reference:{variant}"
        if reference not in results and variant != "qknorm_undeclared":
            ref_plan = make_plan(registries, {}, {}, variant)
            ref_model = single_process(build_model(ref_plan, registries), loss_fn)
            start = qk_norms(ref_model)
            results[reference] = {**train(ref_model, ref_plan, data), "qk_start": start, "qk_norms": qk_norms(ref_model)}
        plan = make_plan(registries, parallel, train_over, variant, world)
        try:
            model = build_model(plan, registries)
            pmodel = parallelize(model, plan, torch.device("cpu"), build_loss(model, plan.config))
        except ForgeError as exc:  # a scenario whose model must be refused at build
            results[name] = {"error": str(exc)}
            continue
        got = train(pmodel, plan, data)
        every = [None] * world
        dist.all_gather_object(every, {"loss": got["loss"], "norm": got["norm"], "qk_norms": qk_norms(pmodel),
                                       "vocab_shard": vocab_shard(pmodel)})
        results[name] = {**got, "reference": reference, "ranks": every}
        if name == "fsdp" and os.environ.get("FORGE_TEST_CKPT"):
            results[name]["probe_ids"] = data[0][INPUT_IDS][:2].tolist()
            results[name]["probe"] = probe_logits(pmodel, data)
            save_checkpoint(pmodel, os.environ["FORGE_TEST_CKPT"])
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(results, f)
    dist.barrier()
    dist.destroy_process_group()


def save_checkpoint(pmodel: Any, run_dir: str) -> None:
    """Save with the trainer's checkpoint manager (DCP, each rank writes its shards)."""
    from forge_core.train.checkpoint import CheckpointManager

    # FSDP keeps the root's parameters gathered after a forward until the next backward
    # (the probe was forward only); the trainer builds its optimizers before any
    # forward, these are built now, so shard first: they must hold the sharded ones.
    for part in pmodel.parts:
        if hasattr(part, "reshard"):
            part.reshard()
    optimizers = [torch.optim.SGD(part.parameters(), lr=LR) for part in pmodel.parts]
    CheckpointManager(run_dir, keep=1, rank=dist.get_rank(), world_size=dist.get_world_size()).save(
        STEPS, pmodel.parts, optimizers, {"step": STEPS}
    )


if __name__ == "__main__":
    main()
