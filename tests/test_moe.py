"""The mixture-of-experts feed-forward (forge_plugins/models/moe.py) and the ``llama``
model's MoE blocks: kernels, routing, capacity, balancing losses and their gradients.
Identities in float64; the grouped GEMM kernel (which has no float64 kernel) in float32
within its size-derived rounding."""

from __future__ import annotations

import math
from types import SimpleNamespace

import attrs
import pytest
import torch
from test_train_loop import final_weights
from train_helpers import read_metrics, tiny_config, write_config

from forge_core.testing import assert_within_rounding, forge_run, train_in_process
from forge_plugins.attention.options import SdpaOptions
from forge_plugins.attention.sdpa import SdpaAttention
from forge_plugins.models import rules as model_rules
from forge_plugins.models.feed_forward import FeedForward
from forge_plugins.models.llama import build
from forge_plugins.models.moe import MoE, RoutedExperts, capacity_keep, summarize_stats
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


# --- capacity ---------------------------------------------------------------------------


def test_capacity_keeps_each_experts_heaviest_assignments_then_the_earliest():
    # One row, 4 tokens, top-1, 2 experts, factor 1: capacity ceil(1 * 4 * 1 / 2) = 2.
    indices = torch.tensor([[[0], [0], [0], [1]]])
    weights = torch.tensor([[[0.5], [0.9], [0.5], [0.3]]])
    keep = capacity_keep(indices, weights, 1.0, 2)
    # Expert 0: 0.9 (position 1) first, then the tie 0.5 at positions 0 and 2: position 0.
    assert keep.view(-1).tolist() == [True, True, False, True]


def test_capacity_drops_the_same_assignments_of_a_row_in_any_batch():
    generator = torch.Generator().manual_seed(3)
    rows = torch.randint(0, 4, (5, 16, 2), generator=generator)
    weights = torch.rand(5, 16, 2, generator=generator)
    alone = capacity_keep(rows[2:3], weights[2:3], 0.5, 4)
    for batch in ([0, 1, 2], [2, 4], [4, 3, 0, 2]):
        at = batch.index(2)
        assert torch.equal(capacity_keep(rows[batch], weights[batch], 0.5, 4)[at], alone[0])
    assert not alone.all() and alone.any()  # the factor drops some, keeps some


def moe_with(seed: int = 0, dtype=torch.float64, **changes) -> MoE:
    torch.manual_seed(seed)
    module = MoE(DIM, attrs.evolve(MOE, **changes))
    for p in module.parameters():
        torch.nn.init.normal_(p, std=0.4)
    return module.to(dtype)


def test_capacity_dropped_assignments_are_not_computed_and_rows_are_independent():
    module = moe_with(capacity_factor=0.5)
    x = torch.randn(3, 8, DIM, dtype=torch.float64)
    together = module(x)
    alone = module(x[1:2])
    assert_within_rounding(together[1:2], alone, dtype=torch.float64, terms=DIM, what="row 1")
    stats = module.step_stats()
    assert 0 < float(stats["dropped"]) < float(stats["assignments"])
    assert float(stats["tokens_per_expert"].sum()) == float(stats["assignments"] - stats["dropped"])
    # Dropless: the same routing computes every assignment; so does evaluation.
    dropless = moe_with(capacity_factor=0.0)
    assert_within_rounding(module.eval()(x), dropless(x), dtype=torch.float64, terms=DIM, what="eval")
    assert float(dropless.step_stats()["dropped"]) == 0
    assert not torch.allclose(together, dropless(x))  # control: training did drop


# --- balancing losses -------------------------------------------------------------------


