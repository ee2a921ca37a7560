"""Sampling: the llama's key/value cache gives the logits of a full forward (float64
identity), so cached decoding picks the tokens cache-free decoding picks; top-k/top-p
filtering; stop strings and streaming; ``forge-run sample`` with several prompts, and
with ``--chat``: the run's chat template, its special tokens and its end of turn."""

from __future__ import annotations

import json

import pytest
import torch
from test_chat_data import CHATML, TALK, hf_folder, hf_tokenizer  # noqa: F401 - hf_folder: a fixture
from torch import nn
from train_helpers import tiny_config, write_config

from forge_core import cli
from forge_core.cli.sample import StreamPrinter, continuation
from forge_core.generate import generate
from forge_core.generate.batched import CachedRows, Completion
from forge_core.generate.sampling import choose, uniform
from forge_core.testing import assert_within_rounding, forge_run, longest_sum
from forge_plugins.attention.options import SdpaOptions
from forge_plugins.attention.sdpa import SdpaAttention
from forge_plugins.models.llama import build
from forge_plugins.models.options import LlamaOptions

VOCAB = 50


class WithoutCache(nn.Module):
    """The same model, offering no cache: the sampler re-reads the context."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, input_ids):
        return self.inner(input_ids)


def model64(**options):
    torch.manual_seed(0)
    base = dict(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=64, init_std=0.3)
    return build(LlamaOptions(**{**base, **options}), VOCAB, SdpaAttention(SdpaOptions())).double().eval()


@pytest.mark.numerical
@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_cached_logits_equal_a_full_forward_at_every_step(family):
    model = model64(family=family)
    ids = torch.randint(0, VOCAB, (1, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(ids)
        cache = model.new_cache(1, 32)
        pieces = [model(ids[:, :7], cache=cache)]  # the prompt, through the backend
        pieces += [model(ids[:, i : i + 1], cache=cache) for i in range(7, 12)]  # one token a step
        pieces.append(model(ids[:, 12:], cache=cache))  # several after a cached prefix
    assert cache.length == 20
    assert_within_rounding(
        torch.cat(pieces, 1),
        full,
        dtype=torch.float64,
        terms=longest_sum(model, 20),
        what="cached decoding against the full forward",
    )


def test_cached_and_cache_free_greedy_decoding_pick_the_same_tokens():
    model = model64()
    prompt = [3, 14, 15, 9, 2, 6]
    cached = generate(model, prompt, 40, context=64, temperature=0, top_k=0)
    plain = generate(WithoutCache(model), prompt, 40, context=64, temperature=0, top_k=0)
    assert len(cached) == 40 and cached == plain


def test_a_full_cache_is_cut_to_its_second_half_and_decoding_goes_on():
    model = model64()
    history = [1, 2, 3]
    rows = CachedRows(model, 8, [list(history)])
    for token in range(4, 30):
        history.append(token)
        logits = rows.step([token], [False])[0]
    # The context was cut (29 tokens, 8 fit): the logits are those of a full forward over
    # the last n tokens for exactly one n between the half and the whole context.
    with torch.no_grad():
        fits = [
            n
            for n in range(4, 9)
            if torch.allclose(logits, model(torch.tensor([history[-n:]]))[0, -1], rtol=0, atol=1e-10)
        ]
    assert len(fits) == 1, fits


def test_top_k_and_top_p_keep_only_the_most_likely_tokens():
    logits = torch.tensor([2.0, 1.5, 1.0, -1.0]).log_softmax(0)
    probs = torch.softmax(logits, 0)  # [0.48, 0.29, 0.18, 0.03] (about)
    many = logits.expand(300, -1)
    draws = [uniform(0, i) for i in range(300)]

    def drawn(temperature=1.0, top_k=0, top_p=1.0):
        return set(choose(many, temperature, top_k, top_p, draws)[0].tolist())

    assert drawn() == {0, 1, 2, 3}
    assert drawn(top_k=2) == {0, 1}
    assert drawn(top_p=float(probs[0]) - 1e-3) == {0}
    assert drawn(top_p=float(probs[:2].sum()) + 1e-3) == {0, 1, 2}
    assert drawn(top_p=float(probs[0]) + 1e-3) == {0, 1}
    assert drawn(temperature=0.0, top_k=5, top_p=0.1) == {0}  # temperature 0: greedy
    # A temperature so small that logits / temperature overflow: greedy, not nan.
    assert drawn(temperature=1e-320) == {0}


def test_streaming_holds_back_what_may_become_a_stop_string_or_a_character():
    written: list[str] = []
    printer = StreamPrinter(written.append, ["END", "\n\n"])
    for text in ["a", "ab E", "ab EN", "ab ENx\n", "ab ENx\n\ufffd", "ab ENx\nok"]:
        printer.update(text)
    assert "".join(written) == "ab ENx\nok"
    # "E" and "EN" waited until "x" ruled out "END"; "\n" until "\ufffd" ruled out "\n\n",
    # which waited for the rest of its character.
    assert written == ["a", "b ", "ENx", "\n", "ok"]
    assert continuation(type("T", (), {"decode": staticmethod(lambda ids: "one END two")}), [1], ["END"]) == (
        "one ",
        True,
    )


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sample")
    config = tiny_config(tmp, "run", train={"steps": 2}, checkpoint={"every": 0})
    assert cli.main([write_config(tmp / "run.yaml", config)]) == 0
    return tmp / "run"


def sample(capsys, run_dir, *extra):
    args = ["sample", str(run_dir), "--temperature", "0", "--max-new-tokens", "24", *extra]
    assert cli.main(args) == 0
    return capsys.readouterr()


def test_sample_continues_several_prompts_streamed_or_not_and_stops_at_a_stop_string(run_dir, capsys):
    both = sample(capsys, run_dir, "--prompt", "the quick", "--prompt", "a lazy", "--no-stream")
    assert sample(capsys, run_dir, "--prompt", "the quick", "--prompt", "a lazy").out == both.out
    first = sample(capsys, run_dir, "--prompt", "the quick").out
    second = sample(capsys, run_dir, "--prompt", "a lazy").out
    assert both.out == first + "\n" + second
    assert first.startswith("the quick") and len(first) > len("the quick\n")
    assert "tokens sampled" in both.err and "key/value cache" in both.err
    # A stop string taken from the greedy continuation ends it just before (not printed).
    text = first[len("the quick") : -1]
    stop = text[3:6]
    assert len(stop) == 3, text
    assert sample(capsys, run_dir, "--prompt", "the quick", "--stop", stop).out == (
        "the quick" + text[: text.find(stop)] + "\n"
    )


def test_sample_refuses_a_top_p_outside_its_range(run_dir, capsys):
    assert cli.main(["sample", str(run_dir), "--top-p", "0"]) == 2
    assert "--top-p must be in (0, 1]" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flag", "value", "said"),
    [
        ("--temperature", "nan", "--temperature must be a finite number, 0 or more"),
        ("--temperature", "-1", "--temperature must be a finite number, 0 or more"),
        ("--temperature", "inf", "--temperature must be a finite number, 0 or more"),
        ("--top-k", "-1", "--top-k must be 0 (off) or more"),
        ("--seed", str(2**70), "--seed must fit in 64 bits"),
    ],
)
def test_sample_refuses_sampling_settings_outside_their_range(run_dir, flag, value, said):
    """Before: --temperature nan ended in torch.multinomial's RuntimeError, exit 1."""
    result = forge_run(["sample", run_dir, flag, value])
    assert result.code == 2 and said in result.stderr, result.stderr


