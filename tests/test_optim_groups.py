"""Optimizer parameter groups: the declared role rule (module type and shape, never a
model's layer names), the weight-decay split it gives every built-in optimizer, and the
optimizer contract (named parameters; the old signature still served, with a warning)."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from forge_core import components
from forge_core.api import NamedParameter, OptimizerSpec
from forge_core.components.named_params import named_parameters
from forge_core.config.blocks import resolve_components
from forge_core.config.schema import ForgeConfig
from forge_core.config.structuring import structure
from forge_core.judge import judge_config
from forge_core.registry import load_registries

LLAMA = {"dim": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "max_seq_len": 16, "multiple_of": 16}


def config(registries, optimizer="adamw", options=None, tie=False):
    """The judged plan of a small llama config (what the component builders take)."""
    raw = {
        "model": {"name": "llama", "options": {**LLAMA, "tie_embeddings": tie}},
        "train": {"optimizer": optimizer, "optimizer_options": options or {}, "lr": 1e-2},
    }
    cfg, issues = structure(raw, ForgeConfig)
    assert not issues
    cfg, issues = resolve_components(cfg, registries)
    assert not issues, issues
    return judge_config(cfg, registries, 1).plan


def llama(registries, cfg):
    torch.manual_seed(0)
    return components.model(cfg, registries, 64, components.attention(cfg, registries))


def test_llama_roles_follow_the_rule(forge_registries):
    """Every llama parameter, by name: the embedding is an embedding, the hand-written
    RMSNorm scales are vectors (1-D), every linear weight a matrix; nothing else."""
    named = named_parameters(llama(forge_registries, config(forge_registries)))
    roles = {p.name: p.role for p in named}
    assert [p.name for p in named] == [
        n for n, _ in llama(forge_registries, config(forge_registries)).named_parameters()
    ]
    expected = {"tok_embeddings.weight": "embedding", "norm.weight": "vector", "output.weight": "matrix"}
    for i in range(LLAMA["n_layers"]):
        expected[f"layers.{i}.attention_norm.weight"] = "vector"
        expected[f"layers.{i}.ffn_norm.weight"] = "vector"
        for w in (
            "attention.wq",
            "attention.wk",
            "attention.wv",
            "attention.wo",
            "feed_forward.w1",
            "feed_forward.w2",
            "feed_forward.w3",
        ):
            expected[f"layers.{i}.{w}.weight"] = "matrix"
    assert roles == expected


def test_tied_output_is_the_embedding_and_appears_once(forge_registries):
    named = named_parameters(llama(forge_registries, config(forge_registries, tie=True)))
    assert "output.weight" not in {p.name for p in named}
    assert {p.name: p.role for p in named}["tok_embeddings.weight"] == "embedding"


class Odd(nn.Module):
    """Torch's own norm modules, a biased linear, a 1-D gate, a conv kernel."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.proj = nn.Linear(4, 4)
        self.ln = nn.LayerNorm(4)
        self.rms = nn.RMSNorm(4)
        self.bn = nn.BatchNorm1d(4)
        self.gate = nn.Parameter(torch.zeros(4))
        self.conv = nn.Conv1d(4, 4, 3, bias=False)
        self.frozen = nn.Parameter(torch.zeros(4, 4), requires_grad=False)


def test_rule_by_module_type_and_shape():
    roles = {p.name: p.role for p in named_parameters(Odd())}
    assert roles == {
        "gate": "vector",
        "emb.weight": "embedding",
        "proj.weight": "matrix",
        "proj.bias": "bias",
        "ln.weight": "norm",
        "ln.bias": "bias",
        "rms.weight": "norm",
        "bn.weight": "norm",
        "bn.bias": "bias",
        "conv.weight": "matrix",
    }  # the frozen parameter is not trained, so not given to the optimizer


def test_a_model_overrides_roles_through_param_roles():
    class Declared(Odd):
        def param_roles(self):
            return {"gate": "matrix", "conv.weight": "vector"}

    roles = {p.name: p.role for p in named_parameters(Declared())}
    assert roles["gate"] == "matrix" and roles["conv.weight"] == "vector" and roles["proj.bias"] == "bias"

    class Wrong(Odd):
        def param_roles(self):
            return {"gate": "scale"}

    with pytest.raises(Exception, match="unknown roles.*'gate': 'scale'.*embedding, bias, norm"):
        named_parameters(Wrong())


