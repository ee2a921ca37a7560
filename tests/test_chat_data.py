"""Chat SFT and preference data: records rendered by a chat template (a local tokenizer
folder's own, trained here with ``tokenizers``, or a template file), labels exactly the
assistant tokens, packed conversations equal to each alone in float64, the counted
truncation policy, preference pairs as one unit of two documents, and what ``forge-run
check`` refuses without building anything."""

from __future__ import annotations

import json

import numpy as np
import pytest
from train_helpers import tiny_config, write_config

from forge_core import cli
from forge_core.api import DOC_IDS, IGNORE_INDEX, INPUT_IDS, LABELS, POSITIONS, ForgeError
from forge_core.config.schema import CacheSection, ChatSection
from forge_core.data.build import source_shards
from forge_core.data.chat import ChatDocuments, chat_stream
from forge_core.data.packed_rows import PackedRows
from forge_plugins.packers.bfd import BfdPacker
from forge_plugins.sources.options import TextOptions
from forge_plugins.sources.text import TextSource
from forge_plugins.tokenizers.byte import ByteTokenizer
from forge_plugins.tokenizers.chat import ChatTemplate

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# ChatML without an add_generation_prompt branch: nothing tells the header from the answer.
NO_PROMPT = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
# The same layout, the assistant's content marked: only it takes a loss.
MARKED = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.role == 'assistant' %}{% generation %}{{ m.content }}{% endgeneration %}"
    "{% else %}{{ m.content }}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# Rewrites earlier answers: rendering a prefix is not the start of the whole.
UNSTABLE = (
    "{% for m in messages %}{% if m.role == 'assistant' and not loop.last %}[answer]"
    "{% else %}{{ m.role }}: {{ m.content }}\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)

TALK = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Name a colour."},
    {"role": "assistant", "content": "Blue."},
    {"role": "user", "content": "Another one, in French?"},
    {"role": "assistant", "content": "Rouge, c'est rouge."},
]


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory):
    """A tiny BPE tokenizer trained here, saved with ChatML special tokens and a chat
    template of its own."""
    pytest.importorskip("transformers")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<unk>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    corpus = [m["content"] for m in TALK] * 20 + ["system user assistant"] * 20
    tok.train_from_iterator(
        corpus,
        trainers.BpeTrainer(
            vocab_size=300, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        ),
    )
    folder = tmp_path_factory.mktemp("tok") / "chatml"
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", unk_token="<unk>")
    fast.chat_template = CHATML
    fast.save_pretrained(folder)
    return folder


def hf_tokenizer(folder):
    from forge_plugins.tokenizers.hf import HFTokenizer
    from forge_plugins.tokenizers.options import HFOptions

    return HFTokenizer(HFOptions(path=str(folder)))


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def rows_of(tmp_path, records, tokenizer, seq_len=128, **chat):
    """Every row a run reads of ``records`` (a .jsonl through the text source, the token
    cache, the chat stream and bfd), and what the truncation did."""
    chat = ChatSection(format=chat.pop("format", "messages"), **chat)
    data = write_jsonl(tmp_path / f"chat-{len(list(tmp_path.iterdir()))}.jsonl", records)
    source = ChatDocuments(TextSource(TextOptions(paths=[str(data)])), tokenizer, chat)
    cache = CacheSection(dir=str(tmp_path / "cache"))
    shards, _ = source_shards(source, tokenizer, cache, "chat", report=lambda m: None)
    stream, truncation = chat_stream(
        shards, np.arange(shards.num_documents), tokenizer.eos_id, tokenizer.vocab_size, chat, seq_len
    )
    packer = BfdPacker(None, seq_len=seq_len, eos_id=tokenizer.eos_id, pad_id=tokenizer.pad_id)
    rows = PackedRows(
        packer.layout(stream.lengths.copy()), stream, eos_id=tokenizer.eos_id, pad_id=tokenizer.pad_id
    )
    return rows.read(np.arange(rows.num_rows)), truncation


def labelled(out):
    """The tokens that are targets, in row order."""
    labels = out[LABELS].reshape(-1)
    return labels[labels != IGNORE_INDEX].tolist()