# --- sample --chat ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def chat_run(request, tmp_path_factory):
    """``(run, tokenizer folder)``: two steps of chat SFT with a Hugging Face tokenizer
    whose own template is ChatML (``<|im_start|>`` and ``<|im_end|>`` are special tokens)."""
    folder = request.getfixturevalue("hf_folder")
    tmp = tmp_path_factory.mktemp("chat")
    data = tmp / "talk.jsonl"
    data.write_text(json.dumps({"messages": TALK[1:3]}) + "\n")
    config = tiny_config(
        tmp,
        "run",
        data={
            "source": "text",
            "source_options": {"paths": [str(data)]},
            "tokenizer": "hf",
            "tokenizer_options": {"path": str(folder)},
            "packer": "bfd",
            "seq_len": 64,
            "chat": {"format": "messages"},
        },
        train={"steps": 2, "batch_size": 1},
    )
    assert cli.main([write_config(tmp / "run.yaml", config)]) == 0
    return tmp / "run", folder


def test_sample_chat_renders_the_template_keeps_its_special_tokens_and_stops_at_the_end_of_turn(
    chat_run, capsys, monkeypatch
):
    from forge_core.cli import sample as command

    run, folder = chat_run
    tok = hf_tokenizer(folder).tokenizer
    im_start, im_end = tok.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"])
    given: list[list[int]] = []
    reply = tok.encode("Blue.", add_special_tokens=False)

    def sampled(model, rows, sampling, **kwargs):
        given.extend(list(row.ids) for row in rows)
        assert im_end in sampling.eos_ids  # the end of the assistant's turn ends the reply
        return [Completion((*reply, im_end), (0.0,) * (len(reply) + 1), "eos") for _ in rows]

    monkeypatch.setattr(command, "generate_rows", sampled)
    args = ["sample", str(run), "--chat", "--system", "Be brief.", "--prompt", "Name a colour."]
    assert cli.main([*args, "--no-stream"]) == 0
    out = capsys.readouterr().out
    prompt = (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nName a colour.<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert out == prompt + "Blue.\n"
    # The rendered prompt's special tokens are the tokenizer's ids, not their characters.
    assert given[0] == tok.encode(prompt, add_special_tokens=False)
    assert given[0][0] == im_start and given[0].count(im_end) == 2
    assert cli.main(args) == 0 and capsys.readouterr().out == out  # streamed: the same


def test_sample_chat_takes_a_template_file_and_refuses_a_run_without_one(run_dir, tmp_path, capsys):
    """The plain run's byte tokenizer has no template, nor did its data name one."""
    result = forge_run(["sample", str(run_dir), "--chat", "--prompt", "hi"])
    assert result.code == 2 and "Or give a template file with --template FILE." in result.stderr
    template = tmp_path / "chatml.jinja"
    template.write_text(CHATML)
    args = ["--chat", "--prompt", "hi", "--template", str(template), "--max-new-tokens", "4"]
    out = sample(capsys, run_dir, *args).out
    assert out.startswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    for wrong, said in (
        (["--system", "x"], "--system and --template render a chat prompt: add --chat."),
        (["--chat"], "sample --chat needs --prompt TEXT"),
    ):
        result = forge_run(["sample", str(run_dir), *wrong])
        assert result.code == 2 and said in result.stderr, result.stderr


def test_sample_takes_prompts_from_a_file_and_several_samples_of_each_in_order(run_dir, tmp_path, capsys):
    """Sampled (temperature 1): each continuation is a function of the seed and its
    prompt and sample index, so batches of one give what batches of four give."""
    lines = tmp_path / "prompts.txt"
    lines.write_text("the quick\n\na lazy\n")
    jsonl = tmp_path / "prompts.jsonl"
    jsonl.write_text('"the quick"\n{"prompt": "a lazy"}\n')
    args = ["--temperature", "1", "--max-new-tokens", "8", "--num-samples", "2"]
    together = sample(capsys, run_dir, "--prompts", str(lines), *args, "--batch-size", "4")
    one_by_one = sample(capsys, run_dir, "--prompts", str(jsonl), *args, "--batch-size", "1")
    assert together.out == one_by_one.out
    assert "forge: sample: 2/4 continuations" in one_by_one.err and "forge: sample:" not in together.err
    # In order, prompt after prompt: a prompt at the same index gives what it gives alone
    # (a draw depends on the prompt's index, so "a lazy" first is sampled otherwise).
    quick = sample(capsys, run_dir, "--prompt", "the quick", *args).out
    lazy = sample(capsys, run_dir, "--prompt", "a lazy", *args).out
    assert together.out.startswith(quick + "\n") and together.out.count("\na lazy") == 2
    one = sample(capsys, run_dir, "--prompt", "the quick", *args[:-1], "1").out
    assert quick.startswith(one) and quick != one + "\n" + one  # the control: two samples differ
    mixed = sample(capsys, run_dir, "--prompt", "a lazy", "--prompts", str(jsonl), *args).out
    assert mixed.startswith(lazy + "\nthe quick")  # --prompt first, then the file


@pytest.mark.parametrize(
    ("content", "said"),
    [
        ('"ok"\n{"text": "x"}\n', 'prompts.jsonl:2: a JSONL prompt is a string or an object with a "prompt"'),
        ("not json\n", "prompts.jsonl:1: not JSON"),
    ],
)
def test_sample_refuses_a_prompts_file_it_cannot_read_naming_the_line(run_dir, tmp_path, content, said):
    path = tmp_path / "prompts.jsonl"
    path.write_text(content)
    result = forge_run(["sample", run_dir, "--prompts", str(path)])
    assert result.code == 2 and said in result.stderr, result.stderr
    missing = forge_run(["sample", run_dir, "--prompts", str(tmp_path / "none.txt")])
    assert missing.code == 2 and "cannot be read" in missing.stderr
    zero = forge_run(["sample", run_dir, "--num-samples", "0"])
    assert zero.code == 2 and "--num-samples must be 1 or more, got 0" in zero.stderr
