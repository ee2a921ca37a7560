"""``prepare`` and the pipeline: text -> shards -> rows equals direct tokenization,
determinism, atomic output, interrupted prepares, and bad shards or corpora."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from forge_core.api import ForgeError
from forge_core.api.unstable import Shards
from forge_core.data.build import pack, source_shards
from forge_core.data.packed_rows import pack_documents
from forge_core.data.pipeline import document_hashes, tokenize
from forge_core.data.prepare import prepare
from forge_core.data.shards import stream as document_stream
from forge_core.testing import forge_run
from forge_plugins.packers.bfd import BfdPacker
from forge_plugins.packers.concat import ConcatPacker
from forge_plugins.packers.options import ConcatOptions
from forge_plugins.sources.options import ShardsOptions, TextOptions
from forge_plugins.sources.shards import ShardSource
from forge_plugins.sources.text import TextSource
from forge_plugins.tokenizers.byte import ByteTokenizer

BYTE = ByteTokenizer(None)


class ListSource:
    def __init__(self, docs):
        self.docs = docs

    def documents(self):
        yield from self.docs

    def describe(self):
        return "list source"


@pytest.fixture
def text_source(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.jsonl").write_text(
        "".join(json.dumps({"text": f"document {i}: " + "é" * (i % 7) + "x" * i}) + "\n" for i in range(300))
    )
    (data / "b.txt").write_text("one\n\ntwo, longer\n\nthree")
    return TextSource(TextOptions(paths=[str(data / "a.jsonl"), str(data / "b.txt")], separator="\n\n"))


def quiet(*args, **kwargs):
    return prepare(*args, progress=False, report=lambda _: None, **kwargs)


def documents_with_eos(source, tokenizer):
    return [
        np.append(d, np.int32(tokenizer.eos_id))
        for batch, _ in tokenize(source, tokenizer, progress=False)
        for d in batch
    ]


def build_rows(source, tokenizer, packer, cache_dir):
    """Every row a run reads from ``source`` (through its shards, or the cache in ``cache_dir``)."""
    from forge_core.config.schema import CacheSection
    from forge_plugins.packers import plugin

    spec = {s.name: s for s in plugin.forge_packers()}[
        {"ConcatPacker": "concat", "BfdPacker": "bfd"}[type(packer).__name__]
    ]
    shards, _ = source_shards(
        source, tokenizer, CacheSection(dir=str(cache_dir)), "test", report=lambda m: None
    )
    stream = document_stream(shards, tokenizer.eos_id, tokenizer.vocab_size)
    rows = pack(packer, spec, spec.options(), stream, packer.seq_len, tokenizer.eos_id, tokenizer.pad_id)
    return rows.read(np.arange(rows.num_rows))


def packers():
    return [
        ConcatPacker(ConcatOptions(), seq_len=64, eos_id=BYTE.eos_id, pad_id=BYTE.pad_id),
        BfdPacker(None, seq_len=64, eos_id=BYTE.eos_id, pad_id=BYTE.pad_id),
    ]


def test_round_trip_text_shards_rows_equals_direct(text_source, tmp_path):
    index = quiet(text_source, BYTE, tmp_path / "shards")
    assert index["num_documents"] == 303 and index["dtype"] == "uint16"
    shard_source = ShardSource(ShardsOptions(path=str(tmp_path / "shards")))
    assert shard_source.tokenizer_identity == BYTE.identity
    direct_docs = documents_with_eos(text_source, BYTE)
    shard_docs = documents_with_eos(shard_source, BYTE)
    assert [d.tolist() for d in shard_docs] == [d.tolist() for d in direct_docs]
    assert all(d[-1] == BYTE.eos_id and (d[:-1] < 256).all() for d in direct_docs)
    # The hashes are those of the texts (not of the tokens), made while tokenizing.
    assert np.array_equal(Shards(tmp_path / "shards").hashes, document_hashes(list(text_source.documents())))
    for direct_packer, shard_packer in zip(packers(), packers()):
        direct = pack_documents(direct_packer, direct_docs)
        from_shards = build_rows(shard_source, BYTE, shard_packer, tmp_path / "cache")
        assert direct.keys() == from_shards.keys()
        for key in direct:
            assert np.array_equal(direct[key], from_shards[key]), key
    assert not (tmp_path / "cache").exists()  # shards are read as they are, never cached again


def test_prepare_is_deterministic(text_source, tmp_path):
    quiet(text_source, BYTE, tmp_path / "one")
    quiet(text_source, BYTE, tmp_path / "two")
    for name in ("index.json", "tokens.bin", "offsets.npy", "hashes.npy"):
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes()


def test_existing_output_needs_overwrite(text_source, tmp_path):
    quiet(ListSource(["old"]), BYTE, tmp_path / "out")
    with pytest.raises(ForgeError, match="already exists"):
        quiet(text_source, BYTE, tmp_path / "out")
    quiet(text_source, BYTE, tmp_path / "out", overwrite=True)
    assert Shards(tmp_path / "out").num_documents == 303
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "out"]


def test_error_during_prepare_leaves_nothing(tmp_path):
    def docs():
        yield from ["fine"] * 600
        raise ForgeError("bad document")

    source = ListSource(docs())
    with pytest.raises(ForgeError, match="bad document"):
        quiet(source, BYTE, tmp_path / "out")
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ForgeError, match="yielded no document"):
        quiet(ListSource([]), BYTE, tmp_path / "out")
    assert list(tmp_path.iterdir()) == []


KILLED = textwrap.dedent(
    """
    import os, signal, sys
    from forge_core.data.prepare import prepare
    from forge_plugins.tokenizers.byte import ByteTokenizer

    class Dying:
        def describe(self):
            return "dying"
        def documents(self):
            for i in range(2000):
                if i == 1000:  # after a few batches reached the disk
                    os.kill(os.getpid(), signal.SIGKILL)
                yield f"doc {i}"

    prepare(Dying(), ByteTokenizer(), sys.argv[1], progress=False)
    """
)


def test_interrupted_prepare_is_detected_and_cleaned(tmp_path):
    out = tmp_path / "shards"
    proc = subprocess.run([sys.executable, "-c", KILLED, str(out)])
    assert proc.returncode == -signal.SIGKILL
    assert not out.exists()
    (left,) = tmp_path.glob(".shards.forge-partial-*")
    assert (left / "tokens.bin").stat().st_size > 0
    with pytest.raises(ForgeError, match="interrupted"):
        ShardSource(ShardsOptions(path=str(out)))
    notes = []
    prepare(ListSource(["a", "b"]), BYTE, out, progress=False, report=notes.append)
    assert "interrupted prepare" in notes[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shards"]
    assert Shards(out).num_documents == 2


def test_shards_from_another_tokenizer_are_refused(text_source, tmp_path):
    quiet(text_source, BYTE, tmp_path / "shards")

    class Other(ByteTokenizer):
        identity = "byte:latin-1"

    source = ShardSource(ShardsOptions(path=str(tmp_path / "shards")))
    match = "tokenized with 'byte:utf-8.*configured tokenizer is 'byte:latin-1'"
    with pytest.raises(ForgeError, match=match):
        build_rows(source, Other(None), packers()[0], tmp_path / "cache")


def test_ids_outside_the_vocabulary_are_refused(text_source, tmp_path):
    quiet(text_source, BYTE, tmp_path / "shards")
    tokens = np.memmap(tmp_path / "shards" / "tokens.bin", dtype=np.uint16, mode="r+")
    offsets = np.load(tmp_path / "shards" / "offsets.npy")
    tokens[offsets[5] + 2] = 300  # inside document 5
    tokens.flush()
    del tokens
    source = ShardSource(ShardsOptions(path=str(tmp_path / "shards")))
    # Ids were checked when written; a file damaged since is caught when its row is read.
    match = r"tokens\.bin: document 5 holds token id 300, outside the tokenizer's vocabulary of 258"
    with pytest.raises(ForgeError, match=match):
        build_rows(source, BYTE, packers()[0], tmp_path / "cache")


def test_damaged_shards_are_refused(text_source, tmp_path):
    quiet(text_source, BYTE, tmp_path / "shards")
    tokens = tmp_path / "shards" / "tokens.bin"
    tokens.write_bytes(tokens.read_bytes()[:-2])
    with pytest.raises(ForgeError, match=r"tokens\.bin: .* bytes, the index says"):
        ShardSource(ShardsOptions(path=str(tmp_path / "shards")))


def test_corpus_smaller_than_one_row_is_an_error(tmp_path):
    from forge_core.data.build import build_training_data
    from forge_core.plan import make_plan
    from forge_core.resolve import load_resolved

    (tmp_path / "tiny.txt").write_text("hello\n\nworld!")
    config = tmp_path / "c.yaml"
    config.write_text(
        f"data: {{source: text, source_options: {{paths: ['{tmp_path / 'tiny.txt'}'], "
        f'separator: "\\n\\n"}}, '
        f"seq_len: 64, cache: {{dir: '{tmp_path / 'cache'}'}}}}\n"
    )
    cfg, registries = load_resolved(str(config))
    with pytest.raises(ForgeError, match="13 tokens in 2 documents, not enough for one row of seq_len 64"):
        build_training_data(make_plan(cfg, registries, 1), registries, BYTE, report=lambda m: None)


# --- forge-run prepare ----------------------------------------------------------------


def prepare_command(tmp_path, *extra, tokenizer="byte", train_bpe=0):
    """``forge-run prepare`` of a 200-document corpus into ``tmp_path/shards``."""
    data = tmp_path / "corpus.txt"
    data.write_text("\n\n".join(f"def f{i}(x):\n    return x * {i}\n" for i in range(200)))
    config = tmp_path / "config.yaml"
    config.write_text(
        f"data:\n  source: text\n  source_options: {{paths: ['{data}'], separator: \"\\n\\n\"}}\n"
        f"  tokenizer: {tokenizer}\n"
    )
    return forge_run(["prepare", config, "--out", tmp_path / "shards", "--train-bpe", str(train_bpe), *extra])


def test_cli_prepares_shards_with_the_configured_tokenizer(tmp_path):
    done = prepare_command(tmp_path)
    assert done.code == 0, done.stderr
    index = Shards(tmp_path / "shards").index
    assert index["num_documents"] == 200 and index["tokenizer"]["identity"] == BYTE.identity
    assert "data.source_options: {path: " in done.stderr
    again = prepare_command(tmp_path)
    assert again.code == 2 and "already exists" in again.stderr


def test_cli_trains_bpe_and_ships_it_with_the_shards(tmp_path):
    from forge_plugins.tokenizers.hf import HFTokenizer

    refused = prepare_command(tmp_path, train_bpe=300)
    assert refused.code == 2 and "--train-bpe needs a tokenizer that loads from a directory" in refused.stderr
    assert prepare_command(tmp_path, tokenizer="hf", train_bpe=300).code == 0
    tok = HFTokenizer.load(str(tmp_path / "shards" / "tokenizer"))
    assert tok.vocab_size == 300
    source = ShardSource(ShardsOptions(path=str(tmp_path / "shards")))
    assert source.tokenizer_identity == tok.identity
    first = next(iter(source.documents()))
    assert tok.decode(first) == "def f0(x):\n    return x * 0"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yaml", "corpus.txt", "shards"]


def test_cli_refuses_a_mixture(tmp_path):
    config = tmp_path / "mix.yaml"
    config.write_text(
        "data:\n  sources:\n    - {name: stdlib, options: {max_files: 2}}\n    - {name: stdlib}\n"
    )
    refused = forge_run(["prepare", config, "--out", tmp_path / "out"])
    assert refused.code == 2
    assert "mixes 2 sources (data.sources); `forge-run prepare` tokenizes one" in refused.stderr
