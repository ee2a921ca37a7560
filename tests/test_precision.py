"""``train.precision: bf16``: refused with a clear error where the hardware has no bf16,
and where it has, a few steps train with the loss in fp32 (full and chunked loss)."""

from __future__ import annotations

import pytest
import torch
from train_helpers import Recorder, tiny_config, write_config

from forge_core.api import ForgeError
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
