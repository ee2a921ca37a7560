"""Rotary position embeddings in Hugging Face's ``rotate_half`` layout.

A head vector is split into halves ``(x1, x2)``; channel ``i`` of each half is rotated
by the angle ``position * theta^(-2i / head_dim)``. This is the layout of
``transformers``' Llama, so ``wq``/``wk`` weights move between Forge and Hugging Face
without the interleaved-to-half permutation Meta's original checkpoints need.

The cos/sin table covers positions ``0 .. max_seq_len - 1`` in fp32 and is a
non-persistent buffer: it is rebuilt from the options, never stored in checkpoints.
"""

from __future__ import annotations

import torch
from torch import nn


def rotary_table(head_dim: int, max_seq_len: int, theta: float, device=None):
    """``(cos, sin)`` of shape ``(max_seq_len, head_dim)``, computed as transformers does."""
    inv_freq = 1.0 / (
        theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float() / head_dim)
    )
    positions = torch.arange(max_seq_len, dtype=torch.int64, device=device).float()
    freqs = torch.outer(positions, inv_freq)
    angles = torch.cat((freqs, freqs), dim=-1)
    return angles.cos(), angles.sin()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x (B, S, H, D)`` with ``cos``/``sin`` of shape ``(B or 1, S, 1, D)``."""
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return x * cos + rotate_half(x) * sin


class Rotary(nn.Module):
    def __init__(self, head_dim: int, max_seq_len: int, theta: float) -> None:
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"rotary embeddings need an even head dim, got {head_dim}")
        self.head_dim, self.max_seq_len, self.theta = head_dim, max_seq_len, theta
        cos, sin = rotary_table(head_dim, max_seq_len, theta)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def reset_table(self) -> None:
        """Recompute the table in place (after ``to_empty`` from the meta device)."""
        cos, sin = rotary_table(self.head_dim, self.max_seq_len, self.theta, device=self.cos.device)
        with torch.no_grad():
            self.cos.copy_(cos)
            self.sin.copy_(sin)

    def forward(
        self, seq_len: int, positions: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(cos, sin)`` for a row of ``seq_len`` tokens, shaped ``(B or 1, S, 1, D)``.

        ``positions (B, S)`` restart at every packed document; without them the
        positions are ``0 .. seq_len - 1``.
        """
        if positions is None:
            if seq_len > self.max_seq_len:
                raise ValueError(
                    f"sequence of {seq_len} tokens exceeds model.options.max_seq_len="
                    f"{self.max_seq_len}: raise max_seq_len or lower data.seq_len"
                )
            return self.cos[None, :seq_len, None], self.sin[None, :seq_len, None]
        return self.cos[positions][:, :, None], self.sin[positions][:, :, None]
