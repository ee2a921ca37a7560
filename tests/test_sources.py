"""The built-in sources: order, splitting, JSON Lines, encodings, the stdlib corpus,
and an error naming the file (and line) for every kind of bad input."""

from __future__ import annotations

import json
import sysconfig

import pytest

from forge_core.api import ForgeError
from forge_plugins.sources.options import ShardsOptions, StdlibOptions, TextOptions
from forge_plugins.sources.shards import ShardSource
from forge_plugins.sources.stdlib import StdlibSource, stdlib_files
from forge_plugins.sources.text import TextSource


def docs(**options):
    return list(TextSource(TextOptions(**options)).documents())


@pytest.fixture
def corpus(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "2.txt").write_text("second")
    (tmp_path / "b" / "1.txt").write_text("first")
    (tmp_path / "a.txt").write_text("para one\n\npara two\n\n\n\n")
    (tmp_path / "c.jsonl").write_text(
        json.dumps({"text": "j1"}) + "\n\n" + json.dumps({"text": "j2", "id": 2}) + "\n"
    )
    return tmp_path


def test_text_order_is_patterns_then_sorted_matches_without_duplicates(corpus):
    assert docs(paths=["b/*.txt", "a.txt", "b/1.txt"]) == ["first", "second", "para one\n\npara two\n\n\n\n"]


def test_text_separator_splits_and_skips_empty_pieces(corpus):
    assert docs(paths=["a.txt"], separator="\n\n") == ["para one", "para two"]


def test_jsonl_reads_the_text_field_and_skips_blank_lines(corpus):
    assert docs(paths=["*.jsonl"]) == ["j1", "j2"]
    (corpus / "d.jsonl").write_text(json.dumps({"body": "x"}) + "\n")
    assert docs(paths=["d.jsonl"], text_field="body") == ["x"]


def test_recursive_glob(corpus):
    assert docs(paths=["**/*.txt"]) == ["para one\n\npara two\n\n\n\n", "first", "second"]


@pytest.mark.parametrize(
    "paths, message",
    [
        ([], "paths is empty"),
        (["nothing/*.txt"], r"pattern 'nothing/\*\.txt' matches no file"),
        (["missing.txt"], "no such file 'missing.txt'"),
        (["b"], "'b' is a directory"),
    ],
)
def test_bad_paths(corpus, paths, message):
    with pytest.raises(ForgeError, match=message):
        TextSource(TextOptions(paths=paths))


def test_empty_file_and_file_without_document(corpus):
    (corpus / "empty.txt").write_bytes(b"")
    with pytest.raises(ForgeError, match=r"empty\.txt: file is empty"):
        TextSource(TextOptions(paths=["a.txt", "empty.txt"]))
    (corpus / "blank.jsonl").write_text("\n  \n")
    with pytest.raises(ForgeError, match=r"blank\.jsonl: contains no document"):
        docs(paths=["blank.jsonl"])


def test_invalid_utf8_is_rejected_with_line_or_replaced(corpus):
    (corpus / "bad.txt").write_bytes(b"ok\nstill ok\nbad \xff byte\n")
    with pytest.raises(ForgeError, match=r"bad\.txt, line 3: invalid UTF-8.*encoding_errors: replace"):
        docs(paths=["bad.txt"])
    assert docs(paths=["bad.txt"], encoding_errors="replace") == ["ok\nstill ok\nbad \ufffd byte\n"]
    (corpus / "bad.jsonl").write_bytes(b'{"text": "a"}\n{"text": "\xc3("}\n')
    with pytest.raises(ForgeError, match=r"bad\.jsonl, line 2: invalid UTF-8"):
        docs(paths=["bad.jsonl"])
    assert docs(paths=["bad.jsonl"], encoding_errors="replace") == ["a", "\ufffd("]


@pytest.mark.parametrize(
    "content, message",
    [
        ('{"text": "a"}\nnot json\n', r"x\.jsonl, line 2: not valid JSON"),
        ('{"text": "a"}\n[1, 2]\n', r"x\.jsonl, line 2: expected a JSON object, got list"),
        (
            '{"text": "a"}\n\n{"body": "b", "id": 1}\n',
            r"x\.jsonl, line 3: no field 'text' \(fields: body, id\)",
        ),
        ('{"text": 5}\n', r"x\.jsonl, line 1: field 'text' is int, not a string"),
    ],
)
def test_bad_jsonl_names_file_and_line(corpus, content, message):
    (corpus / "x.jsonl").write_text(content)
    with pytest.raises(ForgeError, match=message):
        docs(paths=["x.jsonl"])


