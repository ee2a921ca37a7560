"""The ``dpo`` objective: its loss and rewards against a hand computation in float64,
its variants, the refusal of rows that do not hold whole pairs, chosen == rejected
(log 2, no gradient), packed pairs == each pair alone, the frozen reference and the
step's normalizer and metrics."""

from __future__ import annotations

import math

import pytest
import torch
from distributed.pair_rows import pair_row, random_pairs, stack

from forge_core.api import ForgeError
from forge_core.distributed.parallelize import single_process
from forge_core.train.loss import loss_fn
from forge_core.train.reference import build_reference
from forge_plugins.objectives.dpo import ACCURACY, CHOSEN, MARGIN, REJECTED, DirectPreference
from forge_plugins.objectives.options import DpoOptions

VOCAB = 7
PAIRS = [([2, 3], [4, 5, 6], [6]), ([5], [3, 3], [2, 4, 6, 5])]


def dpo(**options) -> DirectPreference:
    return DirectPreference(DpoOptions(**options), token_loss=loss_fn)


def tiny_llama() -> torch.nn.Module:
    """A float64 llama over VOCAB tokens with the eager backend (exact document masks)."""
    from forge_plugins.attention.eager import EagerAttention
    from forge_plugins.models.llama import build
    from forge_plugins.models.options import LlamaOptions

    torch.manual_seed(0)
    model = build(
        LlamaOptions(dim=16, n_layers=2, n_heads=2, n_kv_heads=1, max_seq_len=64, init_std=0.3),
        vocab_size=VOCAB,
        attention=EagerAttention(None),
    )
    return model.double()


def hand_logps(logits: torch.Tensor, row: dict[str, torch.Tensor]) -> dict[int, float]:
    """Each document's summed log-probability of its labelled tokens, token by token."""
    out: dict[int, float] = {}
    for i, label in enumerate(row["labels"][0].tolist()):
        if label == -100:
            continue
        z = logits[0, i].tolist()
        logp = z[label] - math.log(sum(math.exp(v) for v in z))
        doc = int(row["doc_ids"][0, i])
        out[doc] = out.get(doc, 0.0) + logp
    return out


@pytest.mark.numerical
def test_the_loss_and_rewards_equal_a_hand_computation_in_float64():
    row = pair_row(PAIRS, 24)
    gen = torch.Generator().manual_seed(0)
    policy = torch.randn(1, 24, VOCAB, generator=gen, dtype=torch.float64)
    ref = torch.randn(1, 24, VOCAB, generator=gen, dtype=torch.float64)
    pi, rf = hand_logps(policy, row), hand_logps(ref, row)
    assert sorted(pi) == [0, 1, 2, 3]  # two pairs, every completion labelled
    beta = 0.3
    for variant in ("sigmoid", "ipo"):
        losses, chosen, rejected, wins = 0.0, 0.0, 0.0, 0
        for k in range(2):
            c, r = pi[2 * k] - rf[2 * k], pi[2 * k + 1] - rf[2 * k + 1]
            m = c - r
            losses += math.log1p(math.exp(-beta * m)) if variant == "sigmoid" else (m - 1 / (2 * beta)) ** 2
            chosen, rejected, wins = chosen + beta * c, rejected + beta * r, wins + (c > r)
        loss_sum, count, sums = dpo(beta=beta, loss=variant).loss(policy, row, ref)
        assert int(count) == 2
        assert float(loss_sum) == pytest.approx(losses, rel=1e-12)
        assert float(sums[CHOSEN]) == pytest.approx(chosen, rel=1e-12)
        assert float(sums[REJECTED]) == pytest.approx(rejected, rel=1e-12)
        assert float(sums[MARGIN]) == pytest.approx(chosen - rejected, rel=1e-12)
        assert int(sums[ACCURACY]) == wins
    # Reference-free: the reference log-probabilities are 0.
    m0 = (pi[0] - pi[1], pi[2] - pi[3])
    loss_sum, _, _ = dpo(beta=beta, reference="none").loss(policy, row, None)
    assert float(loss_sum) == pytest.approx(sum(math.log1p(math.exp(-beta * m)) for m in m0), rel=1e-12)
    assert not dpo(reference="none").needs_reference and dpo().needs_reference


def test_count_is_the_pairs_and_half_a_pair_is_refused():
    rows = stack([pair_row(PAIRS, 24), pair_row(PAIRS[:1], 24)])
    assert dpo().count(rows) == 3
    # The rejected completion of the second pair lost every label (cut away).
    broken = pair_row(PAIRS, 24)
    broken["labels"][broken["doc_ids"] == 3] = -100
    with pytest.raises(ForgeError, match=r"row 0 .* document 2 and 3 as pair 1, but only the chosen one"):
        dpo().count(broken)
    with pytest.raises(ForgeError, match="data.packer: bfd"):
        dpo().count({k: v for k, v in rows.items() if k != "doc_ids"})


