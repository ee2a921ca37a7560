"""The mixture-of-experts feed-forward (forge_plugins/models/moe.py) and the ``llama``
model's MoE blocks: kernels, routing, capacity, balancing losses and their gradients.
Identities in float64; the grouped GEMM kernel (which has no float64 kernel) in float32
within its size-derived rounding."""

from __future__ import annotations

import attrs
import pytest
import torch

from forge_core.testing import assert_within_rounding
from forge_plugins.attention.options import SdpaOptions
from forge_plugins.attention.sdpa import SdpaAttention
from forge_plugins.models.feed_forward import FeedForward
from forge_plugins.models.llama import build
from forge_plugins.models.moe import MoE, RoutedExperts
from forge_plugins.models.options import LlamaOptions, MoEOptions, is_moe_layer

DIM = 16
MOE = MoEOptions(num_experts=4, top_k=2, expert_hidden=8)
TINY = LlamaOptions(dim=DIM, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=32, init_std=0.2, moe=MOE)
VOCAB = 40


def tiny_model(options: LlamaOptions = TINY, seed: int = 0):
    torch.manual_seed(seed)
    return build(options, vocab_size=VOCAB, attention=SdpaAttention(SdpaOptions()))


def experts_with(kernel: str, dtype: torch.dtype, seed: int = 0) -> RoutedExperts:
    torch.manual_seed(seed)
    experts = RoutedExperts(DIM, attrs.evolve(MOE, kernel=kernel))
    for w in (experts.w1, experts.w2, experts.w3):
        torch.nn.init.normal_(w, std=0.5)
    return experts.to(dtype)


def grads_of(experts: RoutedExperts, x: torch.Tensor, counts: torch.Tensor, upstream: torch.Tensor):
    x = x.detach().clone().requires_grad_(True)
    out = experts.compute(x, counts)
    out.backward(upstream)
    return [out, x.grad, experts.w1.grad, experts.w2.grad, experts.w3.grad]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_grouped_kernel_equals_the_per_expert_loop_forward_and_every_gradient(dtype):
    # Uneven groups, one of them empty: the grouped offsets must skip it.
    counts = torch.tensor([5, 0, 3, 9])
    x = torch.randn(int(counts.sum()), DIM, dtype=dtype)
    upstream = torch.randn(int(counts.sum()), DIM, dtype=dtype)
    loop = grads_of(experts_with("loop", dtype), x, counts, upstream)
    grouped = grads_of(experts_with("grouped", dtype), x, counts, upstream)
    for name, got, want in zip(("output", "x.grad", "w1.grad", "w2.grad", "w3.grad"), grouped, loop):
        assert_within_rounding(got, want, dtype=dtype, terms=DIM, what=f"grouped {name}")
    # The empty expert gets an exact zero gradient from both.
    assert torch.equal(grouped[2][1], torch.zeros_like(grouped[2][1]))


def test_float32_grouped_kernel_is_torch_grouped_mm(monkeypatch):
    calls = []
    real = torch._grouped_mm

    def counting(*args, **kwargs):
        calls.append(args[1].shape)
        return real(*args, **kwargs)

    monkeypatch.setattr(torch, "_grouped_mm", counting)
    experts = experts_with("grouped", torch.float32)
    experts.compute(torch.randn(6, DIM), torch.tensor([1, 2, 0, 3]))
    assert len(calls) == 3  # w1, w3, w2


def test_one_expert_top_1_softmax_moe_equals_the_dense_feed_forward():
    options = MoEOptions(num_experts=1, top_k=1, expert_hidden=12)
    torch.manual_seed(0)
    dense = FeedForward(DIM, 12).double()
    moe = MoE(DIM, options).double()
    with torch.no_grad():
        moe.experts.w1.copy_(dense.w1.weight.T.unsqueeze(0))
        moe.experts.w3.copy_(dense.w3.weight.T.unsqueeze(0))
        moe.experts.w2.copy_(dense.w2.weight.T.unsqueeze(0))
    x = torch.randn(3, 7, DIM, dtype=torch.float64)
    assert_within_rounding(moe(x), dense(x), dtype=torch.float64, terms=DIM, what="moe vs dense")


def test_moe_blocks_follow_every_or_the_explicit_layer_list():
    def moe_layers(**changes):
        options = attrs.evolve(TINY, n_layers=4, moe=attrs.evolve(MOE, **changes))
        return [i for i in range(4) if is_moe_layer(options, i)]

    assert moe_layers() == [0, 1, 2, 3]
    assert moe_layers(every=2) == [1, 3]
    assert moe_layers(every=2, layers=[0]) == [0]
    model = tiny_model(attrs.evolve(TINY, moe=attrs.evolve(MOE, layers=[1])))
    assert isinstance(model.layers["0"].feed_forward, FeedForward)
    assert isinstance(model.layers["1"].feed_forward, MoE)
    assert model.parallel_contract().experts == "feed_forward.experts"
    assert tiny_model(attrs.evolve(TINY, moe=None)).parallel_contract().experts is None


def test_moe_model_trains_a_step_and_every_parameter_gets_a_gradient():
    model = tiny_model()
    tokens = torch.randint(0, VOCAB, (2, 12))
    model(tokens).logsumexp(-1).mean().backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert missing == []
    names = set(model.state_dict())
    assert {"layers.0.feed_forward.router.expert_bias", "layers.0.feed_forward.experts.w1"} <= names
