"""FLOP counting for MFU, the measured peak and its cache, and the loss normalisation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from forge_core.api import IGNORE_INDEX
from forge_core.train import flops
from forge_core.train.loss import loss_fn


def brute_force_pairs(doc_ids: np.ndarray) -> int:
    """Count (query, key) pairs with key <= query in the same document, one by one."""
    total = 0
    for row in doc_ids:
        for i in range(len(row)):
            for j in range(i + 1):
                total += row[i] == row[j]
    return total


def test_attended_pairs_example():
    doc_ids = torch.tensor([[0, 0, 0, 1, 1], [0, 1, 1, 1, 1]])
    # Row 1: documents of 3 and 2 tokens -> 6 + 3; row 2: 1 and 4 -> 1 + 10.
    assert flops.attended_pairs(doc_ids, 2, 5) == 20
    assert flops.attended_pairs(None, 2, 5) == 2 * 15


@pytest.mark.parametrize("seed", range(5))
def test_attended_pairs_matches_brute_force(seed):
    rng = np.random.default_rng(seed)
    rows, seq = 3, 24
    starts = rng.random((rows, seq)) < 0.2
    starts[:, 0] = False
    doc_ids = np.cumsum(starts, axis=1)
    if seed == 0:
        doc_ids[1] = 0  # a row that is one document: the full causal triangle
    assert flops.attended_pairs(torch.from_numpy(doc_ids), rows, seq) == brute_force_pairs(doc_ids)


def test_document_masking_costs_less_than_the_causal_square():
    doc_ids = torch.arange(64).div(8, rounding_mode="floor").unsqueeze(0)  # 8 docs of 8
    assert flops.attended_pairs(doc_ids, 1, 64) == 8 * 36 < flops.attended_pairs(None, 1, 64) == 2080


def test_matmul_params_excludes_embeddings_but_counts_a_tied_head():
    emb, head = torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10, bias=False)
    model = torch.nn.Sequential(emb, torch.nn.Linear(4, 4), head)
    assert flops.matmul_params(model) == 20 + 40
    head.weight = emb.weight  # tied: the output matmul uses the embedding matrix
    assert flops.matmul_params(model) == 20 + 40


def test_active_params_count_the_share_of_routed_experts_a_token_uses():
    from toy_router import ToyModel, ToyOptions

    model = ToyModel(ToyOptions(dim=8, experts=4, top_k=2, n_layers=2), vocab_size=32)
    gate, experts, head = 4 * 8, 4 * 8 * 8, 32 * 8
    # Every token passes the gates and the head; it visits 2 of each layer's 4 experts.
    assert flops.matmul_params(model) == 2 * (gate + experts) + head
    assert flops.active_matmul_params(model) == 2 * (gate + experts * 2 // 4) + head
    # Nested declarations multiply; a model that declares none is counted whole.
    model.layers["0"].active_fraction = lambda: 0.5
    assert flops.active_matmul_params(model) == (gate + experts // 2) // 2 + gate + experts // 2 + head
    dense = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 4))
    assert flops.active_matmul_params(dense) == flops.matmul_params(dense) == 20


def test_mfu_counts_the_active_parameters():
    from forge_core.train.mfu import MfuMeter

    meter = MfuMeter(n_matmul=400, attn_width=0, peak=1.0, peak_source="x", world_size=1, n_active=100)
    assert meter.step_flops(input_tokens=10, pairs=0) == 6 * 100 * 10
    assert MfuMeter(400, 0, 1.0, "x", 1).step_flops(10, 0) == 6 * 400 * 10  # dense: all of them


def llama(vocab=50, tie=False, attention=None, moe=None):
    from forge_plugins.attention.options import SdpaOptions
    from forge_plugins.attention.sdpa import SdpaAttention
    from forge_plugins.models.llama import build
    from forge_plugins.models.options import LlamaOptions

    options = LlamaOptions(
        dim=32, n_layers=3, n_heads=4, n_kv_heads=2, max_seq_len=16, tie_embeddings=tie, moe=moe
    )
    return build(options, vocab_size=vocab, attention=attention or SdpaAttention(SdpaOptions()))


def test_matmul_params_of_llama():
    model = llama()
    total = sum(p.numel() for p in model.parameters())
    assert flops.matmul_params(model) == total - 50 * 32


def test_active_params_of_an_moe_llama_count_top_k_of_the_routed_experts():
    from forge_plugins.models.options import MoEOptions

    moe = MoEOptions(num_experts=4, top_k=1, expert_hidden=8, shared_experts=1, every=2)
    model = llama(moe=moe)
    total = sum(p.numel() for p in model.parameters())
    routed = 3 * 4 * 32 * 8  # w1, w3, w2 of 4 experts in block 1, the one MoE block of three
    assert flops.matmul_params(model) == total - 50 * 32
    # Routed experts count 1 of their 4; the router and the shared expert count fully.
    assert flops.active_matmul_params(model) == total - 50 * 32 - routed * 3 // 4


def test_attention_probe_measures_heads_times_head_dim_per_layer():
    from forge_plugins.attention.options import SdpaOptions
    from forge_plugins.attention.sdpa import SdpaAttention

    probe = flops.AttentionProbe(SdpaAttention(SdpaOptions()))
    model = llama(attention=probe)
    # 3 layers x 4 query heads x head dim 8; grouped-query k/v heads do not change it.
    assert flops.measure_attention_width(model, probe, torch.device("cpu")) == 3 * 32
    assert not probe.recording
    assert probe.options is probe.inner.options  # other attributes pass through


def test_attention_width_is_measured_on_a_meta_copy_and_the_model_keeps_its_backend(tmp_path):
    """The MFU meter measures d_attn on a meta-device copy of the model: the model that
    trains holds the configured backend itself, never the probe."""
    from forge_core.judge import judge
    from forge_core.train.mfu import attention_width

    path = tmp_path / "c.yaml"
    path.write_text(
        "model: {name: llama, options: {dim: 32, n_layers: 3, n_heads: 4, n_kv_heads: 2, "
        "max_seq_len: 16}}\nattention: {backend: sdpa}\n"
    )
    result = judge(str(path))
    warnings = []
    assert attention_width(result.plan, result.registries, 50, warnings.append) == 3 * 32
    assert warnings == []

    from forge_core import components

    model = components.model(
        result.plan, result.registries, 50, components.attention(result.plan, result.registries)
    )
    held = {type(v).__name__ for m in model.modules() for v in vars(m).values()}
    assert "SdpaAttention" in held and "AttentionProbe" not in held


def test_step_flops_formula():
    # 6 N per token; 12 d_attn per attended pair.
    assert flops.step_flops(1000, 64, 10, 55) == 6 * 1000 * 10 + 12 * 64 * 55


def test_loss_sum_ignores_minus_100_and_counts_labelled_tokens():
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 5)
    labels = torch.tensor([[1, IGNORE_INDEX, 2], [IGNORE_INDEX, IGNORE_INDEX, 4]])
    loss_sum, count = loss_fn(logits, labels)
    assert int(count) == 3
    mean = torch.nn.functional.cross_entropy(
        logits.reshape(-1, 5), labels.reshape(-1), ignore_index=IGNORE_INDEX
    )
    torch.testing.assert_close(loss_sum / 3, mean)
    assert loss_fn(logits.bfloat16(), labels)[0].dtype == torch.float32


def test_a_model_that_cannot_be_built_on_the_meta_device_leaves_attention_out_of_mfu(tmp_path, monkeypatch):
    """The FLOPs measurement never stops a run: a model factory that fails on the meta
    device gives d_attn 0 and one warning naming the model and the error."""
    from forge_core import components
    from forge_core.judge import judge
    from forge_core.train import mfu

    path = tmp_path / "c.yaml"
    path.write_text("model: {name: llama, options: {dim: 32, n_layers: 1, n_heads: 4, max_seq_len: 16}}\n")
    result = judge(str(path))

    def refuses(*args, **kwargs):
        raise RuntimeError("no meta here")

    monkeypatch.setattr(components, "model", refuses)
    warnings = []
    assert mfu.attention_width(result.plan, result.registries, 50, warnings.append) == 0
    assert warnings == [
        "MFU leaves attention out: model 'llama' could not be built and run on the meta device to "
        "measure it (RuntimeError: no meta here)"
    ]


def test_the_pair_count_is_the_attention_backends():
    # Which pairs are attended is the backend's to say: one that counts its own (a
    # sliding window) is asked; otherwise causal within documents only for a backend
    # whose spec honours doc_ids, whatever keys the batch carries.
    doc_ids = torch.tensor([[0, 0, 1, 1, 1]])
    batch = {"input_ids": torch.zeros(1, 5, dtype=torch.long), "doc_ids": doc_ids}

    class Windowed:
        def attended_pairs(self, doc_ids, rows, seq_len):
            return 1000 + rows * seq_len + (0 if doc_ids is None else 1)

    assert flops.pair_counter(Windowed(), frozenset({"doc_ids"}))(batch) == 1006
    assert flops.pair_counter(object(), frozenset({"doc_ids"}))(batch) == 3 + 6
    assert flops.pair_counter(object(), frozenset())(batch) == 15
    assert flops.pair_counter(object(), frozenset({"doc_ids"}))({"input_ids": batch["input_ids"]}) == 15