def model_step(model, rows, objective, reference=None) -> tuple[float, dict[str, float], dict]:
    """One forward/backward through the ParallelModel's objective path, normalized by the
    pairs; returns the loss per pair, the metric means and the gradients."""
    pmodel = single_process(model, loss_fn)
    pmodel.objective, pmodel.reference = objective, reference
    pairs = objective.count(rows)
    model.zero_grad()
    loss_sum, count = pmodel.forward_backward(rows, None, pairs)
    assert int(count) == pairs
    sums = pmodel.take_objective_sums()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return float(loss_sum) / pairs, {k: float(v) / pairs for k, v in sums.items()}, grads


@pytest.mark.numerical
def test_chosen_equal_to_rejected_gives_log_2_and_no_gradient():
    """The margin is 0 whatever the model, so the loss is log 2, and its gradient
    through the model vanishes: d margin / d theta = d pi_c - d pi_r = 0. (The gradient
    with respect to the margin itself is -beta / 2, not 0.) A pair whose completions
    differ is the control: it gets a gradient."""
    model = tiny_llama()
    same = pair_row([([2, 3], [4, 5], [4, 5]), ([6], [3], [3])], 24)
    loss, metrics, grads = model_step(model, same, dpo(reference="none"))
    assert loss == pytest.approx(math.log(2), rel=1e-12)
    # A tie by definition (within the rounding of the sums), whatever the CPU's kernels
    # make of the two documents' positions in the row.
    assert metrics[MARGIN] == 0.0 and metrics[ACCURACY] == 0.0
    assert max(float(g.abs().max()) for g in grads.values()) < 1e-12
    _, _, control = model_step(model, pair_row([([2, 3], [4, 5], [5, 4])], 24), dpo(reference="none"))
    assert max(float(g.abs().max()) for g in control.values()) > 1e-4


