"""The file manifest: a start checks the corpus by stat and reads none of it; any file
whose identity, size or modification time changed is hashed again (and only that one);
``forge-run prepare --verify`` catches an edit that kept the size and time."""

from __future__ import annotations

import os
import shutil
import time

import numpy as np
import pytest
from train_helpers import tiny_config, write_config

from forge_core.api import FileSet, files_fingerprint
from forge_core.api import fingerprint as fp_module
from forge_core.data.cache import cached_shards
from forge_core.data.manifest import fingerprint
from forge_core.testing import forge_run
from forge_plugins.sources.options import TextOptions
from forge_plugins.sources.text import TextSource
from forge_plugins.tokenizers.byte import ByteTokenizer

BYTE = ByteTokenizer()
HOUR_AGO_NS = time.time_ns() - 3600 * 10**9


def age(path, ns=HOUR_AGO_NS):
    """Set ``path``'s times an hour back: a record of it is then not racy."""
    os.utime(path, ns=(ns, ns))


@pytest.fixture
def corpus(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    for i in range(5):
        (data / f"{i}.txt").write_text(f"document {i} " + "lorem ipsum " * (10 + 3 * i))
        age(data / f"{i}.txt")
    return data


@pytest.fixture
def reads(monkeypatch):
    """The files hashed (every byte read), in order."""
    seen = []
    original = fp_module.file_digest

    def counting(path):
        seen.append(os.path.basename(path))
        return original(path)

    monkeypatch.setattr(fp_module, "file_digest", counting)
    return seen


def start(corpus, root):
    source = TextSource(TextOptions(paths=[str(corpus / "*.txt")]))
    return cached_shards(source, BYTE, root=root, wait_s=5, label="text", progress=False)


def test_a_second_start_reads_no_file_and_reuses_the_entry(corpus, tmp_path, reads, counted):
    first, _ = start(corpus, tmp_path / "cache")
    assert len(reads) == 5 and len(counted) == 1
    reads.clear()
    again, note = start(corpus, tmp_path / "cache")
    assert reads == [] and len(counted) == 1 and note.startswith("cached at")
    assert again.path == first.path


@pytest.mark.parametrize("change", ["content", "size", "mtime", "inode"])
def test_a_changed_file_is_hashed_again(corpus, tmp_path, reads, counted, change):
    first, _ = start(corpus, tmp_path / "cache")
    reads.clear()
    path = corpus / "2.txt"
    text = path.read_text()
    if change == "content":  # same size, new time: new bytes
        path.write_text(text.replace("lorem", "LOREM", 1))
        age(path, HOUR_AGO_NS + 10**9)
    elif change == "size":
        path.write_text(text + " more")
        age(path)
    elif change == "mtime":  # touched: same bytes
        age(path, HOUR_AGO_NS + 1)
    else:  # replaced by a copy with its times kept (cp -p): another inode
        shutil.copy2(path, tmp_path / "copy")
        os.replace(tmp_path / "copy", path)
    second, _ = start(corpus, tmp_path / "cache")
    assert reads == ["2.txt"]  # that file alone
    new_bytes = change in ("content", "size")
    assert (second.path != first.path) == new_bytes and len(counted) == 1 + new_bytes
    reads.clear()
    start(corpus, tmp_path / "cache")
    assert reads == []  # recorded again: the next start reads nothing


def test_a_file_modified_just_before_it_was_hashed_is_not_trusted(corpus, tmp_path, reads):
    (corpus / "0.txt").write_text("fresh")  # its mtime is now: within the clock granularity
    start(corpus, tmp_path / "cache")
    reads.clear()
    start(corpus, tmp_path / "cache")
    assert reads == ["0.txt"]


def test_the_fingerprint_is_the_full_hash_of_before(corpus, tmp_path):
    files = sorted(str(p) for p in corpus.glob("*.txt"))
    full = files_fingerprint("text/1", files, {"x": 1})
    assert FileSet("text/1", files, {"x": 1}).fingerprint() == full
    assert fingerprint(FileSet("text/1", files, {"x": 1}), tmp_path).fingerprint == full
    assert fingerprint(FileSet("text/1", files, {"x": 1}), tmp_path).fingerprint == full  # from records
    assert fingerprint(FileSet("text/1", files, {"x": 2}), tmp_path).fingerprint != full


def test_a_damaged_manifest_is_ignored_not_trusted(corpus, tmp_path, reads):
    files = FileSet("text/1", sorted(str(p) for p in corpus.glob("*.txt")), {})
    checked = fingerprint(files, tmp_path)
    checked.manifest.write_text('{"format": "forge-file-manifest", "version": 1, "files": [')
    reads.clear()
    assert fingerprint(files, tmp_path).fingerprint == checked.fingerprint and len(reads) == 5


def test_verify_catches_an_edit_that_kept_size_and_time(tmp_path, reads):
    config = tiny_config(tmp_path, data={"cache": {"dir": str(tmp_path / "cache")}})
    path = write_config(tmp_path / "c.yaml", config)
    corpus = tmp_path / "corpus"
    for f in corpus.glob("*.txt"):
        age(f)
    first, _ = start(corpus, tmp_path / "cache")
    victim = sorted(corpus.glob("*.txt"))[7]
    stat = victim.stat()
    text = victim.read_text()
    victim.write_text(text[::-1])  # same size
    os.utime(victim, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # same time: a start cannot see it
    unseen, _ = start(corpus, tmp_path / "cache")
    assert unseen.path == first.path  # the documented limit

    result = forge_run(["prepare", path, "--verify"])
    assert result.code == 2, result.stderr
    assert "1 file(s) changed without a change of size or modification time" in result.stderr
    assert f"data.source: {victim}" in result.stderr and "Traceback" not in result.stderr
    fixed, _ = start(corpus, tmp_path / "cache")
    assert fixed.path != first.path
    assert bytes(np.asarray(fixed.tokens, np.uint8)).find(text[::-1].encode()) >= 0
    again = forge_run(["prepare", path, "--verify"])
    assert again.code == 0 and "0 changed under an unchanged size and time" in again.stderr


def test_prepare_without_out_or_verify_says_what_it_needs(tmp_path):
    path = write_config(tmp_path / "c.yaml", tiny_config(tmp_path))
    result = forge_run(["prepare", path])
    assert result.code == 2 and "needs --out DIR" in result.stderr
