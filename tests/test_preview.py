"""``forge-run preview``: the rows a config trains on, with the tokens that take a loss
marked. The marks are the trainer's labels: on chat data (a ChatML template without a
generation block) and on plain text, the marked tokens of the first ``train.batch_size``
rows are exactly the labelled tokens of the run's first step."""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_chat_data import TALK, chat_config
from train_helpers import Recorder, tiny_config, write_config, write_corpus

from forge_core.api import IGNORE_INDEX
from forge_core.cli.preview import row_preview
from forge_core.testing import forge_run, train_in_process

RECORDS = [
    {"messages": TALK},
    {"messages": [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Blue."}]},
    {"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4."}]},
    {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello there."}]},
]


def chat_run(tmp_path, records):
    """A tiny run of ``records`` (ChatML, byte tokenizer, bfd) with rows that hold them."""
    cfg = chat_config(tmp_path, records)
    cfg["data"]["seq_len"] = cfg["model"]["options"]["max_seq_len"] = 160
    return cfg


def first_step_tokens(config_path: str) -> int:
    """The labelled tokens of the first step of a run of ``config_path``, as the trainer
    counted them (its ``tokens`` metric)."""
    recorder = Recorder()
    assert train_in_process(config_path, ["train.steps=1"], [("recorder", recorder)]) == "completed"
    return int(recorder.metrics[1]["tokens"])


def preview(config_path: str, *extra: str) -> dict:
    result = forge_run(["preview", config_path, "--json", *extra])
    assert result.code == 0, result.stderr
    return json.loads(result.stdout)


def trained_text(row: dict) -> str:
    return "".join(t["text"] if t["trained"] else "|" for t in row["tokens"])


@pytest.mark.parametrize("data", ["chat", "text"])
def test_the_marked_tokens_are_the_labelled_tokens_of_the_first_step(tmp_path, data):
    if data == "chat":
        cfg = chat_run(tmp_path, RECORDS)
    else:
        write_corpus(tmp_path / "corpus", short=True)  # EOS boundaries, labelled -100, in every row
        cfg = tiny_config(tmp_path, "text")
    path = write_config(tmp_path / "run.yaml", cfg)
    batch = cfg["train"]["batch_size"]
    shown = preview(path, "--rows", str(batch))
    assert len(shown["rows"]) == batch
    assert shown["labelled"] == sum(r["labelled"] for r in shown["rows"])
    assert shown["labelled"] == sum(t["trained"] for r in shown["rows"] for t in r["tokens"])
    assert shown["labelled"] == first_step_tokens(path)
    if data == "chat":
        marked = "".join(trained_text(r) for r in shown["rows"])
        # What trains is the answers and the end of their turns, never a header or a prompt.
        assert "<|im_start|>" not in marked and "user" not in marked and "Name a colour" not in marked
        assert any(
            a in marked for a in ("Blue.<|im_end|>\n", "Rouge, c'est rouge.<|im_end|>\n", "4.<|im_end|>")
        )
    else:
        assert 0 < shown["labelled"] < shown["tokens"]  # EOS boundaries and padding take no loss


def test_the_printed_rows_mark_the_answers_and_count_them(tmp_path):
    path = write_config(tmp_path / "run.yaml", chat_run(tmp_path, RECORDS[1:2]))
    result = forge_run(["preview", path, "--rows", "5"])
    assert result.code == 0, result.stderr
    out = result.stdout
    prompt = "<|im_start|>user\nName a colour.<|im_end|>\n<|im_start|>assistant\n"
    assert prompt + "[[Blue.<|im_end|>\n<|endoftext|>]]" in out
    # One conversation, one row: 5 + 11 + 1 bytes take a loss, the rest is prompt and padding.
    assert "--- row 1 (layout row 0): 17 of 160 tokens take a loss" in out
    assert "1 row(s): 17 of 160 tokens (10.6%) take a loss (marked [[ ]])" in out


def test_a_row_shows_the_token_its_last_label_names_and_counts_its_padding():
    ids = np.array([5, 6, 7, 8, 9, 9])
    labels = np.array([6, IGNORE_INDEX, 8, 9, IGNORE_INDEX, IGNORE_INDEX])
    shown = row_preview(3, ids, labels, pad_id=9)
    assert shown.ids == [5, 6, 7, 8, 9, 9] and shown.trained == [False, True, False, True, True, False]
    assert shown.labelled == 3 and shown.padding == 1  # the 9 a label names is not padding
    continued = row_preview(0, np.array([1, 2]), np.array([2, 3]), pad_id=0)
    assert continued.ids == [1, 2, 3] and continued.trained == [False, True, True]
    assert continued.labelled == 2 and continued.length == 2


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (["--rows", "0"], "--rows must be 1 or more, got 0"),
        (["data.stream.enabled=true"], "a streamed source is packed while training runs"),
        (["train.grad_accum=3"], "[train.batch-divisible]"),
    ],
)
def test_preview_refuses_what_it_cannot_show_with_the_fix(tmp_path, extra, said):
    path = write_config(tmp_path / "run.yaml", tiny_config(tmp_path))
    result = forge_run(["preview", path, *extra])
    assert result.code == 2 and said in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
