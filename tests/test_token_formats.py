"""The token formats labs have, read in place: Megatron's indexed dataset (``.bin`` +
``.idx``) and flat token files (``.npy``, raw ``.bin`` with a dtype; documents split at
EOS). The files are written here in their published layout; a run on each reads exactly
the rows (and trains exactly the losses) of the same documents prepared as shards, and
bad files are refused by ``forge-run check`` naming the field and the file."""

from __future__ import annotations

import pickle
import struct

import numpy as np
import pytest
from train_helpers import read_metrics, tiny_config, write_config

from forge_core.data.build import build_training_data
from forge_core.data.pipeline import document_hashes
from forge_core.data.shards import ShardWriter
from forge_core.data.shards import stream as document_stream
from forge_core.plan import make_plan
from forge_core.resolve import load_resolved
from forge_core.testing import forge_run
from forge_plugins.sources.megatron import MegatronSource
from forge_plugins.sources.options import MegatronOptions, TokenFileOptions
from forge_plugins.sources.token_file import TokenFileSource
from forge_plugins.tokenizers.byte import ByteTokenizer

BYTE = ByteTokenizer()
EOS = BYTE.eos_id
MEGATRON_CODES = {"uint8": 1, "int8": 2, "int16": 3, "int32": 4, "int64": 5, "uint16": 8}


def corpus(seed=0, n=60):
    """Many short documents of byte ids (one empty), so rows cross boundaries often."""
    rng = np.random.default_rng(seed)
    docs = [rng.integers(0, 256, int(rng.integers(1, 40))) for _ in range(n)]
    docs[7] = np.zeros(0, np.int64)
    return docs


def write_megatron(prefix, documents, dtype="uint16", append_eod=False, sentences=False):
    """Megatron-LM's MMIDIDX version 1 layout (``_IndexWriter``): documents as sequences
    (``sentences``: each document cut into two), pointers in bytes, document indices."""
    lengths, pointers, doc_index, data = [], [], [0], []
    position = 0
    for doc in documents:
        doc = np.append(doc, EOS) if append_eod else np.asarray(doc)
        pieces = np.array_split(doc, 2) if sentences and len(doc) > 1 else [doc]
        for piece in pieces:
            lengths.append(len(piece))
            pointers.append(position)
            position += len(piece) * np.dtype(dtype).itemsize
            data.append(piece.astype(dtype))
        doc_index.append(len(lengths))
    with open(f"{prefix}.bin", "wb") as f:
        f.write(np.concatenate(data).astype(dtype).tobytes())
    with open(f"{prefix}.idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00")
        f.write(struct.pack("<Q", 1))
        f.write(struct.pack("<B", MEGATRON_CODES[dtype]))
        f.write(struct.pack("<Q", len(lengths)))
        f.write(struct.pack("<Q", len(doc_index)))
        f.write(np.array(lengths, np.int32).tobytes())
        f.write(np.array(pointers, np.int64).tobytes())
        f.write(np.array(doc_index, np.int64).tobytes())
    return str(prefix)


def write_flat(path, documents, dtype="uint16", eos_first=False):
    """Documents joined by EOS: after each (``eos_first``: before each, nanoGPT's way)."""
    parts = [np.append([EOS], d) if eos_first else np.append(d, EOS) for d in documents]
    flat = np.concatenate(parts).astype(dtype)
    if str(path).endswith(".npy"):
        np.save(path, flat)
    else:
        flat.tofile(path)
    return str(path)


def write_shards(directory, documents):
    """The same documents through the existing path: a shard directory."""
    writer = ShardWriter(
        directory, {"identity": BYTE.identity, "vocab_size": 258, "eos_id": EOS, "pad_id": BYTE.pad_id}
    )
    writer.add([np.asarray(d, np.int64) for d in documents], document_hashes(documents))
    writer.commit("test")
    return str(directory)


def config(tmp_path, name, source, options, **data):
    cfg = tiny_config(tmp_path, name, data={"source": source, "source_options": options, **data})
    cfg["train"]["steps"] = 3
    cfg["logging"]["loggers"] = ["jsonl"]
    return write_config(tmp_path / f"{name}.yaml", cfg)


