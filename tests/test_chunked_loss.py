"""The chunked loss (``train.loss.name: chunked``): equal to the full-logits loss in
value and in every gradient (an identity in float64, within the rounding of float32),
never holding the logits of more than one chunk, reached by the trainer, by
``ParallelModel.evaluate`` and refused at check time for a model that does not say
where its output head is. The tensor-parallel (vocabulary-sharded) and pipeline cases
run under torchrun in ``tests/distributed``."""

from __future__ import annotations

import copy

import attrs
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from train_helpers import Recorder, tiny_config, write_config

from forge_core.api import IGNORE_INDEX, INPUT_IDS, LABELS, ForgeError, ModelSpec, hookimpl
from forge_core.distributed.parallelize import single_process
from forge_core.judge import judge
from forge_core.testing import assert_within_rounding, longest_sum
from forge_core.train.chunked_loss import ChunkedLoss, take_over_head
from forge_core.train.loss import build_loss, loss_fn
from forge_plugins.attention.options import SdpaOptions
from forge_plugins.attention.sdpa import SdpaAttention
from forge_plugins.models.llama import Llama, build
from forge_plugins.models.options import LlamaOptions

VOCAB = 97
OPTIONS = LlamaOptions(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=32, init_std=0.2)


def model_pair(options: LlamaOptions = OPTIONS, dtype=torch.float64) -> tuple[Llama, Llama, ChunkedLoss]:
    """The same weights twice: one returning logits, one whose head the chunked loss took over."""
    torch.manual_seed(0)
    full = build(options, vocab_size=VOCAB, attention=SdpaAttention(SdpaOptions())).to(dtype)
    chunked = copy.deepcopy(full)
    if options.tie_embeddings:
        chunked.output.weight = chunked.tok_embeddings.weight
    return full, chunked, ChunkedLoss(take_over_head(chunked, "llama"), chunk_tokens=5)


def batch(rows: int = 3, seq: int = 11) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(7)
    ids = torch.randint(0, VOCAB, (rows, seq + 1), generator=gen)
    labels = ids[:, 1:].clone()
    labels[torch.rand(labels.shape, generator=gen) < 0.25] = IGNORE_INDEX  # uneven over chunks
    return {INPUT_IDS: ids[:, :-1], LABELS: labels}


def loss_and_grads(model: torch.nn.Module, loss, data) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    loss_sum, tokens = loss(model(data[INPUT_IDS]), data[LABELS])
    (loss_sum / tokens).backward()
    return loss_sum.detach(), {name: p.grad for name, p in model.named_parameters()}


@pytest.mark.parametrize("tied", [False, True])
def test_chunked_equals_full_in_float64(tied):
    """Loss and every parameter's gradient (embedding, blocks, head) equal the full
    loss's within float64 rounding; 33 tokens in chunks of 5 leave a short last chunk."""
    full, chunked, chunked_loss = model_pair(attrs.evolve(OPTIONS, tie_embeddings=tied))
    data = batch()
    want, want_grads = loss_and_grads(full, loss_fn, data)
    got, got_grads = loss_and_grads(chunked, chunked_loss, data)
    terms = longest_sum(full, 11)
    assert_within_rounding(got, want, dtype=torch.float64, terms=terms, what="loss sum")
    assert set(got_grads) == set(want_grads)
    for name, grad in want_grads.items():
        assert_within_rounding(got_grads[name], grad, dtype=torch.float64, terms=terms, what=f"grad {name}")
    assert chunked.output.weight.grad.abs().max() > 0


@pytest.mark.parametrize("chunk", [1, 7, 33, 1000])
def test_chunked_equals_full_in_float32_for_any_chunk_size(chunk):
    full, chunked, _ = model_pair(dtype=torch.float32)
    data = batch()
    want, want_grads = loss_and_grads(full, loss_fn, data)
    got, got_grads = loss_and_grads(chunked, ChunkedLoss(chunked.output, chunk), data)
    terms = longest_sum(full, 11)
    assert_within_rounding(got, want, dtype=torch.float32, terms=terms, what="loss sum")
    for name, grad in want_grads.items():
        assert_within_rounding(got_grads[name], grad, dtype=torch.float32, terms=terms, what=f"grad {name}")


