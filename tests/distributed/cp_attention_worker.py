"""Run under ``torchrun`` (gloo, CPU): context-parallel attention against one process, in
float64, for every built-in backend, both cp attention modes, packed rows and plain
causal ones, and a split that differs between rows. Every rank holds its share of the
same random ``q``, ``k``, ``v``;
the sharded output and the gradients of its ``q``, ``k``, ``v`` are compared with the
rows of the single-process attention. A variant that drops the keys gathered from the
other ranks is measured the same way (a negative control), and Ulysses is handed key
heads that do not divide. Rank 0 writes the relative errors of every rank.

Usage: ``torchrun --standalone --nproc-per-node 2 cp_attention_worker.py OUT.json``
"""

from __future__ import annotations

import json
import sys
import warnings

import torch
import torch.distributed as dist
from torch.nn.attention.flex_attention import flex_attention

from forge_core.api import AttentionContext, NoOptions
from forge_core.cli.exiting import exit_process
from forge_core.testing import doc_ids_from_lengths
from forge_plugins.attention import flex_kernel
from forge_plugins.attention.eager import EagerAttention
from forge_plugins.attention.flex import FlexAttention
from forge_plugins.attention.options import FlexOptions, SdpaOptions
from forge_plugins.attention.sdpa import SdpaAttention
from forge_plugins.context_parallel import attention as cp_attention
from forge_plugins.context_parallel.attention import ContextParallelAttention
from forge_plugins.context_parallel.balance import shard_index, zigzag_index
from forge_plugins.context_parallel.collectives import gather_sequence
from forge_plugins.context_parallel.options import ContextParallelOptions

S, HEADS, KV_HEADS, HEAD_DIM = 64, 4, 2, 8
#: Two packed rows: documents crossing the shard boundaries (S/4 = 16) and flex's
#: 16-token blocks, single-token documents, a document spanning three shards.
ROWS = doc_ids_from_lengths(((5, 1, 11, 7, 9, 1, 30), (1, 40, 7, 10, 6)), S)


def cp_options(attention: str, balance: str = "zigzag") -> ContextParallelOptions:
    return ContextParallelOptions(attention=attention, balance=balance)


class DropsOtherRanksKeys(ContextParallelAttention):
    """Negative control: the keys and values gathered from the other ranks are zeroed."""

    def gather_keys(self, k, v, prepared):
        mine = torch.zeros(self.ctx.size, k.shape[2], dtype=k.dtype)
        mine[self.ctx.rank] = 1
        keep = mine.flatten()[prepared.inverse][:, None, :, None]  # row order, like gather_keys
        k, v = super().gather_keys(k, v, prepared)
        return k * keep, v * keep


def per_row_index(doc_ids, seq_len, cp, balance):
    """A balancer whose split differs between rows (zigzag on even rows, contiguous on
    odd ones), as a per-document balancer's may: the ``(B, cp, S/cp)`` index path."""
    contiguous = torch.arange(seq_len).view(cp, -1)
    return torch.stack([contiguous if b % 2 else zigzag_index(seq_len, cp) for b in range(doc_ids.shape[0])])


def backends():
    return {
        "eager": EagerAttention(NoOptions()),
        "sdpa": SdpaAttention(SdpaOptions()),
        "flex": FlexAttention(FlexOptions(block_size=16)),
    }


def tensors(seed: int, kv_heads: int = KV_HEADS):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, HEADS, S, HEAD_DIM, generator=g, dtype=torch.float64)
    k, v = (torch.randn(2, kv_heads, S, HEAD_DIM, generator=g, dtype=torch.float64) for _ in "kv")
    weight = torch.randn(2, HEADS, S, HEAD_DIM, generator=g, dtype=torch.float64)
    return q, k, v, weight


def one_process(backend, doc_ids, q, k, v, weight):
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    out = backend.attend(q, k, v, backend.prepare(doc_ids, S, "cpu"))
    (out * weight).sum().backward()
    return out.detach(), q.grad, k.grad, v.grad


