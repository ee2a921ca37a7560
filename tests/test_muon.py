"""The built-in ``muon`` optimizer: Muon on exactly the 2-D weights inside the model's
blocks (by the declared rule: role, dimensionality, ``in_block`` from the parallel
contract), AdamW on the rest; it is torch's Muon + AdamW built by hand on the same
groups, it trains, its state survives a checkpoint round trip, and the rule refuses the
layouts whose matrices are sharded."""

from __future__ import annotations

import copy

import pytest
import torch
from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

from forge_core import components
from forge_core.api import ParallelContract
from forge_core.components.named_params import named_parameters
from forge_core.config.blocks import resolve_components
from forge_core.config.schema import ForgeConfig
from forge_core.config.structuring import structure
from forge_core.judge import judge, judge_config
from forge_core.train.checkpoint import _optim_options
from forge_core.train.loss import loss_fn
from forge_plugins.optim.groups import decay_groups
from forge_plugins.optim.muon import MuonWithAdamW, split
from forge_plugins.optim.options import MuonOptions
from forge_plugins.optim.rules import MUON_SHARDED

LLAMA = {"dim": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "max_seq_len": 16, "multiple_of": 16}
MATRICES = (
    "attention.wq",
    "attention.wk",
    "attention.wv",
    "attention.wo",
    "feed_forward.w1",
    "feed_forward.w2",
    "feed_forward.w3",
)


def plan_of(registries, tie=False, options=None):
    raw = {
        "model": {"name": "llama", "options": {**LLAMA, "tie_embeddings": tie}},
        "train": {"optimizer": "muon", "optimizer_options": options or {}, "lr": 1e-2},
    }
    cfg, issues = structure(raw, ForgeConfig)
    assert not issues
    cfg, issues = resolve_components(cfg, registries)
    assert not issues, issues
    return judge_config(cfg, registries, 1).plan


def llama(registries, plan):
    torch.manual_seed(0)
    return components.model(plan, registries, 64, components.attention(plan, registries))


@pytest.mark.parametrize("tie", [False, True])
def test_muon_takes_exactly_the_matrices_inside_the_blocks(forge_registries, tie):
    """For llama: the seven projection matrices of every block go to Muon; the token
    embedding, the output head (2-D, but outside the blocks), the final norm and the
    blocks' norms go to AdamW."""
    model = llama(forge_registries, plan_of(forge_registries, tie))
    muon, adamw = split(named_parameters(model))
    blocks = [f"layers.{i}.{m}.weight" for i in range(LLAMA["n_layers"]) for m in MATRICES]
    norms = [
        f"layers.{i}.{n}.weight" for i in range(LLAMA["n_layers"]) for n in ("attention_norm", "ffn_norm")
    ]
    assert sorted(p.name for p in muon) == sorted(blocks)
    outside = ["tok_embeddings.weight", "norm.weight"] + ([] if tie else ["output.weight"])
    assert sorted(p.name for p in adamw) == sorted(outside + norms)


def test_the_split_follows_the_contract_not_the_names():
    """A model whose blocks live under another attribute: what its contract names is
    inside; a 2-D weight outside the blocks goes to AdamW; without a contract, nothing
    is inside a block."""

    class Net(torch.nn.Module):
        def __init__(self, contract):
            super().__init__()
            self.contract = contract
            self.trunk = torch.nn.ModuleDict(
                {"a": torch.nn.Linear(4, 4), "b": torch.nn.Linear(4, 4, bias=False)}
            )
            self.readout = torch.nn.Linear(4, 2, bias=False)

        def parallel_contract(self):
            return ParallelContract(blocks="trunk") if self.contract else None

    muon, adamw = split(named_parameters(Net(contract=True)))
    assert [p.name for p in muon] == ["trunk.a.weight", "trunk.b.weight"]
    assert [p.name for p in adamw] == ["trunk.a.bias", "readout.weight"]
    muon, _ = split(named_parameters(Net(contract=False)))
    assert muon == []


def test_a_model_without_matrices_in_blocks_is_refused_at_build(forge_registries):
    from forge_core.api import ForgeError
    from forge_plugins.optim.muon import build_muon

    with pytest.raises(ForgeError, match="found no 2-D weight inside the model's blocks"):
        build_muon(named_parameters(torch.nn.Linear(3, 3)), 1e-2, MuonOptions())


def _batch(seed):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 64, (4, 17), generator=gen)
    return ids[:, :-1], ids[:, 1:]


def _step(model, optimizer, seed):
    ids, labels = _batch(seed)
    loss_sum, tokens = loss_fn(model(ids), labels)
    (loss_sum / tokens).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(loss_sum.detach() / tokens)