@pytest.mark.parametrize("template, trained", [(CHATML, "{}<|im_end|>\n"), (MARKED, "{}")])
def test_labels_are_exactly_the_assistant_tokens_of_the_rendering(hf_folder, tmp_path, template, trained):
    tok = hf_tokenizer(hf_folder)
    path = tmp_path / "template.jinja"
    path.write_text(template)
    out, _ = rows_of(tmp_path, [{"messages": TALK}], tok, template=str(path) if template is MARKED else "")
    # The template's rendering, written out by hand, and its pieces encoded alone: the
    # special tokens cut the text, so the pieces encode as they do inside the whole.
    assistant = [trained.format(m["content"]) for m in TALK if m["role"] == "assistant"]
    text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in TALK)
    ids = tok.encode(text)
    assert out[INPUT_IDS][0, : len(ids) + 1].tolist() == [*ids, tok.eos_id]
    # transformers renders the folder's template to the same text and, for the marked
    # one, finds the same assistant tokens.
    hf = tok.tokenizer
    assert hf.apply_chat_template(TALK, chat_template=template, tokenize=False) == text
    if template is MARKED:
        marked = hf.apply_chat_template(
            TALK, chat_template=template, return_dict=True, return_assistant_tokens_mask=True
        )
        assert marked["input_ids"] == ids
        mask = np.asarray(marked["assistant_masks"], bool)
        assert (out[LABELS][0, : len(ids) - 1] != IGNORE_INDEX).tolist() == mask[1:].tolist()
    targets = labelled(out)
    want = [t for piece in assistant for t in tok.encode(piece)]
    # The EOS the stream appends trains only after a trained last token.
    assert targets == want + ([tok.eos_id] if template is CHATML else [])
    assert tok.decode(targets) == "".join(assistant).replace("<|im_end|>", "")


def test_chatml_trains_exactly_the_answers_and_their_end_of_turn_counted_by_hand(tmp_path):
    path = tmp_path / "chatml.jinja"
    path.write_text(CHATML)
    talk = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello"},
        {"role": "user", "content": "Bye"},
        {"role": "assistant", "content": "Ciao"},
    ]
    out, _ = rows_of(tmp_path, [{"messages": talk}], ByteTokenizer(), seq_len=256, template=str(path))
    # One byte a token: "Hello" 5 + "<|im_end|>" 10 + "\n" 1, "Ciao" 4 + 10 + 1, and the EOS
    # after the trained last token: 32. The header "<|im_start|>assistant\n" (22 bytes a turn)
    # is not among them; trained, it would make 76.
    targets = labelled(out)
    assert len(targets) == 32
    assert bytes(targets[:-1]).decode() == "Hello<|im_end|>\nCiao<|im_end|>\n"


def test_a_template_without_a_generation_prompt_is_refused_with_the_fix(tmp_path):
    path = tmp_path / "no-prompt.jinja"
    path.write_text(NO_PROMPT)
    for chat in ({"format": "messages"}, {"format": "prompt_completion"}):
        record = {"messages": TALK} if chat["format"] == "messages" else {"prompt": "Hi", "completion": "Yo"}
        with pytest.raises(ForgeError) as refused:
            rows_of(tmp_path, [record], ByteTokenizer(), template=str(path), **chat)
        message = str(refused.value)
        assert "chat-" in message and "line 1: " in message and "no-prompt.jinja: " in message
        assert "writes nothing for add_generation_prompt" in message
        assert "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}" in message
        assert "{% generation %}" in message


@pytest.mark.parametrize("shape", ["parquet", "saved"])
def test_records_from_parquet_and_a_saved_datasets_folder_read_as_the_jsonl(tmp_path, shape):
    datasets = pytest.importorskip("datasets")
    from forge_plugins.sources.hf_datasets import HFDatasetsSource
    from forge_plugins.sources.options import HFDatasetsOptions

    path = tmp_path / "chatml.jinja"
    path.write_text(CHATML)
    records = [{"prompt": f"q{i}", "completion": "a" * (i + 1)} for i in range(4)]
    byte, chat = ByteTokenizer(), ChatSection(format="prompt_completion", template=str(path))
    table = datasets.Dataset.from_list(records)
    if shape == "parquet":
        table.to_parquet(tmp_path / "chat.parquet")
        options = HFDatasetsOptions(data_files=[str(tmp_path / "chat.parquet")])
    else:
        table.save_to_disk(tmp_path / "saved")
        options = HFDatasetsOptions(path=str(tmp_path / "saved"))
    got = list(ChatDocuments(HFDatasetsSource(options), byte, chat).documents())
    data = write_jsonl(tmp_path / "chat.jsonl", records)
    want = list(ChatDocuments(TextSource(TextOptions(paths=[str(data)])), byte, chat).documents())
    assert len(got) == len(want) == 4
    for a, b in zip(got, want):
        assert a.ids.tolist() == b.ids.tolist() and a.trainable.tolist() == b.trainable.tolist()