def explicit_penalties(module: MoE, x: torch.Tensor, doc_ids=None) -> torch.Tensor:
    """The balancing and z-loss of ``module``'s options written out from their
    definitions, differentiable (for autograd to compare with the injected gradient)."""
    options = module.options
    tokens = x.reshape(-1, DIM)
    logits = tokens @ module.router.gate.weight.T
    scores = logits.softmax(-1) if options.router == "softmax" else logits.sigmoid()
    probs = scores if options.router == "softmax" else scores / scores.sum(-1, keepdim=True)
    chosen = (scores.detach() + module.router.expert_bias).topk(options.top_k, -1).indices
    E, k = options.num_experts, options.top_k
    if options.aux_loss_scope == "batch":
        docs = [torch.arange(tokens.shape[0])]
    else:
        B, S = x.shape[:2]
        ids = torch.zeros(B, S, dtype=torch.long) if doc_ids is None else doc_ids
        docs = [
            torch.nonzero((torch.arange(B * S) // S == b) & (ids.reshape(-1) == d)).view(-1)
            for b in range(B)
            for d in ids[b].unique().tolist()
        ]
    aux = 0  # each document's E * sum_e f_e * P_e, weighted by its share of the tokens
    for members in docs:
        f = torch.stack([(chosen[members] == e).sum() for e in range(E)]).double() / (len(members) * k)
        aux = aux + E * (f * probs[members].mean(0)).sum() * len(members) / tokens.shape[0]
    z = logits.logsumexp(-1).pow(2).mean()
    return options.aux_loss * aux + options.z_loss * z


@pytest.mark.parametrize(
    "changes",
    [
        dict(aux_loss=0.3, z_loss=0.05),
        dict(aux_loss=0.3, aux_loss_scope="sequence"),
        dict(aux_loss=0.2, z_loss=0.1, router="sigmoid", normalize_weights=True, route_scale=2.5),
    ],
    ids=["batch", "sequence", "sigmoid"],
)
def test_balancing_gradients_equal_autograd_of_the_explicit_losses(changes):
    module = moe_with(**changes)
    plain = moe_with(**changes).eval()  # the same weights; eval adds no penalty gradient
    x = torch.randn(2, 9, DIM, dtype=torch.float64)
    doc_ids = torch.tensor([[0] * 4 + [1] * 5, [0] * 9])
    upstream = torch.randn(2, 9, DIM, dtype=torch.float64)
    inputs = [x.clone().requires_grad_(True) for _ in range(2)]
    out = module(inputs[0], doc_ids=doc_ids if module.needs_doc_ids else None)
    (out * upstream).sum().backward()
    want_out = plain(inputs[1])
    ((want_out * upstream).sum() + explicit_penalties(plain, inputs[1], doc_ids)).backward()
    # The output itself is unchanged by the penalties.
    assert_within_rounding(out, want_out, dtype=torch.float64, terms=DIM, what="output")
    for (name, got), want in zip(module.named_parameters(), plain.parameters()):
        assert_within_rounding(got.grad, want.grad, dtype=torch.float64, terms=DIM, what=name)
    assert_within_rounding(inputs[0].grad, inputs[1].grad, dtype=torch.float64, terms=DIM, what="x.grad")


def test_penalty_gradients_are_real():
    # Negative control of the test above: without the injection the router gate's
    # gradient differs from autograd of the explicit losses.
    plain = moe_with(aux_loss=0.0)
    x = torch.randn(2, 9, DIM, dtype=torch.float64)
    plain(x).sum().backward()
    without = plain.router.gate.weight.grad.clone()
    plain.zero_grad()
    module = moe_with(aux_loss=0.5, z_loss=0.5)
    module(x).sum().backward()
    assert (module.router.gate.weight.grad - without).abs().max() > 1e-3


def test_sequence_scope_statistics_of_a_packed_row_are_its_documents_run_alone():
    module = moe_with(aux_loss=1.0, aux_loss_scope="sequence")
    x = torch.randn(1, 11, DIM, dtype=torch.float64)
    doc_ids = torch.tensor([[0] * 4 + [1] * 7])

    def gate_grad(inputs, **kwargs):
        module.zero_grad()
        module(inputs, **kwargs).mul(0).sum().backward()  # the penalty's gradient alone
        return module.router.gate.weight.grad.clone(), float(module.step_stats()["aux_loss"])

    packed, packed_aux = gate_grad(x, doc_ids=doc_ids)
    first, first_aux = gate_grad(x[:, :4])
    second, second_aux = gate_grad(x[:, 4:])
    # A mean over the forward's tokens: each document weighs its share of them.
    want = (4 * first + 7 * second) / 11
    assert_within_rounding(packed, want, dtype=torch.float64, terms=DIM, what="gate grad")
    assert packed_aux == pytest.approx((4 * first_aux + 7 * second_aux) / 11, rel=1e-6)  # stats are fp32
    # Without doc ids the packed row is one sequence: a different statistic (control).
    row, _ = gate_grad(x)
    assert (row - packed).abs().max() > 1e-6


# --- loss-free balancing ----------------------------------------------------------------


def test_bias_update_moves_toward_balance_and_changes_selection_only():
    module = moe_with(bias_update_rate=0.05, top_k=1)
    with torch.no_grad():
        module.router.gate.weight[0] += 2.0  # expert 0 wins most tokens
    x = torch.randn(4, 8, DIM, dtype=torch.float64).abs()
    _, scores, before, weights = module.router(x.reshape(-1, DIM))
    module(x)
    load = module._routed.clone()
    module.after_optimizer_step()
    bias = module.router.expert_bias
    mean = load.mean()
    assert torch.equal(torch.sign(bias), torch.sign(mean - load).to(bias.dtype))
    assert bias[0] < 0
    # Selection changes, weights are still the unbiased scores of the chosen experts.
    with torch.no_grad():
        module.router.expert_bias.copy_(torch.tensor([-10.0, 0.0, 0.0, 0.0]))
    _, scores_after, after, weights_after = module.router(x.reshape(-1, DIM))
    assert not torch.equal(after, before) and not (after == 0).any()
    assert torch.equal(scores_after, scores)
    assert torch.equal(weights_after, scores.gather(-1, after))
    # Eval forwards do not count toward the next update.
    module.eval()
    module(x)
    module.after_optimizer_step()
    assert torch.equal(module.router.expert_bias, torch.tensor([-10.0, 0.0, 0.0, 0.0], dtype=torch.float64))


# --- statistics -------------------------------------------------------------------------


def test_step_stats_sum_the_training_forwards_then_reset():
    module = moe_with(aux_loss=0.1, z_loss=0.1, capacity_factor=0.5)
    x = torch.randn(2, 8, DIM, dtype=torch.float64)
    module(x)
    first = module.step_stats()
    module(x)
    module(x)
    twice = module.step_stats()
    assert float(twice["forwards"]) == 2 and float(first["forwards"]) == 1
    for key in ("tokens_per_expert", "aux_loss", "z_loss", "dropped", "assignments"):
        assert torch.allclose(twice[key], 2 * first[key])
    assert float(module.step_stats()["forwards"]) == 0
    summary = summarize_stats(first)
    load = first["tokens_per_expert"].double()
    assert summary["load_max"] == pytest.approx(float(load.max() / load.mean()))
    assert summary["dropped_frac"] == pytest.approx(float(first["dropped"] / first["assignments"]))
    assert summary["aux_loss"] == pytest.approx(float(first["aux_loss"]))


# --- options and rules ------------------------------------------------------------------


def _ctx(options, cp: int = 1, pp: int = 1):
    degrees = {"cp": cp, "pp": pp}
    return SimpleNamespace(
        config=SimpleNamespace(model=SimpleNamespace(options=options)),
        degrees=degrees,
        is_active=lambda name: degrees.get(name, 1) > 1,
    )


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(top_k=5), "model.options.moe.top_k=5 exceeds model.options.moe.num_experts=4"),
        (dict(layers=[0, 2]), "model.options.moe.layers=[0, 2] names [2], outside the blocks 0..1"),
        (dict(layers=[1, 1]), "names a block twice"),
        (dict(layers=[]), "model.options.moe.layers=[] makes no block MoE"),
        (dict(every=3), "model.options.moe.every=3 exceeds n_layers=2, so no block is MoE"),
        (dict(shared_hidden=8), "shared_hidden=8 with shared_experts=0"),
        (dict(aux_loss_scope="sequence"), "aux_loss_scope='sequence' with aux_loss=0"),
    ],
)
def test_moe_rules_refuse_options_that_cannot_work(changes, message):
    options = attrs.evolve(TINY, moe=attrs.evolve(MOE, **changes))
    assert message in " ".join(model_rules.check_moe_options(_ctx(options)))
    with pytest.raises(ValueError, match="invalid llama options"):
        tiny_model(options)
    assert model_rules.check_moe_options(_ctx(TINY)) == []


