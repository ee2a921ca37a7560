"""The token cache: a source is tokenized once and reused (no tokenization on the second
build: asserted), keyed by content (a file changed in place with its size and times
kept just after it was hashed is seen: its manifest record is racy, see
tests/test_manifest.py) and by tokenizer; entries made for another tokenizer or format version are
refused with an error naming them; a crash mid-way leaves nothing a later run trusts;
a process waits for another that holds the lock, and gives up after data.cache.wait_s."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from forge_core.api import ForgeError
from forge_core.data import cache as cache_module
from forge_core.data.build import build_training_data
from forge_core.data.cache import cache_key, cached_shards
from forge_core.data.fingerprint import source_fingerprint
from forge_core.plan import make_plan
from forge_core.resolve import load_resolved
from forge_plugins.sources.options import TextOptions
from forge_plugins.sources.text import TextSource
from forge_plugins.tokenizers.byte import ByteTokenizer

BYTE = ByteTokenizer()


class OtherByte(ByteTokenizer):
    identity = "byte:utf-8:eos=256:pad=257:other"


@pytest.fixture
def corpus(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    for i in range(6):
        (data / f"{i}.txt").write_text(f"document {i} " + "lorem ipsum " * (20 + 7 * i))
    return data


def text_source(corpus):
    return TextSource(TextOptions(paths=[str(corpus / "*.txt")]))


def build(corpus, root, tokenizer=BYTE, notes=None):
    return cached_shards(
        text_source(corpus),
        tokenizer,
        root=root,
        wait_s=5,
        label="text",
        progress=False,
        report=(notes or []).append,
        announce=(notes or []).append,
    )


def test_second_build_reuses_the_cache_without_tokenizing(corpus, tmp_path, counted):
    first, note = build(corpus, tmp_path / "cache")
    assert len(counted) == 1 and note.startswith("tokenized into")
    again, note = build(corpus, tmp_path / "cache")
    assert len(counted) == 1 and note.startswith("cached at")  # no tokenization
    assert again.path == first.path and np.array_equal(np.asarray(again.tokens), np.asarray(first.tokens))
    # Moving the corpus elsewhere keeps the key: content, not location.
    shutil.copytree(corpus, tmp_path / "moved")
    build(tmp_path / "moved", tmp_path / "cache")
    assert len(counted) == 1


def test_a_change_of_content_with_the_same_size_and_times_is_a_new_entry(corpus, tmp_path, counted):
    first, _ = build(corpus, tmp_path / "cache")
    path = corpus / "3.txt"
    stat = path.stat()
    text = path.read_text()
    path.write_text(text.replace("lorem", "LOREM", 1))  # same size
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # same times
    second, note = build(corpus, tmp_path / "cache")
    assert len(counted) == 2 and second.path != first.path
    assert b"LOREM" in bytes(np.asarray(second.tokens, np.uint8))


def test_another_tokenizer_gets_its_own_entry_and_a_copied_entry_is_refused(corpus, tmp_path, counted):
    byte, _ = build(corpus, tmp_path / "cache")
    other, _ = build(corpus, tmp_path / "cache", OtherByte())
    assert len(counted) == 2 and other.path != byte.path
    assert other.tokenizer["identity"] == OtherByte.identity
    # An entry placed under another tokenizer's key (copied by hand) is refused, not reused.
    shutil.rmtree(other.path)
    shutil.copytree(byte.path, other.path)
    with pytest.raises(
        ForgeError,
        match=r"index\.json: refusing this token cache entry: .*tokenizer identity "
        r"'byte:utf-8:eos=256:pad=257', the configured tokenizer has "
        r"'byte:utf-8:eos=256:pad=257:other'",
    ):
        build(corpus, tmp_path / "cache", OtherByte())
    assert len(counted) == 2


def test_an_entry_of_another_format_version_is_refused(corpus, tmp_path):
    shards, _ = build(corpus, tmp_path / "cache")
    index = json.loads((shards.path / "index.json").read_text())
    (shards.path / "index.json").write_text(json.dumps({**index, "version": 1}))
    with pytest.raises(
        ForgeError,
        match=r"the token cache entry .* is unusable: .*shard format version 1, this "
        r"Forge reads version 2.*Delete that directory",
    ):
        build(corpus, tmp_path / "cache")


def test_the_key_covers_fingerprint_tokenizer_and_format_version(corpus, monkeypatch):
    fp = source_fingerprint(text_source(corpus))
    key = cache_key(fp, BYTE.identity)
    assert key != cache_key(fp + "x", BYTE.identity) and key != cache_key(fp, OtherByte.identity)
    monkeypatch.setattr(cache_module, "VERSION", 3)
    assert cache_key(fp, BYTE.identity) != key


KILLED = textwrap.dedent(
    """
    import os, signal, sys
    from forge_core.data.cache import cached_shards
    from forge_plugins.tokenizers.byte import ByteTokenizer

    class Dying:
        def describe(self):
            return "dying"
        def fingerprint(self):
            return "dying-1"
        def documents(self):
            for i in range(3000):
                if i == 2000:  # after batches reached the disk
                    os.kill(os.getpid(), signal.SIGKILL)
                yield f"doc {i}"

    cached_shards(Dying(), ByteTokenizer(), root=sys.argv[1], wait_s=5, label="dying", progress=False)
    """
)


def test_a_crash_mid_way_leaves_no_entry_and_the_next_build_cleans_up(tmp_path):
    root = tmp_path / "cache"
    proc = subprocess.run([sys.executable, "-c", KILLED, str(root)])
    assert proc.returncode == -signal.SIGKILL
    key = cache_key("dying-1", BYTE.identity)
    leftovers = list(root.glob(f"{key}.partial-*"))
    assert len(leftovers) == 1 and (leftovers[0] / "tokens.bin").stat().st_size > 0
    assert not (root / key).exists()  # nothing that looks complete

    class Fine:
        def describe(self):
            return "fine"

        def fingerprint(self):
            return "dying-1"

        def documents(self):
            yield from (f"doc {i}" for i in range(10))

    shards, note = cached_shards(Fine(), BYTE, root=root, wait_s=5, label="fine", progress=False)
    assert shards.num_documents == 10 and note.startswith("tokenized")
    assert not list(root.glob(f"{key}.partial-*"))


def test_a_waiting_process_reports_the_holder_and_gives_up_after_wait_s(corpus, tmp_path):
    root = tmp_path / "cache"
    root.mkdir()
    key = cache_key(source_fingerprint(text_source(corpus)), BYTE.identity)
    with open(root / f"{key}.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        held.write("pid 4242 on elsewhere since 2030-01-01 00:00:00\n")
        held.flush()
        notes = []
        with pytest.raises(
            ForgeError,
            match=r"gave up after \d+ s waiting for pid 4242 on elsewhere .* "
            r"\(data.cache.wait_s: 0.5\)",
        ):
            cached_shards(
                text_source(corpus),
                BYTE,
                root=root,
                wait_s=0.5,
                label="text",
                progress=False,
                report=notes.append,
            )
    assert notes and notes[0].startswith("waiting for pid 4242 on elsewhere")
    shards, _ = build(corpus, root)  # released: the next build goes ahead
    assert shards.num_documents == 6


def test_a_source_without_fingerprint_is_fingerprinted_by_its_documents(tmp_path, counted):
    class Plain:
        def __init__(self, docs):
            self.docs = docs

        def describe(self):
            return "plain"

        def documents(self):
            yield from self.docs

    a, _ = cached_shards(Plain(["x", "y"]), BYTE, root=tmp_path, wait_s=5, label="p", progress=False)
    b, _ = cached_shards(Plain(["x", "y"]), BYTE, root=tmp_path, wait_s=5, label="p", progress=False)
    c, _ = cached_shards(Plain(["x", "z"]), BYTE, root=tmp_path, wait_s=5, label="p", progress=False)
    assert a.path == b.path != c.path and len(counted) == 2


def test_a_training_build_reads_through_the_cache_and_says_so(corpus, tmp_path, counted):
    config = tmp_path / "c.yaml"
    config.write_text(
        json.dumps(
            {
                "data": {
                    "source": "text",
                    "source_options": {"paths": [str(corpus / "*.txt")]},
                    "tokenizer": "byte",
                    "seq_len": 32,
                    "cache": {"dir": str(tmp_path / "c")},
                }
            }
        )
    )
    cfg, registries = load_resolved(str(config))
    plan = make_plan(cfg, registries, 1)
    first = build_training_data(plan, registries, BYTE, report=lambda m: None)
    second = build_training_data(plan, registries, BYTE, report=lambda m: None)
    assert len(counted) == 1
    assert "tokens tokenized into" in first.summary and "tokens cached at" in second.summary
    assert first.rows.num_rows == second.rows.num_rows > 0
    rows = np.arange(first.rows.num_rows)
    assert all(np.array_equal(first.rows.read(rows)[k], second.rows.read(rows)[k]) for k in first.rows.keys)
