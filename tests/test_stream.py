"""Streaming: an endless source reaches its first batch having read a bounded prefix;
``concat`` over windows gives exactly the whole stream's rows and ``bfd`` places every
token once; ranks read disjoint documents that together are the stream; the end of the
stream starts a new pass; a restored loader gives bit-identical batches (mid-window,
across windows and passes); what check refuses under a stream; and a streamed run
trains and resumes exactly through the trainer and the CLI."""

from __future__ import annotations

import itertools
import json
import threading
from collections import Counter

import numpy as np
import pytest
from train_helpers import Recorder, SignalAt, tiny_config, write_config, write_corpus

from forge_core.api import ForgeError
from forge_core.data.packed_rows import PackedRows, check_layout, pack_documents
from forge_core.data.stream import StreamingLoader, rank_documents
from forge_core.train.train_state import decode, encode
from forge_plugins.packers.bfd import BfdPacker
from forge_plugins.packers.concat import ConcatPacker
from forge_plugins.packers.options import ConcatOptions
from forge_plugins.tokenizers.byte import EOS, PAD, ByteTokenizer

S = 16


def text(i: int) -> str:
    """Document ``i``: its number, then a run of letters of a length that varies a lot
    (1 to 60 characters), so documents cross windows and rows unevenly."""
    return f"{i}:" + "abcdefghij"[i % 10] * (1 + (i * 7919) % 60)


class Stream:
    """Documents ``text(0), text(1), ...``: ``n`` of them, or endless; counts what was read."""

    def __init__(self, n: int | None = None) -> None:
        self.n, self.read, self.opened = n, 0, 0

    def describe(self) -> str:
        return f"test stream of {self.n or 'endless'} documents"

    def documents(self):
        self.opened += 1
        for i in itertools.count() if self.n is None else range(self.n):
            self.read += 1
            yield text(i)


def packer(name: str):
    cls = {"concat": ConcatPacker, "bfd": BfdPacker}[name]
    p = cls(ConcatOptions(), seq_len=S, eos_id=EOS, pad_id=PAD)

    def pack_window(stream):
        layout = check_layout(p.layout(stream.lengths.copy()), stream, S, name)
        return PackedRows(layout, stream, eos_id=EOS, pad_id=PAD)

    return pack_window


def loader(source, name="concat", *, batch=3, window=4 * S, shuffle=True, rank=0, size=1, report=None):
    return StreamingLoader(
        source,
        ByteTokenizer(),
        packer(name),
        batch,
        seq_len=S,
        dp_rank=rank,
        dp_size=size,
        seed=5,
        shuffle=shuffle,
        window_tokens=window,
        ahead=2,
        report=report,
    )


def first_pass(ld):
    """Every batch of the loader's first pass (batch size 1: no batch spans two passes)."""
    out = []
    for batch in ld:
        if ld.position.pass_number:
            return out
        out.append({k: v.numpy() for k, v in batch.items()})
    raise AssertionError("unreachable")


def tokens_of(documents):
    return Counter(itertools.chain.from_iterable([*d.encode(), EOS] for d in documents))


def test_an_endless_source_reaches_its_first_batch_having_read_a_bounded_prefix():
    source = Stream()
    ld = loader(source, window=1024, batch=4)
    batch = next(ld)
    assert batch["input_ids"].shape == (4, S)
    # A control that materialized the source would never return. The thread reads on
    # until its queue is full, then waits: a few windows (~1024 tokens of ~30-token
    # documents each) and a tokenizing batch of 256 documents, never the whole source.
    for _ in range(1000):
        if ld._queue.full():
            break
        threading.Event().wait(0.01)
    assert ld._queue.full()
    assert 0 < source.read < 2_000
    ld.close()


@pytest.mark.parametrize("window", [2 * S, 5 * S + 3, 10_000])
def test_concat_over_windows_gives_exactly_the_rows_of_the_whole_stream(window):
    """What a window cannot fill is carried into the next one, part of a document included:
    the rows are those of concat over every document at once, bit for bit."""
    docs = [text(i) for i in range(300)]
    whole = pack_documents(
        ConcatPacker(ConcatOptions(), seq_len=S, eos_id=EOS, pad_id=PAD),
        [np.array([*d.encode(), EOS]) for d in docs],
    )
    got = first_pass(loader(Stream(300), batch=1, window=window, shuffle=False))
    assert len(got) == len(whole["input_ids"])
    for key in ("input_ids", "labels", "doc_ids", "positions"):
        assert np.array_equal(np.concatenate([b[key] for b in got]), whole[key]), key