def test_sequence_scope_under_context_parallelism_is_refused():
    options = attrs.evolve(TINY, moe=attrs.evolve(MOE, aux_loss=0.01, aux_loss_scope="sequence"))
    assert "parallel.cp=2" in model_rules.check_moe_sequence_cp(_ctx(options, cp=2))
    assert model_rules.check_moe_sequence_cp(_ctx(options, cp=1)) is None
    batch = attrs.evolve(TINY, moe=attrs.evolve(MOE, aux_loss=0.01))
    assert model_rules.check_moe_sequence_cp(_ctx(batch, cp=2)) is None


def test_bias_update_under_pipeline_parallelism_is_warned():
    options = attrs.evolve(TINY, moe=attrs.evolve(MOE, bias_update_rate=0.01))
    assert "parallel.pp=2" in model_rules.check_moe_bias_pipeline(_ctx(options, pp=2))
    assert model_rules.check_moe_bias_pipeline(_ctx(options)) is None
    assert model_rules.check_moe_bias_pipeline(_ctx(TINY, pp=2)) is None


def test_check_names_the_moe_option_and_its_value(tmp_path):
    config = tiny_config(tmp_path, "rules")
    config["model"]["options"]["moe"] = {"num_experts": 2, "top_k": 3, "expert_hidden": 16}
    result = forge_run(["check", write_config(tmp_path / "rules.yaml", config)])
    assert result.code == 2, result.stdout + result.stderr
    assert "error: [llama.moe-options]" in result.stdout
    assert "model.options.moe.top_k=3 exceeds model.options.moe.num_experts=2" in result.stdout
    assert "Traceback" not in result.stdout + result.stderr