def rows_of(path):
    cfg, registries = load_resolved(path)
    built = build_training_data(make_plan(cfg, registries, 1), registries, BYTE, report=lambda m: None)
    every = np.arange(built.rows.num_rows)
    return built, {k: np.asarray(built.rows.read(every)[k]) for k in built.rows.keys}


def assert_same_rows(a, b):
    assert a.keys() == b.keys() and len(a["input_ids"]) > 5
    for key in a:
        assert np.array_equal(a[key], b[key]), key


# the tokens no (non-empty) document holds: the empty one is dropped by the flat format
NON_EMPTY = [d for d in corpus() if len(d)]


@pytest.mark.parametrize("packer", ["concat", "bfd"])
@pytest.mark.parametrize(
    "kind",
    ["megatron", "megatron-eod", "megatron-sentences", "npy", "bin", "bin-eos-first"],
)
def test_each_format_gives_the_rows_of_the_same_shards(tmp_path, kind, packer):
    docs = corpus()
    data = {"packer": packer, "heldout": {"fraction": 0.2, "seed": 3}}
    if kind.startswith("megatron"):
        prefix = write_megatron(
            tmp_path / "mm", docs, append_eod=kind.endswith("eod"), sentences=kind.endswith("sentences")
        )
        options = {"path": prefix, "append_eod": kind.endswith("eod")}
        source = "megatron"
    else:
        docs = NON_EMPTY  # the flat format has no empty document: it is two EOS in a row
        name = "t.npy" if kind == "npy" else "t.bin"
        path = write_flat(tmp_path / name, docs, eos_first=kind.endswith("first"))
        options = {"path": path} if kind == "npy" else {"path": path, "dtype": "uint16"}
        source = "token_file"
    expected_cfg = config(tmp_path, "ref", "shards", {"path": write_shards(tmp_path / "sh", docs)}, **data)
    built, rows = rows_of(config(tmp_path, "fmt", source, options, **data))
    reference, expected = rows_of(expected_cfg)
    assert_same_rows(rows, expected)
    assert len(built.sources[0].heldout) == len(reference.sources[0].heldout) > 0  # same content hashes
    assert "memory-mapped from" in built.summary


def test_a_tiny_training_run_on_each_format_trains_the_losses_of_shards(tmp_path):
    docs = NON_EMPTY
    runs = {
        "shards": ("shards", {"path": write_shards(tmp_path / "sh", docs)}),
        "megatron": ("megatron", {"path": write_megatron(tmp_path / "mm", docs, dtype="int32")}),
        "npy": ("token_file", {"path": write_flat(tmp_path / "t.npy", docs, dtype="int32")}),
    }
    losses = {}
    for name, (source, options) in runs.items():
        result = forge_run([config(tmp_path, name, source, options)])
        assert result.code == 0, result.stderr
        losses[name] = [m["loss"] for m in read_metrics(tmp_path / name) if "loss" in m]
    assert len(losses["shards"]) == 3
    assert losses["megatron"] == losses["shards"] == losses["npy"]


def test_a_memory_mapped_npy_reaches_a_loader_worker_at_its_offset(tmp_path):
    source = TokenFileSource(TokenFileOptions(path=write_flat(tmp_path / "t.npy", NON_EMPTY)))
    stream = document_stream(source.token_documents(EOS), EOS, 258)
    again = pickle.loads(pickle.dumps(stream))
    everything = np.arange(stream.total)
    assert np.array_equal(again.gather(everything)[0], stream.gather(everything)[0])


def test_megatron_documents_match_the_written_ones(tmp_path):
    docs = corpus()
    source = MegatronSource(
        MegatronOptions(path=write_megatron(tmp_path / "mm", docs, sentences=True) + ".idx")
    )
    got = list(source.token_documents(EOS).documents())
    assert len(got) == len(docs) and all(np.array_equal(a, b) for a, b in zip(got, docs))
    assert all(np.array_equal(a, b) for a, b in zip(source.documents(), docs))


def check(tmp_path, source, options, tokenizer="byte"):
    return forge_run(["check", config(tmp_path, "chk", source, options, tokenizer=tokenizer)])


