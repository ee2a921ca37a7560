"""The peak MFU is measured against: the CUDA device table, the CPU measurement by CPU
time, ``train.peak_tflops`` and its validation, and MFU capped at 1 against a low peak."""

from __future__ import annotations

import itertools

import pytest
import torch

from forge_core.config.errors import ConfigError
from forge_core.judge import judge
from forge_core.train import peak
from forge_core.train.mfu import MfuMeter

CUDA = torch.device("cuda")


@pytest.fixture
def f32_precision():
    """Restore torch's fp32 matmul precision, which a test changes."""
    before = torch.get_float32_matmul_precision()
    yield
    torch.set_float32_matmul_precision(before)


@pytest.mark.parametrize(
    ("reported", "entry", "bf16", "fp32"),
    [
        # Names as torch.cuda.get_device_name reports them.
        ("NVIDIA H100 80GB HBM3", "NVIDIA H100 SXM", 989.5, 67.0),
        ("NVIDIA H100 PCIe", "NVIDIA H100 PCIe", 756.0, 51.0),
        ("NVIDIA H100 NVL", "NVIDIA H100 NVL", 835.5, 60.0),
        ("NVIDIA H200", "NVIDIA H200 SXM", 989.5, 67.0),
        ("NVIDIA H200 NVL", "NVIDIA H200 NVL", 835.5, 60.0),
        ("NVIDIA A100-SXM4-40GB", "NVIDIA A100 SXM 40GB", 312.0, 19.5),
        ("NVIDIA A100-SXM4-80GB", "NVIDIA A100 SXM 80GB", 312.0, 19.5),
        ("NVIDIA A100-PCIE-40GB", "NVIDIA A100 PCIe 40GB", 312.0, 19.5),
        ("NVIDIA A100 80GB PCIe", "NVIDIA A100 PCIe 80GB", 312.0, 19.5),
        ("NVIDIA B200", "NVIDIA B200", 2250.0, 75.0),
    ],
)
def test_a_cuda_peak_comes_from_the_device_table_by_name_and_dtype(
    monkeypatch, f32_precision, reported, entry, bf16, fp32
):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: reported)
    got = peak.peak_flops(CUDA, torch.bfloat16)
    assert got == peak.Peak(bf16 * 1e12, f"device table: {entry}, dense bf16")
    torch.set_float32_matmul_precision("highest")  # torch's default: fp32 on CUDA cores
    assert peak.peak_flops(CUDA, torch.float32) == peak.Peak(
        fp32 * 1e12, f"device table: {entry}, dense fp32"
    )
    torch.set_float32_matmul_precision("high")  # fp32 matmuls run as TF32
    tf32 = peak.peak_flops(CUDA, torch.float32)
    assert tf32.source == f"device table: {entry}, dense tf32" and fp32 * 1e12 < tf32.flops < bf16 * 1e12


def test_a_gpu_outside_the_table_is_not_given_a_neighbours_figure():
    assert peak.table_entry("Tesla T4") is None
    assert peak.table_entry("NVIDIA GeForce RTX 4090") is None


def test_a_configured_peak_wins_over_the_table(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    assert peak.peak_flops(CUDA, torch.bfloat16, 2.5) == peak.Peak(2.5e12, "train.peak_tflops")


def scripted(*deltas):
    """A clock whose successive (start, end) readings are ``deltas`` apart."""
    readings = itertools.chain.from_iterable((10.0 * i, 10.0 * i + d) for i, d in enumerate(deltas))
    return lambda: next(readings)


def test_the_cpu_peak_is_the_best_sample_times_the_threads():
    # Samples of 0.4 s, 0.1 s (the one that had the core) and 0.2 s of CPU time; a
    # sample the clock cannot resolve (0 s) says nothing.
    got = peak.measure_cpu(torch.float32, 3, samples=4, size=8, clock=scripted(0.4, 0.1, 0.0, 0.2))
    assert got.flops == pytest.approx(3 * 2 * 8**3 / 0.1)
    assert got.source == "measured by CPU time: best of 4 8x8 float32 matmuls, 3 threads"


def test_the_cpu_peak_is_timed_by_cpu_time_not_the_wall_clock(monkeypatch):
    """A busy machine stretches wall time: the wall clock here says each matmul took an
    hour; the CPU-time clock is the one the peak comes from."""
    monkeypatch.setattr(peak, "CPU_SIZE", 8)
    monkeypatch.setattr(peak, "CPU_SAMPLES", 2)
    monkeypatch.setattr(peak.time, "process_time", scripted(0.5, 0.25))
    wall = itertools.count(0.0, 3600.0)
    monkeypatch.setattr(peak.time, "perf_counter", lambda: next(wall))
    monkeypatch.setattr(peak.time, "monotonic", lambda: next(wall))
    threads = torch.get_num_threads()
    got = peak.peak_flops(torch.device("cpu"), torch.float32)
    assert got.flops == pytest.approx(threads * 2 * 8**3 / 0.25)


def test_the_cpu_peak_is_measured_at_every_start_not_cached(monkeypatch, tmp_path):
    monkeypatch.setenv("FORGE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(peak, "CPU_SIZE", 8)
    monkeypatch.setattr(peak, "CPU_SAMPLES", 1)
    monkeypatch.setattr(peak.time, "process_time", scripted(1.0, 0.5))
    first = peak.peak_flops(torch.device("cpu"), torch.float32)
    second = peak.peak_flops(torch.device("cpu"), torch.float32)
    assert second.flops == 2 * first.flops and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("-1", "must be at least 0, got -1.0"),
        ("-0.5", "must be at least 0, got -0.5"),
        (".inf", "expected a finite number, got inf; peak_tflops must be at least 0"),
        (".nan", "expected a finite number, got nan; peak_tflops must be at least 0"),
        ("'fast'", "expected a number, got 'fast' (str); peak_tflops must be at least 0"),
    ],
)
def test_a_configured_peak_must_be_finite_and_at_least_0(tmp_path, value, message):
    config = tmp_path / "c.yaml"
    config.write_text(f"train:\n  peak_tflops: {value}\n")
    with pytest.raises(ConfigError) as info:
        judge(config, [])
    assert dict(info.value.issues) == {"$.train.peak_tflops": message}


def test_mfu_above_the_peak_is_capped_flagged_and_said_once():
    # 6 FLOPs per token per matmul parameter: 100 params x 10 tokens = 6,000 FLOPs a step.
    meter = MfuMeter(n_matmul=100, attn_width=0, peak=1000.0, peak_source="train.peak_tflops", world_size=1)
    assert meter(10, 0, 12.0) == (0.5, False, None)  # 500 FLOP/s: half the peak
    mfu, capped, notice = meter(10, 0, 4.0)  # 1,500 FLOP/s: 150% of the peak
    assert (mfu, capped) == (1.0, True)
    assert "above the peak of 1e-09 TFLOP/s (train.peak_tflops)" in notice
    assert "underestimated" in notice and "Set train.peak_tflops" in notice
    assert meter(10, 0, 1.0) == (1.0, True, None)  # said once
    assert meter(10, 0, 12.0) == (0.5, False, None)