def test_bfd_over_windows_places_every_token_of_the_stream_once():
    got = first_pass(loader(Stream(300), "bfd", batch=1, window=6 * S, shuffle=False))
    ids = np.concatenate([b["input_ids"] for b in got]).reshape(-1)
    assert Counter(ids[ids != PAD].tolist()) == tokens_of(text(i) for i in range(300))


def test_ranks_read_disjoint_documents_that_together_are_the_stream():
    for size in (2, 3):
        parts = [list(rank_documents(iter(range(17)), r, size)) for r in range(size)]
        assert sorted(itertools.chain(*parts)) == list(range(17))
        assert all(not set(a) & set(b) for a, b in itertools.combinations(parts, 2))
    assert list(rank_documents(iter(range(17)), 1, 3, start=2)) == [7, 10, 13, 16]
    # Each rank's loader packs its own documents, and only those.
    for rank in (0, 1):
        got = first_pass(loader(Stream(101), "bfd", batch=1, rank=rank, size=2, shuffle=False))
        ids = np.concatenate([b["input_ids"] for b in got]).reshape(-1)
        assert Counter(ids[ids != PAD].tolist()) == tokens_of(text(i) for i in range(rank, 101, 2))


def test_the_end_of_the_stream_reads_it_again_as_the_next_pass():
    source, said = Stream(12), []
    ld = loader(source, batch=1, shuffle=False, report=said.append)
    one = first_pass(ld)
    assert ld.state_dict()["pass"] == 1 and source.opened == 2
    # first_pass took the first batch of pass 1 already; the rest follow.
    two = [b["input_ids"].numpy() for b in itertools.islice(ld, len(one) - 1)]
    ld.close()
    assert len(one) > 2 and all(np.array_equal(a["input_ids"], b) for a, b in zip(one[1:], two))
    assert any(m.startswith("stream: pass 0 ended on data-parallel rank 0: 12 documents") for m in said)
    assert said[0].startswith("stream: first window after")
    assert any(m.startswith("stream: pass 0, window 1:") and "unknown until it ends" in m for m in said)


@pytest.mark.parametrize("name", ["concat", "bfd"])
def test_a_restored_loader_gives_bit_identical_batches(name):
    """Stopped at every batch of a run that crosses windows and a pass, shuffled, the state
    through the checkpoint's JSON encoding: the batches after it are the uninterrupted
    run's."""
    straight = loader(Stream(25), name)
    want = [b["input_ids"].numpy() for b in itertools.islice(straight, 40)]
    assert straight.state_dict()["pass"] >= 1
    straight.close()
    for stop in (0, 1, 5, 13, 22, 31):
        first = loader(Stream(25), name)
        got = [b["input_ids"].numpy() for b in itertools.islice(first, stop)]
        state = decode(json.loads(json.dumps(encode(first.state_dict()))))
        first.close()
        resumed = loader(Stream(25), name)
        resumed.load_state_dict(state)
        got += [b["input_ids"].numpy() for b in itertools.islice(resumed, 40 - stop)]
        resumed.close()
        assert all(np.array_equal(a, b) for a, b in zip(got, want)) and len(got) == 40, stop


def test_resume_refuses_another_stream_layout_or_a_cached_run():
    state = loader(Stream(40)).state_dict()
    with pytest.raises(ForgeError, match="dp_size was 1 when the checkpoint was saved and is 2 now"):
        loader(Stream(40), size=2).load_state_dict(state)
    with pytest.raises(ForgeError, match="saved reading the token cache, the config now streams"):
        loader(Stream(40)).load_state_dict({"epoch": 0, "batch": 3})


def test_a_stream_too_short_for_one_row_and_a_window_too_small_are_errors():
    ld = loader(Stream(1), batch=1)
    with pytest.raises(ForgeError, match="one pass of the stream gives no row of data.seq_len 16"):
        next(ld)
    ld.close()
    with pytest.raises(ForgeError, match="window_tokens: 20 is less than two rows"):
        loader(Stream(), window=20)


def _judge(tmp_path, data, **sections):
    from forge_core.judge import judge

    cfg = tiny_config(tmp_path, "j", **sections)
    cfg["data"].update(data)
    if "sources" in data:
        del cfg["data"]["source"], cfg["data"]["source_options"]
    found: dict[str, str] = {}
    for v in judge(write_config(tmp_path / "j.yaml", cfg), world_size=1).errors:
        found[v.rule_id] = found.get(v.rule_id, "") + v.message + "\n"
    return found


