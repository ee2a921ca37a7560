"""Peak memory in the step metrics: the resident-memory high-water mark on CPU, the
CUDA peaks per logging window, their largest over processes, in every logger."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from train_helpers import Recorder, read_metrics, tiny_config, write_config

from forge_core.testing import train_in_process
from forge_core.train import memory
from forge_core.train.memory import MemoryMeter, peak_rss_bytes


def test_rss_high_water_mark_rises_with_what_the_process_touches():
    """In a fresh process (this one's mark may stand higher already, from earlier tests)."""
    script = textwrap.dedent("""
        import torch
        from forge_core.train.memory import peak_rss_bytes
        before = peak_rss_bytes()
        block = torch.ones(64 * 2**20)  # 256 MiB, every page written
        after = peak_rss_bytes()
        del block
        print(before, after, peak_rss_bytes())
    """)
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120
    )
    before, after, later = map(int, out.stdout.split())
    assert after - before >= 200 * 2**20
    # The block is gone but the high-water mark stays (to within the few pages the
    # kernel's per-thread RSS counters may lag by).
    assert later >= after - 4 * 2**20


def test_rss_falls_back_to_getrusage_without_proc(monkeypatch):
    proc = peak_rss_bytes()
    real = Path.read_text

    def no_proc(self, *args, **kwargs):
        if str(self) == "/proc/self/status":
            raise OSError("no /proc")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", no_proc)
    # Both are the same kernel counter; allow for pages touched in between.
    assert peak_rss_bytes() == pytest.approx(proc, rel=0.05)


def test_cuda_peaks_are_read_per_window_and_reset_after_it(monkeypatch):
    peaks = {"allocated": 3 * 2**30, "reserved": 4 * 2**30}
    resets = []
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device: peaks["allocated"])
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda device: peaks["reserved"])
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device: resets.append(device))
    meter = MemoryMeter(torch.device("cuda", 0))
    assert len(resets) == 1  # the first window starts with the meter
    got = meter.measure()
    assert got[memory.CUDA_ALLOCATED] == got[memory.CUDA_ALLOCATED + memory.MAX] == 3.0
    assert got[memory.CUDA_RESERVED] == got[memory.CUDA_RESERVED + memory.MAX] == 4.0
    assert got[memory.RSS] > 0
    meter.next_window()
    assert resets == [torch.device("cuda", 0)] * 2


def test_no_cuda_keys_on_cpu():
    got = MemoryMeter(torch.device("cpu")).measure()
    anon = {memory.ANON, memory.ANON + memory.MAX} if sys.platform.startswith("linux") else set()
    assert set(got) == {memory.RSS, memory.RSS + memory.MAX} | anon
    assert got[memory.RSS] == got[memory.RSS + memory.MAX] > 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RssAnon is Linux's")
def test_anonymous_memory_is_what_the_process_holds_now_not_a_mapped_file(tmp_path):
    import numpy as np

    meter = MemoryMeter(torch.device("cpu"))
    before = meter.measure()[memory.ANON]
    block = torch.ones(16 * 2**20)  # 64 MiB, every page written
    held = meter.measure()[memory.ANON]
    del block
    after = meter.measure()[memory.ANON]
    assert held - before >= 48 / 1024 and after < held - 48 / 1024  # GiB: falls when freed
    path = tmp_path / "tokens.bin"
    np.full(64 * 2**20, 1, np.uint8).tofile(path)  # a 64 MiB file
    mapped = np.memmap(path, dtype=np.uint8, mode="r")
    assert int(mapped[:: 4096 // 2].sum(dtype=np.uint64)) == 32 * 2**10  # every page read
    assert meter.measure()[memory.ANON] < after + 24 / 1024  # file-backed: not anonymous


def test_every_step_reports_memory_to_hooks_jsonl_and_console(tmp_path, monkeypatch, capsys):
    windows = []
    monkeypatch.setattr(MemoryMeter, "next_window", lambda self: windows.append(1))
    rec = Recorder()
    cfg = tiny_config(
        tmp_path,
        "mem",
        train={"steps": 5},
        logging={"loggers": ["console", "jsonl"], "every": 2, "options": {"console": {"bar": False}}},
    )
    path = write_config(tmp_path / "mem.yaml", cfg)
    assert train_in_process(path, [], extra_plugins=(("rec", rec),)) == "completed"
    for step, metrics in rec.metrics.items():
        assert metrics[memory.RSS] == metrics[memory.RSS + memory.MAX] > 0.01, step  # alone: max is its own
    # logged steps 2, 4 and the last; one window for the meter's start, one after each
    assert len(windows) == 1 + 3
    records = read_metrics(tmp_path / "mem")
    assert [r["step"] for r in records] == [2, 4, 5]
    assert all(r[memory.RSS + memory.MAX] > 0.01 for r in records)
    err = capsys.readouterr().err
    assert f"rss {records[-1][memory.RSS + memory.MAX]:.2f} GiB" in err
