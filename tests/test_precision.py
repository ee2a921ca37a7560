"""``train.precision: bf16``: refused with a clear error where the hardware has no bf16
(by ``check`` from the CPU flags, and by the run), and where it has, a few steps train
with the loss in fp32 (full and chunked loss)."""

from __future__ import annotations

import pytest
import torch
from train_helpers import Recorder, tiny_config, write_config

from forge_core import hardware
from forge_core.api import ForgeError
from forge_core.judge import judge
from forge_core.testing import train_in_process
from forge_core.train import precision

needs_bf16 = pytest.mark.skipif(
    not precision.cpu_has_bf16(), reason="this CPU has no native bf16 (AVX512_BF16/AMX)"
)


def test_bf16_detection_follows_the_cpu_capabilities(monkeypatch):
    monkeypatch.setattr(
        torch.cpu, "get_capabilities", lambda: {"avx512_bf16": False, "amx_bf16": True, "avx2": True}
    )
    assert precision.cpu_has_bf16()
    monkeypatch.setattr(
        torch.cpu, "get_capabilities", lambda: {"avx512_bf16": False, "amx_bf16": False, "avx2": True}
    )
    assert not precision.cpu_has_bf16()


def test_bf16_on_a_cpu_without_it_stops_before_anything_is_built(tmp_path, monkeypatch):
    monkeypatch.setattr(precision, "cpu_has_bf16", lambda: False)
    config = tiny_config(tmp_path, "nobf16", train={"steps": 2, "precision": "bf16"})
    with pytest.raises(
        ForgeError, match=r"train.precision: bf16, but this CPU has no native bf16.*train.precision: fp32"
    ):
        train_in_process(write_config(tmp_path / "c.yaml", config), [])
    assert not (tmp_path / "nobf16" / "checkpoints").exists()
    precision.check_precision("fp32", torch.device("cpu"))  # fp32 needs nothing


@needs_bf16
@pytest.mark.parametrize("loss", ["full", "chunked"])
def test_bf16_steps_train_with_the_loss_in_fp32(tmp_path, monkeypatch, loss):
    """Eight bf16 steps: the loss falls; the loss sum the trainer back-propagates is
    fp32 while the logits (full loss) come out of a bf16 matmul."""
    from forge_core.train import loss as losses

    dtypes = []
    real = losses.loss_fn

    def recording(logits, labels):
        loss_sum, tokens = real(logits, labels)
        dtypes.append((logits.dtype, loss_sum.dtype))
        return loss_sum, tokens

    monkeypatch.setattr(losses, "loss_fn", recording)
    from forge_core.train.chunked_loss import ChunkedLoss

    real_chunked = ChunkedLoss.__call__

    def chunked(self, hidden, labels):
        loss_sum, tokens = real_chunked(self, hidden, labels)
        dtypes.append(
            (torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None, loss_sum.dtype)
        )
        return loss_sum, tokens

    monkeypatch.setattr(ChunkedLoss, "__call__", chunked)
    rec = Recorder()
    config = tiny_config(
        tmp_path,
        loss,
        train={"steps": 8, "precision": "bf16", "lr": 1e-2, "loss": {"name": loss, "chunk_tokens": 40}},
    )
    train_in_process(write_config(tmp_path / f"{loss}.yaml", config), [], extra_plugins=(("rec", rec),))
    losses_seen = [rec.metrics[step]["loss"] for step in range(1, 9)]
    assert losses_seen[-1] < losses_seen[0] - 0.3, losses_seen
    assert len(dtypes) == 8 and all(d == (torch.bfloat16, torch.float32) for d in dtypes), dtypes


# --- what check says before anything starts (torch-free, from the CPU flags) ---------

XEON_FLAGS = "fpu vme sse sse2 avx avx2 avx512f avx512bw avx512_vnni"


def _judged(forge_config, device, tmp_path, monkeypatch, flags, gpu=False):
    """judge a bf16 config on a machine whose /proc/cpuinfo lists ``flags``."""
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nmodel name\t: test\nflags\t\t: {flags}\n\nprocessor\t: 1\n")
    gpus = tmp_path / "gpus"
    gpus.mkdir(exist_ok=True)
    if gpu:
        (gpus / "0000:01:00.0").mkdir(exist_ok=True)
    monkeypatch.setattr(hardware, "CPUINFO", cpuinfo)
    monkeypatch.setattr(hardware, "NVIDIA_GPUS", gpus)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    path = forge_config(
        {"run": {"device": device}, "train": {"precision": "bf16"}, "data": {"packer": "none"}}
    )
    return {v.rule_id: v for v in judge(path, [], 1).violations if v.rule_id.startswith("train.bf16")}


def test_check_refuses_bf16_on_a_cpu_without_it(forge_config, tmp_path, monkeypatch):
    found = _judged(forge_config, "cpu", tmp_path, monkeypatch, XEON_FLAGS)
    (violation,) = found.values()
    assert violation.rule_id == "train.bf16-on-cpu" and violation.severity == "error"
    assert ("train.precision", "bf16") in violation.fields
    assert "this machine's CPU has no native bf16 arithmetic" in violation.message
    assert "train.precision: fp32" in violation.fix
    for native in ("avx512_bf16", "amx_bf16 amx_tile"):
        assert not _judged(forge_config, "cpu", tmp_path, monkeypatch, f"{XEON_FLAGS} {native}"), native
    # Arm lists its extensions under Features; unreadable flags (not Linux) say nothing.
    assert not _judged(forge_config, "cpu", tmp_path, monkeypatch, "fp asimd bf16")
    monkeypatch.setattr(hardware, "CPUINFO", tmp_path / "missing")
    assert hardware.cpu_flags() is None


def test_check_warns_on_bf16_with_device_auto_and_no_gpu_in_sight(forge_config, tmp_path, monkeypatch):
    found = _judged(forge_config, "auto", tmp_path, monkeypatch, XEON_FLAGS)
    assert [(v.rule_id, v.severity) for v in found.values()] == [("train.bf16-on-auto-device", "warning")]
    assert "no CUDA GPU is visible here" in found["train.bf16-on-auto-device"].message
    assert not _judged(forge_config, "auto", tmp_path, monkeypatch, XEON_FLAGS, gpu=True)
    assert not _judged(
        forge_config, "cuda", tmp_path, monkeypatch, XEON_FLAGS
    )  # the GPU's answer is the run's
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert hardware.cuda_gpu_visible() is False