@pytest.mark.numerical
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_margin_that_is_a_rounding_residue_is_a_tie(dtype):
    """The chosen and rejected completions hold the same tokens in another order under
    logits that do not depend on the position: their log-probabilities are the same
    terms summed in another order, equal in exact arithmetic, a rounding apart in
    floating point. Compared with 0 (the old definition) the pair is won or lost by that
    residue; within the tolerance it is a tie: not won, margin 0. A pair with a real
    difference (a rejected completion ending in another token) is still decided."""
    from forge_plugins.objectives.dpo import sequence_logps, tie_tolerance

    row = pair_row([([2], [3, 4, 5, 6], [6, 5, 4, 3])], 16)
    residues = []
    for seed in range(40):
        z = 3 * torch.randn(VOCAB, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
        logits = z.to(dtype).expand(1, 16, VOCAB).clone()
        logps, _, scale = sequence_logps(logits, row["labels"], row["doc_ids"])
        margin = float(logps[0, 0, 0] - logps[0, 0, 1])
        if margin > 0:  # the old definition counted this pair as won
            residues.append(margin)
            assert margin <= float(tie_tolerance(scale, dtype)[0, 0])
            _, count, sums = dpo(beta=0.5, reference="none").loss(logits, row, None)
            assert int(count) == 1 and int(sums[ACCURACY]) == 0 and float(sums[MARGIN]) == 0.0
    assert residues, "no order of the sums left a residue: the test proves nothing here"
    real = pair_row([([2], [3, 4, 5, 6], [6, 5, 4, 2])], 16)
    for sign in (1, -1):
        logits = (sign * torch.arange(VOCAB, dtype=dtype)).expand(1, 16, VOCAB).clone()
        _, _, sums = dpo(beta=0.5, reference="none").loss(logits, real, None)
        assert int(sums[ACCURACY]) == (sign > 0)
        assert float(sums[MARGIN]) == pytest.approx(0.5 * sign, rel=1e-5)


@pytest.mark.numerical
def test_packed_pairs_equal_each_pair_alone_in_float64():
    model = tiny_llama()
    pairs = random_pairs(4, VOCAB, torch.Generator().manual_seed(3))
    packed = stack([pair_row(pairs[:3], 48), pair_row(pairs[3:], 48)])
    alone = stack([pair_row([p], 48) for p in pairs])
    reference = build_reference(tiny_llama().double(), torch.device("cpu"))
    with torch.no_grad():  # move the policy away from the reference: the margins are not 0
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    got = model_step(model, packed, dpo(beta=0.5), reference)
    want = model_step(model, alone, dpo(beta=0.5), reference)
    assert got[0] == pytest.approx(want[0], rel=1e-12) and got[0] != pytest.approx(math.log(2))
    assert got[1] == pytest.approx(want[1], rel=1e-12, abs=1e-12)
    for name, grad in want[2].items():
        torch.testing.assert_close(got[2][name], grad, rtol=1e-10, atol=1e-13)
    # The control: a model that lets the documents of a row attend to each other (it
    # drops doc_ids) scores the packed pairs differently.
    leaky = model_step(Leaky(model), packed, dpo(beta=0.5), reference)
    assert abs(leaky[0] - want[0]) > 0.1


class Leaky(torch.nn.Module):
    """The model without document isolation: its forward drops ``doc_ids``."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids, doc_ids, positions):
        return self.model(input_ids, positions=positions)


def test_the_reference_is_a_frozen_copy_and_the_first_loss_is_log_2():
    """Policy == reference at the start: every margin is 0, the loss log 2; after a step
    of the policy the reference still gives the initial model's output."""
    model = tiny_llama()
    reference = build_reference(model, torch.device("cpu"))
    copy = reference.module
    assert copy is not model and not copy.training
    assert not any(p.requires_grad for p in copy.parameters())
    rows = stack([pair_row(random_pairs(2, VOCAB, torch.Generator().manual_seed(5)), 32)])
    inputs = {k: v for k, v in rows.items() if k != "labels"}
    before = reference(inputs)
    loss, metrics, grads = model_step(model, rows, dpo(), reference)
    assert loss == pytest.approx(math.log(2), rel=1e-12) and metrics[MARGIN] == 0.0
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.sub_(grads[name])
    torch.testing.assert_close(reference(inputs), before, rtol=0, atol=0)
    loss_after, _, _ = model_step(model, rows, dpo(), reference)
    assert loss_after < math.log(2)  # one gradient step prefers the chosen completions


def test_with_lora_the_reference_is_the_base_model_with_the_adapters_off(tmp_path):
    """No copy: the reference runs the adapted model with its adapters disabled, and its
    sequence log-probabilities are the base model's, while the policy's have moved."""
    from test_lora import build, lora_config
    from train_helpers import tiny_config

    from forge_core.train.reference import adapters_off, needs_copy
    from forge_plugins.objectives.dpo import sequence_logps

    base = build(tmp_path, tiny_config(tmp_path)).double()
    adapted = build(tmp_path, lora_config(tmp_path)).double()
    assert needs_copy(base) and not needs_copy(adapted)
    with torch.no_grad():
        for name, param in adapted.named_parameters():
            if ".lora_B." in name:
                param.normal_(std=0.1)
    pmodel = single_process(adapted, loss_fn)
    reference = adapters_off(pmodel)
    rows = stack([pair_row(random_pairs(3, 256, torch.Generator().manual_seed(7)), 64)])
    inputs = {k: v for k, v in rows.items() if k != "labels"}
    labels, doc_ids = rows["labels"], rows["doc_ids"]
    want = sequence_logps(base(**inputs), labels, doc_ids)[0]
    got = sequence_logps(reference(inputs), labels, doc_ids)[0]
    torch.testing.assert_close(got, want, rtol=1e-12, atol=0)
    policy = sequence_logps(adapted(**inputs), labels, doc_ids)[0]
    assert float((policy - want).detach().abs().max()) > 1e-3  # the adapters are on again outside
    assert adapted.training  # the reference put the modes back


def test_the_console_shows_the_objective_metrics_and_an_evaluation_without_perplexity():
    """Before: the console read ``eval/perplexity`` on every evaluation, a KeyError under dpo."""
    from forge_plugins.loggers.console import _fmt_eval, _fmt_objective

    step = {"loss": 0.5, "dpo/reward_accuracy": 0.75, "data/web/share": 1.0}
    assert _fmt_objective(step, "dpo", "=") == "dpo/reward_accuracy=0.75"
    assert _fmt_objective(step, "lm", "=") == ""
    evaluated = {"eval/loss": 0.25, "eval/pairs": 14, "eval/dpo/reward_accuracy": 1.0, "eval/a/loss": 0.2}
    assert _fmt_eval(evaluated, "dpo") == "eval/loss 0.2500  eval/pairs 14  eval/dpo/reward_accuracy 1"


@pytest.mark.parametrize(
    ("overrides", "world_size", "rule"),
    [
        (["parallel.pp=2"], 2, "train.objective-under-pipeline"),
        (["parallel.cp=2"], 2, "train.objective-under-token-split"),
        (["train.loss.name=chunked"], 1, "train.objective-needs-logits"),
        (["data.packer=none"], 1, "train.objective-needs-metadata"),
    ],
)
def test_layouts_dpo_cannot_run_under_are_refused_before_anything_is_built(
    tmp_path, overrides, world_size, rule
):
    """Before: dpo under pp would have scored each microbatch from its labels alone, under
    cp each rank's share of every completion, under the chunked loss hidden states."""
    from train_helpers import tiny_config, write_config

    from forge_core.config.loader import load_config
    from forge_core.judge import judge_config
    from forge_core.registry import load_registries

    config = tiny_config(tmp_path, train={"objective": "dpo"})
    config["data"].update(packer="bfd", seq_len=64)
    path = write_config(tmp_path / "dpo.yaml", config)
    registries = load_registries()
    assert not judge_config(load_config(path, [], registries), registries, world_size=1).errors
    judged = judge_config(load_config(path, overrides, registries), registries, world_size=world_size)
    assert rule in {v.rule_id for v in judged.errors}, [str(v) for v in judged.errors]
    lm = judge_config(
        load_config(path, [*overrides, "train.objective=lm"], registries), registries, world_size=world_size
    )
    assert rule not in {v.rule_id for v in lm.errors}