def test_equals_torch_muon_and_adamw_built_by_hand(forge_registries):
    """Two steps (so Muon's momentum and AdamW's moments are used), from the same weights
    and batches: every parameter ends bit for bit where torch's own Muon on the block
    matrices and AdamW on the rest (the declared decay groups) put it."""
    plan = plan_of(forge_registries)
    ours = llama(forge_registries, plan)
    theirs = llama(forge_registries, plan)
    optimizer = components.optimizer(plan, forge_registries, ours)
    assert isinstance(optimizer, MuonWithAdamW)
    o = MuonOptions()
    muon_params, rest = split(named_parameters(theirs))
    by_hand = [
        torch.optim.Muon(
            [p.param for p in muon_params],
            lr=1e-2,
            weight_decay=o.weight_decay,
            momentum=o.momentum,
            nesterov=o.nesterov,
            ns_coefficients=o.ns_coefficients,
            eps=o.eps,
            ns_steps=o.ns_steps,
            adjust_lr_fn="match_rms_adamw",
        ),
        torch.optim.AdamW(
            decay_groups(rest, o.adamw_weight_decay, o.decay_embeddings),
            lr=1e-2,
            betas=(o.adamw_beta1, o.adamw_beta2),
            eps=o.adamw_eps,
            foreach=True,
        ),
    ]
    start = {n: p.detach().clone() for n, p in ours.named_parameters()}
    for seed in (1, 2):
        _step(ours, optimizer, seed)
        ids, labels = _batch(seed)
        loss_sum, tokens = loss_fn(theirs(ids), labels)
        (loss_sum / tokens).backward()
        for opt in by_hand:
            opt.step()
            opt.zero_grad(set_to_none=True)
    theirs_now = dict(theirs.named_parameters())
    for name, param in ours.named_parameters():
        assert not torch.equal(param, start[name]), name  # every parameter moved
        assert torch.equal(param, theirs_now[name]), name


def test_every_group_follows_the_schedule_and_the_state_survives_a_checkpoint(forge_registries):
    """The trainer sets ``lr`` on every group: Muon's and AdamW's. Through DCP's optimizer
    state dict (what checkpoints save), a fresh optimizer continues exactly."""
    plan = plan_of(forge_registries)
    model = llama(forge_registries, plan)
    optimizer = components.optimizer(plan, forge_registries, model)
    _step(model, optimizer, 1)
    for group in optimizer.param_groups:
        group["lr"] = 5e-3
    assert all(g["lr"] == 5e-3 for opt in optimizer.parts for g in opt.param_groups)
    # A copy, as a checkpoint on disk is: the state dict holds the optimizer's own tensors.
    saved = copy.deepcopy(get_optimizer_state_dict(model, optimizer, options=_optim_options()))
    weights = {n: p.detach().clone() for n, p in model.named_parameters()}

    again = llama(forge_registries, plan)
    with torch.no_grad():
        for name, param in again.named_parameters():
            param.copy_(weights[name])
    restored = components.optimizer(plan, forge_registries, again)
    set_optimizer_state_dict(again, restored, saved, options=_optim_options())
    assert any("momentum_buffer" in s for s in restored.parts[0].state.values())
    assert restored.parts[0].state is restored.state is restored.parts[1].state
    _step(model, optimizer, 2)
    _step(again, restored, 2)
    for (name, a), b in zip(model.named_parameters(), again.parameters()):
        assert torch.equal(a, b), name


def test_a_few_steps_reduce_the_loss(tmp_path):
    from train_helpers import read_metrics, tiny_config, write_config

    from forge_core import cli

    config = tiny_config(
        tmp_path,
        train={"steps": 8, "optimizer": "muon", "lr": 1e-2, "warmup_steps": 0},
        logging={"loggers": ["jsonl"], "every": 1},
    )
    assert cli.main([write_config(tmp_path / "muon.yaml", config)]) == 0
    losses = [m["loss"] for m in read_metrics(tmp_path / "run") if "loss" in m]
    assert len(losses) == 8 and losses[-1] < 0.8 * losses[0], losses


@pytest.mark.parametrize(
    ("parallel", "refused"),
    [
        ({"tp": 2}, "parallel.tp = 2 splits them"),
        ({"dp_shard": 2}, "fsdp (parallel.dp_shard = 2) shards them"),
        ({"pp": 2, "dp_replicate": 2}, "replicas under pipeline parallelism"),
        ({"dp_replicate": 2}, None),  # ddp: every replica holds whole matrices
        ({"pp": 2}, None),
        ({}, None),
    ],
)
def test_the_rule_refuses_layouts_with_sharded_matrices(forge_config, parallel, refused):
    data = {
        "model": {"name": "llama", "options": {**LLAMA, "n_layers": 4}},
        "data": {"packer": "none"},
        "parallel": {"dp_shard": 1, **parallel},
        "train": {"optimizer": "muon", "batch_size": 8},
    }
    result = judge(forge_config(data), [], None)
    found = [v.message for v in result.violations if v.rule_id == MUON_SHARDED]
    if refused is None:
        assert found == []
    else:
        assert len(found) == 1 and refused in found[0] and "whole" in found[0]
    data["train"]["optimizer"] = "adamw"
    assert not [v for v in judge(forge_config(data), [], None).violations if v.rule_id == MUON_SHARDED]