def test_a_template_that_is_not_prefix_stable_is_refused_naming_the_message(tmp_path):
    path = tmp_path / "unstable.jinja"
    path.write_text(UNSTABLE)
    with pytest.raises(
        ForgeError, match=r"unstable.jinja: the chat template is not prefix-stable.*message 2"
    ):
        rows_of(tmp_path, [{"messages": TALK}], ByteTokenizer(), template=str(path))


def test_loss_all_trains_every_token_and_prompt_completion_only_the_completion(tmp_path):
    path = tmp_path / "chatml.jinja"
    path.write_text(CHATML)
    byte = ByteTokenizer()
    record = {"prompt": "2+2?", "completion": "4"}
    out, _ = rows_of(tmp_path, [record], byte, format="prompt_completion", template=str(path))
    assert bytes(labelled(out)[:-1]).decode() == "4<|im_end|>\n"
    out, _ = rows_of(tmp_path, [record], byte, format="prompt_completion", template=str(path), loss="all")
    text = "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n"
    assert labelled(out) == [*text.encode()[1:], byte.eos_id]
    # Every token trains, so no assistant span is looked for: a template without a
    # generation prompt, or one that is not prefix-stable, renders.
    for name, source in (("no-prompt", NO_PROMPT), ("unstable", UNSTABLE)):
        path = tmp_path / f"{name}.jinja"
        path.write_text(source)
        out, _ = rows_of(tmp_path, [{"messages": TALK}], byte, seq_len=256, template=str(path), loss="all")
        assert len(labelled(out)) == len(ChatTemplate(source, "t").render(TALK, False)[0]), name


def test_truncation_drops_or_cuts_the_prompt_and_counts_what_it_did(tmp_path):
    path = tmp_path / "chatml.jinja"
    path.write_text(CHATML)
    short = {"prompt": "hi", "completion": "yo"}  # 65 bytes rendered
    long_prompt = {"prompt": "x" * 60, "completion": "ok"}  # the prompt can go
    long_answer = {"prompt": "hi", "completion": "y" * 80}  # cutting would reach the answer
    records = [short, long_prompt, long_answer]
    kw = dict(format="prompt_completion", template=str(path), seq_len=80)
    out, report = rows_of(tmp_path, records, ByteTokenizer(), **kw)
    assert (report.units, report.too_long, report.dropped, report.cut) == (3, 2, 2, 0)
    assert out[INPUT_IDS].shape[0] == 1
    out, report = rows_of(tmp_path, records, ByteTokenizer(), truncation="cut_prompt", **kw)
    assert (report.units, report.too_long, report.dropped, report.cut) == (3, 2, 1, 1)
    assert report.note(80, "prompt_completion") == (
        "chat: 3 conversations, 2 longer than seq_len 80: 1 dropped, 1 cut from the left of their prompt"
    )
    # The cut one keeps its whole answer, and fits exactly.
    answers = [bytes(r[r != IGNORE_INDEX][:-1].tolist()).decode() for r in out[LABELS]]
    assert sorted(answers) == ["ok<|im_end|>\n", "yo<|im_end|>\n"]


