"""Rotary position embeddings in Hugging Face's ``rotate_half`` layout.

A head vector is split into halves ``(x1, x2)``; channel ``i`` of each half is rotated
by the angle ``position * theta^(-2i / head_dim)``. This is the layout of
``transformers``' Llama, so ``wq``/``wk`` weights move between Forge and Hugging Face
without the interleaved-to-half permutation Meta's original checkpoints need.

The cos/sin table covers positions ``0 .. max_seq_len - 1`` in fp32 and is a
non-persistent buffer: it is rebuilt from the options, never stored in checkpoints.

Scaling (``model.options.rope_scaling``) changes the inverse frequencies and, for YaRN,
scales cos and sin, computed operation for operation as transformers'
``modeling_rope_utils`` does in fp32, so an imported checkpoint sees the same table:
``linear`` (frequencies divided by ``factor``), ``llama3`` (Llama 3.1's three frequency
bands), ``yarn`` (a ramp between interpolated and extrapolated frequencies, and an
attention factor) and ``dynamic`` (dynamic NTK, which equals the plain table while the
sequence fits the original context; the rules refuse a longer ``max_seq_len``).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn


def _llama3(inv_freq: torch.Tensor, scaling: Any) -> torch.Tensor:
    factor, low, high = scaling.factor, scaling.low_freq_factor, scaling.high_freq_factor
    old_context = scaling.original_max_position_embeddings
    low_freq_wavelen, high_freq_wavelen = old_context / low, old_context / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(medium, smoothed, scaled)


def _yarn(theta: float, head_dim: int, scaling: Any, device: Any) -> torch.Tensor:
    factor, original = scaling.factor, scaling.original_max_position_embeddings

    def correction_dim(rotations: float) -> float:
        return (head_dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(theta))

    low, high = correction_dim(scaling.beta_fast), correction_dim(scaling.beta_slow)
    if scaling.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001  # as transformers: no zero-width ramp
    pos_freqs = theta ** (torch.arange(0, head_dim, 2).to(device=device, dtype=torch.float) / head_dim)
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    ramp = torch.clamp((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    keep = 1 - ramp.to(device=device, dtype=torch.float)
    return interpolation * (1 - keep) + extrapolation * keep


def inverse_frequencies(
    head_dim: int, theta: float, scaling: Any = None, device=None
) -> tuple[torch.Tensor, float]:
    """``(inverse frequencies, attention factor)`` for ``scaling`` (a
    :class:`~forge_plugins.models.options.RopeScaling` or ``None``)."""
    kind = scaling.type if scaling is not None else "default"
    if kind == "yarn":
        factor = scaling.attention_factor or (
            1.0 if scaling.factor <= 1 else 0.1 * math.log(scaling.factor) + 1.0
        )
        return _yarn(theta, head_dim, scaling, device), factor
    inv_freq = 1.0 / (
        theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float() / head_dim)
    )
    if kind == "linear":
        inv_freq = inv_freq / scaling.factor
    elif kind == "llama3":
        inv_freq = _llama3(inv_freq, scaling)
    return inv_freq, 1.0


def rotary_table(head_dim: int, max_seq_len: int, theta: float, device=None, scaling: Any = None):
    """``(cos, sin)`` of shape ``(max_seq_len, head_dim)``, computed as transformers does."""
    inv_freq, attention_factor = inverse_frequencies(head_dim, theta, scaling, device)
    positions = torch.arange(max_seq_len, dtype=torch.int64, device=device).float()
    freqs = torch.outer(positions, inv_freq)
    angles = torch.cat((freqs, freqs), dim=-1)
    if attention_factor != 1.0:
        return angles.cos() * attention_factor, angles.sin() * attention_factor
    return angles.cos(), angles.sin()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x (B, S, H, D)`` with ``cos``/``sin`` of shape ``(B or 1, S, 1, D)``."""
    if cos.dtype != x.dtype:
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return x * cos + rotate_half(x) * sin


class Rotary(nn.Module):
    def __init__(self, head_dim: int, max_seq_len: int, theta: float, scaling: Any = None) -> None:
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"rotary embeddings need an even head dim, got {head_dim}")
        self.head_dim, self.max_seq_len, self.theta, self.scaling = head_dim, max_seq_len, theta, scaling
        cos, sin = rotary_table(head_dim, max_seq_len, theta, scaling=scaling)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def reset_table(self) -> None:
        """Recompute the table in place (after ``to_empty`` from the meta device)."""
        cos, sin = rotary_table(self.head_dim, self.max_seq_len, self.theta, self.cos.device, self.scaling)
        with torch.no_grad():
            self.cos.copy_(cos)
            self.sin.copy_(sin)

    def forward(
        self, seq_len: int, positions: torch.Tensor | None, start: int = 0
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(cos, sin)`` for a row of ``seq_len`` tokens, shaped ``(B or 1, S, 1, D)``.

        ``positions (B, S)`` restart at every packed document; without them the
        positions are ``start .. start + seq_len - 1`` (``start``: tokens already cached).
        """
        if positions is None:
            end = start + seq_len
            if end > self.max_seq_len:
                raise ValueError(
                    f"sequence of {end} tokens exceeds model.options.max_seq_len="
                    f"{self.max_seq_len}: raise max_seq_len or lower data.seq_len"
                )
            return self.cos[None, start:end, None], self.sin[None, start:end, None]
        return self.cos[positions][:, :, None], self.sin[positions][:, :, None]