@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
@pytest.mark.parametrize("decay_embeddings", [True, False])
def test_every_builtin_optimizer_splits_decay_by_the_rule(forge_registries, optimizer, decay_embeddings):
    cfg = config(forge_registries, optimizer, {"weight_decay": 0.05, "decay_embeddings": decay_embeddings})
    model = llama(forge_registries, cfg)
    opt = components.optimizer(cfg, forge_registries, model)
    names = {id(p): n for n, p in model.named_parameters()}
    by_rate = {g["weight_decay"]: {names[id(p)] for p in g["params"]} for g in opt.param_groups}
    matrices = {
        n
        for n, _ in model.named_parameters()
        if n.endswith(
            (
                "wq.weight",
                "wk.weight",
                "wv.weight",
                "wo.weight",
                "w1.weight",
                "w2.weight",
                "w3.weight",
                "output.weight",
            )
        )
    }
    norms = {n for n, _ in model.named_parameters() if "norm" in n}
    decayed = matrices | ({"tok_embeddings.weight"} if decay_embeddings else set())
    assert by_rate == {0.05: decayed, 0.0: norms | ({"tok_embeddings.weight"} - decayed)}


def test_adamw_with_the_split_equals_a_hand_built_torch_adamw(forge_registries):
    """Three steps of the built-in AdamW and of torch.optim.AdamW given the two groups
    by hand: bit-identical weights (same groups, same order, same hyperparameters)."""
    cfg = config(
        forge_registries, "adamw", {"weight_decay": 0.3, "decay_embeddings": False, "implementation": "loop"}
    )
    ours, theirs = llama(forge_registries, cfg), llama(forge_registries, cfg)
    built = components.optimizer(cfg, forge_registries, ours)
    params = dict(theirs.named_parameters())
    no_decay = [params[n] for n in params if "norm" in n or n == "tok_embeddings.weight"]
    decay = [p for n, p in params.items() if not ("norm" in n or n == "tok_embeddings.weight")]
    by_hand = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.3}, {"params": no_decay, "weight_decay": 0.0}],
        lr=1e-2,
        betas=(0.9, 0.95),
        eps=1e-8,
        foreach=False,
    )
    # Negative control: decay on everything (no split) must end somewhere else.
    unsplit = llama(forge_registries, cfg)
    everything = torch.optim.AdamW(
        unsplit.parameters(), lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.3, foreach=False
    )
    ids = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))
    for model, opt in ((ours, built), (theirs, by_hand), (unsplit, everything)):
        for _ in range(3):
            model(ids).logsumexp(-1).mean().backward()
            opt.step()
            opt.zero_grad()
    for (name, a), b in zip(ours.named_parameters(), theirs.parameters(), strict=True):
        assert torch.equal(a, b), name
    assert not torch.equal(ours.norm.weight, unsplit.norm.weight)
    assert not torch.equal(ours.tok_embeddings.weight, unsplit.tok_embeddings.weight)


def old_style(param_groups, lr, options):
    return torch.optim.SGD(param_groups, lr=lr)


def new_style(named_params, lr, options):
    assert all(isinstance(p, NamedParameter) for p in named_params)
    return torch.optim.SGD([p.param for p in named_params], lr=lr)


def keyword_style(**kwargs):
    return new_style(**kwargs)


class Third:
    from forge_core.api import hookimpl

    @hookimpl
    def forge_optimizers(self):
        return [
            OptimizerSpec(name="old", summary="old contract", impl="test_optim_groups:old_style"),
            OptimizerSpec(name="new", summary="new contract", impl="test_optim_groups:new_style"),
            OptimizerSpec(name="kw", summary="keywords only", impl="test_optim_groups:keyword_style"),
        ]


def test_an_optimizer_factory_of_the_old_signature_is_refused_naming_the_call():
    from forge_core.api import ForgeError

    registries = load_registries(extra=(("third", Third()),))
    model = llama(registries, config(registries))
    with pytest.raises(
        ForgeError,
        match=r"optimizer 'old' \(plugin 'third'\).*build\(named_params=\.\.\., lr=\.\.\., "
        r"options=\.\.\.\).*NamedParameter.*Rename its first parameter",
    ):
        components.optimizer(config(registries, "old"), registries, model)
    for name in ("new", "kw"):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            opt = components.optimizer(config(registries, name), registries, model)
        assert sum(len(g["params"]) for g in opt.param_groups) == len(list(model.parameters()))