def test_a_preference_pair_is_one_unit_of_two_documents_chosen_first(tmp_path):
    path = tmp_path / "chatml.jinja"
    path.write_text(CHATML)
    byte = ByteTokenizer()
    pairs = [{"prompt": f"q{i}" * (i + 1), "chosen": "yes" * (i + 1), "rejected": "no"} for i in range(5)]
    out, report = rows_of(tmp_path, pairs, byte, format="preference", template=str(path), seq_len=512)
    assert report.note(512, "preference") == "chat: 5 pairs"
    assert out[INPUT_IDS].shape[0] < 5  # several pairs share a row
    seen = 0
    for ids, labels, doc, pos in zip(out[INPUT_IDS], out[LABELS], out[DOC_IDS], out[POSITIONS]):
        real = ids != byte.pad_id
        docs = np.unique(doc[real])
        assert len(docs) % 2 == 0  # whole pairs only
        for k in range(0, len(docs), 2):
            chosen, rejected = (np.flatnonzero(doc == d) for d in docs[k : k + 2])
            assert rejected[0] == chosen[-1] + 1 and pos[chosen[0]] == pos[rejected[0]] == 0
            ctext, rtext = (bytes(ids[span][:-1].tolist()).decode() for span in (chosen, rejected))
            prompt = ctext[: ctext.index("<|im_start|>assistant\n")]
            assert rtext.startswith(prompt) and ctext[len(prompt) :].startswith("<|im_start|>assistant\nyes")
            assert rtext[len(prompt) :] == "<|im_start|>assistant\nno<|im_end|>\n"
            # Labels: only the completions (each ending with its EOS); the EOS inside the
            # unit predicts nothing of the other half.
            for span, answer in ((chosen, ctext[len(prompt) + 22 :]), (rejected, "no<|im_end|>\n")):
                got = labels[span][labels[span] != IGNORE_INDEX].tolist()
                assert got == [*answer.encode(), byte.eos_id]
            assert labels[chosen[-1]] == IGNORE_INDEX
            seen += 1
    assert seen == 5


@pytest.mark.numerical
def test_packed_conversations_equal_each_alone_in_float64(tmp_path):
    import torch

    from forge_core.testing import assert_within_rounding, longest_sum
    from forge_plugins.attention.options import SdpaOptions
    from forge_plugins.attention.sdpa import SdpaAttention
    from forge_plugins.models.llama import build
    from forge_plugins.models.options import LlamaOptions

    path = tmp_path / "chatml.jinja"
    path.write_text(CHATML)
    byte = ByteTokenizer()
    records = [{"prompt": "p" * (3 + 5 * i), "completion": "c" * (2 + 3 * i)} for i in range(6)]
    kw = dict(format="prompt_completion", template=str(path))
    packed, _ = rows_of(tmp_path, records, byte, seq_len=192, **kw)
    assert packed[INPUT_IDS].shape[0] < len(records)
    torch.manual_seed(0)
    options = LlamaOptions(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=192, init_std=0.2)
    model = build(options, vocab_size=byte.vocab_size, attention=SdpaAttention(SdpaOptions())).double()
    t = {k: torch.as_tensor(v) for k, v in packed.items()}
    logits = model(t[INPUT_IDS], doc_ids=t[DOC_IDS], positions=t[POSITIONS])
    loss = torch.nn.functional.cross_entropy(
        logits.flatten(0, 1), t[LABELS].flatten(), ignore_index=IGNORE_INDEX, reduction="none"
    ).view_as(t[LABELS])
    found = 0
    for r in range(len(t[INPUT_IDS])):
        for d in t[DOC_IDS][r].unique().tolist():
            span = torch.nonzero(t[DOC_IDS][r] == d).flatten()
            ids = t[INPUT_IDS][r, span]
            if (ids == byte.pad_id).all():
                continue
            alone = model(ids[None])[0]
            alone_loss = torch.nn.functional.cross_entropy(
                alone, t[LABELS][r, span], ignore_index=IGNORE_INDEX, reduction="none"
            )
            terms = longest_sum(model, len(span))
            assert_within_rounding(logits[r, span], alone, dtype=torch.float64, terms=terms, what="logits")
            assert_within_rounding(loss[r, span], alone_loss, dtype=torch.float64, terms=terms, what="loss")
            found += 1
    assert found == len(records)


def chat_config(tmp_path, records, **chat):
    data = write_jsonl(tmp_path / "talk.jsonl", records)
    template = tmp_path / "chatml.jinja"
    template.write_text(CHATML)
    chat = {"format": "messages", "template": str(template), **chat}
    return tiny_config(
        tmp_path,
        "chat",
        data={
            "source": "text",
            "source_options": {"paths": [str(data)]},
            "tokenizer": "byte",
            "packer": "bfd",
            "seq_len": 64,
            "chat": chat,
        },
        train={"steps": 2, "batch_size": 2, "lr": 3e-3, "warmup_steps": 1, "peak_tflops": 1.0},
    )


