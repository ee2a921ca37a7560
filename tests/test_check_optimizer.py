"""The kit's optimizer check (forge_core.testing.check_optimizer): a stock torch
Adafactor, which fails under FSDP and tensor parallelism, fails it with the in-place
operation named; AdamW and SGD pass; and each of its other findings (plain state beside
a DTensor parameter, a result that differs from plain tensors) has a control that
trips it."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.tensor import DTensor

from forge_core.testing import check_optimizer


def adafactor(named_params, lr, options):
    return torch.optim.Adafactor([p.param for p in named_params], lr=lr)


def test_stock_adafactor_fails_with_the_in_place_operation_named_and_the_fix():
    with pytest.raises(AssertionError) as caught:
        check_optimizer(adafactor)
    message = str(caught.value)
    assert message.startswith(
        "optimizer adafactor: step() fails on DTensor parameters laid out as fsdp: Shard(0)"
    )
    assert "the in-place operation aten.pow_ writes into a sharded tensor" in message
    assert "in-place operations that require placement changes are not supported" in message
    assert "Compute that value out of place" in message


@pytest.mark.parametrize("implementation", ["foreach", "loop"])
def test_the_built_in_adamw_passes_on_every_layout_and_lands_where_plain_tensors_do(implementation):
    report = check_optimizer("adamw", {"implementation": implementation, "weight_decay": 0.1}, steps=3)
    assert report.layouts == (
        "fsdp: Shard(0)",
        "tp row-wise: Shard(1), vectors replicated",
        "fsdp x tp: (Shard(0), Shard(1))",
    )
    assert report.steps == 3 and report.worst < 1


class _PlainMomentum(torch.optim.Optimizer):
    """Momentum kept in a plain tensor of the parameter's shape: works on one process,
    would meet a shard's gradient on several."""

    def __init__(self, params, lr):
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                grad = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
                state = self.state[p]
                if not state:
                    state["momentum"] = torch.zeros(tuple(p.shape), dtype=p.dtype)
                state["momentum"].mul_(0.9).add_(grad)
                p.sub_(p.grad * group["lr"])


class _TwiceOnShards(torch.optim.SGD):
    """Steps twice as far on DTensor parameters: passes no comparison."""

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                p.sub_(p.grad * group["lr"] * (2 if isinstance(p, DTensor) else 1))


@pytest.mark.parametrize(
    ("cls", "complaint"),
    [
        (
            _PlainMomentum,
            "optimizer <lambda>: state 'momentum' of parameter 'embed.weight' (laid out as fsdp: "
            "Shard(0)) is a plain tensor of the whole parameter's shape (12, 8)",
        ),
        (
            _TwiceOnShards,
            "optimizer <lambda>: parameter 'embed.weight' after 3 steps laid out as fsdp: Shard(0), "
            "against the same steps on plain tensors: max |difference|",
        ),
    ],
)
def test_plain_state_and_a_different_result_are_caught(cls, complaint):
    with pytest.raises(AssertionError) as caught:
        check_optimizer(lambda named_params, lr, options: cls([p.param for p in named_params], lr=lr))
    assert str(caught.value).startswith(complaint), caught.value