def test_a_head_with_a_bias_and_a_loss_without_gradient():
    torch.manual_seed(0)
    head = torch.nn.Linear(6, 40).double()
    hidden = torch.randn(4, 9, 6, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(0, 40, (4, 9))
    labels[1] = IGNORE_INDEX
    want, want_tokens = loss_fn(head(hidden), labels)
    want.backward()
    want_grads = [hidden.grad, head.weight.grad, head.bias.grad]
    hidden.grad, head.weight.grad, head.bias.grad = None, None, None
    got, tokens = ChunkedLoss(head, 4)(hidden, labels)
    (got * 1.0).backward()
    assert int(tokens) == int(want_tokens) == 27
    terms = 40
    assert_within_rounding(got.detach(), want.detach(), dtype=torch.float64, terms=terms, what="loss")
    for grad, expected, what in zip([hidden.grad, head.weight.grad, head.bias.grad], want_grads, "hwb"):
        assert_within_rounding(grad, expected, dtype=torch.float64, terms=terms, what=what)
    with torch.no_grad():  # evaluation: no gradient computed, the same value
        again, _ = ChunkedLoss(head, 4)(hidden, labels)
    assert again.item() == pytest.approx(got.item(), rel=1e-14) and not again.requires_grad


class LargestTensor(TorchDispatchMode):
    """Records the most elements any tensor an operation returns has."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


def test_the_full_logits_are_never_allocated():
    """Forward and backward of the loss step: no tensor larger than one chunk's logits
    (chunk x vocabulary); the full loss allocates all the logits (the negative control).
    Shapes make the logits (rows x seq x vocab) far larger than anything else: weights
    (vocab x dim) and hidden states (rows x seq x dim)."""
    vocab, dim, rows, seq, chunk = 3000, 8, 4, 64, 16
    torch.manual_seed(0)
    head = torch.nn.Linear(dim, vocab, bias=False)
    hidden = torch.randn(rows, seq, dim, requires_grad=True)
    labels = torch.randint(0, vocab, (rows, seq))
    for loss, bound in ((ChunkedLoss(head, chunk), chunk * vocab), (None, None)):
        with LargestTensor() as seen:
            if loss is None:
                loss_sum, _ = loss_fn(head(hidden), labels)
            else:
                loss_sum, _ = loss(hidden, labels)
            loss_sum.backward()
        if bound is None:
            assert seen.largest >= rows * seq * vocab  # the plain loss holds every logit
        else:
            assert seen.largest <= bound < rows * seq * vocab // 8


def test_a_model_without_an_output_head_is_refused_at_build():
    class NoContract(torch.nn.Module):
        pass

    with pytest.raises(ForgeError, match="model 'mine' .* no parallel_contract.*train.loss.name: full"):
        take_over_head(NoContract(), "mine")
    _, chunked, _ = model_pair()
    chunked.parallel_contract = lambda: attrs.evolve(Llama.parallel_contract(chunked), output_head=None)
    with pytest.raises(ForgeError, match="names no output_head"):
        take_over_head(chunked, "llama")


def test_evaluate_uses_the_models_loss_and_refuses_a_loss_over_logits():
    full, chunked, chunked_loss = model_pair()
    data = batch()
    want, want_tokens = single_process(full, loss_fn).evaluate(data)
    pmodel = single_process(chunked, chunked_loss)
    got, tokens = pmodel.evaluate(data)
    assert int(tokens) == int(want_tokens)
    assert_within_rounding(got, want, dtype=torch.float64, terms=longest_sum(full, 11), what="eval loss")
    assert all(p.grad is None for p in chunked.parameters())
    with pytest.raises(ForgeError, match="built for the chunked loss.*loss_fn=None"):
        pmodel.evaluate(data, loss_fn)
    with pytest.raises(ForgeError, match="built for the chunked loss"):
        pmodel.forward_backward(data, loss_fn, 1.0)


def test_the_loss_is_fp32_under_bf16_autocast():
    """Under bf16 autocast the matmuls run in bf16, the loss sums in fp32 (both losses)
    and the two agree within bf16 rounding."""
    full, chunked, chunked_loss = model_pair(dtype=torch.float32)
    data = batch()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = full(data[INPUT_IDS])
        want, _ = loss_fn(logits, data[LABELS])
        got, _ = chunked_loss(chunked(data[INPUT_IDS]), data[LABELS])
    assert logits.dtype == torch.bfloat16
    assert want.dtype == got.dtype == torch.float32
    assert_within_rounding(got, want, dtype=torch.bfloat16, terms=longest_sum(full, 11), what="bf16 loss")


# --- config, rule and trainer ----------------------------------------------------------


class HeadlessModels:
    """A third-party model family whose spec does not declare OUTPUT_HEAD."""

    @hookimpl
    def forge_models(self):
        return [
            ModelSpec(
                name="headless",
                summary="llama without a declared head",
                impl="forge_plugins.models.llama:build",
                options=LlamaOptions,
                supports=set(),
            )
        ]


def test_check_refuses_the_chunked_loss_for_a_model_without_a_declared_head(tmp_path):
    config = tiny_config(tmp_path, model={"name": "headless"}, train={"loss": {"name": "chunked"}})
    result = judge(
        write_config(tmp_path / "c.yaml", config), [], 1, extra_plugins=(("headless", HeadlessModels()),)
    )
    found = [v for v in result.violations if v.rule_id == "train.loss-needs-output-head"]
    assert len(found) == 1 and found[0].severity == "error"
    assert "model 'headless' does not declare output_head" in found[0].message
    assert "train.loss.name: full" in found[0].fix
    config["train"]["loss"] = {"name": "full"}
    result = judge(
        write_config(tmp_path / "d.yaml", config), [], 1, extra_plugins=(("headless", HeadlessModels()),)
    )
    assert not [v for v in result.violations if v.rule_id == "train.loss-needs-output-head"]


def test_the_loss_config_is_checked(tmp_path):
    from forge_core.config.errors import ConfigError

    for loss, path in (
        ({"name": "fused"}, "$.train.loss.name"),
        ({"chunk_tokens": 0}, "$.train.loss.chunk_tokens"),
    ):
        config = tiny_config(tmp_path, train={"loss": loss})
        with pytest.raises(ConfigError) as info:
            judge(write_config(tmp_path / "bad.yaml", config), [], 1)
        assert path in str(info.value)


def test_build_loss_takes_over_the_head_only_when_chunked(tmp_path):
    from forge_core.config.schema import ForgeConfig
    from forge_core.config.structuring import structure

    config, issues = structure({"train": {"loss": {"name": "chunked", "chunk_tokens": 3}}}, ForgeConfig)
    assert not issues
    full, chunked, _ = model_pair()
    assert (
        build_loss(
            full,
            attrs.evolve(
                config, train=attrs.evolve(config.train, loss=attrs.evolve(config.train.loss, name="full"))
            ),
        )
        is loss_fn
    )
    loss = build_loss(chunked, config)
    assert isinstance(loss, ChunkedLoss) and loss.chunk_tokens == 3 and loss.head is chunked.output
    hidden = chunked(batch()[INPUT_IDS])
    assert hidden.shape == (3, 11, OPTIONS.dim)  # the model now returns hidden states
    assert "output.weight" in chunked.state_dict()  # ... and keeps its head's weight


def test_training_with_the_chunked_loss_equals_the_full_loss(tmp_path, monkeypatch):
    """The trainer's per-step losses and gradient norms with the chunked loss equal the
    full loss's (float32, AdamW, 4 steps): rounding only, far below a step's change."""
    from forge_core.testing import train_in_process

    calls = []
    real_call = ChunkedLoss.__call__
    monkeypatch.setattr(ChunkedLoss, "__call__", lambda self, *a: calls.append(1) or real_call(self, *a))
    records = {}
    for name in ("full", "chunked"):
        rec = Recorder()
        config = tiny_config(tmp_path, name, train={"steps": 4, "loss": {"name": name, "chunk_tokens": 24}})
        train_in_process(write_config(tmp_path / f"{name}.yaml", config), [], extra_plugins=(("rec", rec),))
        records[name] = rec.metrics
    for step in range(1, 5):
        full, chunked = records["full"][step], records["chunked"][step]
        assert chunked["loss"] == pytest.approx(full["loss"], rel=1e-5)
        assert chunked["grad_norm"] == pytest.approx(full["grad_norm"], rel=1e-4)
    assert records["full"][4]["loss"] < records["full"][1]["loss"] - 0.05
    assert len(calls) == 4  # the trainer really used it, once per step
