"""Batched generation (:mod:`forge_core.generate.batched`): each row of a batch gets what
it gets alone (greedy and sampled, left-padded, with a context that fills and is cut),
greedy decoding equals transformers' batched ``generate``, the reported
log-probabilities equal a full forward's, EOS and stop strings end rows separately,
LoRA adapters take part (in eval mode), and the kit's cache check catches a forward that
drops the padding mask."""

from __future__ import annotations

import pytest
import torch
from test_hf_interop import float64_norms, forge_from, random_hf
from test_lora import build as build_from_config
from test_lora import lora_config
from test_sample import VOCAB, WithoutCache, model64

from forge_core.api import transforms_disabled
from forge_core.generate.batched import Row, Sampling, generate_rows
from forge_core.testing import assert_within_rounding, check_cached_decoding, longest_sum

LENGTHS = (3, 11, 1, 7, 5)


def prompts(lengths=LENGTHS, vocab=VOCAB, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return [tuple(torch.randint(0, vocab, (n,), generator=gen).tolist()) for n in lengths]


def rows_of(given, samples=1):
    return [Row(ids, p, s) for p, ids in enumerate(given) for s in range(samples)]


def alone(model, rows, sampling, context):
    return [generate_rows(model, [row], sampling, context=context)[0] for row in rows]


@pytest.mark.parametrize(
    ("temperature", "context"),
    [(0.0, 40), (1.0, 40), (0.0, 12), (1.0, 12)],
    ids=["greedy", "sampled", "greedy-cut-context", "sampled-cut-context"],
)
def test_every_row_of_a_batch_gets_what_it_gets_alone(temperature, context):
    """Left padding, per-row positions and the padding mask keep rows apart; a context of
    12 fills (11 + 16 tokens) and is cut per row. float64: the padded batch rounds
    differently from a row alone, and sampling must not turn that into other tokens."""
    model = model64()
    rows = rows_of(prompts(), samples=2)
    sampling = Sampling(16, temperature, top_k=20, top_p=0.95, seed=3)
    batched = generate_rows(model, rows, sampling, context=context)
    assert [b.ids for b in batched] == [a.ids for a in alone(model, rows, sampling, context)]
    # Nor does the order of the batch matter: the draws follow each row's indices.
    backwards = generate_rows(model, rows[::-1], sampling, context=context)[::-1]
    assert [b.ids for b in backwards] == [b.ids for b in batched]
    assert all(len(b.ids) == 16 and b.finish == "length" for b in batched)
    if temperature:  # the control: the samples of one prompt differ
        assert any(batched[i].ids != batched[i + 1].ids for i in range(0, len(rows), 2))


def test_a_model_without_a_cache_samples_the_same_rows():
    model = model64()
    rows = rows_of(prompts(), samples=2)
    sampling = Sampling(12, 0.9, top_k=10, seed=5)
    cached = generate_rows(model, rows, sampling, context=32)
    reread = generate_rows(WithoutCache(model), rows, sampling, context=32)
    assert [c.ids for c in cached] == [r.ids for r in reread]
    assert all(len(r.ids) == 12 for r in reread)


@pytest.mark.parametrize(
    ("field", "value", "said"),
    [
        ("temperature", float("nan"), "Sampling.temperature must be a finite number, 0 or more"),
        ("temperature", -1.0, "Sampling.temperature must be a finite number, 0 or more"),
        ("top_p", 0.0, r"Sampling.top_p must be in \(0, 1\]"),
        ("top_k", -1, "'top_k' must be >= 0"),
        ("max_new_tokens", -1, "'max_new_tokens' must be >= 0"),
    ],
)
def test_sampling_settings_outside_their_range_are_refused(field, value, said):
    with pytest.raises(ValueError, match=said):
        Sampling(**{"max_new_tokens": 4, field: value})


def test_draws_follow_seed_step_prompt_and_sample():
    model = model64()
    (ids,) = prompts((4,))
    base = Sampling(12, 1.0, seed=0, step=0)

    def sampled(row, sampling=base):
        return generate_rows(model, [row], sampling, context=32)[0].ids

    first = sampled(Row(ids, 0, 0))
    assert sampled(Row(ids, 0, 0)) == first
    for other in (
        sampled(Row(ids, 1, 0)),
        sampled(Row(ids, 0, 1)),
        sampled(Row(ids, 0, 0), Sampling(12, 1.0, seed=1)),
        sampled(Row(ids, 0, 0), Sampling(12, 1.0, step=1)),
    ):
        assert other != first


@pytest.mark.numerical
def test_greedy_batched_decoding_equals_transformers_batched_generate(tmp_path):
    """The same llama weights in both (imported by Forge from the transformers folder),
    float64 with transformers' float32 norm round trip removed, so that near ties cannot
    tip either side; transformers left-pads the batch itself."""
    hf = random_hf(tmp_path, vocab=67).double()
    float64_norms(hf)
    model = forge_from(tmp_path, vocab=67).double()
    given = prompts(vocab=67, seed=4)
    width = max(map(len, given))
    ids = torch.tensor([[0] * (width - len(p)) + list(p) for p in given])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in given])
    with torch.no_grad():
        out = hf.generate(
            ids, attention_mask=mask, max_new_tokens=20, do_sample=False, eos_token_id=None, pad_token_id=0
        )
    ours = generate_rows(model, rows_of(given), Sampling(20, 0.0), context=64)
    assert [list(o.ids) for o in ours] == out[:, width:].tolist()