def sharded(attention, doc_ids, q, k, v, weight, rank):
    """This rank's output and gradients, and the same rows of the full tensors."""
    rows = cp_attention.shard_index(doc_ids, S, attention.ctx.size, attention.ctx.options.balance)[:, rank]

    def pick(t):
        return t.gather(2, rows.expand(t.shape[0], -1)[:, None, :, None].expand(-1, t.shape[1], -1, HEAD_DIM))

    local = [pick(t).requires_grad_() for t in (q, k, v)]
    local_doc = None if doc_ids is None else doc_ids.gather(1, rows.expand(doc_ids.shape[0], -1))
    out = attention.attend(*local, attention.prepare(local_doc, S // attention.ctx.size, "cpu"))
    (out * pick(weight)).sum().backward()
    return (out.detach(), *(t.grad for t in local)), pick


def relative(got, want) -> float:
    return float((got - want).abs().max() / want.abs().max())


def main() -> None:
    out_path = sys.argv[1]
    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    # float64 on CPU: PyTorch's unfused flex_attention (same BlockMask semantics) in place
    # of the compiled kernel, which takes no float64; the backward is flex's own.
    flex_kernel.compiled = flex_attention
    warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
    results: dict[str, object] = {}
    seed = 0
    for name, backend in backends().items():
        for mode in ("allgather", "ulysses"):
            for packed, split in ((True, "zigzag"), (False, "zigzag"), (True, "per-row")):
                seed += 1
                doc_ids = ROWS if packed else None
                cp_attention.shard_index = per_row_index if split == "per-row" else shard_index
                q, k, v, weight = tensors(seed)
                want = one_process(backend, doc_ids, q, k, v, weight)
                ctx = AttentionContext(group=None, rank=rank, size=size, options=cp_options(mode))
                variants = {"": ContextParallelAttention}
                if mode == "allgather":
                    variants["drops-other-ranks-keys"] = DropsOtherRanksKeys
                for label, cls in variants.items():
                    got, pick = sharded(cls(backend, ctx), doc_ids, q, k, v, weight, rank)
                    rows = ("packed" if packed else "causal") + ("-per-row" if split == "per-row" else "")
                    case = "-".join(filter(None, (name, mode, rows, label)))
                    results[case] = {
                        what: relative(g, pick(w)) for what, g, w in zip(("out", "dq", "dk", "dv"), got, want)
                    }
    cp_attention.shard_index = shard_index
    # Under torch.compile (dynamo and AOT autograd; the collectives stay outside the graph).
    for mode in ("allgather", "ulysses"):
        backend = backends()["sdpa"]
        q, k, v, weight = tensors(100)
        want = one_process(backend, ROWS, q, k, v, weight)
        attention = ContextParallelAttention(backend, AttentionContext(None, rank, size, cp_options(mode)))
        attention.attend = torch.compile(attention.attend, backend="aot_eager")
        got, pick = sharded(attention, ROWS, q, k, v, weight, rank)
        results[f"sdpa-{mode}-packed-compiled"] = {
            what: relative(g, pick(w)) for what, g, w in zip(("out", "dq", "dk", "dv"), got, want)
        }
    # Ulysses with key/value heads that do not divide by cp is refused, naming the fix.
    ctx = AttentionContext(group=None, rank=rank, size=size, options=cp_options("ulysses"))
    q, k, v, weight = tensors(0, kv_heads=1)
    try:
        sharded(ContextParallelAttention(backends()["eager"], ctx), None, q, k, v, weight, rank)
        results["ulysses-indivisible-kv-heads"] = "accepted"
    except ValueError as exc:
        results["ulysses-indivisible-kv-heads"] = str(exc)
    # Shards that are not the balancer's (a contiguous split of packed rows) are refused.
    contiguous = ROWS.view(2, size, -1)[:, rank]
    try:
        ContextParallelAttention(backends()["eager"], ctx).prepare(contiguous, S // size, "cpu")
        results["contiguous-shards"] = "accepted"
    except ValueError as exc:
        results["contiguous-shards"] = str(exc)
    # The sequence gather of integer ids is exact and in rank order.
    ids = torch.arange(3)[None] + 10 * rank
    results["gather-ids"] = gather_sequence(ids, None, dim=1).tolist()
    seen: list = [None] * size
    dist.all_gather_object(seen, results)
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(seen, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    exit_process(main())