def check(tmp_path, cfg, capsys):
    code = cli.main(["check", write_config(tmp_path / "check.yaml", cfg)])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_check_judges_fields_template_and_packer_without_building(tmp_path, capsys):
    short = [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}]
    cfg = chat_config(tmp_path, short)
    assert check(tmp_path, cfg, capsys)[0] == 0
    cases = [
        ({"format": "preference"}, "reads 'chosen' and 'rejected', which the first record of"),
        ({"template": str(tmp_path / "nope.jinja")}, "data.chat.template: cannot read"),
        ({"template": ""}, "the byte tokenizer has no chat template of its own"),
    ]
    for change, message in cases:
        code, out = check(
            tmp_path, {**cfg, "data": {**cfg["data"], "chat": {**cfg["data"]["chat"], **change}}}, capsys
        )
        assert code == 2 and message in out and "Traceback" not in out, (change, out)
    no_prompt = tmp_path / "no-prompt.jinja"
    no_prompt.write_text(NO_PROMPT)
    for loss, refused in (("assistant", True), ("all", False)):
        change = {"template": str(no_prompt), "loss": loss}
        code, out = check(
            tmp_path, {**cfg, "data": {**cfg["data"], "chat": {**cfg["data"]["chat"], **change}}}, capsys
        )
        assert (code, "writes nothing for add_generation_prompt" in out) == (
            (2, True) if refused else (0, False)
        )
    broken = tmp_path / "broken.jinja"
    broken.write_text("{% for m in messages %}{{ m.content }")
    code, out = check(
        tmp_path,
        {**cfg, "data": {**cfg["data"], "chat": {**cfg["data"]["chat"], "template": str(broken)}}},
        capsys,
    )
    assert code == 2 and "broken.jinja, line 1: not a valid Jinja chat template" in out
    pair = [{"prompt": "hi", "chosen": "yo", "rejected": "no"}]
    cfg = chat_config(tmp_path, pair, format="preference")
    for packer, rule in (("concat", "concat.pairs"), ("none", "data.chat-pairs-isolated")):
        code, out = check(tmp_path, {**cfg, "data": {**cfg["data"], "packer": packer}}, capsys)
        assert code == 2 and rule in out, out
    assert check(tmp_path, cfg, capsys)[0] == 0


