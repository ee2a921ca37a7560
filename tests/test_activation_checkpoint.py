"""The built-in ``act_ckpt`` wrapper in one process: training with it is training without
it (losses and gradients of every step, float64), it recomputes exactly the blocks its
options choose, it keeps far fewer tensors for the backward pass, and it leaves every
parameter name as it was. Under tp, fsdp and pp the distributed harness compares it with
one process (tests/distributed/test_parallel_equivalence.py)."""

from __future__ import annotations

import pytest
import torch

from forge_core import components
from forge_core.api import blocks_of
from forge_core.config.blocks import resolve_components
from forge_core.config.schema import ForgeConfig
from forge_core.config.structuring import structure
from forge_core.distributed.parallelize import parallelize
from forge_core.plan import make_plan
from forge_core.train.loss import loss_fn

TINY = {"dim": 32, "n_layers": 4, "n_heads": 4, "n_kv_heads": 2, "ffn_hidden": 48, "max_seq_len": 16}
VOCAB, ROWS, SEQ, STEPS = 64, 4, 16, 3


def plan_of(registries, parallel):
    raw = {
        "model": {"name": "llama", "options": TINY},
        "attention": {"backend": "sdpa"},
        "parallel": parallel,
    }
    config, issues = structure(raw, ForgeConfig)
    assert not issues, issues
    config, issues = resolve_components(config, registries)
    assert not issues, issues
    return make_plan(config, registries, 1)


def build(registries, parallel, dtype=torch.float64):
    plan = plan_of(registries, parallel)
    torch.manual_seed(0)
    model = components.model(plan, registries, VOCAB, components.attention(plan, registries)).to(dtype)
    return parallelize(model, plan, torch.device("cpu"), loss_fn)


def batches():
    gen = torch.Generator().manual_seed(7)
    ids = torch.randint(0, VOCAB, (STEPS, ROWS, SEQ + 1), generator=gen)
    return [{"input_ids": step[:, :-1], "labels": step[:, 1:]} for step in ids]


def train(pmodel):
    """Per-step losses and per-step gradients (name -> tensor) of a few SGD steps."""
    optimizer = torch.optim.SGD(list(pmodel.parameters()), lr=0.5)
    losses, grads = [], []
    for batch in batches():
        loss, _ = pmodel.forward_backward(batch, loss_fn, float(batch["labels"].numel()))
        losses.append(float(loss))
        grads.append({n: p.grad.clone() for n, p in pmodel.parts[0].named_parameters()})
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return losses, grads


@pytest.mark.parametrize("every", [1, 2])
def test_training_with_checkpointing_equals_training_without(forge_registries, every):
    """float64, so that the identity is proven bit for bit: the recomputed forward is the
    same arithmetic, and the backward consumes the same tensors in the same order."""
    plain_losses, plain_grads = train(build(forge_registries, {}))
    ckpt = build(forge_registries, {"wrappers": ["act_ckpt"], "options": {"act_ckpt": {"every": every}}})
    losses, grads = train(ckpt)
    assert len(set(plain_losses)) == STEPS  # it trains: the comparison below could fail
    assert losses == plain_losses
    for step, plain in zip(grads, plain_grads):
        assert step.keys() == plain.keys()
        for name in plain:
            assert torch.equal(step[name], plain[name]), name


def _forward_counts(pmodel):
    """Calls of each block's submodules per training step: 2 where the block's forward is
    recomputed in the backward pass, 1 where it is not. (The block's own ``__call__``
    runs once either way; the recomputation calls the original forward.)"""
    counts = [0] * len(blocks_of(pmodel.parts[0]))
    for i, block in enumerate(blocks_of(pmodel.parts[0])):
        first_child = next(iter(block.children()))

        def count(*_, i=i):
            counts[i] += 1

        first_child.register_forward_hook(count)
    batch = batches()[0]
    pmodel.forward_backward(batch, loss_fn, 1.0)
    return counts


@pytest.mark.parametrize(
    ("every", "expected"), [(1, [2, 2, 2, 2]), (2, [1, 2, 1, 2]), (3, [1, 1, 2, 1]), (5, [1, 1, 1, 1])]
)
def test_every_k_recomputes_the_k_th_blocks(forge_registries, every, expected):
    pmodel = build(forge_registries, {"wrappers": ["act_ckpt"], "options": {"act_ckpt": {"every": every}}})
    assert _forward_counts(pmodel) == expected


def test_without_the_wrapper_nothing_is_recomputed(forge_registries):
    assert _forward_counts(build(forge_registries, {})) == [1, 1, 1, 1]


def _saved_bytes(pmodel):
    """Bytes of the tensors autograd keeps from one forward pass for the backward."""
    total = 0

    def pack(tensor):
        nonlocal total
        total += tensor.numel() * tensor.element_size()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logits = pmodel.forward(input_ids=batches()[0]["input_ids"])
    logits.sum().backward()
    return total


def test_checkpointing_keeps_far_fewer_tensors_for_the_backward(forge_registries):
    """What the memory saving comes from, counted rather than timed: with every block
    checkpointed the forward keeps only each block's inputs (and the embedding and head),
    not every intermediate of attention and the feed-forward. (The recomputation's own
    tensors are saved during backward, one block at a time; only the forward's count.)"""
    plain = _saved_bytes(build(forge_registries, {}, torch.float32))
    full = _saved_bytes(build(forge_registries, {"wrappers": ["act_ckpt"]}, torch.float32))
    half = _saved_bytes(
        build(
            forge_registries, {"wrappers": ["act_ckpt"], "options": {"act_ckpt": {"every": 2}}}, torch.float32
        )
    )
    assert full < half < plain
    assert full < 0.35 * plain, (full, plain)


def test_parameter_names_and_modules_are_unchanged(forge_registries):
    plain = build(forge_registries, {}).parts[0]
    ckpt = build(forge_registries, {"wrappers": ["act_ckpt"]}).parts[0]
    assert list(ckpt.state_dict()) == list(plain.state_dict())
    assert [type(m) for m in ckpt.modules()] == [type(m) for m in plain.modules()]


def test_check_refuses_it_for_a_model_without_blocks(forge_registries):
    """A model whose spec does not declare BLOCKS: the kernel rule names the wrapper."""
    import attrs

    from forge_core import rules as engine

    plan = plan_of(forge_registries, {"wrappers": ["act_ckpt"]})
    plan = attrs.evolve(
        plan, specs={**plan.specs, "model": attrs.evolve(plan.specs["model"], supports=frozenset())}
    )
    messages = [
        v.message
        for v in engine.evaluate(forge_registries.rules, plan)
        if v.rule_id == "parallel.model-supports-strategy"
    ]
    assert len(messages) == 1 and "'act_ckpt' needs the model to supply blocks" in messages[0]
    assert "remove 'act_ckpt' from parallel.wrappers" in messages[0]
