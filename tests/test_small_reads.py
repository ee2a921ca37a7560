"""The bounded reader of small metadata files (:func:`forge_core.api.files.read_small_text`):
a regular file (or a symlink to one) of at most its limit is read; a FIFO, a device, a
directory or a larger file is refused with the file's name and why, without blocking
and without reading more than the limit."""

from __future__ import annotations

import os

import pytest
from deadline import deadline

from forge_core.api import ForgeError
from forge_core.api.files import FileRefused, read_small_text


def test_a_small_regular_file_and_a_link_to_one_are_read(tmp_path):
    (tmp_path / "ref").write_text("a" * 40 + "\n")
    (tmp_path / "link").symlink_to(tmp_path / "ref")  # the Hub cache links snapshots to blobs
    assert read_small_text(tmp_path / "ref", 41, "the ref") == "a" * 40 + "\n"
    assert read_small_text(str(tmp_path / "link"), 41, "the ref") == "a" * 40 + "\n"
    with pytest.raises(FileNotFoundError):
        read_small_text(tmp_path / "missing", 41, "the ref")  # absent: as open() says it


@pytest.mark.parametrize(
    "kind, says",
    [
        ("fifo", "is a FIFO (named pipe), not a regular file"),
        ("zero", "is a character device, not a regular file"),
        ("dir", "is a directory, not a regular file"),
        ("big", "is more than the 41 bytes such a file may be"),
    ],
)
def test_anything_else_is_refused_with_its_path_and_why(tmp_path, kind, says):
    path = tmp_path / "ref"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "zero":
        path.symlink_to("/dev/zero")  # endless: bounded by the limit even if it were read
    elif kind == "dir":
        path.mkdir()
    else:
        path.write_text("a" * 42)
    with deadline(30, f"reading a {kind}"), pytest.raises(FileRefused) as info:
        read_small_text(path, 41, "the Hub cache ref")
    assert isinstance(info.value, ForgeError) and not isinstance(info.value, OSError)
    assert str(info.value).startswith(f"the Hub cache ref {str(path)!r} {says}")