# --- a training run ---------------------------------------------------------------------

MOE_RUN = {
    "num_experts": 4,
    "top_k": 2,
    "expert_hidden": 16,
    "every": 2,
    "shared_experts": 1,
    "capacity_factor": 1.5,
    "aux_loss": 0.01,
    "z_loss": 0.001,
    "bias_update_rate": 0.01,
}


def test_moe_run_trains_and_resumes_bit_exactly_with_its_expert_bias(tmp_path):
    train, logging = {"steps": 2, "schedule_steps": 2, "grad_accum": 2}, {"loggers": ["jsonl"]}
    straight = tiny_config(tmp_path, "straight", train=train, logging=logging)
    straight["model"]["options"]["moe"] = MOE_RUN
    assert train_in_process(write_config(tmp_path / "straight.yaml", straight)) == "completed"
    resumed = tiny_config(tmp_path, "resumed", train={**train, "steps": 1}, logging=logging)
    resumed["model"]["options"]["moe"] = MOE_RUN
    path = write_config(tmp_path / "resumed.yaml", resumed)
    assert train_in_process(path) == "completed"
    assert train_in_process(path, ["train.steps=2"]) == "completed"  # resumes after step 1
    losses = [[r["loss"] for r in read_metrics(tmp_path / name)] for name in ("straight", "resumed")]
    assert all(math.isfinite(x) for x in losses[0]) and losses[0] == losses[1]
    a, b = (final_weights(tmp_path / name) for name in ("straight", "resumed"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    bias = a["layers.1.feed_forward.router.expert_bias"]
    assert bias.abs().sum() > 0  # the loss-free update ran, and was checkpointed


def test_resuming_a_dense_checkpoint_with_moe_blocks_is_refused_naming_what_it_lacks(tmp_path):
    dense = tiny_config(tmp_path, "run", train={"steps": 1, "schedule_steps": 2})
    assert train_in_process(write_config(tmp_path / "dense.yaml", dense)) == "completed"
    routed = tiny_config(tmp_path, "run", train={"steps": 2, "schedule_steps": 2})
    routed["model"]["options"]["moe"] = MOE_RUN
    result = forge_run(["train", write_config(tmp_path / "routed.yaml", routed)])
    assert result.code == 2, result.stderr
    assert "it holds no 'layers.1.feed_forward.router" in result.stderr
    assert "Traceback" not in result.stderr


def test_packed_moe_model_gives_each_document_its_sequence_balancing_alone():
    # The llama passes doc_ids to the MoE blocks (sequence scope) and positions to rotary:
    # the penalty gradient of a packed row is what each document gives alone, weighted
    # by its share of the row's tokens, in every MoE block.
    moe = attrs.evolve(MOE, aux_loss=1.0, aux_loss_scope="sequence")
    model = tiny_model(attrs.evolve(TINY, moe=moe)).double()
    tokens = torch.randint(0, VOCAB, (1, 12), generator=torch.Generator().manual_seed(2))
    doc_ids = torch.tensor([[0] * 5 + [1] * 7])
    positions = torch.tensor([list(range(5)) + list(range(7))])

    def penalty_grads(**inputs):
        model.zero_grad()
        model(**inputs).mul(0).sum().backward()  # the balancing loss's gradient alone
        return [layer.feed_forward.router.gate.weight.grad.clone() for layer in model.layers.values()]

    packed = penalty_grads(input_ids=tokens, doc_ids=doc_ids, positions=positions)
    first = penalty_grads(input_ids=tokens[:, :5])
    second = penalty_grads(input_ids=tokens[:, 5:])
    as_one = penalty_grads(input_ids=tokens, positions=positions)  # control: no doc ids
    assert len(packed) == 2
    for n, (got, a, b) in enumerate(zip(packed, first, second)):
        want = (5 * a + 7 * b) / 12
        assert_within_rounding(got, want, dtype=torch.float64, terms=DIM, what=f"block {n} gate grad")
    assert (as_one[1] - packed[1]).abs().max() > 1e-6
