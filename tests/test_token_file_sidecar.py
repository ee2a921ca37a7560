"""The ``token_file`` source keeps its document boundaries in a sidecar beside the file:
a second start reads them instead of scanning the corpus, and nothing but an unchanged,
settled file of the same EOS is ever trusted (a changed, touched or fresh file, another
EOS, a damaged or lying sidecar is scanned again)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from forge_plugins.sources import token_file
from forge_plugins.sources.options import TokenFileOptions
from forge_plugins.sources.token_file import TokenFileSource

EOS = 257


def write(path, documents, age_s=3600):
    """Documents each followed by EOS, as uint16; modified ``age_s`` seconds ago."""
    np.concatenate([np.append(d, EOS) for d in documents]).astype("<u2").tofile(path)
    if age_s:
        ns = os.stat(path).st_mtime_ns - age_s * 10**9
        os.utime(path, ns=(ns, ns))
    return str(path)


def boundaries(path):
    docs = TokenFileSource(TokenFileOptions(path=path, dtype="uint16")).token_documents(EOS)
    return docs.starts.tolist(), docs.counts.tolist()


@pytest.fixture
def scans(monkeypatch):
    """Counts the scans of the file for EOS."""
    count = []
    real = token_file.scan

    def counted(tokens, eos_id):
        count.append(eos_id)
        return real(tokens, eos_id)

    monkeypatch.setattr(token_file, "scan", counted)
    return count


def test_a_second_start_reads_the_sidecar_instead_of_scanning(tmp_path, scans):
    path = write(tmp_path / "a.bin", [[1, 2, 3], [4], [5, 6]])
    first = boundaries(path)
    assert first == ([0, 4, 6], [3, 1, 2]) and len(scans) == 1
    assert token_file.sidecar_path(path, EOS).is_file()
    assert boundaries(path) == first and len(scans) == 1  # no second scan
    boundaries(path)
    assert len(scans) == 1


def test_a_changed_file_is_scanned_again(tmp_path, scans):
    path = write(tmp_path / "a.bin", [[1, 2, 3], [4], [5, 6]])
    boundaries(path)
    # Rewritten in place (the same inode) at the same size, other documents: only the
    # modification time tells.
    write(path, [[1], [2, 3], [4, 5, 6]])
    assert os.path.getsize(path) == 18
    assert boundaries(path) == ([0, 2, 5], [1, 2, 3]) and len(scans) == 2
    # Touched (same bytes, new mtime): not trusted either.
    stat = os.stat(path)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    boundaries(path)
    assert len(scans) == 3


def test_a_fresh_file_is_never_trusted(tmp_path, scans):
    # Written just now: it could still change within the clock's granularity.
    path = write(tmp_path / "a.bin", [[1, 2], [3]], age_s=0)
    boundaries(path), boundaries(path)
    assert len(scans) == 2


def test_another_eos_a_damaged_or_a_lying_sidecar_is_scanned_again(tmp_path, scans):
    path = write(tmp_path / "a.bin", [[1, 2, 3], [4], [5, 6]])
    boundaries(path)
    other = TokenFileSource(TokenFileOptions(path=path, dtype="uint16")).token_documents(4)
    assert other.counts.tolist() == [4, 4] and len(scans) == 2  # its own sidecar
    sidecar = token_file.sidecar_path(path, EOS)
    sidecar.write_bytes(b"not a zip file")
    assert boundaries(path) == ([0, 4, 6], [3, 1, 2]) and len(scans) == 3
    # A sidecar whose stat matches but whose boundaries run past the file's end.
    with np.load(sidecar) as z:
        meta = str(z["meta"])
    np.savez(
        sidecar, starts=np.array([0, 4], np.int64), lengths=np.array([4, 99], np.int64), meta=np.array(meta)
    )
    assert boundaries(path) == ([0, 4, 6], [3, 1, 2]) and len(scans) == 4


def test_a_directory_that_cannot_be_written_only_costs_the_scan(tmp_path, scans, monkeypatch):
    path = write(tmp_path / "a.bin", [[1, 2, 3], [4]])

    def refuse(*_):
        raise PermissionError("read-only")

    monkeypatch.setattr(token_file, "atomic_write", refuse)
    assert boundaries(path) == ([0, 4], [3, 1]) and boundaries(path) == ([0, 4], [3, 1])
    assert len(scans) == 2 and not token_file.sidecar_path(path, EOS).exists()