def full_forward_logits(model, row, completion):
    """The logits before each completion token by one forward over prompt and completion,
    without a cache: what a trainer recomputes."""
    with torch.no_grad():
        return model(torch.tensor([[*row.ids, *completion.ids]]))[0, len(row.ids) - 1 : -1]


@pytest.mark.numerical
@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_the_reported_logprobs_equal_a_full_forward_over_prompt_and_completion(temperature):
    """float32. Not bitwise: a decoding step multiplies the weights with one token per
    row, the full forward with the whole sequence, and CPU kernels block those sums
    differently. A log-probability ``logit - logsumexp`` rounds as the logits do, so
    the tolerance is the logits' rounding (``longest_sum`` of the model over the
    sequence) times the norm of the row of logits compared."""
    model = model64().float()
    rows = rows_of(prompts())
    done = generate_rows(model, rows, Sampling(20, temperature, top_k=5, seed=7), context=48)
    for row, completion in zip(rows, done):
        logits = full_forward_logits(model, row, completion) / (temperature or 1.0)
        want = logits.log_softmax(-1).gather(-1, torch.tensor(completion.ids)[:, None])[:, 0]
        got = torch.tensor(completion.logprobs)
        # Each log-probability over the norm of its row of logits, whose rounding it carries.
        scale = logits.norm(dim=-1)
        assert_within_rounding(
            (got / scale)[:, None],
            (want / scale)[:, None],
            dtype=torch.float32,
            terms=longest_sum(model, len(row.ids) + 20),
            what=f"row {row.prompt}: reported against recomputed log-probabilities (over |logits|)",
            scale=1.0,
        )


def test_eos_and_stop_strings_end_each_row_alone():
    model = model64()
    rows = rows_of(prompts())
    free = generate_rows(model, rows, Sampling(16, 0.0), context=32)
    eos = free[1].ids[5]
    decode = lambda ids: ",".join(map(str, ids)) + ","  # noqa: E731 - every token its own text
    stop = ",".join(map(str, free[3].ids[6:8])) + ","
    sampling = Sampling(16, 0.0, eos_ids=frozenset({eos}), stops=(stop,))
    ended = generate_rows(model, rows, sampling, context=32, decode=decode)
    for free_row, row in zip(free, ended):
        text = decode(list(free_row.ids))
        at_eos = free_row.ids.index(eos) + 1 if eos in free_row.ids else 99
        at_stop = min((n for n in range(1, 17) if stop in decode(list(free_row.ids[:n]))), default=99)
        n = min(at_eos, at_stop, 16)
        assert row.ids == free_row.ids[:n], text
        assert row.finish == ("eos" if n == at_eos else "stop" if n == at_stop else "length")
    assert ended[1].finish == "eos" and ended[3].finish in ("eos", "stop")
    assert any(row.finish == "length" for row in ended)  # the others went on


def test_lora_adapters_take_part_in_batched_generation(tmp_path):
    """On the model as it trains: adapters with dropout, in train mode. Decoding is in
    eval mode (no dropout draws), and the model comes back training."""
    model = build_from_config(tmp_path, lora_config(tmp_path, lora={"dropout": 0.5})).train()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".lora_B." in name:
                param.normal_(std=0.5, generator=torch.Generator().manual_seed(2))
    rows = rows_of(prompts(vocab=256))
    sampling = Sampling(12, 0.0)
    adapted = generate_rows(model, rows, sampling, context=32)
    with transforms_disabled(model):
        base = generate_rows(model, rows, sampling, context=32)
    assert [a.ids for a in adapted] != [b.ids for b in base]
    assert [a.ids for a in adapted] == [a.ids for a in alone(model, rows, sampling, 32)]
    assert all(module.training for module in model.modules())
    sampled = Sampling(12, 1.0, seed=4)
    first = generate_rows(model, rows, sampled, context=32)
    assert generate_rows(model, rows, sampled, context=32) == first
    assert generate_rows(model.eval(), rows, sampled, context=32) == first


class DropsTheMask(torch.nn.Module):
    """A caching model whose forward ignores attention_mask: real tokens attend to padding."""

    def __init__(self, inner) -> None:
        super().__init__()
        self.inner, self.vocab_size = inner, inner.vocab_size

    def new_cache(self, batch_size, max_len):
        return self.inner.new_cache(batch_size, max_len)

    def forward(self, input_ids, positions=None, cache=None, attention_mask=None):
        return self.inner(input_ids, positions=positions, cache=cache)


@pytest.mark.numerical
@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_the_kit_checks_batched_cached_decoding_and_catches_a_forward_that_drops_the_mask(family):
    assert check_cached_decoding(model64(family=family)) < 1
    with pytest.raises(AssertionError, match=r"row 0 \(3 tokens, left-padded by 4\) decoded in a batch"):
        check_cached_decoding(DropsTheMask(model64(family=family)))