def test_check_refuses_what_a_stream_does_not_support(tmp_path):
    glob = str(tmp_path / "corpus/*.txt")
    assert not {k for k in _judge(tmp_path, {"stream": {"enabled": True}}) if k.startswith("data.stream")}
    mix = {
        "stream": {"enabled": True},
        "sources": [{"name": "text", "options": {"paths": [glob]}}, {"name": "stdlib"}],
    }
    found = _judge(tmp_path, mix)["data.stream-one-source"]
    assert "data.stream.enabled asks for a stream, but data.sources mixes 2 sources" in found
    # hf_datasets' own option asks for it too, named by its path.
    hf = {"name": "hf_datasets", "options": {"data_files": [glob], "format": "text", "streaming": True}}
    found = _judge(tmp_path, {"sources": [hf, {"name": "stdlib"}]})["data.stream-one-source"]
    assert found.startswith("data.sources[0].options.streaming asks for a stream")
    stream = {"enabled": True, "window_tokens": 40}
    found = _judge(tmp_path, {"stream": stream, "heldout": {"fraction": 0.1}, "num_workers": 1})
    assert "data.heldout.fraction is 0.1 under a stream (data.stream.enabled)" in found["data.stream-heldout"]
    assert found["data.stream-workers"].startswith("data.num_workers is 1 under a stream")
    assert found["data.stream-window"].startswith("data.stream.window_tokens is 40 under a stream")
    chat = _judge(tmp_path, {"stream": {"enabled": True}, "chat": {"format": "messages"}})
    assert chat["data.stream-chat"].startswith("data.chat.format is 'messages' under a stream")
    # Without a stream, none of them has anything to say.
    stream["enabled"] = False
    quiet = _judge(tmp_path, {"stream": stream, "heldout": {"fraction": 0.1}, "num_workers": 1})
    assert not {k for k in quiet if k.startswith("data.stream")}


def test_a_streamed_source_is_not_read_when_the_run_is_built(tmp_path):
    """Neither the training data nor the held-out documents (a plugin's view) read the
    stream or fill the cache: a stream is read by its loader only."""
    from forge_core.data.build import build_training_data, heldout_documents
    from forge_core.plan import make_plan
    from forge_core.resolve import load_resolved

    cfg = tiny_config(tmp_path, "b")
    cfg["data"].update({"stream": {"enabled": True}, "cache": {"dir": str(tmp_path / "cache")}})
    config, registries = load_resolved(write_config(tmp_path / "b.yaml", cfg))
    plan = make_plan(config, registries, 1)
    data = build_training_data(plan, registries, ByteTokenizer())
    assert data.rows is None and data.stream is not None
    assert "documents, tokens and rows unknown until the stream ends" in data.summary
    assert heldout_documents(plan, registries, ByteTokenizer()) == []
    assert not (tmp_path / "cache").exists()


def test_an_hf_data_set_streamed_trains_and_resumes_exactly(tmp_path):
    """``hf_datasets`` with ``streaming: true``, stopped by SIGTERM at step 2 mid-window
    and resumed: every loss is the uninterrupted run's."""
    pytest.importorskip("datasets")
    from forge_core.testing import train_in_process

    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"text": text(i)}) + "\n" for i in range(200)))
    hf = {"source": "hf_datasets", "source_options": {"data_files": [str(rows)], "streaming": True}}

    def run(name, *plugins):
        cfg = tiny_config(tmp_path, name, train={"steps": 4, "batch_size": 4, "lr": 3e-3, "warmup_steps": 1})
        cfg["data"].update({**hf, "stream": {"window_tokens": 200}})
        path = write_config(tmp_path / f"{name}.yaml", cfg)
        return train_in_process(path, [], extra_plugins=tuple((f"p{i}", p) for i, p in enumerate(plugins)))

    straight, first, second = Recorder(), Recorder(), Recorder()
    assert run("straight", straight) == "completed"
    assert run("cut", first, SignalAt(2)) == "interrupted"
    assert run("cut", second) == "completed"
    assert sorted(second.metrics) == [3, 4]
    for step in range(1, 5):
        got = (first.metrics if step <= 2 else second.metrics)[step]
        assert got["loss"] == straight.metrics[step]["loss"], step


def test_forge_run_streams_any_source_and_says_what_is_not_known(tmp_path, capfd):
    from forge_core.cli.main import main

    write_corpus(tmp_path / "corpus", docs=60, short=True)
    cfg = tiny_config(tmp_path, "s", train={"steps": 2, "batch_size": 2, "lr": 3e-3, "warmup_steps": 1})
    cfg["data"]["stream"] = {"enabled": True, "window_tokens": 256}
    assert main(["train", write_config(tmp_path / "s.yaml", cfg)]) == 0
    out = "".join(capfd.readouterr())
    assert "data: streaming rows of 32 tokens (text: 60 files" in out
    assert "unknown until the stream ends" in out and "stream: first window after" in out
    assert "tokenizing" not in out  # no token cache was filled
