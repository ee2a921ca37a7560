"""The one file-system utility (:mod:`forge_core.api.files`): a file replaced atomically,
a directory moved into place, and why a directory cannot be written. Each failure
leaves no partial result and the previous content as it was."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys

import pytest

from forge_core.api.files import (
    ATOMIC_TMP_RE,
    TEMPORARY_MARKER,
    atomic_write,
    directory_problem,
    leftover_temporaries,
    move_into_place,
    remove_temporary,
    temporary_dir,
)


def _no_space(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_atomic_write_replaces_text_and_bytes_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "state.json"
    atomic_write(path, "héllo\n")
    assert path.read_bytes() == "héllo\n".encode()
    atomic_write(path, b"\x89PNG\x00")
    assert path.read_bytes() == b"\x89PNG\x00"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]


@pytest.mark.parametrize("where", ["fsync", "replace"])
def test_a_failed_atomic_write_keeps_the_old_file_and_removes_the_temporary(tmp_path, monkeypatch, where):
    path = tmp_path / "state.json"
    path.write_text("old")
    seen = []
    real_fsync = os.fsync

    def fsync_then_fail(fd):
        seen.append(sorted(p.name for p in tmp_path.iterdir()))
        _no_space()

    monkeypatch.setattr(os, "fsync", fsync_then_fail if where == "fsync" else real_fsync)
    if where == "replace":
        monkeypatch.setattr(os, "replace", _no_space)
    with pytest.raises(OSError, match="No space left"):
        atomic_write(path, "new content")
    assert path.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]
    if where == "fsync":  # the failure came while the temporary existed beside the file
        temporary = [n for n in seen[0] if n != "state.json"]
        assert len(temporary) == 1 and ATOMIC_TMP_RE.match(temporary[0])


def _tree(root):
    return {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*")) if p.is_file()}


def _written(root, files):
    root.mkdir()
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_move_into_place_creates_or_replaces_the_directory(tmp_path):
    out = tmp_path / "out"
    move_into_place(_written(tmp_path / "a.partial", {"x": "1", "sub/y": "2"}), out)
    assert _tree(out) == {"x": "1", "sub/y": "2"}
    move_into_place(_written(tmp_path / "b.partial", {"z": "3"}), out)
    assert _tree(out) == {"z": "3"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no .old, no partial left


def test_a_failed_move_into_place_puts_the_old_directory_back(tmp_path, monkeypatch):
    out = _written(tmp_path / "out", {"x": "old"})
    tmp = _written(tmp_path / "out.partial", {"x": "new"})
    real_replace = os.replace

    def fail_on_the_new_one(src, dst):
        if os.fspath(src) == str(tmp):
            _no_space()
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", fail_on_the_new_one)
    with pytest.raises(OSError, match="No space left"):
        move_into_place(tmp, out)
    assert _tree(out) == {"x": "old"}
    assert _tree(tmp) == {"x": "new"}  # left for the caller to remove
    assert not (tmp_path / "out.old").exists()


def test_move_into_place_without_replace_never_touches_an_existing_directory(tmp_path):
    out = _written(tmp_path / "out", {"x": "old"})
    tmp = _written(tmp_path / "out.partial", {"x": "new"})
    with pytest.raises(OSError):
        move_into_place(tmp, out, replace=False)
    assert _tree(out) == {"x": "old"} and _tree(tmp) == {"x": "new"}
    move_into_place(tmp, tmp_path / "fresh", replace=False)
    assert _tree(tmp_path / "fresh") == {"x": "new"}


def test_move_into_place_touches_no_sibling_named_old_or_partial(tmp_path):
    """The names a user may have chosen beside ``out`` (``out.old``, ``out.partial``)
    hold the user's files: replacing ``out`` twice leaves them as they were."""
    siblings = {
        name: _written(tmp_path / name, {"run/config.yaml": name}) for name in ("out.old", "out.partial")
    }
    out = tmp_path / "out"
    for content in ("1", "2"):
        tmp = temporary_dir(out)
        (tmp / "x").write_text(content)
        move_into_place(tmp, out)
        assert _tree(out) == {"x": content}  # the marker stays behind, out holds only what was written
    for name, folder in siblings.items():
        assert _tree(folder) == {"run/config.yaml": name}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "out.old", "out.partial"]


def _dead_pid() -> int:
    proc = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    return int(proc.stdout)


def test_only_temporaries_forge_marked_are_removed_and_leftovers_only_of_gone_writers(tmp_path):
    out = tmp_path / "out"
    mine = temporary_dir(out)  # this process writes there: in use
    assert mine.name.startswith(".out.forge-partial-") and (mine / TEMPORARY_MARKER).is_file()
    left = temporary_dir(out)
    marker = json.loads((left / TEMPORARY_MARKER).read_text())
    (left / TEMPORARY_MARKER).write_text(json.dumps({**marker, "pid": _dead_pid()}))
    # The same pattern of name, without the marker: somebody's folder, never removed.
    lookalike = _written(tmp_path / ".out.forge-partial-mine", {"keep": "me"})
    assert leftover_temporaries(out) == [left]
    assert sorted(leftover_temporaries(out, running=True)) == sorted([mine, left])
    assert not remove_temporary(lookalike) and not remove_temporary(tmp_path / "missing")
    assert remove_temporary(left) and not left.exists()
    assert _tree(lookalike) == {"keep": "me"}


def test_a_failed_move_into_place_leaves_the_temporary_marked(tmp_path, monkeypatch):
    tmp = temporary_dir(tmp_path / "out")
    monkeypatch.setattr(os, "replace", _no_space)
    with pytest.raises(OSError, match="No space left"):
        move_into_place(tmp, tmp_path / "out")
    assert remove_temporary(tmp) and list(tmp_path.iterdir()) == []


def test_directory_problem_says_why_and_creates_nothing(tmp_path, monkeypatch):
    (tmp_path / "a-file").write_text("x")
    assert directory_problem(tmp_path / "a-file") == "exists and is not a directory"
    below_a_file = directory_problem(tmp_path / "a-file" / "run")
    assert below_a_file == f"cannot be created: {str(tmp_path / 'a-file')!r} is a file"
    assert directory_problem(tmp_path / "new" / "run") is None and not (tmp_path / "new").exists()
    assert directory_problem(tmp_path) is None
    locked = tmp_path / "locked"
    locked.mkdir()
    # Root may write anywhere, so the permission answer is the operating system's, faked.
    monkeypatch.setattr(os, "access", lambda p, mode: os.fspath(p) != str(locked))
    assert directory_problem(locked) == "is not writable by this user"
    below = directory_problem(locked / "a" / "b")
    assert below == f"cannot be created: {str(locked)!r} is not writable by this user"