def test_utf8_bom_is_dropped(corpus):
    (corpus / "bom.txt").write_bytes(b"\xef\xbb\xbfhello")
    assert docs(paths=["bom.txt"]) == ["hello"]


# --- stdlib ------------------------------------------------------------------------


def test_stdlib_corpus_is_sorted_stdlib_source_without_tests_or_site_packages():
    files = stdlib_files()
    assert files == sorted(files) and len(files) > 300
    assert "os.py" in files and "json/decoder.py" in files
    assert not any(
        part in {"site-packages", "dist-packages", "test", "tests", "idle_test"}
        for f in files
        for part in f.split("/")
    )
    assert all(f.endswith(".py") for f in files)


def test_stdlib_limits():
    root = sysconfig.get_paths()["stdlib"]
    first = StdlibSource(StdlibOptions(max_files=3))
    assert first.files == stdlib_files()[:3]
    texts = list(first.documents())
    assert texts and texts[0] == open(f"{root}/{first.files[0]}", encoding="utf-8").read()
    limited = StdlibSource(StdlibOptions(max_bytes=200_000))
    assert 0 < limited.bytes <= 200_000
    n = len(limited.files)
    assert limited.files == stdlib_files()[:n]  # a prefix, and the longest one
    with_next = StdlibSource(StdlibOptions(max_files=n + 1))
    assert with_next.bytes > 200_000
    assert "standard library" in limited.describe() and f"{n} .py files" in limited.describe()
    with pytest.raises(ForgeError, match="no file selected"):
        StdlibSource(StdlibOptions(max_bytes=1))


# --- shards (format tested in test_prepare.py) ---------------------------------------


def test_shard_source_errors(tmp_path):
    with pytest.raises(ForgeError, match="path is empty"):
        ShardSource(ShardsOptions())
    with pytest.raises(ForgeError, match="no such shard directory"):
        ShardSource(ShardsOptions(path=str(tmp_path / "nope")))
    (tmp_path / "half").mkdir()
    with pytest.raises(ForgeError, match=r"index\.json: missing"):
        ShardSource(ShardsOptions(path=str(tmp_path / "half")))


def test_a_binary_file_is_refused_naming_it(corpus):
    (corpus / "blob.txt").write_bytes(b"GIF89a\x00\x01\x02 looks like text after the header")
    with pytest.raises(
        ForgeError, match=r"blob\.txt, line 1: a NUL byte \(at byte 6\): this looks like a binary file"
    ):
        docs(paths=["blob.txt"])
    assert docs(paths=["blob.txt"], encoding_errors="replace")[0].startswith("GIF89a\x00")
    (corpus / "rec.jsonl").write_bytes(b'{"text": "a"}\n{"text": "b\x00"}\n')
    with pytest.raises(ForgeError, match=r"rec\.jsonl, line 2: a NUL byte"):
        docs(paths=["rec.jsonl"])


def test_the_fingerprint_follows_content_and_settings_not_location(corpus, tmp_path):
    base = TextSource(TextOptions(paths=["a.txt", "b/*.txt"])).fingerprint()
    assert base == TextSource(TextOptions(paths=["a.txt", "b/*.txt"])).fingerprint()
    assert base != TextSource(TextOptions(paths=["a.txt", "b/*.txt"], separator="\n\n")).fingerprint()
    assert base != TextSource(TextOptions(paths=["b/*.txt", "a.txt"])).fingerprint()  # order matters
    moved = tmp_path / "elsewhere"
    moved.mkdir()
    (moved / "a.txt").write_bytes((corpus / "a.txt").read_bytes())
    (moved / "b").mkdir()
    for f in ("1.txt", "2.txt"):
        (moved / "b" / f).write_bytes((corpus / "b" / f).read_bytes())
    assert base == TextSource(TextOptions(paths=[str(moved / "a.txt"), str(moved / "b/*.txt")])).fingerprint()
    (corpus / "b" / "2.txt").write_text("secoND")
    assert base != TextSource(TextOptions(paths=["a.txt", "b/*.txt"])).fingerprint()
