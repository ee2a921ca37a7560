"""A backward pass for FlexAttention on CPU, where PyTorch provides none.

The forward runs the compiled ``flex_attention`` kernel. The backward walks the
``BlockMask``: for every query block it gathers the key blocks the mask keeps (partial
blocks get their ``mask_mod`` evaluated on index tensors, full blocks need none),
recomputes the scores and their log-sum-exp (CPU flex cannot return it), and applies
the standard softmax-attention gradient. Skipped blocks cost nothing, so the work
follows the mask's sparsity, and memory stays at one query block's scores,
``(heads, block_size, kept keys)``.

It assumes ``mask_mod`` is written with broadcastable index arithmetic (as the built-in
masks are); score modifications (``score_mod``) are not supported.
"""

from __future__ import annotations

import math
from typing import Any

import torch


def _kept_kv(block_mask: Any, b: int, h: int, q_block: int, seq_len: int, kv_block_size: int):
    """Token indices of kept keys and whether each comes from a partial block."""
    parts, partial_flags = [], []
    for num, idx, partial in (
        (block_mask.kv_num_blocks, block_mask.kv_indices, True),
        (block_mask.full_kv_num_blocks, block_mask.full_kv_indices, False),
    ):
        if num is None:
            continue
        count = int(num[b, h, q_block])
        for blk in idx[b, h, q_block, :count].tolist():
            tokens = torch.arange(
                blk * kv_block_size, min((blk + 1) * kv_block_size, seq_len), device=num.device
            )
            parts.append(tokens)
            partial_flags.append(torch.full_like(tokens, partial, dtype=torch.bool))
    if not parts:
        empty = torch.empty(0, dtype=torch.long)
        return empty, empty.bool()
    return torch.cat(parts), torch.cat(partial_flags)


def _backward(q, k, v, out, grad_out, block_mask, scale):
    batch, heads, seq_len, _ = q.shape
    group = heads // k.shape[1]
    q_bs, kv_bs = block_mask.BLOCK_SIZE
    mask_batch, mask_heads = block_mask.kv_num_blocks.shape[:2]
    qf, kf, vf, of, gof = (t.float() for t in (q, k, v, out, grad_out))
    dq, dk, dv = torch.zeros_like(qf), torch.zeros_like(kf), torch.zeros_like(vf)
    for b in range(batch):
        mb = b if mask_batch > 1 else 0
        for mh in range(mask_heads):
            # A mask without a head dimension covers every query head at once.
            q_heads = torch.arange(heads) if mask_heads == 1 else torch.tensor([mh])
            kv_heads = q_heads // group
            for qb in range(block_mask.kv_num_blocks.shape[2]):
                rows = torch.arange(qb * q_bs, min((qb + 1) * q_bs, seq_len))
                if rows.numel() == 0:
                    continue
                cols, partial = _kept_kv(block_mask, mb, mh, qb, seq_len, kv_bs)
                if cols.numel() == 0:
                    continue
                allowed = ~partial[None, :].expand(rows.numel(), -1)
                if bool(partial.any()):
                    mod = block_mask.mask_mod(
                        torch.tensor(mb), torch.tensor(mh), rows[:, None], cols[None, :]
                    )
                    allowed = allowed | (mod & partial[None, :])
                qs = qf[b, q_heads][:, rows]  # (Hq, r, D)
                ks = kf[b, kv_heads][:, cols]  # (Hq, c, D), key heads repeated per group
                vs = vf[b, kv_heads][:, cols]
                scores = (qs @ ks.transpose(-1, -2)) * scale
                scores = scores.masked_fill(~allowed, float("-inf"))
                lse = torch.logsumexp(scores, dim=-1, keepdim=True)
                probs = torch.exp(scores - lse).nan_to_num(0.0)  # fully masked rows -> 0
                go = gof[b, q_heads][:, rows]
                o = of[b, q_heads][:, rows]
                d_probs = go @ vs.transpose(-1, -2)
                d_scores = probs * (d_probs - (go * o).sum(-1, keepdim=True))
                dq[b, q_heads[:, None], rows[None, :]] += scale * (d_scores @ ks)
                dk_part = scale * (d_scores.transpose(-1, -2) @ qs)  # (Hq, c, D)
                dv_part = probs.transpose(-1, -2) @ go
                # Sum the query heads of each group onto their shared key/value head.
                dk_g = dk_part.view(-1, group, *dk_part.shape[1:]).sum(1)
                dv_g = dv_part.view(-1, group, *dv_part.shape[1:]).sum(1)
                kvh = kv_heads.view(-1, group)[:, 0]
                dk[b, kvh[:, None], cols[None, :]] += dk_g
                dv[b, kvh[:, None], cols[None, :]] += dv_g
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


class _FlexCpu(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, block_mask, scale):
        from forge_plugins.attention.flex import compiled_flex_attention

        # Detached: CPU flex refuses inputs that require grad, even under no_grad.
        out = compiled_flex_attention()(
            q.detach(), k.detach(), v.detach(), block_mask=block_mask, scale=scale, enable_gqa=q.shape[1] != k.shape[1]
        )
        ctx.save_for_backward(q, k, v, out)
        ctx.block_mask = block_mask
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out = ctx.saved_tensors
        dq, dk, dv = _backward(q, k, v, out, grad_out, ctx.block_mask, ctx.scale)
        return dq, dk, dv, None, None


def flex_attention_cpu_trainable(q, k, v, block_mask, scale: float | None = None):
    """``flex_attention(q, k, v, block_mask=...)`` with a backward that works on CPU."""
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    return _FlexCpu.apply(q, k, v, block_mask, scale)
