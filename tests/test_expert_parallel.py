"""Expert parallelism's pieces that need no process group: the declared mesh dimension
and how it combines with data parallelism, the check-time rules (judged from the model's
facts, without torch), and the strategy's refusals. Its numerics over real ep groups are
proved under torchrun in tests/distributed/test_expert_parallel.py."""

from __future__ import annotations

import pytest
import torch
import yaml

from forge_core.api import ForgeError, ModelFacts, ModelSpec, hookimpl
from forge_core.judge import judge
from forge_core.testing import check_rule
from forge_plugins.expert_parallel import rules as R
from forge_plugins.expert_parallel.slicing import expert_block
from forge_plugins.expert_parallel.strategy import routed_experts

DENSE = {"name": "llama", "options": {"dim": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2}}
MOE = {"name": "tiny_moe"}


class TinyMoE:
    """A third-party model whose facts declare 6 routed experts per MoE layer (the rules
    read only the facts; nothing is built)."""

    @staticmethod
    @hookimpl
    def forge_models():
        return [
            ModelSpec(
                name="tiny_moe",
                summary="a model with six routed experts per MoE layer",
                impl="forge_plugins.models.llama:build",
                facts=lambda options: ModelFacts(blocks=2, heads=4, kv_heads=2, experts=6),
            )
        ]


PLUGINS = [("tiny_moe", TinyMoE)]


def config(model: dict, **parallel) -> dict:
    return {"model": model, "parallel": parallel}


def test_ep_needs_a_model_with_routed_experts():
    messages = check_rule(
        R.EP_NEEDS_EXPERTS,
        violating=[config(DENSE, ep=2)],
        passing=[config(MOE, ep=2), config(DENSE, ep=1)],
        extra_plugins=PLUGINS,
        world_size=2,
    )
    assert "model 'llama' has no routed experts under its options (ModelFacts.experts = 0)" in messages[0]


def test_the_experts_must_divide_by_ep():
    messages = check_rule(
        R.EP_EXPERTS_DIVISIBLE,
        violating=[config(MOE, ep=4)],
        passing=[config(MOE, ep=2), config(MOE, ep=3)],
        extra_plugins=PLUGINS,
        world_size=12,
    )
    assert messages == [
        "model 'tiny_moe' has 6 routed experts per MoE layer, not divisible by parallel.ep = 4: every "
        "ep rank holds the same number of whole experts"
    ]


def test_ep_times_the_other_degrees_must_equal_the_world_size():
    check_rule(
        "parallel.world-size",
        violating=[config(MOE, ep=2, tp=2)],
        passing=[config(MOE, ep=2), config(MOE, ep=2, dp_shard=1)],
        extra_plugins=PLUGINS,
        world_size=2,
    )


def test_ep_ranks_read_their_own_batches_and_switch_fsdp_on(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config(MOE, ep=2)))
    plan = judge(str(path), [], world_size=4, extra_plugins=tuple(PLUGINS)).plan
    assert list(plan.degrees) == ["pp", "dp_replicate", "dp_shard", "ep", "cp", "tp"]
    assert plan.degrees["dp_shard"] == 2  # -1 takes what ep leaves of 4 processes
    assert plan.data_parallel_size == 4  # dp_shard x ep different batches
    assert [s.name for s in plan.strategies] == ["ep", "fsdp"]  # fsdp shards over dp_shard x ep


def test_an_uneven_expert_split_is_refused_when_it_is_built():
    assert expert_block(8, 3, 4) == (6, 2)
    with pytest.raises(ForgeError, match=r"^6 routed experts do not divide by parallel.ep = 4"):
        expert_block(6, 0, 4)


def test_a_model_without_routed_experts_is_refused_naming_the_contract_field():
    class Dense(torch.nn.Module):
        def parallel_contract(self):
            from forge_core.api import ParallelContract

            return ParallelContract(blocks="layers")

    with pytest.raises(
        ForgeError, match=r"model part Dense declares no routed experts \(ParallelContract.experts\)"
    ):
        routed_experts(Dense())