def test_check_refuses_bad_megatron_files_naming_the_field_and_the_file(tmp_path):
    prefix = write_megatron(tmp_path / "mm", corpus())
    assert check(tmp_path, "megatron", {"path": prefix}).code == 0
    missing = check(tmp_path, "megatron", {"path": str(tmp_path / "nope")})
    assert missing.code == 2 and f"$.data.source_options.path: {tmp_path / 'nope.idx'} does not exist" in (
        missing.stderr + missing.stdout
    )
    idx = tmp_path / "mm.idx"
    good = idx.read_bytes()
    idx.write_bytes(b"NOTANIDX!" + good[9:])
    bad = check(tmp_path, "megatron", {"path": prefix})
    assert bad.code == 2 and f"{idx} is not a Megatron index" in bad.stderr + bad.stdout
    idx.write_bytes(good[:-8])
    cut = check(tmp_path, "megatron", {"path": prefix})
    assert cut.code == 2 and "the index is truncated or damaged" in cut.stderr + cut.stdout
    narrow = write_megatron(tmp_path / "u8", [d % 200 for d in corpus()], dtype="uint8")
    u8 = check(tmp_path, "megatron", {"path": narrow})
    assert (
        u8.code == 2
        and "holds uint8 tokens" in u8.stderr + u8.stdout
        and "megatron.index" in u8.stdout + u8.stderr
    )


def test_check_refuses_bad_token_files_naming_the_field_and_the_file(tmp_path):
    raw = write_flat(tmp_path / "t.bin", NON_EMPTY)
    assert check(tmp_path, "token_file", {"path": raw, "dtype": "uint16"}).code == 0
    no_dtype = check(tmp_path, "token_file", {"path": raw})
    assert no_dtype.code == 2 and f"$.data.source_options.dtype is empty, but {raw}" in (
        no_dtype.stderr + no_dtype.stdout
    )
    odd = tmp_path / "odd.bin"
    odd.write_bytes(b"\x01\x00\x02")
    ragged = check(tmp_path, "token_file", {"path": str(odd), "dtype": "uint16"})
    assert (
        ragged.code == 2 and "3 bytes, not a whole number of uint16 tokens" in ragged.stderr + ragged.stdout
    )
    np.save(tmp_path / "m.npy", np.zeros((2, 3), np.int32))
    matrix = check(tmp_path, "token_file", {"path": str(tmp_path / "m.npy")})
    assert matrix.code == 2 and "shape (2, 3)" in matrix.stderr + matrix.stdout
    np.save(tmp_path / "f.npy", np.zeros(3, np.float32))
    floats = check(tmp_path, "token_file", {"path": str(tmp_path / "f.npy")})
    assert floats.code == 2 and "holds an array of <f4" in floats.stderr + floats.stdout


def test_a_run_refuses_eod_that_is_not_there_and_ids_outside_the_vocabulary(tmp_path):
    prefix = write_megatron(tmp_path / "mm", NON_EMPTY)  # written without EOD
    result = forge_run([config(tmp_path, "eod", "megatron", {"path": prefix, "append_eod": True})])
    assert result.code == 2 and "$.data.source_options.append_eod is true, but document 0 of" in result.stderr
    docs = [d.copy() for d in NON_EMPTY]
    docs[3][0] = 300  # the byte tokenizer has 258 ids
    wide = write_flat(tmp_path / "w.npy", docs, dtype="int32")
    result = forge_run([config(tmp_path, "wide", "token_file", {"path": wide})])
    assert result.code == 2 and "300" in result.stderr and "Traceback" not in result.stderr


def test_a_run_refuses_a_token_type_too_narrow_for_the_tokenizer(tmp_path):
    from forge_core.api import ForgeError
    from forge_core.data.build import source_shards

    narrow = write_flat(tmp_path / "u8.npy", [d % 200 for d in NON_EMPTY], dtype="uint8")
    source = TokenFileSource(TokenFileOptions(path=narrow))
    with pytest.raises(
        ForgeError, match=r"u8\.npy: tokens of type uint8 hold ids up to 255, but the configured"
    ):
        source_shards(source, BYTE, None, "t", report=lambda m: None)
