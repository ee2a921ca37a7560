"""A backward pass for FlexAttention on CPU, where PyTorch provides none.

The forward runs the compiled ``flex_attention`` kernel
(:func:`~forge_plugins.attention.flex_kernel.flex_forward`). The backward walks the
``BlockMask``: for every query block it gathers the key blocks the mask keeps (partial
blocks get their ``mask_mod`` evaluated on index tensors, full blocks need none),
recomputes the scores and their log-sum-exp (CPU flex cannot return it), and applies
the standard softmax-attention gradient. Queries and keys may differ in length (a
``BlockMask`` with ``Q_LEN != KV_LEN``). Skipped blocks cost nothing, so the work
follows the mask's sparsity, and memory stays at one query block's scores,
``(heads, block_size, kept keys)``.

It assumes ``mask_mod`` is written with broadcastable index arithmetic and one mask
for every head (as the built-in masks are); score modifications (``score_mod``) are not
supported.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from forge_plugins.attention.flex_kernel import flex_forward


def _kept_blocks(block_mask: Any, b: int, h: int, q_block: int) -> tuple[list[int], list[int]]:
    """Indices of the partial and of the full key blocks kept for one query block."""
    out = []
    for num, idx in (
        (block_mask.kv_num_blocks, block_mask.kv_indices),
        (block_mask.full_kv_num_blocks, block_mask.full_kv_indices),
    ):
        if num is None:
            out.append([])
        else:
            out.append(idx[b, h, q_block, : int(num[b, h, q_block])].tolist())
    return out[0], out[1]


def _tokens(blocks: list[int], block_size: int, seq_len: int) -> torch.Tensor:
    if not blocks:
        return torch.empty(0, dtype=torch.long)
    return torch.cat([torch.arange(blk * block_size, min((blk + 1) * block_size, seq_len)) for blk in blocks])


def _backward_heads(q, k, v, out, grad_out, block_mask, scale, mask_b, dq, dk, dv):
    """Gradients for one batch row (row ``mask_b`` of the mask), every query head.

    ``q, out, grad_out``: ``(Hkv, group, Sq, D)``; ``k, v``: ``(Hkv, 1, S, D)``, so each
    key/value head broadcasts over its query heads without being copied. ``dq`` (like
    ``q``) and ``dk, dv`` (``(Hkv, S, D)``) are accumulated in place. ``Sq`` may differ
    from ``S`` (a rectangular mask: context parallelism's queries of some row positions).
    """
    q_len, kv_len = q.shape[2], k.shape[2]
    q_bs, kv_bs = block_mask.BLOCK_SIZE
    # D_i = sum_d dO_id * O_id, the softmax-gradient correction, once for all rows.
    correction = (grad_out * out).sum(-1, keepdim=True)
    b_index, h_index = torch.tensor(mask_b), torch.tensor(0)
    for qb in range(block_mask.kv_num_blocks.shape[2]):
        r0, r1 = qb * q_bs, min((qb + 1) * q_bs, q_len)
        partial_blocks, full_blocks = _kept_blocks(block_mask, mask_b, 0, qb)
        partial_cols = _tokens(partial_blocks, kv_bs, kv_len)
        full_cols = _tokens(full_blocks, kv_bs, kv_len)
        cols = torch.cat([partial_cols, full_cols])
        if cols.numel() == 0:
            continue
        rows = torch.arange(r0, r1)
        allowed = torch.cat(
            [
                block_mask.mask_mod(b_index, h_index, rows[:, None], partial_cols[None, :]),
                torch.ones(r1 - r0, full_cols.numel(), dtype=torch.bool),
            ],
            dim=1,
        )
        qs, go, corr = q[:, :, r0:r1], grad_out[:, :, r0:r1], correction[:, :, r0:r1]
        ks, vs = k.index_select(2, cols), v.index_select(2, cols)
        scores = (qs @ ks.transpose(-1, -2)) * scale
        scores = scores.masked_fill(~allowed, float("-inf"))
        lse = torch.logsumexp(scores, dim=-1, keepdim=True)
        probs = torch.exp(scores - lse).nan_to_num(0.0)  # fully masked rows -> 0
        d_scores = probs * ((go @ vs.transpose(-1, -2)) - corr)
        dq[:, :, r0:r1] += scale * (d_scores @ ks)
        # Sum over the query heads of each group onto their shared key/value head.
        dk.index_add_(1, cols, scale * (d_scores.transpose(-1, -2) @ qs).sum(1))
        dv.index_add_(1, cols, (probs.transpose(-1, -2) @ go).sum(1))


def _backward(q, k, v, out, grad_out, block_mask, scale):
    batch, heads, q_len, head_dim = q.shape
    kv_heads = k.shape[1]
    group = heads // kv_heads
    mask_batch, mask_heads = block_mask.kv_num_blocks.shape[:2]
    if mask_heads != 1:
        raise NotImplementedError(
            f"the CPU FlexAttention backward needs one BlockMask for every head, got {mask_heads}"
        )
    # At least fp32 (half-precision inputs accumulate in fp32); float64 stays float64.
    work = torch.promote_types(q.dtype, torch.float32)
    qf, kf, vf, of, gof = (t.to(work) for t in (q, k, v, out, grad_out))
    dq, dk, dv = torch.zeros_like(qf), torch.zeros_like(kf), torch.zeros_like(vf)
    for b in range(batch):

        def grouped(t, n):  # (H, S, D) -> (H / n, n, S, D)
            return t[b].reshape(-1, n, t.shape[2], head_dim)

        # All query heads at once, grouped by the key/value head they share.
        dq_b = torch.zeros(kv_heads, group, q_len, head_dim, dtype=work)
        _backward_heads(
            grouped(qf, group),
            grouped(kf, 1),
            grouped(vf, 1),
            grouped(of, group),
            grouped(gof, group),
            block_mask,
            scale,
            b if mask_batch > 1 else 0,
            dq_b,
            dk[b],
            dv[b],
        )
        dq[b] += dq_b.reshape(heads, q_len, head_dim)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


class _FlexCpu(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, block_mask, scale):
        # Detached: CPU flex refuses inputs that require grad, even under no_grad.
        out = flex_forward(q.detach(), k.detach(), v.detach(), block_mask)
        ctx.save_for_backward(q, k, v, out)
        ctx.block_mask = block_mask
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out = ctx.saved_tensors
        dq, dk, dv = _backward(q, k, v, out, grad_out, ctx.block_mask, ctx.scale)
        return dq, dk, dv, None, None


# Under torch.compile(model) this runs as a graph break: the block loop is Python and the
# forward already calls a compiled kernel.
@torch.compiler.disable
def flex_attention_cpu_trainable(q, k, v, block_mask):
    """``flex_attention(q, k, v, block_mask=...)`` (scale ``1/sqrt(head_dim)``) with a
    backward that works on CPU."""
    return _FlexCpu.apply(q, k, v, block_mask, 1.0 / math.sqrt(q.shape[-1]))