def test_check_finds_a_tokenizer_folder_without_a_chat_template(hf_folder, tmp_path, capsys):
    import shutil

    bare = tmp_path / "bare"
    shutil.copytree(hf_folder, bare)
    config = json.loads((bare / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (bare / "tokenizer_config.json").write_text(json.dumps(config))
    (bare / "chat_template.jinja").unlink(missing_ok=True)
    cfg = chat_config(tmp_path, [{"messages": TALK}], template="")
    cfg["data"].update(tokenizer="hf", tokenizer_options={"path": str(hf_folder)})
    assert check(tmp_path, cfg, capsys)[0] == 0
    cfg["data"]["tokenizer_options"] = {"path": str(bare)}
    code, out = check(tmp_path, cfg, capsys)
    assert code == 2 and f"the tokenizer folder {bare} has no chat template" in out


def test_the_chat_sft_section_of_the_fine_tuning_page_runs_as_pasted(tmp_path):
    from doc_chapters import REPO, play

    page = (REPO / "docs" / "fine-tuning.md").read_text()
    start = page.index("## Chat SFT")
    end = page.find("\n## ", start + 1)
    play(page[start : end if end > 0 else None], tmp_path, "docs/fine-tuning.md#chat-sft")


def test_check_reads_the_columns_of_a_parquet_file_for_the_chat_fields(tmp_path, capsys):
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_list([{"prompt": "hi", "answer": "yo"}]).to_parquet(tmp_path / "chat.parquet")
    cfg = chat_config(tmp_path, [], format="prompt_completion")
    cfg["data"].update(source="hf_datasets", source_options={"data_files": [str(tmp_path / "chat.parquet")]})
    code, out = check(tmp_path, cfg, capsys)
    assert code == 2 and "reads 'completion', which the first record of" in out
    assert "(fields: prompt, answer)" in out
    # Chat columns without data.chat: not a text column to suggest, the chat format.
    datasets.Dataset.from_list([{"prompt": "hi", "completion": "yo"}]).to_parquet(tmp_path / "chat.parquet")
    del cfg["data"]["chat"]
    code, out = check(tmp_path, cfg, capsys)
    assert (
        code == 2 and "'text' is not a field of" in out and "set data.chat.format: prompt_completion" in out
    )


def test_check_refuses_chat_records_read_as_text_and_names_the_format(tmp_path, capsys):
    cases = [
        ({"prompt": "hi", "completion": "yo"}, "prompt_completion"),
        ({"messages": [{"role": "user", "content": "hi"}]}, "messages"),
        ({"prompt": "hi", "chosen": "yo", "rejected": "no"}, "preference"),
    ]
    for record, fmt in cases:
        cfg = chat_config(tmp_path, [record])
        del cfg["data"]["chat"]
        code, out = check(tmp_path, cfg, capsys)
        assert code == 2 and "text.chat-records" in out and "has no field 'text'" in out, out
        assert f"set data.chat.format: {fmt} to render them" in out and "Traceback" not in out
        # What the build says, had check not been run.
        with pytest.raises(ForgeError, match=f"line 1: no field 'text'.*set data.chat.format: {fmt}"):
            list(TextSource(TextOptions(paths=[str(tmp_path / "talk.jsonl")])).documents())
    cfg = chat_config(tmp_path, [{"text": "plain text", "prompt": "a column too"}])
    del cfg["data"]["chat"]
    assert check(tmp_path, cfg, capsys)[0] == 0


@pytest.mark.parametrize(
    "record, message",
    [
        ({"text": "hi"}, r"chat-\d+.jsonl, line 2: no field 'messages' \(fields: text\)"),
        ({"messages": "hi"}, r"line 2: field 'messages' is str 'hi'; it must be a list of messages"),
        ({"messages": [{"content": "hi"}]}, r"line 2: messages\[0\] is dict .* a string \"role\""),
        (
            {"messages": [{"role": "user", "content": "hi"}]},
            r"line 2: the conversation has no assistant message",
        ),
        (
            {"messages": [{"role": "user", "content": None}, {"role": "assistant", "content": "yo"}]},
            r"line 2: messages\[0\]\.content is NoneType None, not a string: it would be trained as the "
            r"text 'None'",
        ),
        (
            {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": 5}]},
            r"line 2: messages\[1\]\.content is int 5, not a string",
        ),
        (
            {"messages": [{"role": "user", "content": float("nan")}, {"role": "assistant", "content": "yo"}]},
            r"line 2: messages\[0\]\.content is float nan, not a string: .* as the text 'nan'",
        ),
        (
            {
                "prompt": [{"role": "user", "content": [{"type": "image", "url": "x.png"}]}],
                "completion": "yo",
            },
            r"line 2: prompt\[0\]\.content\[0\] is a part of type 'image'; .* only text parts",
        ),
    ],
)
def test_a_malformed_record_is_refused_naming_its_file_line_and_field(tmp_path, record, message):
    path = tmp_path / "chatml.jinja"
    path.write_text(CHATML)
    good = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}
    fmt = "prompt_completion" if "prompt" in record else "messages"
    good = {"prompt": "hi", "completion": "yo"} if fmt == "prompt_completion" else good
    with pytest.raises(ForgeError, match=message):
        rows_of(tmp_path, [good, record], ByteTokenizer(), template=str(path), format=fmt)


def test_text_parts_read_as_their_joined_text_and_a_tool_call_may_have_no_content(tmp_path):
    path = tmp_path / "chatml.jinja"
    path.write_text(CHATML)
    byte = ByteTokenizer()
    parts = [{"type": "text", "text": "Name a "}, {"type": "text", "text": "colour."}]
    plain = {
        "messages": [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Blue."}]
    }
    split = {"messages": [{"role": "user", "content": parts}, {"role": "assistant", "content": "Blue."}]}
    a, _ = rows_of(tmp_path, [plain], byte, template=str(path))
    b, _ = rows_of(tmp_path, [split], byte, template=str(path))
    assert a[INPUT_IDS].tolist() == b[INPUT_IDS].tolist() and a[LABELS].tolist() == b[LABELS].tolist()
    call = {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"function": {"name": "f", "arguments": {}}}],
    }
    talk = [{"role": "user", "content": "hi"}, call, {"role": "tool", "content": "1"}, *plain["messages"][1:]]
    tools = tmp_path / "tools.jinja"
    tools.write_text(CHATML.replace("{{ m.content }}", "{{ m.content if m.content is string else 'call' }}"))
    out, _ = rows_of(tmp_path, [{"messages": talk}], byte, seq_len=256, template=str(tools))
    assert bytes(labelled(out)[:-1]).decode() == "call<|im_end|>\nBlue.<|im_end|>\n"


def test_a_pair_stays_on_one_side_of_the_heldout_split(tmp_path):
    from forge_core.config.schema import HeldoutSection
    from forge_core.data.build import split_documents

    path = tmp_path / "chatml.jinja"
    path.write_text(CHATML)
    chat = ChatSection(format="preference", template=str(path))
    pairs = [{"prompt": f"q{i}", "chosen": "yes", "rejected": f"no{i}"} for i in range(40)]
    data = write_jsonl(tmp_path / "pairs.jsonl", pairs)
    byte = ByteTokenizer()
    source = ChatDocuments(TextSource(TextOptions(paths=[str(data)])), byte, chat)
    shards, _ = source_shards(source, byte, CacheSection(dir=str(tmp_path / "c")), "p", report=lambda m: None)
    train, held = split_documents(shards, HeldoutSection(fraction=0.3))
    sizes = [
        len(chat_stream(shards, side, byte.eos_id, byte.vocab_size, chat, 256)[0]) for side in (train, held)
    ]
    assert sum(sizes) == 40 and min(sizes) > 0


def test_pairs_that_cannot_teach_are_counted_and_refused_when_every_pair_is_one(tmp_path, capsys):
    """Identical chosen and rejected completions (the margin is 0 whatever the model) and
    empty completions: some are a warning with their count and the first record, all of
    them a ForgeError naming the source. Good pairs alone say nothing."""
    path = tmp_path / "chatml.jinja"
    path.write_text(CHATML)
    byte = ByteTokenizer()
    good = [{"prompt": f"q{i}", "chosen": "yes", "rejected": f"no{i}"} for i in range(4)]
    same = {"prompt": "q", "chosen": "same", "rejected": "same"}
    empty = {"prompt": "q", "chosen": "yes", "rejected": " "}
    rows_of(tmp_path, good, byte, format="preference", template=str(path), seq_len=256)
    assert "cannot teach" not in capsys.readouterr().err
    rows_of(tmp_path, [*good, same, empty], byte, format="preference", template=str(path), seq_len=256)
    err = capsys.readouterr().err
    assert "warning: " in err and "2 of 6 preference pairs cannot teach" in err
    assert "1 with the same chosen and rejected completion" in err and "1 with an empty completion" in err
    assert ".jsonl, line 5" in err  # the first such record
    for pairs in ([same, same], [same, empty, {"prompt": "p", "chosen": "", "rejected": "no"}]):
        refused = rf"none of its {len(pairs)} preference pairs can teach.*'chosen'"
        with pytest.raises(ForgeError, match=refused):
            rows_of(tmp_path, pairs, byte, format="preference", template=str(path), seq_len=256)


def test_prepared_pair_shards_train_as_the_cached_ones(tmp_path):
    from forge_core.api.unstable import Shards
    from forge_core.data.prepare import prepare

    path = tmp_path / "chatml.jinja"
    path.write_text(CHATML)
    chat = ChatSection(format="preference", template=str(path))
    data = write_jsonl(tmp_path / "pairs.jsonl", [{"prompt": "q", "chosen": "yes", "rejected": "no"}] * 3)
    byte = ByteTokenizer()
    source = ChatDocuments(TextSource(TextOptions(paths=[str(data)])), byte, chat)
    prepare(source, byte, tmp_path / "shards", progress=False, report=lambda m: None)
    prepared = Shards(tmp_path / "shards")
    cached, _ = source_shards(source, byte, CacheSection(dir=str(tmp_path / "c")), "p", report=lambda m: None)
    streams = [
        chat_stream(s, np.arange(s.num_documents), byte.eos_id, byte.vocab_size, chat, 256)[0]
        for s in (prepared, cached)
    ]
    assert np.array_equal(streams[0].inner, streams[1].inner) and len(streams[0]) == 3
    assert np.array_equal(np.asarray(prepared.trainable), np.asarray(cached.trainable))
    # A shard of text documents is not pair data.
    with pytest.raises(ForgeError, match="do not hold whole pairs"):
        chat_stream(prepared, np.arange(5), byte.eos_id, byte.vocab_size, chat, 128)
